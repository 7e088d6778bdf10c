"""Peak memory of `python -m producer enqueue` on files made to cost the head node gigabytes (issue 25).

Each file (tests/support/crafted_inputs.py) is small on disk and would take gigabytes read whole; each is
enqueued into a fresh redis-server by a process of its own, and its peak resident memory, wall time,
exit code and first line of output are reported, beside an ordinary file's for comparison.

    .venv/bin/python benchmarks/bench_crafted_inputs.py
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from devstack.local_stack import PROJECT_ROOT, free_port, start_redis
from producer.settings import REDIS_URL_ENV
from tests.support.crafted_inputs import BUILDERS

TIME_BIN = "/usr/bin/time"
ORDINARY_ROWS = 100_000
KIB_PER_MIB = 1024
SHOWN_CHARS = 110


def ordinary(folder: Path) -> Path:
    path = folder / "ordinary.jsonl"
    with path.open("w") as handle:
        for index in range(ORDINARY_ROWS):
            handle.write(json.dumps({"id": f"p{index}", "prompt": f"Question {index}: explain it."}) + "\n")
    return path


def enqueue(data: Path, redis_url: str, run: str) -> tuple[int, float, int, str]:
    """Exit code, wall seconds, peak RSS in KiB and the telling line of one enqueue."""
    command = [sys.executable, "-m", "producer", "enqueue", str(data)]
    command += ["--run", run, "--output", str(data.parent / "out" / run)]
    started = time.monotonic()
    env = {**os.environ, REDIS_URL_ENV: redis_url}  # a password never goes on a command line
    done = subprocess.run(
        [TIME_BIN, "-v", *command], cwd=PROJECT_ROOT, capture_output=True, text=True, env=env
    )
    elapsed = time.monotonic() - started
    peak = re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr)
    said = [line for line in (done.stdout + done.stderr).splitlines() if "error:" in line or "row 2:" in line]
    return done.returncode, elapsed, int(peak.group(1)) if peak else 0, (said or ["ok"])[0].strip()


def main() -> int:
    if not Path(TIME_BIN).exists():
        print(f"needs {TIME_BIN} (Debian's `time` package) for peak memory", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        files = {name: build(root) for name, build in BUILDERS.items()}
        files["ordinary (100k rows)"] = ordinary(root)
        server = start_redis(free_port(), root / "redis", root)
        try:
            print(f"{'file':<26} {'on disk':>10} {'exit':>4} {'peak RSS':>9} {'wall':>6}  what it said")
            for index, (name, path) in enumerate(files.items()):
                code, wall_s, peak_kib, said = enqueue(path, server.url, f"crafted-{index}")
                size = path.stat().st_size
                print(
                    f"{name:<26} {size / 1024:>8.0f}KB {code:>4} {peak_kib / KIB_PER_MIB:>7.0f}MB "
                    f"{wall_s:>5.1f}s  {said[:SHOWN_CHARS]}"
                )
        finally:
            server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
