"""Starting a command costs only what it uses: building the parsers imports neither Celery, openai,
pyarrow nor boto3 (together over a second of start-up), so `--help` and a refusal answer at once."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from devstack.local_stack import PROJECT_ROOT

HEAVY_MODULES = ("celery", "openai", "pyarrow", "boto3", "aiohttp")
PROBE_TIMEOUT_S = 60


def heavy_modules_after(code: str) -> list[str]:
    """The heavy top-level modules a fresh interpreter holds after running `code`."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}})))"
    done = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=PROBE_TIMEOUT_S,
        check=True,
    )
    loaded = set(json.loads(done.stdout.splitlines()[-1]))
    return [name for name in HEAVY_MODULES if name in loaded]


@pytest.mark.parametrize(
    "code",
    [
        "from producer.cli import build_parser; build_parser()",
        "from inference.cli import build_parser; build_parser()",
        "from node.cli import build_parser; build_parser()",
        "import workers.settings, producer.settings",
    ],
    ids=["producer parsers", "inference parsers", "node parsers", "settings"],
)
def test_building_the_command_line_imports_no_heavy_library(code: str) -> None:
    assert heavy_modules_after(code) == []


def test_a_status_against_a_redis_that_is_down_never_imports_celery_or_openai() -> None:
    code = (
        "from producer.cli import main\n"
        "main(['--redis-url', 'redis://127.0.0.1:1/0', 'status', '--run', 'r'])"
    )
    assert heavy_modules_after(code) == []


def test_an_enqueue_of_a_missing_file_is_refused_before_pyarrow_celery_or_redis_is_asked() -> None:
    code = (
        "from producer.cli import main\n"
        "assert main(['--redis-url', 'redis://127.0.0.1:1/0', 'enqueue', 'no-such.jsonl', '--run', 'r']) == 2"
    )
    assert heavy_modules_after(code) == []
