"""Flower asks for a login when it is bound beyond loopback, and refuses to start without one.

The guard comes with the app (workers/flower_guard.py), so it holds from any working folder and
with any --conf; these tests start real `celery -A workers flower` processes to show it.
"""

from __future__ import annotations

import base64
import subprocess
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

import pytest

from devstack.local_stack import PROJECT_ROOT, ManagedProcess, celery_command, free_port, http_ok, worker_env

pytestmark = pytest.mark.integration
START_TIMEOUT_S = 60
PROBE_TIMEOUT_S = 5
PASSWORD = "s3cret"
LOGIN = f"ops:{PASSWORD}"
EVERY_INTERFACE = "--address=0.0.0.0"
NO_CONFIG_FILE = "--conf=/dev/null"
LISTENING_TABLES = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))
TCP_LISTEN_STATE = "0A"
LOOPBACK_IPV4_HEX = "0100007F"  # 127.0.0.1 as /proc/net/tcp writes it
TABLE_HEADER_LINES = 1
LOCAL_ADDRESS_FIELD = 1  # "sl local_address rem_address st ...": fields of one /proc/net/tcp row
STATE_FIELD = 3
HEX_BASE = 16


def status_of(url: str, credentials: str | None = None) -> int:
    request = urllib.request.Request(url)
    if credentials:
        request.add_header("Authorization", "Basic " + base64.b64encode(credentials.encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=PROBE_TIMEOUT_S) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return error.code


def flower_env(redis_url: str, basic_auth: str | None = None) -> dict[str, str]:
    """Only what Flower needs; PYTHONPATH lets `-A workers` import from any working folder."""
    env = {**worker_env(redis_url), "PATH": "/usr/bin:/bin", "PYTHONPATH": str(PROJECT_ROOT)}
    if basic_auth is not None:
        env["FLOWER_BASIC_AUTH"] = basic_auth
    return env


def run_flower_until_it_exits(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        celery_command("flower", f"--port={free_port()}", *args),
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT_S,
        check=False,
    )


def listening_addresses(port: int) -> list[str]:
    """The local addresses (as /proc/net/tcp{,6} write them) of the sockets listening on `port`."""
    addresses = []
    for table in LISTENING_TABLES:
        for row in table.read_text().splitlines()[TABLE_HEADER_LINES:]:
            fields = row.split()
            address, _, port_hex = fields[LOCAL_ADDRESS_FIELD].partition(":")
            if fields[STATE_FIELD] == TCP_LISTEN_STATE and int(port_hex, HEX_BASE) == port:
                addresses.append(address)
    return addresses


def start_flower(env: dict[str, str], log_dir: Path, cwd: Path, *args: str) -> tuple[ManagedProcess, int]:
    port = free_port()
    flower = ManagedProcess(
        "flower", celery_command("flower", f"--port={port}", *args), log_dir / "flower.log", env=env, cwd=cwd
    ).start()
    try:
        flower.wait_ready(lambda: http_ok(f"http://127.0.0.1:{port}/healthcheck"), timeout_s=START_TIMEOUT_S)
    except BaseException:
        flower.stop()
        raise
    return flower, port


@pytest.mark.parametrize(
    ("where", "options"),
    [
        ("project folder", (EVERY_INTERFACE,)),
        ("another folder", (EVERY_INTERFACE,)),
        ("project folder", (EVERY_INTERFACE, NO_CONFIG_FILE)),
        ("another folder", (EVERY_INTERFACE, NO_CONFIG_FILE)),
    ],
)
def test_flower_on_all_interfaces_without_a_login_refuses_to_start(
    redis_url: str, tmp_path: Path, where: str, options: Sequence[str]
) -> None:
    cwd = PROJECT_ROOT if where == "project folder" else tmp_path
    result = run_flower_until_it_exits(flower_env(redis_url), cwd, *options)
    assert result.returncode != 0
    assert "without a login" in result.stderr + result.stdout


@pytest.mark.parametrize("basic_auth", ["admin:", f":{PASSWORD}", f"{LOGIN},admin:"])
def test_flower_given_a_login_with_an_empty_user_or_password_refuses_to_start(
    redis_url: str, tmp_path: Path, basic_auth: str
) -> None:
    result = run_flower_until_it_exits(
        flower_env(redis_url, basic_auth), tmp_path, EVERY_INTERFACE, NO_CONFIG_FILE
    )
    output = result.stderr + result.stdout
    assert result.returncode != 0
    assert "has an empty user" in output or "has an empty password" in output
    assert PASSWORD not in output


def test_flower_on_all_interfaces_asks_for_the_configured_login(redis_url: str, log_dir: Path) -> None:
    flower, port = start_flower(flower_env(redis_url, LOGIN), log_dir, PROJECT_ROOT, EVERY_INTERFACE)
    try:
        assert status_of(f"http://127.0.0.1:{port}/workers") == 401
        assert status_of(f"http://127.0.0.1:{port}/workers", "ops:wrong") == 401
        assert status_of(f"http://127.0.0.1:{port}/workers", LOGIN) == 200
    finally:
        flower.stop()


def test_flower_from_another_folder_with_a_login_starts_and_asks_for_it(
    redis_url: str, log_dir: Path, tmp_path: Path
) -> None:
    flower, port = start_flower(
        flower_env(redis_url, LOGIN), log_dir, tmp_path, EVERY_INTERFACE, NO_CONFIG_FILE
    )
    try:
        assert status_of(f"http://127.0.0.1:{port}/workers") == 401
        assert status_of(f"http://127.0.0.1:{port}/workers", LOGIN) == 200
    finally:
        flower.stop()


def test_flower_given_no_address_listens_on_loopback_only(
    redis_url: str, log_dir: Path, tmp_path: Path
) -> None:
    flower, port = start_flower(flower_env(redis_url), log_dir, tmp_path, NO_CONFIG_FILE)
    try:
        assert listening_addresses(port) == [LOOPBACK_IPV4_HEX]
    finally:
        flower.stop()
