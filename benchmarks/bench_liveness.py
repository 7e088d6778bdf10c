"""Time to verdict: a run whose last three prompts are poison (one drops its connection, one hangs while the
server answers others, one wedges the whole server), with every liveness setting at its default, against
the same run without the poison, in one sitting (docs/performance.md, the row "every run ends").

Real processes: redis-server, simulated GPUs kept up by a supervisor (the liveness watch's restart command
kills one, and it starts again on its port), their generate workers and the uploader, the README's
defaults; `--request-timeout-s` sets the client's timeout (1200 s by default; the issue's operator ran
60 s, shorter than the liveness stall window).

    .venv/bin/python benchmarks/bench_liveness.py [--request-timeout-s 60] [--prompts 120]

Per run: wall time to finished (every prompt committed or dead-lettered, `wait`'s exit), each poison
prompt's verdict (when its dead letter was committed, from the enqueue), the servers' restarts, and the
cost to ordinary prompts: each one tried alone (a batchmate of a wedge), from its first suspicion to its
acquittal, against the docs' bound for one trial (`workers.run_end.RunEnd.trial_s`). Last line:
`poison_wall_s=... clean_wall_s=... verdicts_bound_s=...`.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from devstack.local_stack import free_port, start_redis
from inference.client_settings import DEFAULT_REQUEST_TIMEOUT_S
from inference.simulator import SimulatorSettings
from tests.support import prompt_files
from tests.support.stack import README_WORKER_ENV, Stack
from tests.support.supervised_simulator import SupervisedSimulator
from workers.run_end import RunEnd
from workers.settings import WorkerSettings
from workers.state.keys import RunKeys
from workers.state.ledger import RunLedger
from workers.state.poison import Suspicion, TrialBegun, TrialEnd, TrialEnded, decode_evidence

DROPS, HANGS, WEDGES = "POISON-DROPS", "POISON-HANGS", "POISON-WEDGES"
FAULTS = json.dumps({DROPS: "drop", HANGS: "hang", WEDGES: "wedge"})
DEFAULT_PROMPTS = 120
DEFAULT_GPUS = 2
DEFAULT_SPEEDUP = 20.0  # a completion in ~2 s: the ordinary prompts take a minute, the tail is the poison's
BATCH = 16
SERVER_RESTART_S = 10.0  # a supervised simulator answers again within this of its SIGKILL
GIVE_UP_S = 4 * 3600.0
POLL_S = 5.0


@dataclass(frozen=True)
class Outcome:
    wall_s: float
    verdicts_s: dict[str, float]  # poison prompt -> seconds from the enqueue to its dead letter's commit
    restarts: int
    held_back_s: list[float]  # ordinary prompts tried alone: first suspicion to acquittal


def one_run(args: argparse.Namespace, *, poison: bool, work: Path) -> Outcome:
    log_dir = work / ("logs-poison" if poison else "logs-clean")
    log_dir.mkdir(parents=True)
    server = start_redis(free_port(), work / f"redis-{poison}", log_dir / "redis")
    settings = SimulatorSettings(
        speedup=args.speedup, enable_metrics=True, prompt_faults=FAULTS if poison else None
    )
    gpus = [
        SupervisedSimulator(lambda _life: settings, work / f"gpu{i}-{poison}.pid").start()
        for i in range(args.gpus)
    ]
    env = {**README_WORKER_ENV, "DRAFTGEN_REQUEST_TIMEOUT_S": str(args.request_timeout_s)}
    stack = Stack(
        server.url,
        log_dir,
        gpus,  # type: ignore[arg-type]  # supervised simulators: the stack reads their urls
        extra_env=env,
        fast=False,
        gpu_env={i: {"DRAFTGEN_SERVER_RESTART_COMMAND": gpu.restart_command()} for i, gpu in enumerate(gpus)},
    ).start()
    try:
        rows = [prompt_files.as_prompt(row) for row in prompt_files.questions(args.prompts, "v")]
        if poison:
            for row, marker in zip(rows[-3:], (DROPS, HANGS, WEDGES), strict=True):
                row["prompt"] = f"{row['prompt']} {marker}"
        run = "poison" if poison else "clean"
        data = prompt_files.write_jsonl(work / f"{run}.jsonl", rows)
        started, wall_started = time.monotonic(), time.time()
        stack.enqueue(data, run, "--output", str(work / f"out-{run}"), "--batch-size", str(BATCH))
        client = redis.Redis.from_url(server.url)
        ledger = RunLedger(client, run)
        verdicts: dict[str, float] = {}
        while True:
            counts = ledger.counts()
            for letter in ledger.dead_letters():
                verdicts.setdefault(letter.prompt_id, time.monotonic() - started)
            if counts.enqueued and not counts.remaining and not counts.staged and not counts.dead_pending:
                break
            if time.monotonic() - started > GIVE_UP_S:
                raise SystemExit(f"run {run} not finished after {GIVE_UP_S:.0f} s: {counts}")
            time.sleep(POLL_S)
        wall_s = time.monotonic() - started
        records = {
            key.decode(): decode_evidence(raw) for key, raw in client.hgetall(RunKeys(run).strikes).items()
        }
        poisoned = {str(row["id"]) for row in rows[-3:]} if poison else set()
        held_back = [
            held
            for prompt_id, events in records.items()
            if prompt_id not in poisoned and (held := held_back_s(events, wall_started)) is not None
        ]
        return Outcome(wall_s, verdicts, sum(gpu.restarts for gpu in gpus), held_back)
    finally:
        stack.stop()
        for gpu in gpus:
            gpu.stop()
        server.stop()


def held_back_s(events: list[Suspicion | TrialBegun | TrialEnded], since: float) -> float | None:
    """From an ordinary prompt's first suspicion to its acquittal alone; None if it was never tried."""
    first = next((e.at for e in events if isinstance(e, Suspicion)), None)
    acquitted = [e for e in events if isinstance(e, TrialEnded) and e.ended is TrialEnd.COMPLETED]
    if first is None or not acquitted:
        return None
    return max(0.0, acquitted[-1].started_at - max(first, since))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--request-timeout-s", type=float, default=DEFAULT_REQUEST_TIMEOUT_S)
    parser.add_argument("--prompts", type=int, default=DEFAULT_PROMPTS)
    parser.add_argument("--gpus", type=int, default=DEFAULT_GPUS)
    parser.add_argument("--speedup", type=float, default=DEFAULT_SPEEDUP)
    args = parser.parse_args()
    ends = RunEnd(
        settings=WorkerSettings(request_timeout_s=args.request_timeout_s), server_restart_s=SERVER_RESTART_S
    )
    with tempfile.TemporaryDirectory(prefix="bench-liveness-") as tmp:
        clean = one_run(args, poison=False, work=Path(tmp))
        poisoned = one_run(args, poison=True, work=Path(tmp))
    bound_s = ends.bound_s(poison=3, ordinary_suspects=len(poisoned.held_back_s))
    print(
        f"{args.prompts} prompts on {args.gpus} GPUs, request timeout {args.request_timeout_s:.0f} s, "
        "liveness at its defaults"
    )
    print(f"without poison: finished in {clean.wall_s:.0f} s")
    print(
        f"with the last three poison: finished in {poisoned.wall_s:.0f} s "
        f"({poisoned.wall_s / clean.wall_s:.1f} x), "
        f"{poisoned.restarts} server restarts; verdicts "
        + ", ".join(f"{prompt_id} at {at:.0f} s" for prompt_id, at in sorted(poisoned.verdicts_s.items()))
    )
    held = poisoned.held_back_s
    if held:
        print(
            f"{len(held)} ordinary prompts tried alone, each held back {min(held):.0f}-{max(held):.0f} s "
            f"(one trial's bound: {ends.trial_s():.0f} s)"
        )
    print(
        f"poison_wall_s={poisoned.wall_s:.0f} clean_wall_s={clean.wall_s:.0f} "
        f"verdicts_bound_s={bound_s:.0f} within={poisoned.wall_s - clean.wall_s <= bound_s}"
    )


if __name__ == "__main__":
    main()
