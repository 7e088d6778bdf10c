"""Every Redis key draftgen uses, in one place. All of a run's keys share the prefix `draftgen:<run>:`."""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass

from workers.errors import InvalidRunName

KEY_PREFIX = "draftgen"
RUNS_KEY = f"{KEY_PREFIX}:runs"  # set of run names
WORKERS_KEY_PREFIX = f"{KEY_PREFIX}:workers:"  # + "<host>/gpu<N>": a generate worker's heartbeat (JSON, TTL)
SERVERS_KEY = (
    f"{KEY_PREFIX}:servers"  # hash: facts id -> a server's facts (JSON), see inference/server_facts.py
)
SEATS_KEY_PREFIX = f"{KEY_PREFIX}:seats:"  # + GPU label: the token of the process seated there (seat.py)
EXIT_NOTES_KEY_PREFIX = (
    f"{KEY_PREFIX}:exits:"  # + GPU label: why its worker ended itself to be restarted (TTL)
)
SEAT_CHANNEL_PREFIX = f"{KEY_PREFIX}:seat:"  # + GPU label + ":" + token: its holder's subscription
# Malformed messages a consumer took off a queue or heard on a channel (workers/broker/parked_messages.py):
PARKED_MESSAGES_KEY = f"{KEY_PREFIX}:parked_messages"  # list, newest first, trimmed: each one's JSON record
PARKED_COUNTS_KEY = f"{KEY_PREFIX}:parked_message_counts"  # hash "<queue>|<reason>" -> parked ever
RUN_NAME_MAX_CHARS = 128
# Buckets of a run's ids (RunKeys.ids). Small hashes stay compact listpacks: deploy/redis.conf lets one
# hold 512 fields of up to 128 bytes, so up to ~30M ids a run cost their id and holder and little more.
ID_BUCKETS = 1 << 16
RUN_NAME_PATTERN = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._-]{{0,{RUN_NAME_MAX_CHARS - 1}}}")


RESERVED_RUN_NAMES = frozenset({"runs", "workers", "servers", "seats", "seat"})  # key prefixes of their own


def check_run_name(run: str) -> str:
    if run in RESERVED_RUN_NAMES:
        raise InvalidRunName(f"run name {run!r} is reserved; choose another")
    if len(run) > RUN_NAME_MAX_CHARS:
        raise InvalidRunName(
            f"run name {run[:40]!r}… is {len(run)} characters long; at most {RUN_NAME_MAX_CHARS}"
        )
    if not RUN_NAME_PATTERN.fullmatch(run):
        raise InvalidRunName(
            f"run name {run!r} must start with a letter or digit and hold only letters, digits, '.', '_', '-'"
        )
    return run


def id_bucket(prompt_id: str) -> int:
    """Which of a run's id buckets holds this id (stable across processes and versions)."""
    return zlib.crc32(prompt_id.encode()) % ID_BUCKETS


def worker_heartbeat_key(worker: str) -> str:
    """A generate worker's heartbeat, `worker` being its GPU label (`host/gpuN`, see ledger.gpu_label)."""
    return WORKERS_KEY_PREFIX + worker


def worker_exit_note_key(worker: str) -> str:
    """Why the generate worker of GPU label `worker` ended itself to be restarted (see consumer_watch.py)."""
    return EXIT_NOTES_KEY_PREFIX + worker


EXIT_NOTES_PATTERN = EXIT_NOTES_KEY_PREFIX + "*/*"  # labels hold a "/", as for heartbeats


def seat_key(label: str) -> str:
    """Which process holds a GPU label's seat: its token."""
    return SEATS_KEY_PREFIX + label


def seat_seen_key(label: str) -> str:
    """When a GPU label's seat holder last showed it lives, on which Redis server (recovery/seat_stamp.py)."""
    return seat_key(label) + ":seen"


def seat_channel_prefix(label: str) -> str:
    return f"{SEAT_CHANNEL_PREFIX}{label}:"


def seat_channel(label: str, token: str) -> str:
    """The channel a seat's holder stays subscribed to: subscribers there mean the holder lives."""
    return seat_channel_prefix(label) + token


# Every heartbeat key: labels always hold a '/', which no key of a run named "workers" would after the prefix.
WORKER_HEARTBEAT_PATTERN = WORKERS_KEY_PREFIX + "*/*"


@dataclass(frozen=True)
class RunKeys:
    run: str

    def _key(self, name: str) -> str:
        return f"{KEY_PREFIX}:{self.run}:{name}"

    @property
    def settings(self) -> str:
        """The run's pinned generation settings (JSON)."""
        return self._key("settings")

    def ids(self, prompt_id: str) -> str:
        """The one of ID_BUCKETS hashes that holds this id once the run has accepted it: id -> its holder,
        the enqueue that claimed it (a number, for a hashed id) or, for an explicit id, its fingerprint
        "content digest|enqueue number|row[|file]" (producer/enqueue/fingerprints.py), which tells a re-used
        id with other content (a conflict) from a duplicate; "0" when only a commit is known of it."""
        return self.ids_bucket(id_bucket(prompt_id))

    def ids_bucket(self, bucket: int) -> str:
        """One of the run's ID_BUCKETS id hashes (see `ids`)."""
        return f"{self.ids_prefix}{bucket}"

    @property
    def ids_prefix(self) -> str:
        """What every id bucket of the run starts with."""
        return self._key("ids:")

    @property
    def enqueued_count(self) -> str:
        """How many ids the run has accepted: the fields of all its id buckets, kept by the scripts that
        add them."""
        return self._key("enqueued_count")

    @property
    def legacy_enqueued(self) -> str:
        """Where draftgen 0.1.0 kept the run's ids (a set, with `fingerprints:<bucket>` hashes beside
        it): `recover` moves such a run to the id buckets."""
        return self._key("enqueued")

    @property
    def legacy_fingerprints_prefix(self) -> str:
        return self._key("fingerprints:")

    def batch(self, batch_id: str) -> str:
        """A batch's prompts (compressed), written before its message is published."""
        return f"{self.batches_prefix}{batch_id}"

    @property
    def batches_prefix(self) -> str:
        """What every batch key of the run starts with (to SCAN for them)."""
        return self._key("batch:")

    def finished_batch(self, batch_id: str) -> str:
        """A finished batch's body, kept (FINISH_BATCH renames `batch` to it) until every prompt of it is
        committed: a prompt quarantined meanwhile re-opens the batch to be generated again."""
        return self._key(f"finished_batch:{batch_id}")

    @property
    def finished_batches(self) -> str:
        """Sorted set of the batch ids whose body is kept finished, by when the uploader last judged them
        (Redis clock, seconds): the least recently judged are looked at first."""
        return self._key("finished_batches")

    @property
    def finished_prompts(self) -> str:
        """Hash prompt id -> the finished batch that carried it, while that batch's body is kept."""
        return self._key("finished_prompts")

    @property
    def quarantined(self) -> str:
        """Hash `<kind>:<id>` -> a record read back that could not be trusted (JSON, state/quarantine.py):
        kept apart with its reason, never committed, never marked done."""
        return self._key("quarantined")

    @property
    def open_batches(self) -> str:
        """Sorted set of stored, unfinished batch ids by when the reconciler may next judge them
        (Redis clock, seconds): dispatch time, or the end of a retry's countdown."""
        return self._key("open_batches")

    @property
    def leases(self) -> str:
        """Sorted set batch id -> lease expiry (Redis clock, seconds) of batches being generated."""
        return self._key("leases")

    @property
    def lease_owners(self) -> str:
        """Hash batch id -> lease holder (JSON: owner token, worker label)."""
        return self._key("lease_owners")

    @property
    def batch_failures(self) -> str:
        """Hash batch id -> unexpected failures so far (a poison batch is dead-lettered, not looped)."""
        return self._key("batch_failures")

    @property
    def unpublished(self) -> str:
        """Set of batch ids stored but not yet confirmed published (the outbox)."""
        return self._key("unpublished")

    @property
    def rejected(self) -> str:
        """Hash "source|file|row" -> rejected row (JSON: row, reason): rows refused at enqueue."""
        return self._key("rejected")

    @property
    def staged(self) -> str:
        """Hash prompt id -> completion (compressed) handed over by a generate worker, not yet committed."""
        return self._key("staged")

    @property
    def staged_index(self) -> str:
        """Sorted set of staged prompt ids by hand-over time (Redis clock), oldest first."""
        return self._key("staged_index")

    @property
    def staged_bytes(self) -> str:
        return self._key("staged_bytes")

    @property
    def stats(self) -> str:
        """Hash of running totals: completions, turns, completion/reasoning/prompt_tokens over staged
        completions, quality:<label> and finish:<reason> over their generated turns; dead:<reason> over
        dead letters; first_completion_at."""
        return self._key("stats")

    @property
    def events(self) -> str:
        """Stream of recent completions (fields: tokens, gpu); its ids are Redis-clock milliseconds."""
        return self._key("events")

    @property
    def done(self) -> str:
        """Set of committed prompt ids: listed in the manifest."""
        return self._key("done")

    @property
    def dead(self) -> str:
        """Hash prompt id -> dead letter (JSON): prompts that will not get a completion, with the reason."""
        return self._key("dead")

    @property
    def strikes(self) -> str:
        """Hash prompt id -> its poison record: suspicions and trials, one JSON event a line, bounded
        (workers/state/poison.py)."""
        return self._key("strikes")

    @property
    def turns(self) -> str:
        """Hash prompt id -> the finished turns of a conversation not yet staged (compressed JSON list of
        core.records.Turn): a later delivery resumes at the next turn. Gone once it is staged or dead."""
        return self._key("turns")

    @property
    def dead_pending(self) -> str:
        """Sorted set of dead-lettered prompt ids not yet committed to the object store, by time."""
        return self._key("dead_pending")

    @property
    def manifest(self) -> str:
        """List of manifest entries (JSON), the Redis copy of the manifest in the object store."""
        return self._key("manifest")

    @property
    def next_part(self) -> str:
        return self._key("next_part")

    @property
    def upload_lock(self) -> str:
        return self._key("upload_lock")

    @property
    def paused(self) -> str:
        """Present while the run is paused: JSON {reason, by, at}. Workers take no batch of it meanwhile."""
        return self._key("paused")

    @property
    def gate_baseline(self) -> str:
        """Copy of `stats` taken at the last resume: the quality gate judges only what came after."""
        return self._key("gate_baseline")

    @property
    def enqueue_lock(self) -> str:
        """Held by the one `enqueue` of the run at work (a lease, renewed per chunk)."""
        return self._key("enqueue_lock")

    @property
    def files(self) -> str:
        """Hash of the numbers the run gave the files of its folders and S3 prefixes: `n:<name>` -> number,
        `i:<number>` -> name, `count`. An explicit id's fingerprint holds its file's number, not its name."""
        return self._key("files")

    @property
    def enqueues(self) -> str:
        """List of notes (JSON: source, at), one per `enqueue` of the run; enqueue N is item N-1."""
        return self._key("enqueues")
