"""A Redis primary, its replica and three Sentinels on loopback, set up as deploy/multi-node.md (section 6)
sets up a fleet's: TLS only (a test CA), the ACL users of deploy/redis-users.acl on every server (the
replication and Sentinel users included), credentials and the Sentinels' first config from
deploy/redis-credentials.sh --sentinel, the Sentinels' settings from deploy/sentinel.conf and
deploy/sentinel-primary.conf as shipped, and each process from a config file of its own (a failover sends
CONFIG REWRITE, and the Sentinels rewrite their own files). Only the ports, folders and certificates are
the test's own.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import redis

from devstack.local_stack import ManagedProcess, free_port, wait_until
from tests.support.redis_head import (
    GPU_NODES,
    ROLES,
    head_config,
    node_user,
    url_in_env_file,
    write_credentials,
)
from tests.support.tls import LOOPBACK_IP, CertificateFiles, make_test_certificates

MASTER_NAME = "draftgen"
SENTINELS = 3
READY_TIMEOUT_S = 20.0
# deploy/sentinel-primary.conf: down after 5 s, then the election and the promotion
FAILOVER_WAIT_S = 45.0
WRONG_PASSWORD = "not-the-password"
LAG_BYTES = 10_000  # of writes the replica lacks when the primary dies, in the case that cuts it off
ADMIN = "admin"
ACL_LOG_ENTRIES = 1000
IGNORED_REFUSALS = frozenset({"client|setinfo"})


@dataclass
class SentinelGroup:
    folder: Path
    certificates: CertificateFiles
    etc: Path  # what redis-credentials.sh wrote
    first_primary: int
    sentinel_ports: list[int]
    servers: dict[int, ManagedProcess] = field(default_factory=dict)  # by port; the first started is primary
    sentinels: dict[int, ManagedProcess] = field(default_factory=dict)

    @property
    def urls(self) -> dict[str, str]:
        """Each user's `sentinel://` URL, as its env file holds it."""
        users = [*ROLES, *(node_user(host) for host in GPU_NODES)]
        return {user: url_in_env_file(self.etc / f"redis-{user}.env") for user in users}

    def password(self, user: str) -> str:
        return (self.etc / "redis-passwords" / user).read_text().strip()

    def start_server(self, replica_of: int | None = None) -> int:
        port = self.first_primary if replica_of is None else free_port()
        folder = self.folder / f"redis-{port}"
        folder.mkdir(parents=True)
        config = head_config(folder, port, self.certificates, self.etc / "redis-users.acl")
        lines = [f"include {self.etc / 'redis-replication.conf'}", "tls-replication yes"]
        if replica_of is not None:
            lines.append(f"replicaof {LOOPBACK_IP} {replica_of}")
        with config.open("a") as file:
            file.write("\n".join(lines) + "\n")
        process = ManagedProcess(f"redis-{port}", ["redis-server", str(config)], folder / "redis.log").start()
        process.wait_for_log("Ready to accept connections")
        self.servers[port] = process
        return port

    def start_sentinel(self, port: int) -> int:
        folder = self.folder / f"sentinel-{port}"
        folder.mkdir(parents=True)
        config = folder / "sentinel.conf"
        shutil.copy(self.etc / "sentinel.conf.initial", config)
        with config.open("a") as file:  # below the shipped settings: this test's ports, folder, certificates
            file.write(
                f"tls-port {port}\nbind {LOOPBACK_IP}\ndir {folder}\n"
                f"tls-cert-file {self.certificates.server_cert}\n"
                f"tls-key-file {self.certificates.server_key}\n"
                f"tls-ca-cert-file {self.certificates.ca_cert}\n"
            )
        config.chmod(0o600)
        process = ManagedProcess(
            f"sentinel-{port}", ["redis-server", str(config), "--sentinel"], folder / "sentinel.log"
        ).start()
        process.wait_for_log("+monitor master")
        self.sentinels[port] = process
        return port

    def sentinel(self, port: int, user: str = ADMIN) -> redis.Redis:
        """The Sentinel on `port`, as `user` (an admin, by default)."""
        return redis.Redis(
            host=LOOPBACK_IP,
            port=port,
            socket_timeout=1,
            username=user,
            password=self.password(user),
            ssl=True,
            ssl_ca_certs=str(self.certificates.ca_cert),
        )

    def primary_port(self) -> int:
        """The port of the primary the Sentinels name now."""
        for port in self.sentinels:
            with contextlib.suppress(redis.RedisError):
                _, primary = self.sentinel(port).sentinel_get_master_addr_by_name(MASTER_NAME)
                return int(primary)
        raise AssertionError("no Sentinel answers")

    def server(self, port: int) -> redis.Redis:
        """The server on `port`, as `admin` (maintenance by hand)."""
        return redis.Redis(
            host=LOOPBACK_IP,
            port=port,
            username=ADMIN,
            password=self.password(ADMIN),
            ssl=True,
            ssl_ca_certs=str(self.certificates.ca_cert),
        )

    def refusals(self, port: int) -> list[dict[str, object]]:
        """ACL LOG of the server on `port`: every command, key or channel a user was refused there (redis-py's
        CLIENT SETINFO, which it ignores, aside)."""
        return _refusals(self.server(port))

    def sentinel_refusals(self) -> list[dict[str, object]]:
        """ACL LOG of every Sentinel: what a user was refused there."""
        return [entry for port in self.sentinels for entry in _refusals(self.sentinel(port))]

    def wait_replica_in_sync(self, replica: int) -> None:
        def synced() -> bool:
            info = self.server(replica).info("replication")
            return bool(info.get("master_link_status") == "up")

        wait_until(synced, timeout_s=READY_TIMEOUT_S, what=f"replica {replica} in sync")

    def wait_sentinels_know_replica(self) -> None:
        def known() -> bool:
            return all(self.sentinel(port).sentinel_slaves(MASTER_NAME) for port in self.sentinels)

        wait_until(known, timeout_s=READY_TIMEOUT_S, what="the Sentinels to know the replica")

    def kill(self, port: int) -> None:
        self.servers[port].kill()

    def freeze(self, port: int) -> None:
        """The server stops answering while every connection to it stays open (SIGSTOP): a host powered off
        or cut off, as its clients see it: no reset, no FIN, no reply. `thaw` lets it go on."""
        os.kill(self.servers[port].pid, signal.SIGSTOP)

    def thaw(self, port: int) -> None:
        os.kill(self.servers[port].pid, signal.SIGCONT)

    def cut_replicas_off(self, primary: int) -> int:
        """Cut the primary's replicas off (their links dropped, their password for it wrong, so they cannot
        sync again) and let it take writes alone until they lack some: the bytes of writes they then lack.
        `restore_replica_auth` puts the password back."""
        client = self.server(primary)
        replicas = [self.server(port) for port in self.servers if port != primary]
        for replica in replicas:
            replica.config_set("masterauth", WRONG_PASSWORD)
        client.client_kill_filter(_type="replica")

        def behind() -> int:
            ahead = int(client.info("replication")["master_repl_offset"])
            return min(ahead - int(r.info("replication")["master_repl_offset"]) for r in replicas)

        wait_until(lambda: behind() >= LAG_BYTES, timeout_s=READY_TIMEOUT_S, what="replicas falling behind")
        return behind()

    def restore_replica_auth(self) -> None:
        for port, process in self.servers.items():
            if process.alive():
                self.server(port).config_set("masterauth", self.password("replica"))

    def wait_failover_from(self, old_primary: int) -> int:
        wait_until(lambda: self.primary_port() != old_primary, timeout_s=FAILOVER_WAIT_S, what="a failover")
        return self.primary_port()

    def stop(self) -> None:
        for process in [*self.sentinels.values(), *self.servers.values()]:
            process.kill()


def _refusals(client: redis.Redis) -> list[dict[str, object]]:
    log = client.acl_log(count=ACL_LOG_ENTRIES)
    return [entry for entry in log if entry["object"] not in IGNORED_REFUSALS]


@contextlib.contextmanager
def sentinel_group(folder: Path) -> Iterator[SentinelGroup]:
    """A primary and a replica in sync, watched by three Sentinels that know both."""
    certificates = make_test_certificates(folder / "tls")
    primary, sentinels = free_port(), [free_port() for _ in range(SENTINELS)]
    etc = folder / "etc"
    sentinel_options = (option for port in sentinels for option in ("--sentinel", f"{LOOPBACK_IP}:{port}"))
    write_credentials(etc, primary, certificates, *sentinel_options, "--master-name", MASTER_NAME)
    group = SentinelGroup(folder, certificates, etc, primary, sentinels)
    try:
        group.start_server()
        replica = group.start_server(replica_of=primary)
        group.wait_replica_in_sync(replica)
        for port in sentinels:
            group.start_sentinel(port)
        group.wait_sentinels_know_replica()
        yield group
    finally:
        group.stop()
