"""What a worker that died holding batches leaves against their prompts (docs/exactly-once.md, "A prompt
that kills its worker").

A worker that dies (SIGKILL, a segfault, the OOM killer) writes nothing: its requests in flight die with it,
and a prompt that killed it would be sent again at the head of the queue, to kill the next worker, for
ever. Its successor on the same GPU label took its seat, which proves the death, and takes its batches
back. Before they are dispatched again, it records against each of their prompts still to generate a
suspicion (`WORKER_DIED`), and closes every trial alone that the dead worker left open as `killed`, timed
up to now (an upper bound on when the worker died: the restart and the seat are in it). A prompt that
kills its worker is so tried alone like any suspect, and convicted on the same control
(workers/state/poison.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import redis

from workers.errors import RecordUnreadable, RunBroken
from workers.generate.batches import read_batch
from workers.recovery.reconciler import TakenBack
from workers.state.ledger import RunLedger, server_identity
from workers.state.poison import WORKER_DIED, Suspicion, TrialEnd, open_trials
from workers.state.runs import load_run_settings

log = logging.getLogger(__name__)

KILLED_NOTE = "its worker died during it; closed by the worker that took its seat"


def record_deaths(
    client: redis.Redis,
    run: str,
    taken: list[TakenBack],
    *,
    label: str,
    clock: Callable[[], float] = time.time,
) -> int:
    """Record the death of the holders of `taken` (batches of `run` taken back by the new holder of
    `label`'s seat) against their prompts still to generate; how many prompts. A Redis that cannot be
    read or written leaves them unrecorded (the next death is recorded instead), never stops the worker.
    `clock`: Unix time, as the dead worker wrote its trials' start (the same host's clock: its label's)."""
    try:
        return _record(client, run, taken, label=label, now=clock())
    except (redis.RedisError, RunBroken, RecordUnreadable) as error:
        log.warning("could not record the death of %s's predecessor in run %s: %s", label, run, error)
        return 0


def _record(client: redis.Redis, run: str, taken: list[TakenBack], *, label: str, now: float) -> int:
    ledger = RunLedger(client, run)
    batch_size = load_run_settings(client, run).batch_size
    recorded = 0
    for one in taken:
        blob = client.get(ledger.keys.batch(one.batch_id))
        batch = None if blob is None else read_batch(client, run, one.batch_id, blob, batch_size=batch_size)
        if batch is None:  # finished meanwhile, or quarantined
            continue
        pending = ledger.pending(batch.prompts)
        if not pending:
            continue
        identity = server_identity(one.holder.seat) if one.holder is not None else ""
        dead_life = f"{label}#{identity}"
        records = ledger.strikes_of([p.id for p in pending])
        for prompt in pending:
            for begun in open_trials(records.get(prompt.id, []), f"{dead_life}.") if identity else []:
                ended = begun.end(
                    TrialEnd.KILLED, failed_after_s=max(0.0, now - begun.started_at), note=KILLED_NOTE
                )
                ledger.strike(prompt.id, ended)
                log.warning(
                    "prompt %s: its trial alone on %s ended with its worker, within %.0f s",
                    prompt.id,
                    label,
                    ended.failed_after_s,
                )
            ledger.strike(prompt.id, Suspicion(life=dead_life, cause=WORKER_DIED, with_server=True, at=now))
            recorded += 1
    if recorded:
        log.warning("run %s: %d prompts suspected, for %s died holding them", run, recorded, label)
    return recorded
