"""A Redis primary, its replica and three Sentinels on loopback, each from a config file of its own.

A failover sends CONFIG REWRITE to the servers (and the Sentinels rewrite their own files), so no process
here runs from the checkout's deploy/redis.conf: each server starts from a copy in its own folder, with
the shipped settings, the group's password (`requirepass`, and `masterauth` to follow a primary), and the
replica's `replicaof`. The Sentinels notice a primary down after `DOWN_AFTER_MS` and fail over within
seconds: the production values (deploy/) are longer.
"""

from __future__ import annotations

import contextlib
import secrets
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import redis

from devstack.local_stack import REDIS_CONF, ManagedProcess, free_port, wait_until

MASTER_NAME = "draftgen"
QUORUM = 2
DOWN_AFTER_MS = 1000
FAILOVER_TIMEOUT_MS = 5000
SENTINELS = 3
PASSWORD_BYTES = 16
READY_TIMEOUT_S = 20.0
FAILOVER_WAIT_S = 30.0
WRONG_PASSWORD = "not-the-password"
LAG_BYTES = 10_000  # of writes the replica lacks when the primary dies, in the case that cuts it off


@dataclass
class SentinelGroup:
    folder: Path
    password: str = field(default_factory=lambda: secrets.token_hex(PASSWORD_BYTES), repr=False)
    servers: dict[int, ManagedProcess] = field(default_factory=dict)  # by port; the first started is primary
    sentinels: dict[int, ManagedProcess] = field(default_factory=dict)

    @property
    def url(self) -> str:
        """The Sentinel URL every draftgen process is given (workers/state/redis_address.py)."""
        first, *others = self.sentinels
        urls = [f"sentinel://:{self.password}@127.0.0.1:{first}/0?master_name={MASTER_NAME}"]
        urls += [f"sentinel://127.0.0.1:{port}" for port in others]
        return ";".join(urls)

    def start_server(self, replica_of: int | None = None) -> int:
        port = free_port()
        folder = self.folder / f"redis-{port}"
        folder.mkdir(parents=True)
        config = folder / "redis.conf"
        shutil.copy(REDIS_CONF, config)
        lines = [
            f"requirepass {self.password}",
            f"masterauth {self.password}",
            f"port {port}",
            f"dir {folder}",
        ]
        if replica_of is not None:
            lines.append(f"replicaof 127.0.0.1 {replica_of}")
        with config.open("a") as file:
            file.write("\n" + "\n".join(lines) + "\n")
        config.chmod(0o600)
        process = ManagedProcess(f"redis-{port}", ["redis-server", str(config)], folder / "redis.log").start()
        process.wait_for_log("Ready to accept connections")
        self.servers[port] = process
        return port

    def start_sentinel(self, primary: int) -> int:
        port = free_port()
        folder = self.folder / f"sentinel-{port}"
        folder.mkdir(parents=True)
        config = folder / "sentinel.conf"
        config.write_text(
            f"port {port}\nbind 127.0.0.1\ndir {folder}\n"
            f"sentinel monitor {MASTER_NAME} 127.0.0.1 {primary} {QUORUM}\n"
            f"sentinel auth-pass {MASTER_NAME} {self.password}\n"
            f"sentinel down-after-milliseconds {MASTER_NAME} {DOWN_AFTER_MS}\n"
            f"sentinel failover-timeout {MASTER_NAME} {FAILOVER_TIMEOUT_MS}\n"
            f"sentinel parallel-syncs {MASTER_NAME} 1\n"
        )
        config.chmod(0o600)
        process = ManagedProcess(
            f"sentinel-{port}", ["redis-server", str(config), "--sentinel"], folder / "sentinel.log"
        ).start()
        process.wait_for_log("+monitor master")
        self.sentinels[port] = process
        return port

    def primary_port(self) -> int:
        """The port of the primary the Sentinels name now."""
        for port in self.sentinels:
            with contextlib.suppress(redis.RedisError):
                client = redis.Redis(port=port, socket_timeout=1)
                _, primary = client.sentinel_get_master_addr_by_name(MASTER_NAME)
                return int(primary)
        raise AssertionError("no Sentinel answers")

    def server(self, port: int) -> redis.Redis:
        return redis.Redis(port=port, password=self.password)

    def wait_replica_in_sync(self, replica: int) -> None:
        def synced() -> bool:
            info = self.server(replica).info("replication")
            return bool(info.get("master_link_status") == "up")

        wait_until(synced, timeout_s=READY_TIMEOUT_S, what=f"replica {replica} in sync")

    def wait_sentinels_know_replica(self) -> None:
        def known() -> bool:
            client = redis.Redis(port=next(iter(self.sentinels)))
            return bool(client.sentinel_slaves(MASTER_NAME))

        wait_until(known, timeout_s=READY_TIMEOUT_S, what="the Sentinels to know the replica")

    def kill(self, port: int) -> None:
        self.servers[port].kill()

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
                self.server(port).config_set("masterauth", self.password)

    def wait_failover_from(self, old_primary: int) -> int:
        wait_until(lambda: self.primary_port() != old_primary, timeout_s=FAILOVER_WAIT_S, what="a failover")
        return self.primary_port()

    def stop(self) -> None:
        for process in [*self.sentinels.values(), *self.servers.values()]:
            process.kill()


@contextlib.contextmanager
def sentinel_group(folder: Path) -> Iterator[SentinelGroup]:
    """A primary and a replica in sync, watched by three Sentinels that know both."""
    group = SentinelGroup(folder)
    try:
        primary = group.start_server()
        replica = group.start_server(replica_of=primary)
        group.wait_replica_in_sync(replica)
        for _ in range(SENTINELS):
            group.start_sentinel(primary)
        group.wait_sentinels_know_replica()
        yield group
    finally:
        group.stop()
