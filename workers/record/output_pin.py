"""A run's output is named twice: in Redis (the run's settings) and in the output itself (`run.json`,
written by every `enqueue`). This module owns run.json: it writes it, reads it (with the one decoder of a
run's settings, workers/state/runs.py), and holds the one check that an output belongs to one run. The
uploader commits a run's parts only where the two agree.

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

import redis

from core.run_settings.model import RunSettings
from workers.errors import ObjectMissing, OutputTaken, RecordUnreadable
from workers.record.manifest import SETTINGS_KEY
from workers.record.object_store import ObjectStore
from workers.state.control import PAUSED_BY_OUTPUT_PIN, pause
from workers.state.runs import decode_run_settings, encode_run_settings

log = logging.getLogger(__name__)

APART = "a run's output neither holds nor lies inside another run's"


def read_run_json(store: ObjectStore) -> RunSettings:
    """The output's run.json: ObjectMissing when it has none, RecordUnreadable when it is not a run's."""
    return decode_run_settings(store.get(SETTINGS_KEY))


def another_runs_output(owner: RunSettings, run: str, url: str) -> str | None:
    """Why the output at `url`, whose run.json is `owner`, is not run `run`'s, or None when it is: the one
    check that an output belongs to one run."""
    if owner.run == run:
        return None
    return f"{url} holds the output of run {owner.run!r}, not {run!r}: an output belongs to one run"


def overlapping_run_output(run: str, url: str, other: RunSettings) -> str | None:
    """Why `url` cannot be run `run`'s output beside run `other` (it is, holds, or lies inside the other
    run's output), or None when they are apart. Both are normalised output URLs."""
    if other.run == run:
        return None
    mine, theirs = url.rstrip("/"), other.output.rstrip("/")
    if mine == theirs:
        return another_runs_output(other, run, url)
    if f"{theirs}/".startswith(f"{mine}/"):
        return f"{url} holds {theirs}, the output of run {other.run!r}: {APART}"
    if f"{mine}/".startswith(f"{theirs}/"):
        return f"{url} is inside {theirs}, the output of run {other.run!r}: {APART}"
    return None


def write_run_json(store: ObjectStore, settings: RunSettings) -> None:
    """Keep the run's settings beside its data (the same bytes every time); OutputTaken when the output
    is another run's."""
    try:
        owner = read_run_json(store)
    except ObjectMissing:
        owner = None
    if owner is not None and (reason := another_runs_output(owner, settings.run, store.url)):
        raise OutputTaken(f"{reason}; give run {settings.run!r} an --output of its own")
    store.put(SETTINGS_KEY, encode_run_settings(settings))


def run_json_of(store: ObjectStore, run: str) -> RunSettings:
    """Run `run`'s settings as its output holds them: ObjectMissing without run.json, OutputTaken when the
    output is another run's."""
    owner = read_run_json(store)
    if reason := another_runs_output(owner, run, store.url):
        raise OutputTaken(reason)
    return owner


def same_location(first_url: str, second_url: str) -> bool:
    """Whether two normalised output URLs name the same place (a trailing slash aside)."""
    return first_url.rstrip("/") == second_url.rstrip("/")


def output_pin_mismatch(run: str, store: ObjectStore) -> str | None:
    """Why `store` must not receive run `run`'s parts, or None when its run.json names this run and itself."""
    try:
        owner = read_run_json(store)
    except ObjectMissing:
        return (
            f"the output Redis names for run {run!r}, {store.url}, holds no {SETTINGS_KEY}: "
            "it is not where this run was enqueued to"
        )
    except RecordUnreadable as error:
        return f"{store.url}/{SETTINGS_KEY} is unreadable ({error}): run {run!r} is not confirmed there"
    if reason := another_runs_output(owner, run, store.url):
        return reason
    if not same_location(owner.output, store.url):
        return (
            f"Redis sends run {run!r} to {store.url}, but the {SETTINGS_KEY} there pins its output "
            f"to {owner.output}"
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
