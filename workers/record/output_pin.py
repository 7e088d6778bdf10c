"""A run's output is named twice: in Redis (the run's settings) and in the output itself (`run.json`,
written by every `enqueue`). The uploader commits a run's parts only where the two agree.

Redis tells the uploader where a run's output goes, so whoever could write to Redis could send a run's
completions elsewhere. Before a run's first part (once per run and process), the uploader reads
`run.json` at the output Redis names; when it is missing, unreadable, or names another run or another
output, the uploader commits nothing of the run: it pauses the run with the reason (workers hand its
batches back; `status` shows why) and logs an error. The staged completions wait in Redis. A process
that confirmed a run's output refuses any other output for that run afterwards. `producer resume`
lifts the pause; the next flush checks again.
"""

from __future__ import annotations

import logging

import msgspec
import redis

from workers.errors import ObjectMissing
from workers.record.manifest import SETTINGS_KEY
from workers.record.object_store import ObjectStore
from workers.state.control import PAUSED_BY_OUTPUT_PIN, pause

log = logging.getLogger(__name__)


class OutputOwner(msgspec.Struct, frozen=True):
    """The two fields of `run.json` the check reads (the rest of the settings may change form)."""

    run: str
    output_url: str


def same_location(first_url: str, second_url: str) -> bool:
    """Whether two normalised output URLs name the same place (a trailing slash aside)."""
    return first_url.rstrip("/") == second_url.rstrip("/")


def output_pin_mismatch(run: str, store: ObjectStore) -> str | None:
    """Why `store` must not receive run `run`'s parts, or None when its run.json names this run and itself."""
    try:
        raw = store.get(SETTINGS_KEY)
    except ObjectMissing:
        return (
            f"the output Redis names for run {run!r}, {store.url}, holds no {SETTINGS_KEY}: "
            "it is not where this run was enqueued to"
        )
    try:
        owner = msgspec.json.decode(raw, type=OutputOwner)
    except msgspec.DecodeError as error:  # ValidationError is a DecodeError
        return f"{store.url}/{SETTINGS_KEY} is unreadable ({error}): run {run!r} is not confirmed there"
    if owner.run != run:
        return f"{store.url}/{SETTINGS_KEY} names run {owner.run!r}, not {run!r}: an output is one run's"
    if not same_location(owner.output_url, store.url):
        return (
            f"Redis sends run {run!r} to {store.url}, but the {SETTINGS_KEY} there pins its output "
            f"to {owner.output_url}"
        )
    return None


class OutputPin:
    """The uploader's check, remembered per run once it passed (one read of run.json per run and process)."""

    def __init__(self, client: redis.Redis) -> None:
        self._client = client
        self._confirmed: dict[str, str] = {}  # run -> the output URL its run.json confirmed

    def confirm(self, run: str, store: ObjectStore) -> bool:
        """True when run `run` may commit to `store`; otherwise the run is paused with the reason."""
        reason = self._mismatch(run, store)
        if reason is None:
            return True
        if pause(self._client, run, reason, by=PAUSED_BY_OUTPUT_PIN):
            log.error("run %s paused, nothing of it committed: %s", run, reason)
        else:
            log.error("run %s (paused) still refused, nothing of it committed: %s", run, reason)
        return False

    def _mismatch(self, run: str, store: ObjectStore) -> str | None:
        confirmed = self._confirmed.get(run)
        if confirmed is not None:
            if same_location(confirmed, store.url):
                return None
            return f"Redis now sends run {run!r} to {store.url}; this uploader confirmed {confirmed} for it"
        reason = output_pin_mismatch(run, store)
        if reason is None:
            self._confirmed[run] = store.url
        return reason
