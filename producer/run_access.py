"""What every command of `python -m producer` shares: reaching Redis, a run's pinned settings, its output.

Light on purpose: `status`, `pause` and `resume` import it, and they start without pyarrow or boto3.
"""

from __future__ import annotations

import argparse
import difflib

import redis

from core.run_settings.model import RunSettings
from producer.errors import OutputError, RunNotFound, RunStateBroken
from producer.settings import ProducerSettings
from workers.errors import RecordUnreadable, UnsupportedStoreUrl
from workers.record.object_store import ObjectStore
from workers.record.storage import check_output_folder, open_store
from workers.state.keys import RUNS_KEY, RunKeys
from workers.state.redis_client import client_for
from workers.state.runs import decode_run_settings


def chosen_redis_url(args: argparse.Namespace, settings: ProducerSettings) -> str:
    url: str = args.redis_url or settings.redis_url
    return url


def connect_redis(args: argparse.Namespace, settings: ProducerSettings) -> redis.Redis:
    """A client whose Redis answered: a wrong URL or password fails here, before anything is done."""
    client = client_for(chosen_redis_url(args, settings))
    client.ping()
    return client


def pinned_settings(client: redis.Redis, run: str) -> RunSettings | None:
    keys = RunKeys(run)
    with client.pipeline(transaction=False) as pipe:
        pipe.get(keys.settings)
        pipe.exists(keys.legacy_enqueued)
        raw, legacy = pipe.execute()
    if raw is None:
        return None
    if legacy:
        raise RunStateBroken(
            f"run {run!r} was enqueued by draftgen 0.1.0, which kept its ids where this version reads them "
            f"no more: run `python -m producer recover --run {run} --output URL` once to move them"
        )
    try:
        return decode_run_settings(raw)
    except RecordUnreadable as error:
        raise RunStateBroken(
            f"run {run!r}: its pinned settings in Redis are unreadable ({error}); `python -m producer "
            f"recover --run {run} --output URL` restores them from the output's run.json"
        ) from error


KNOWN_RUNS_NAMED = 8  # runs a refusal of an unknown run names, nearest first


def run_names(client: redis.Redis) -> list[str]:
    """Every run Redis knows, sorted by name."""
    return sorted(raw.decode(errors="replace") for raw in client.smembers(RUNS_KEY))


def other_runs_settings(client: redis.Redis, run: str) -> list[RunSettings]:
    """The pinned settings of every run in Redis but `run`; a run whose settings are missing or unreadable
    is left out (its own commands say what is wrong with it)."""
    others = [name for name in run_names(client) if name != run]
    with client.pipeline(transaction=False) as pipe:
        for other in others:
            pipe.get(RunKeys(other).settings)
        raws = pipe.execute()
    settings = []
    for raw in raws:
        if raw is None:
            continue
        try:
            settings.append(decode_run_settings(raw))
        except RecordUnreadable:
            continue
    return settings


def require_run(client: redis.Redis, run: str) -> RunSettings:
    pinned = pinned_settings(client, run)
    if pinned is None:
        raise RunNotFound(f"no run named {run!r} in Redis: {known_runs_hint(client, run)}")
    return pinned


def known_runs_hint(client: redis.Redis, run: str) -> str:
    """What to do about an unknown run name: the known runs, nearest to it first, or how to start one."""
    names = run_names(client)
    if not names:
        return f"Redis knows no run yet; start one with `python -m producer enqueue DATA --run {run}`"
    near = difflib.get_close_matches(run, names, n=KNOWN_RUNS_NAMED, cutoff=0.0)
    more = f" and {len(names) - len(near)} more" if len(names) > len(near) else ""
    return f"Redis knows {', '.join(near)}{more} (`python -m producer runs` lists them with their state)"


def checked_output_store(url: str) -> ObjectStore:
    """The store of a normalised output URL, refused before anything is written when a folder cannot be."""
    try:
        check_output_folder(url)
    except UnsupportedStoreUrl as error:
        raise OutputError(f"--output: {error}") from error
    return open_store(url)
