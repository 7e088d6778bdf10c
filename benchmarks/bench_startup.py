"""How long a `python -m producer`, `inference` or `node` command takes to start, whole process.

Each command runs several times in a fresh interpreter; the median wall time is printed. Commands
that need neither Celery nor the openai client (help, argument errors, `files`, `verify` and `status`
up to their first Redis call) should start in under half a second; the Redis URL points at a port
where nothing listens, so the commands stop at their first connection attempt and measure start-up.

    .venv/bin/python benchmarks/bench_startup.py [--runs 7]

Last line: startup_median_s=<the slowest median among the commands that need neither>.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from devstack.local_stack import PROJECT_ROOT, free_port

DEFAULT_RUNS = 7
TARGET_S = 0.5
COMMAND_TIMEOUT_S = 60


def commands(redis_url: str) -> dict[str, list[str]]:
    """Label -> argv after the interpreter; all of them need neither Celery nor openai."""
    producer = ["-m", "producer", "--redis-url", redis_url]
    return {
        "producer --help": ["-m", "producer", "--help"],
        "producer enqueue --help": ["-m", "producer", "enqueue", "--help"],
        "producer files (Redis down)": [*producer, "files", "--run", "r"],
        "producer verify (Redis down)": [*producer, "verify", "--run", "r"],
        "producer status (Redis down)": [*producer, "status", "--run", "r"],
        "inference --help": ["-m", "inference", "--help"],
        "node --help": ["-m", "node", "--help"],
    }


def median_wall_s(argv: list[str], runs: int) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run(
            [sys.executable, *argv],
            cwd=PROJECT_ROOT,
            capture_output=True,
            timeout=COMMAND_TIMEOUT_S,
            check=False,
        )
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=DEFAULT_RUNS)
    args = parser.parse_args()
    redis_url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens: the first call fails at once
    medians = {label: median_wall_s(argv, args.runs) for label, argv in commands(redis_url).items()}
    for label, seconds in medians.items():
        verdict = "ok" if seconds < TARGET_S else f"over {TARGET_S} s"
        print(f"{label:32} {seconds:5.2f} s  median of {args.runs}  {verdict}")
    print(f"startup_median_s={max(medians.values()):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
