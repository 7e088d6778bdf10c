"""The deploy files: units that run what the CLI accepts and a bootstrap whose dry run changes nothing
(the IAM policies of deploy/iam are checked in tests/unit/test_bucket_policies.py)."""

from __future__ import annotations

import argparse
import shlex
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from core.exit_codes import EXIT_OK
from node.cli import register
from workers.bootsteps.seating import EXIT_SEAT_REFUSED

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
UNITS = DEPLOY / "systemd"
ENV_FILE = "/etc/draftgen/draftgen.env"
SCRIPT_TIMEOUT_S = 60
BAD_USAGE = 2  # the exit code of a shell script given a wrong option or file


def unit(name: str) -> dict[str, list[str]]:
    """A unit file's directives (repeatable ones keep every value)."""
    directives: dict[str, list[str]] = {}
    for line in (UNITS / name).read_text().splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            directives.setdefault(key.strip(), []).append(value.strip())
    return directives


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(argv)


@pytest.mark.parametrize(
    "name",
    [
        "draftgen-sglang@.service",
        "draftgen-generate@.service",
        "draftgen-uploader.service",
        "draftgen-flower.service",
        "draftgen-stage.service",
    ],
)
def test_every_unit_reads_the_shared_env_file_and_comes_back_after_a_failure(name: str) -> None:
    directives = unit(name)
    assert directives["EnvironmentFile"][0] == ENV_FILE
    assert directives["Restart"] in (["always"], ["on-failure"])
    assert directives["User"] == ["draftgen"]


@pytest.mark.parametrize(
    ("name", "user"),
    [
        ("draftgen-generate@.service", "worker-%H"),  # its own node's user: %H is the host name
        ("draftgen-uploader.service", "uploader"),
        ("draftgen-flower.service", "flower"),
    ],
)
def test_a_unit_that_talks_to_redis_reads_its_users_url_last_when_the_file_is_there(
    name: str, user: str
) -> None:
    # the '-' lets the unit start without it (a single node's Redis without users)
    assert unit(name)["EnvironmentFile"] == [ENV_FILE, f"-/etc/draftgen/redis-{user}.env"]


def test_a_worker_refused_its_seat_by_redis_is_not_restarted_by_systemd() -> None:
    assert unit("draftgen-generate@.service")["RestartPreventExitStatus"] == [str(EXIT_SEAT_REFUSED)]


def test_the_server_unit_runs_serve_for_its_gpu_with_arguments_serve_accepts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Given the unit's command line for instance 3, with DRAFTGEN_SERVE_ARGS set as in the example env file
    [exec_start] = unit("draftgen-sglang@.service")["ExecStart"]
    argv = shlex.split(exec_start.replace("%i", "3"))
    assert argv[1:4] == ["-m", "node", "serve"]
    example = (DEPLOY / "draftgen.env.example").read_text()
    [serve_args] = [line for line in example.splitlines() if line.startswith("#DRAFTGEN_SERVE_ARGS=")]
    # systemd strips the quotes, then splits an unbraced $VAR at whitespace
    extra = " ".join(shlex.split(serve_args.partition("=")[2])).split()
    argv = [a for a in argv[3:] if a != "$DRAFTGEN_SERVE_ARGS"]

    # When serve parses it in a dry run
    args = parse([*argv, "--model-path", "/dev/shm/Qwen3.6-27B", "--dry-run", *extra])

    # Then it serves GPU 3 on port 30003 with the example's tuning
    assert args.handler(args) == EXIT_OK
    [line] = capsys.readouterr().out.splitlines()
    assert line.startswith("CUDA_VISIBLE_DEVICES=3 ")
    assert "--port 30003 " in line
    assert "--mem-fraction-static 0.88 " in line
    assert "--log-requests >>/var/log/draftgen/sglang-gpu3.log" in line


def test_the_generate_unit_binds_its_worker_to_its_gpu() -> None:
    directives = unit("draftgen-generate@.service")
    assert "DRAFTGEN_GPU=%i" in directives["Environment"]
    [exec_start] = directives["ExecStart"]
    assert exec_start.endswith("celery -A workers worker -Q generate -n gen%i@%H --loglevel INFO")
    assert "draftgen-sglang@%i.service" in directives["After"][0]


def test_the_example_env_file_is_valid_shell(tmp_path: Path) -> None:
    shown = subprocess.run(
        [
            "bash",
            "-c",
            'set -a; . "$1"; set +a; echo "$DRAFTGEN_REDIS_URL"',
            "check",
            DEPLOY / "draftgen.env.example",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=SCRIPT_TIMEOUT_S,
    )
    assert shown.stdout.startswith("rediss://")
    assert "ssl_cert_reqs=required&ssl_ca_certs=" in shown.stdout


@pytest.mark.skipif(shutil.which("apt-get") is None, reason="bootstrap-node.sh is for Debian/Ubuntu")
def test_the_bootstrap_dry_run_shows_every_change_and_makes_none() -> None:
    result = subprocess.run(
        [DEPLOY / "bootstrap-node.sh", "--gpus", "2", "--uploader", "--dry-run"],
        capture_output=True,
        text=True,
        timeout=SCRIPT_TIMEOUT_S,
    )
    assert result.returncode == 0, result.stderr
    changes = [line for line in result.stdout.splitlines() if line.startswith("+ ")]
    enable = next(line for line in changes if line.startswith("+ systemctl enable "))
    for wanted in ("draftgen-sglang@0", "draftgen-sglang@1", "draftgen-generate@1", "draftgen-uploader"):
        assert f"{wanted}.service" in enable
    assert "draftgen-sglang@2" not in enable
    assert "draftgen-flower" not in enable
    assert any(line.startswith("+ runuser -u draftgen") and "inference" in line for line in changes)


def bootstrap_dry_run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [DEPLOY / "bootstrap-node.sh", "--gpus", "1", *args, "--dry-run"],
        capture_output=True,
        text=True,
        timeout=SCRIPT_TIMEOUT_S,
    )


SENTINEL_ADDRESSES = "10.0.0.1:26379/0?master_name=draftgen&sentinel_auth=true;sentinel://10.0.0.2:26379"


def redis_env_file(folder: Path, user: str, *, sentinels: bool = False) -> Path:
    """An env file as deploy/redis-credentials.sh writes it for `user` (with `--sentinel`: Sentinels' URL)."""
    path = folder / f"redis-{user}.env"
    where = (
        f"sentinel://{user}:secret@{SENTINEL_ADDRESSES}"
        if sentinels
        else (f"rediss://{user}:secret@head.example.internal:6380/0")
    )
    path.write_text(f'DRAFTGEN_REDIS_URL="{where}"\n')
    return path


@pytest.mark.skipif(shutil.which("apt-get") is None, reason="bootstrap-node.sh is for Debian/Ubuntu")
@pytest.mark.parametrize("sentinels", [False, True], ids=["head-node", "sentinels"])
def test_the_bootstrap_installs_the_node_s_own_redis_env_file_under_its_host_name(
    tmp_path: Path, sentinels: bool
) -> None:
    host = socket.gethostname()
    env_file = redis_env_file(tmp_path, f"worker-{host}", sentinels=sentinels)
    result = bootstrap_dry_run("--redis-env", str(env_file))
    assert result.returncode == 0, result.stderr
    assert f"/etc/draftgen/redis-worker-{host}.env" in result.stdout


@pytest.mark.skipif(shutil.which("apt-get") is None, reason="bootstrap-node.sh is for Debian/Ubuntu")
def test_the_bootstrap_refuses_another_node_s_redis_env_file_in_one_line(tmp_path: Path) -> None:
    result = bootstrap_dry_run("--redis-env", str(redis_env_file(tmp_path, "worker-another-node")))
    assert result.returncode == BAD_USAGE
    [line] = result.stderr.splitlines()
    assert "is not this node's" in line and f"worker-{socket.gethostname()}" in line


def test_the_bootstrap_refuses_a_bad_gpu_count() -> None:
    result = subprocess.run(
        [DEPLOY / "bootstrap-node.sh", "--gpus", "two", "--dry-run"],
        capture_output=True,
        text=True,
        timeout=SCRIPT_TIMEOUT_S,
    )
    assert result.returncode != 0
    assert "--gpus must be a whole number" in result.stderr or "apt-get not found" in result.stderr
