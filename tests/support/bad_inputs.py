"""The harness of tests/producer/test_bad_inputs.py: a case is a command, the exit code and words it must
give, an optional setup (files, a run pinned before, environment variables), and what must hold after
(nothing pinned, a pinned run unchanged, exactly these rows enqueued)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import redis

from core.exit_codes import EXIT_OK
from core.records import DeadLetter, DeadLetterReason, SamplingSettings
from core.run_settings.model import RunSettings
from producer.cli import main
from producer.settings import REDIS_URL_ENV
from workers.state.keys import RUNS_KEY, RunKeys
from workers.state.ledger import RunLedger
from workers.state.runs import decode_run_settings, encode_run_settings

REPOSITORY_ROOT = Path(__file__).resolve().parents[2]
RUN = "r"  # the run every case names unless it says otherwise
PINNED = "pinned"  # a run enqueued by the setup, before the case's command
BROKEN = "broken"  # a run whose pinned settings an older version wrote unreadable (a NaN as null)
CLOSED_REDIS = "redis://127.0.0.1:1/0"  # nothing listens on port 1
WRONG_USER = "draftgen-no-such-user:wrong-password"
SUBPROCESS_TIMEOUT_S = 60
DATA_ROWS = 3  # rows of data.jsonl, q0..q2
DEAD_ERROR = "Requested token count exceeds the model's maximum context length of 4096 tokens"


@dataclass
class World:
    """What a case runs against: its folder, the real Redis, and what the setup left to compare with."""

    tmp: Path
    client: redis.Redis
    redis_url: str
    before: dict[str, object] = field(default_factory=dict)

    @property
    def wrong_password_url(self) -> str:
        """The same server, with a user and password it does not know (whatever the URL carried)."""
        scheme, _, rest = self.redis_url.partition("://")
        return f"{scheme}://{WRONG_USER}@{rest.rpartition('@')[2]}"

    @property
    def no_password_url(self) -> str:
        """The same server, without the user and password it asks for."""
        scheme, _, rest = self.redis_url.partition("://")
        return f"{scheme}://{rest.rpartition('@')[2]}"


Setup = Callable[[World], None]
Check = Callable[[World], None]


@dataclass(frozen=True)
class Case:
    """One bad input: `argv` after `python -m producer --redis-url URL`, with {tmp} for the case's folder."""

    id: str
    argv: tuple[str, ...]
    exit_code: int
    words: tuple[str, ...]  # each must appear in stderr (a refusal) or stdout (a success)
    after: Check
    setup: Setup | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    redis: str = "live"  # "live", "closed" (nothing listens), "wrong-password" or "no-password"
    subprocess: bool = False  # only for what needs a process of its own
    max_error_lines: int = 2


@dataclass(frozen=True)
class Outcome:
    exit_code: int
    stdout: str
    stderr: str


# --- files every case can name ---------------------------------------------------------------


def rows(count: int, start: int = 0) -> list[dict[str, object]]:
    return [{"id": f"q{i}", "prompt": f"question {i}"} for i in range(start, start + count)]


INPUT_FILES: dict[str, list[object]] = {
    "data.jsonl": list(rows(DATA_ROWS)),
    "nul.jsonl": [rows(1)[0], {"id": "q1", "prompt": "a NUL \u0000 inside"}, rows(1, 2)[0]],
    "nul-system.jsonl": [rows(1)[0], {"id": "q1", "prompt": "fine", "system": "be\u0000brief"}],
    "nul-id.jsonl": [rows(1)[0], {"id": "q\u00001", "prompt": "fine"}],
    "nul-part.jsonl": [
        rows(1)[0],
        {"id": "q1", "messages": [{"role": "user", "content": [{"type": "text", "text": "x\u0000"}]}]},
    ],
    "conflict.jsonl": [*rows(2), {"id": "q0", "prompt": "another question under the same id"}],
    "duplicate.jsonl": [*rows(2), rows(1)[0]],
    "changed.jsonl": [{"id": "q0", "prompt": "question 0, edited since"}, *rows(1, 9)],
    "questions.jsonl": [
        {"uid": f"u{i}", "question": f"question {i}", "answer": "4"} for i in range(DATA_ROWS)
    ],
    "mostly-bad.jsonl": [rows(1)[0], *({"question": f"question {i}"} for i in range(1, 4))],
    "dialogs.jsonl": [  # a chat schema of its own, as a user's export gives it
        {
            "conv_id": f"c{i}",
            "dialog": [
                {"speaker": "human", "text": f"hello {i}"},
                {"speaker": "bot", "text": "hi"},
                {"speaker": "human", "text": f"question {i}"},
            ],
        }
        for i in range(DATA_ROWS)
    ],
    "with-columns.jsonl": [  # columns to keep beside the prompt, the first rows disagreeing on one
        {"id": "q0", "prompt": "question 0", "lang": "en", "source": "web", "score": 1},
        {"id": "q1", "prompt": "question 1", "lang": "fr", "score": 0.5, "tags": ["a", "b"]},
        {"id": "q2", "prompt": "question 2", "lang": 3, "source": "book"},
    ],
    "first-columns.jsonl": [
        {"id": f"q{i}", "prompt": f"question {i}", "lang": "en", "source": "web"} for i in range(DATA_ROWS)
    ],
    "later-columns.jsonl": [  # a later input of a run that keeps `lang` as a string
        {"id": "q3", "prompt": "question 3", "lang": "de"},
        {"id": "q4", "prompt": "question 4", "lang": 4},
        {"id": "q5", "prompt": "question 5", "lang": "it", "new": 1},
    ],
    "with-metadata.jsonl": [{"id": "q0", "prompt": "question 0", "metadata": {"a": 1}}],
}
TEXT_FILES = {
    "empty.jsonl": "",
    "blank.jsonl": "\n\n  \n",
    "afile": "not a folder\n",
    "data.csv": "id,prompt\nq0,hi\n",
    "nan.toml": "[sampling]\ntemperature = nan\n",
    "top-p.toml": "top_p = 2.0\n",
    "huge.toml": "# " + "x" * (1 << 20) + "\n",
}


def write_inputs(tmp: Path) -> None:
    for name, records in INPUT_FILES.items():
        (tmp / name).write_text("".join(json.dumps(record) + "\n" for record in records))
    for name, text in TEXT_FILES.items():
        (tmp / name).write_text(text)


# --- running a case ------------------------------------------------------------------------


def redis_url_for(case: Case, world: World) -> str:
    urls = {
        "live": world.redis_url,
        "closed": CLOSED_REDIS,
        "wrong-password": world.wrong_password_url,
        "no-password": world.no_password_url,
    }
    return urls[case.redis]


def argv_for(case: Case, world: World) -> list[str]:
    return [part.format(tmp=world.tmp) for part in case.argv]


def env_for(case: Case, world: World) -> dict[str, str]:
    """The case's variables, and the Redis it runs against in DRAFTGEN_REDIS_URL (a password never goes on
    a command line: `--redis-url` with one is refused)."""
    return {REDIS_URL_ENV: redis_url_for(case, world), **case.env}


def run_in_subprocess(argv: list[str], env: Mapping[str, str], cwd: Path) -> Outcome:
    clean = {name: value for name, value in os.environ.items() if not name.startswith("DRAFTGEN_")}
    path = os.pathsep.join(filter(None, [str(REPOSITORY_ROOT), os.environ.get("PYTHONPATH")]))
    completed = subprocess.run(
        [sys.executable, "-m", "producer", *argv],
        env={**clean, **env, "PYTHONPATH": path},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
        check=False,
    )
    return Outcome(completed.returncode, completed.stdout, completed.stderr)


def enqueue_for_setup(world: World, data: str, run: str = PINNED, *options: str) -> None:
    """A successful enqueue the case then builds on (its output in {tmp}/pinned-out)."""
    argv = ["enqueue", str(world.tmp / data), "--run", run]
    assert main([*argv, "--output", str(world.tmp / "pinned-out"), *options]) == EXIT_OK


def snapshot(world: World, run: str = PINNED) -> None:
    keys = RunKeys(run)
    world.before["settings"] = world.client.get(keys.settings)
    world.before["enqueued"] = RunLedger(world.client, keys.run).enqueued_ids()
    world.before["rejected"] = world.client.hgetall(keys.rejected)
    world.before["run.json"] = (world.tmp / "pinned-out" / "run.json").read_bytes()


# --- setups ----------------------------------------------------------------------------------


def pinned_run(world: World) -> None:
    enqueue_for_setup(world, "data.jsonl")
    snapshot(world)


def foreign_run_output(world: World) -> None:
    """{tmp}/pinned-out holds a run's output this Redis does not know (a run of another Redis)."""
    (world.tmp / "pinned-out").mkdir()
    output = (world.tmp / "pinned-out").as_uri()
    foreign = RunSettings(run="foreign", sampling=SamplingSettings(), output=output)
    (world.tmp / "pinned-out" / "run.json").write_bytes(encode_run_settings(foreign))


def pinned_run_keeping_lang(world: World) -> None:
    """The pinned run keeps every column: `lang` and `source`, strings in its first rows."""
    enqueue_for_setup(world, "first-columns.jsonl", PINNED, "--keep-columns", "*")
    snapshot(world)


def pinned_run_in_default_output(world: World) -> None:
    """The pinned run was enqueued without --output: its output is ./output/pinned."""
    argv = ["enqueue", str(world.tmp / "data.jsonl"), "--run", PINNED]
    assert main(argv) == EXIT_OK


def filled_folder(world: World) -> None:
    """{tmp}/filled holds a file of the user's own."""
    (world.tmp / "filled").mkdir()
    (world.tmp / "filled" / "notes.txt").write_text("mine\n")


def pinned_run_and_filled_folder(world: World) -> None:
    pinned_run(world)
    filled_folder(world)


def empty_folder(world: World) -> None:
    (world.tmp / "empty").mkdir()


def named_pipe(world: World) -> None:
    """{tmp}/pipe.toml is a FIFO nobody writes to: reading it whole would wait for ever."""
    os.mkfifo(world.tmp / "pipe.toml")


def linked_folders(world: World) -> None:
    """{tmp}/a/link is a symbolic link to {tmp}/b/c: {tmp}/a/link/.. is {tmp}/b, not {tmp}/a."""
    (world.tmp / "b" / "c").mkdir(parents=True)
    (world.tmp / "a").mkdir()
    (world.tmp / "a" / "link").symlink_to(world.tmp / "b" / "c")


def pinned_mapped_run(world: World) -> None:
    enqueue_for_setup(world, "questions.jsonl", PINNED, "--prompt-field", "question", "--id-field", "uid")
    snapshot(world)


def pinned_run_with_rejects(world: World) -> None:
    enqueue_for_setup(world, "nul.jsonl")
    RunLedger(world.client, PINNED).dead_letter(
        DeadLetter(
            prompt_id="q2",
            row=3,
            reason=DeadLetterReason.REJECTED_BY_SERVER.value,
            error=DEAD_ERROR,
            attempts=1,
        )
    )
    snapshot(world)


def busy_run(world: World) -> None:
    pinned_run(world)
    world.client.set(RunKeys(PINNED).enqueue_lock, "another-enqueue", px=60_000)


def broken_run(world: World) -> None:
    """Settings as the pre-fix code pinned `--temperature nan`: JSON has no NaN, so it wrote null."""
    settings = RunSettings(run=BROKEN, sampling=SamplingSettings(), output=(world.tmp / "b").as_uri())
    raw = encode_run_settings(settings).replace(b'"temperature":0.6', b'"temperature":null')
    world.client.set(RunKeys(BROKEN).settings, raw)
    world.client.sadd(RUNS_KEY, BROKEN)
    world.before["settings"] = raw


# --- checks ----------------------------------------------------------------------------------


def nothing_pinned(run: str = RUN) -> Check:
    """The run has no settings, no ids, and its output folder was not even created."""

    def check(world: World) -> None:
        keys = RunKeys(run)
        assert world.client.exists(keys.settings) == 0, f"run {run!r} was pinned"
        assert not world.client.sismember(RUNS_KEY, run)
        assert RunLedger(world.client, keys.run).counts().enqueued == 0
        assert not (world.tmp / "out").exists(), "the output folder was written"

    return check


def pinned_unchanged(world: World) -> None:
    """The run pinned by the setup is exactly as it was: settings, ids, rejected rows, run.json."""
    keys = RunKeys(PINNED)
    assert world.client.get(keys.settings) == world.before["settings"]
    assert RunLedger(world.client, keys.run).enqueued_ids() == world.before["enqueued"]
    assert world.client.hgetall(keys.rejected) == world.before["rejected"]
    assert (world.tmp / "pinned-out" / "run.json").read_bytes() == world.before["run.json"]


def broken_unchanged(world: World) -> None:
    assert world.client.get(RunKeys(BROKEN).settings) == world.before["settings"]


def enqueued(ids: set[str], *, rejected: int = 0, run: str = RUN) -> Check:
    """Exactly these ids are in the run, and this many rows were kept as rejected."""

    def check(world: World) -> None:
        keys = RunKeys(run)
        assert RunLedger(world.client, keys.run).enqueued_ids() == ids
        assert world.client.hlen(keys.rejected) == rejected

    return check


def run_json_in(folder: str, *, run: str = RUN) -> Check:
    """The run's output is {tmp}/folder: its run.json is there and names it."""

    def check(world: World) -> None:
        settings = decode_run_settings((world.tmp / folder / "run.json").read_bytes())
        assert settings.run == run
        assert settings.output == (world.tmp / folder).as_uri()

    return check


def kept_column_types(types: dict[str, str], *, run: str = RUN) -> Check:
    """The run pinned these kept columns' types, in Redis and in its run.json alike."""

    def check(world: World) -> None:
        pinned = decode_run_settings(world.client.get(RunKeys(run).settings) or b"")
        assert pinned.column_types == types
        stored = decode_run_settings((world.tmp / "out" / "run.json").read_bytes())
        assert stored.column_types == types
        assert list(stored.column_types or {}) == list(types)  # in the order the rows gave them

    return check


def no_state(world: World) -> None:
    """A read-only command left Redis as it found it: empty."""
    assert world.client.dbsize() == 0


def all_of(*checks: Check) -> Check:
    def check(world: World) -> None:
        for one in checks:
            one(world)

    return check
