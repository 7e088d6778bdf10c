"""A generate worker whose server answers every prompt at once: the real `handle_generate` (lease, body,
pending prompts, hand-over, finish or hand back) with no server, no Celery and no thread."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future

import redis

from core.records import Origin, Prompt, SamplingSettings
from core.run_settings.model import RunSettings
from tests.support.records import completion
from workers.generate.batch_life import BatchLife
from workers.generate.batches import BatchReport, handle_generate
from workers.generate.generation import BatchJob, BatchOutcome, Handover
from workers.recovery.leases import LeaseKeeper
from workers.settings import WorkerSettings
from workers.state.queues import GENERATE_TASK

LABEL = "node-a/gpu0"
ORIGIN = Origin(host="node-a", gpu=0, server_url="http://instant")


class InstantEngine:
    """Answers each prompt with the tests' completion of it; `between` runs after the hand-overs, before
    the batch settles (what another process does meanwhile)."""

    def __init__(self) -> None:
        self.origin = ORIGIN
        self.answered: list[str] = []
        self.between: Callable[[], object] = lambda: None

    def submit_batch(
        self,
        run: str,
        prompts: Sequence[Prompt],
        sampling: SamplingSettings,
        handover: Handover,
        truncation: object = None,
        *,
        still_held: Callable[[], bool],
    ) -> BatchJob:
        outcome = BatchOutcome()
        for one in prompts:
            self.answered.append(one.id)
            if handover.stage(completion(one.id)):
                outcome.staged += 1
            else:
                outcome.already_handled += 1
        self.between()
        sent = threading.Event()
        sent.set()
        done: Future[BatchOutcome] = Future()
        done.set_result(outcome)
        return BatchJob(sent, done)


class _ServerRecord:
    def refresh(self) -> Origin:
        return ORIGIN


class InstantWorker:
    """What `handle_generate` reads of a WorkerContext, on its own Redis client (a GPU node's user)."""

    def __init__(self, client: redis.Redis, settings: RunSettings) -> None:
        self.redis = client
        self.stopping = threading.Event()
        self.settings = WorkerSettings()
        self.engine = InstantEngine()
        self.leases = LeaseKeeper(client, worker=LABEL)
        self.tails = None
        self.batch_life = BatchLife(GENERATE_TASK)  # no dispatcher: its events go nowhere
        self.server_record = _ServerRecord()
        self.dispatched: list[str] = []
        self._run_settings = settings

    def run_settings(self, run: str) -> RunSettings:
        return self._run_settings

    def dispatch_generate(
        self, run: str, batch_id: str, *, countdown_s: float, resumed: bool = False
    ) -> None:
        self.dispatched.append(batch_id)

    def dispatch_flush(self, run: str) -> None: ...

    def generate(self, batch_id: str) -> BatchReport:
        return handle_generate(self, self._run_settings.run, batch_id)  # type: ignore[arg-type]
