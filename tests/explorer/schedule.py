"""A deterministic scheduler of many processes' threads, switching between them only at Redis calls.

Every modelled process (an enqueue, a generate worker, the uploader) runs the real draftgen code in
threads of its own, one thread per step (a delivered message, a lease renewal, a batch tail, a
reconcile pass, a flush). Each thread talks to Redis through a `GatedRedis`, which parks the thread
before every command or pipeline until the scheduler grants it the turn. Exactly one thread runs at a
time, so the interleaving of all processes' Redis calls is chosen by the scheduler's seeded generator
alone, and a failing schedule replays from its seed.

A step that sleeps (a seat watched by a newcomer) parks at a "sleep" call: it waits for time to pass
rather than for Redis, and the explorer wakes it as rarely as time passes.

A process is killed (SIGKILL) between two of its Redis calls: its parked threads get `Killed` from the
gate instead of their turn, and every later call of the dead process raises it again, so `finally`
blocks that talk to Redis do nothing, as in a process that is gone.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis
from redis.client import Pipeline

SWITCH_TIMEOUT_S = 30.0  # a step that neither parks nor ends in this long is a harness deadlock


class Killed(BaseException):
    """The process was SIGKILLed at this Redis call: nothing after it runs."""


class HarnessStuck(AssertionError):
    """A thread neither reached its next Redis call nor ended: it waits on something else."""


@dataclass(eq=False)
class Process:
    name: str
    dead: bool = False


@dataclass(eq=False)
class Step:
    """One thread of a process: parked at a Redis call, running, or ended."""

    process: Process
    what: str
    parked: bool = False
    granted: bool = False
    kill: bool = False
    ended: bool = False
    error: BaseException | None = None
    calls: int = 0
    parked_at: str = ""  # the call it waits to make ("sleep": it waits for time to pass, not for Redis)


_current = threading.local()


def current_step() -> Step | None:
    return getattr(_current, "step", None)


@dataclass
class Scheduler:
    """Runs steps one Redis call at a time; `choose` picks which parked step goes next."""

    _cv: threading.Condition = field(default_factory=threading.Condition)
    steps: list[Step] = field(default_factory=list)
    _running: Step | None = None
    trace: list[str] = field(default_factory=list)
    # every client the schedule's processes opened: closed when the schedule ends, since what the run
    # logged with a traceback (kept by pytest's log capture) holds them, and their connections, for the
    # whole test: ~11 a schedule, Redis's 10,000 clients in ~900 schedules
    clients: list[redis.Redis] = field(default_factory=list)

    def close_clients(self) -> None:
        for client in self.clients:
            client.connection_pool.disconnect()

    # ------------------------------------------------------------------ from the steps' threads

    def gate(self, label: str) -> None:
        step = current_step()
        if step is None:  # the harness's own reads and writes go straight through
            return
        with self._cv:
            if step.process.dead:
                raise Killed
            step.parked, step.granted = True, False
            step.parked_at = label
            self._running = None
            self._cv.notify_all()
            self._cv.wait_for(lambda: step.granted or step.kill)
            step.parked = False
            if step.kill:
                raise Killed
            self._running = step
            step.calls += 1
            self.trace.append(f"{step.process.name}/{step.what}: {label}")

    # ------------------------------------------------------------------ from the scheduler's thread

    def start(self, process: Process, what: str, body: Callable[[], Any]) -> Step:
        """Start `body` in a new thread of `process`; returns once it parks at its first call or ends."""
        step = Step(process, what)
        self.steps.append(step)

        def run() -> None:
            _current.step = step
            try:
                body()
            except BaseException as error:
                step.error = error
            finally:
                with self._cv:
                    step.ended = True
                    if self._running is step or self._running is None:
                        self._running = None
                    self._cv.notify_all()

        with self._cv:
            self._running = step
        threading.Thread(target=run, name=f"{process.name}/{what}", daemon=True).start()
        self._wait_switch(step)
        return step

    def parked(self) -> list[Step]:
        with self._cv:
            return [s for s in self.steps if s.parked and not s.ended]

    def grant(self, step: Step) -> None:
        """Let `step` make its Redis call and run on to its next one (or its end)."""
        with self._cv:
            assert step.parked and not step.ended
            step.granted = True
            self._running = step
            self._cv.notify_all()
        self._wait_switch(step)

    def kill(self, process: Process) -> None:
        """SIGKILL: every thread of `process` dies at its parked call; nothing of it runs again."""
        process.dead = True
        for step in self.parked():
            if step.process is process:
                with self._cv:
                    step.kill = True
                    self._running = step
                    self._cv.notify_all()
                self._wait_switch(step)

    def _wait_switch(self, step: Step) -> None:
        with self._cv:
            done = self._cv.wait_for(
                lambda: step.ended or (step.parked and not step.granted and self._running is None),
                timeout=SWITCH_TIMEOUT_S,
            )
        if not done:
            raise HarnessStuck(f"{step.process.name}/{step.what} neither parked nor ended: {self.trace[-5:]}")

    def prune(self) -> list[Step]:
        """Forget ended steps; returns them."""
        with self._cv:
            ended = [s for s in self.steps if s.ended]
            self.steps = [s for s in self.steps if not s.ended]
        return ended


class GatedPipeline(Pipeline):  # type: ignore[misc]  # redis-py is not followed
    scheduler: Scheduler

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        self.scheduler.gate(f"pipeline of {len(self.command_stack)}")
        replies: list[Any] = super().execute(raise_on_error)
        return replies


class GatedRedis(redis.Redis):  # type: ignore[misc]  # redis-py is not followed
    """A Redis client whose every command and pipeline waits for the scheduler's turn."""

    def __init__(self, url: str, scheduler: Scheduler) -> None:
        pool = redis.ConnectionPool.from_url(url)
        super().__init__(connection_pool=pool)
        self.scheduler = scheduler
        scheduler.clients.append(self)

    def execute_command(self, *args: Any, **options: Any) -> Any:
        self.scheduler.gate(str(args[0]) if args else "?")
        return super().execute_command(*args, **options)

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Pipeline:
        pipe = GatedPipeline(self.connection_pool, self.response_callbacks, transaction, shard_hint)
        pipe.scheduler = self.scheduler
        return pipe
