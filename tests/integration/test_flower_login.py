"""Flower asks for a login when it is bound beyond loopback, and refuses to start without one."""

from __future__ import annotations

import base64
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from producer.local_stack import PROJECT_ROOT, ManagedProcess, celery_command, free_port, http_ok, worker_env

pytestmark = pytest.mark.integration
START_TIMEOUT_S = 60


def status_of(url: str, credentials: str | None = None) -> int:
    request = urllib.request.Request(url)
    if credentials:
        request.add_header("Authorization", "Basic " + base64.b64encode(credentials.encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return error.code


def test_flower_on_all_interfaces_without_a_login_refuses_to_start(redis_url: str) -> None:
    result = subprocess.run(
        celery_command("flower", "--address=0.0.0.0", f"--port={free_port()}"),
        cwd=PROJECT_ROOT,
        env={**worker_env(redis_url), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT_S,
        check=False,
    )
    assert result.returncode != 0
    assert "without a login" in result.stderr + result.stdout


def test_flower_on_all_interfaces_asks_for_the_configured_login(redis_url: str, log_dir: Path) -> None:
    port = free_port()
    env = {**worker_env(redis_url), "FLOWER_BASIC_AUTH": "ops:s3cret"}
    flower = ManagedProcess(
        "flower",
        celery_command("flower", "--address=0.0.0.0", f"--port={port}"),
        log_dir / "flower.log",
        env=env,
    ).start()
    try:
        flower.wait_ready(lambda: http_ok(f"http://127.0.0.1:{port}/healthcheck"), timeout_s=START_TIMEOUT_S)
        assert status_of(f"http://127.0.0.1:{port}/workers") == 401
        assert status_of(f"http://127.0.0.1:{port}/workers", "ops:wrong") == 401
        assert status_of(f"http://127.0.0.1:{port}/workers", "ops:s3cret") == 200
    finally:
        flower.stop()
