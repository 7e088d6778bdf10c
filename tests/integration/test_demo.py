"""The README's first quick-start command, as a user runs it."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from devstack.local_stack import PROJECT_ROOT, free_port

pytestmark = pytest.mark.integration
DEMO_TIMEOUT_S = 300
DEMO_SPEEDUP = "100"


def demo_command(tmp_path: Path, *options: str) -> list[str]:
    """`python -m devstack demo` in its own folder and on free ports, as a user would start it."""
    return [
        sys.executable,
        "-m",
        "devstack",
        "demo",
        *options,
        "--workdir",
        str(tmp_path / "demo"),
        "--redis-port",
        str(free_port()),
        "--flower-port",
        str(free_port()),
        "--speedup",
        DEMO_SPEEDUP,
    ]


def run_demo(command: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=DEMO_TIMEOUT_S, check=False
    )


def test_the_local_demo_runs_the_sample_end_to_end_and_verifies(tmp_path: Path) -> None:
    result = run_demo(demo_command(tmp_path, "--exit"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "new                 300 prompts" in result.stdout
    assert "OK: every prompt committed exactly once or dead-lettered" in result.stdout
    assert list((tmp_path / "demo" / "output").glob("demo-*/manifest/part-*.json"))  # one output per run


def test_the_demo_runs_a_users_own_chats_mapped_by_enqueue_options_after_a_double_dash(
    tmp_path: Path,
) -> None:
    data = tmp_path / "dialogs.jsonl"
    dialog = [{"speaker": "human", "text": "hi"}, {"speaker": "bot", "text": "hello"}]
    data.write_text(
        "".join(
            json.dumps(
                {"conv_id": f"c{i}", "dialog": [*dialog, {"speaker": "human", "text": f"question {i}"}]}
            )
            + "\n"
            for i in range(20)
        )
    )
    mapping = ["--messages-field", "dialog", "--id-field", "conv_id", "--turn-keys", "speaker,text"]
    roles = ["--roles", "human=user,bot=assistant"]
    result = run_demo([*demo_command(tmp_path, "--exit", "--data", str(data)), "--", *mapping, *roles])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "--turn-keys speaker,text --roles human=user,bot=assistant" in result.stdout  # the command shown
    assert "new                 20 prompts" in result.stdout and "rejected rows       0" in result.stdout
    assert "OK: every prompt committed exactly once or dead-lettered" in result.stdout


def descendants(pid: int) -> set[int]:
    """Every live process below `pid`, read from /proc."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        parents[int(stat.parent.name)] = int(fields[1])
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def alive(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat")
    try:
        state = stat.read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_sigterm_to_a_waiting_demo_stops_everything_it_started(tmp_path: Path) -> None:
    demo = subprocess.Popen(
        demo_command(tmp_path),
        cwd=PROJECT_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert demo.stdout is not None
    seen = []
    for line in demo.stdout:
        seen.append(line)
        if "Press Ctrl-C to stop" in line:
            break
    else:
        pytest.fail("the demo ended before waiting:\n" + "".join(seen))
    started = descendants(demo.pid)
    assert len(started) >= 6  # redis, two simulators, two generate workers, the uploader, Flower
    demo.send_signal(signal.SIGTERM)
    rest, _ = demo.communicate(timeout=DEMO_TIMEOUT_S)
    assert demo.returncode == 128 + signal.SIGTERM
    assert "everything the demo started is stopped" in rest
    assert not [pid for pid in started if alive(pid)]
