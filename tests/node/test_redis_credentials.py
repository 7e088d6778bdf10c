"""deploy/redis-credentials.sh: one Redis user per GPU node, rendered from the template's one node line, and
clear one-line refusals of what cannot name a node."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
SCRIPT = DEPLOY / "redis-credentials.sh"
TEMPLATE = DEPLOY / "redis-users.acl"
NODE_PLACEHOLDER = "@GPU_NODE@"
PLACEHOLDER = re.compile(r"@[A-Z_]+@")
SCRIPT_TIMEOUT_S = 60
BAD_USAGE = 2


def credentials(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SCRIPT, "--dir", str(folder), "--host", "head.example.internal", *args],
        capture_output=True,
        text=True,
        timeout=SCRIPT_TIMEOUT_S,
    )


def acl_users(acl: Path) -> list[str]:
    return [line.split()[1] for line in acl.read_text().splitlines() if line.startswith("user ")]


def test_the_template_holds_one_line_for_every_gpu_node() -> None:
    lines = [line for line in TEMPLATE.read_text().splitlines() if not line.startswith("#")]
    assert len([line for line in lines if NODE_PLACEHOLDER in line]) == 1


def test_each_gpu_node_of_the_list_gets_its_own_user_and_env_file_and_no_user_is_shared(
    tmp_path: Path,
) -> None:
    nodes = tmp_path / "gpu-nodes"
    nodes.write_text("# the fleet\ngpu1.example.internal\n\ngpu-2  # spare\n")

    result = credentials(tmp_path / "etc", "--gpu-nodes", str(nodes), "--gpu-node", "gpu1.example.internal")

    assert result.returncode == 0, result.stderr
    etc = tmp_path / "etc"
    users = acl_users(etc / "redis-users.acl")
    assert [user for user in users if user.startswith("worker")] == [
        "worker-gpu1.example.internal",
        "worker-gpu-2",
    ]
    env = (etc / "redis-worker-gpu-2.env").read_text()
    assert env.startswith('DRAFTGEN_REDIS_URL="rediss://worker-gpu-2:')
    assert not (etc / "redis-worker.env").exists()
    acl = (etc / "redis-users.acl").read_text()
    assert "~draftgen:seats:gpu-2/*" in acl and "~draftgen:seats:*" not in acl
    assert PLACEHOLDER.search(acl) is None  # every hash and host filled in


@pytest.mark.parametrize(
    ("args", "said"),
    [
        ((), "name the GPU nodes"),
        (("--gpu-node", "gpu*"), "is no host name"),  # a pattern would reach every node's keys
        (("--gpu-node", "gpu1/gpu0"), "is no host name"),
        (("--gpu-nodes", "/no/such/list"), "no such readable file"),
        (("--gpu-node",), "needs a host name"),
    ],
    ids=["none", "a pattern", "a label", "a missing list", "no name"],
)
def test_the_script_refuses_what_names_no_gpu_node_in_one_line_and_writes_nothing(
    tmp_path: Path, args: tuple[str, ...], said: str
) -> None:
    result = credentials(tmp_path / "etc", *args)

    assert result.returncode == BAD_USAGE
    [line] = result.stderr.splitlines()
    assert said in line
    assert not (tmp_path / "etc" / "redis-users.acl").exists()


def test_with_sentinels_every_url_names_them_and_the_servers_and_sentinels_get_their_own_logins(
    tmp_path: Path,
) -> None:
    sentinels = ("--sentinel", "10.0.0.1", "--sentinel", "10.0.0.2:26380", "--sentinel", "10.0.0.3")
    result = credentials(tmp_path / "etc", "--gpu-node", "gpu1", *sentinels, "--master-name", "fleet")

    assert result.returncode == 0, result.stderr
    etc = tmp_path / "etc"
    url = (etc / "redis-worker-gpu1.env").read_text()
    assert url.startswith('DRAFTGEN_REDIS_URL="sentinel://worker-gpu1:')
    assert (
        "@10.0.0.1:26379/0?master_name=fleet&sentinel_auth=true&ssl_cert_reqs=required&ssl_ca_certs=" in url
    )
    assert url.rstrip().endswith(';sentinel://10.0.0.2:26380;sentinel://10.0.0.3:26379"')
    assert {"replica", "sentinel"} <= set(acl_users(etc / "redis-users.acl"))
    replica_password = (etc / "redis-passwords" / "replica").read_text().strip()
    replication = (etc / "redis-replication.conf").read_text()
    assert replication == f"masteruser replica\nmasterauth {replica_password}\n"
    first = (etc / "sentinel.conf.initial").read_text()
    assert "sentinel monitor fleet head.example.internal 6380 2\n" in first  # a majority of three
    assert "sentinel auth-user fleet sentinel\n" in first
    assert f"include {DEPLOY / 'sentinel.conf'}\n" in first
    assert "sentinel down-after-milliseconds fleet 5000\n" in first
    assert PLACEHOLDER.search(first) is None
    assert not (etc / "redis-sentinel.env").exists()  # no process logs in as a server's user
    # the Sentinels' own users: every process's, allowed only to ask where the primary is
    sentinel_users = acl_users(etc / "sentinel-users.acl")
    assert set(sentinel_users) == {
        "default",
        "admin",
        "sentinel",
        "producer",
        "uploader",
        "flower",
        "worker-gpu1",
    }
    assert f"aclfile {etc / 'sentinel-users.acl'}\n" in first
    assert "sentinel sentinel-user sentinel\n" in first


def test_fewer_than_three_sentinels_are_refused_saying_why(tmp_path: Path) -> None:
    result = credentials(tmp_path / "etc", "--gpu-node", "gpu1", "--sentinel", "a", "--sentinel", "b")

    assert result.returncode == BAD_USAGE
    assert "name at least three Sentinels" in result.stderr
    assert not (tmp_path / "etc").exists()
