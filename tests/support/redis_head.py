"""The head node's Redis as deploy/multi-node.md (section 1) configures it, on 127.0.0.1: TLS only, a test
CA, and the ACL users of deploy/redis-users.acl with credentials from deploy/redis-credentials.sh: one per
role, and one per GPU node (GPU_NODES, the hosts the tests' generate workers label themselves with)."""

from __future__ import annotations

import getpass
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devstack.local_stack import PROJECT_ROOT, REDIS_CONF, ManagedProcess, free_port, start_celery_worker
from inference.simulator import SimulatorProcess
from tests.support.stack import Stack
from tests.support.tls import LOOPBACK_IP, CertificateFiles, make_test_certificates

CREDENTIALS_SCRIPT = PROJECT_ROOT / "deploy" / "redis-credentials.sh"
ROLES = ("admin", "producer", "uploader", "flower")
GPU_NODES = ("node-a", "node-b.example.internal")  # a short host name, and one with dots
NODE_USER_PREFIX = "worker-"
ENV_VARIABLE = "DRAFTGEN_REDIS_URL"


def node_user(host: str) -> str:
    """The Redis user of the GPU node whose workers label themselves `<host>/gpuN`."""
    return NODE_USER_PREFIX + host


@dataclass(frozen=True)
class RedisHead:
    process: ManagedProcess
    urls: dict[str, str]  # user -> its rediss:// URL, as its env file holds it

    def stop(self) -> None:
        self.process.stop()


def url_in_env_file(path: Path) -> str:
    """DRAFTGEN_REDIS_URL="..." from an env file the credentials script wrote."""
    for line in path.read_text().splitlines():
        name, _, value = line.partition("=")
        if name == ENV_VARIABLE:
            return value.strip().strip('"')
    raise AssertionError(f"{path} sets no {ENV_VARIABLE}")


def head_config(root: Path, tls_port: int, certificates: CertificateFiles, acl_file: Path) -> Path:
    """/etc/draftgen/redis-head.conf of the guide, with this test's paths and no plain-text port."""
    config = root / "redis-head.conf"
    config.write_text(
        f"include {REDIS_CONF}\n"
        f"bind {LOOPBACK_IP}\n"
        "port 0\n"
        f"tls-port {tls_port}\n"
        f"tls-cert-file {certificates.server_cert}\n"
        f"tls-key-file {certificates.server_key}\n"
        f"tls-ca-cert-file {certificates.ca_cert}\n"
        "tls-auth-clients no\n"
        f"aclfile {acl_file}\n"
        f"dir {root / 'data'}\n"
    )
    (root / "data").mkdir(parents=True, exist_ok=True)
    return config


def write_credentials(etc: Path, port: int, certificates: CertificateFiles, *options: str) -> None:
    """deploy/redis-credentials.sh as the guide runs it, for a server on 127.0.0.1:`port` (`options`: more
    of the script's, e.g. its Sentinels), writing into `etc`."""
    subprocess.run(
        [
            str(CREDENTIALS_SCRIPT),
            "--dir",
            str(etc),
            "--host",
            LOOPBACK_IP,
            "--port",
            str(port),
            "--ca",
            str(certificates.ca_cert),
            "--redis-user",
            getpass.getuser(),
            *(option for host in GPU_NODES for option in ("--gpu-node", host)),
            *options,
        ],
        check=True,
        capture_output=True,
    )


def start_redis_head(root: Path, log_dir: Path) -> RedisHead:
    """Credentials, TLS certificates and redis-server, as the guide sets up the head node."""
    tls_port = free_port()
    etc = root / "etc"
    certificates = make_test_certificates(root / "tls")
    write_credentials(etc, tls_port, certificates)
    config = head_config(root, tls_port, certificates, etc / "redis-users.acl")
    process = ManagedProcess("redis-head", ["redis-server", str(config)], log_dir / "redis-head.log").start()
    process.wait_for_log("Ready to accept connections")
    users = [*ROLES, *(node_user(host) for host in GPU_NODES)]
    return RedisHead(process, {user: url_in_env_file(etc / f"redis-{user}.env") for user in users})


@contextmanager
def redis_head_running(root: Path) -> Iterator[RedisHead]:
    """`start_redis_head`, stopped when the block ends (a module fixture's yield)."""
    head = start_redis_head(root, root)
    try:
        yield head
    finally:
        head.stop()


@dataclass
class RoleStack(Stack):
    """A Stack whose generate workers and uploader each connect as their own Redis user
    (`redis_url`, used by the producer commands and the waits, is the producer's), with mingle and gossip
    on as under the systemd units. The generate workers run as GPU node `worker_host`'s user and label
    themselves with that host."""

    worker_url: str = ""
    worker_host: str = ""
    uploader_url: str = ""

    def start_generator(self, gpu: int) -> ManagedProcess:
        sim = self.sims[gpu]
        env = self.env(
            **{ENV_VARIABLE: self.worker_url},
            DRAFTGEN_SERVER_URL=sim.url,
            DRAFTGEN_GPU=str(gpu),
            DRAFTGEN_HOSTNAME=self.worker_host,
        )
        name = f"gen{gpu}-{len(self.generators)}"
        worker = start_celery_worker(name, "generate", env, self.log_dir, mingle_and_gossip=True)
        self.generators.append(worker)
        return worker

    def start_uploader(self) -> ManagedProcess:
        self.uploads_started += 1
        env = self.env(**{ENV_VARIABLE: self.uploader_url})
        name = f"upload{self.uploads_started}"
        self.uploader = start_celery_worker(
            name, "upload", env, self.log_dir, concurrency=1, mingle_and_gossip=True
        )
        return self.uploader


@contextmanager
def node_stack_running(
    head: RedisHead, log_dir: Path, sims: list[SimulatorProcess], **options: Any
) -> Iterator[RoleStack]:
    """A RoleStack started on `head`: the generate workers as GPU node GPU_NODES[0]'s user, the uploader as
    its own, the producer's commands as the producer; stopped when the block ends."""
    urls = head.urls
    host = GPU_NODES[0]
    stack = RoleStack(
        urls["producer"],
        log_dir,
        sims,
        worker_url=urls[node_user(host)],
        worker_host=host,
        uploader_url=urls["uploader"],
        **options,
    )
    try:
        yield stack.start()
    finally:
        stack.stop()
