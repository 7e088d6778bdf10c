"""`python -m producer metrics` says where it listens, and warns when that is beyond this machine."""

from __future__ import annotations

import subprocess
import sys

from core.exit_codes import EXIT_USAGE
from devstack.local_stack import PROJECT_ROOT

CLOSED_REDIS = "redis://127.0.0.1:1/0"  # the exporter reads Redis only when scraped


def first_lines(*args: str) -> tuple[str, str]:
    process = subprocess.Popen(
        [sys.executable, "-m", "producer", "--redis-url", CLOSED_REDIS, "metrics", "--port", "0", *args],
        cwd=PROJECT_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        serving = process.stdout.readline()
    finally:
        process.terminate()
        _, errors = process.communicate(timeout=10)
    return serving, errors


def test_a_wide_bind_is_warned_about_and_the_real_port_is_printed() -> None:
    serving, errors = first_lines("--address", "0.0.0.0")
    assert "no authentication" in errors
    assert "http://0.0.0.0:" in serving and ":0/" not in serving


def test_the_default_loopback_bind_gives_no_warning() -> None:
    serving, errors = first_lines()
    assert "http://127.0.0.1:" in serving
    assert "warning" not in errors


def test_an_ipv6_wide_bind_is_warned_about_and_served_rather_than_a_traceback() -> None:
    serving, errors = first_lines("--address", "::")
    assert "no authentication" in errors and "Traceback" not in errors
    assert "http://[::]:" in serving


def test_an_address_that_names_nothing_is_one_line_and_exit_2() -> None:
    command = [sys.executable, "-m", "producer", "--redis-url", CLOSED_REDIS, "metrics", "--port", "0"]
    done = subprocess.run(
        [*command, "--address", "no-such-host.invalid"], cwd=PROJECT_ROOT, capture_output=True, text=True
    )
    assert done.returncode == EXIT_USAGE
    assert done.stderr.startswith("error: --address no-such-host.invalid: not an address of this machine")
    assert "Traceback" not in done.stderr
