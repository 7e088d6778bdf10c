"""No input file, however made, costs the head node gigabytes or ends enqueue in a traceback (issue 25).

Each file is small on disk and would take gigabytes to read whole (tests/support/crafted_inputs.py).
`python -m producer enqueue` reads it in a process of its own, under a 2 GiB address-space limit: a reader
that inflated it would fail there with a MemoryError, and the test with it. What must hold: the exit code,
one error line naming the file and the row, the limit it broke, and what the run holds afterwards.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from core.exit_codes import EXIT_OK, EXIT_USAGE
from intake.errors import SourceError
from intake.input_files import open_rows
from producer.settings import REDIS_URL_ENV
from tests.support.crafted_inputs import BUILDERS, MIB
from workers.state.keys import RUNS_KEY, RunKeys
from workers.state.ledger import RunLedger

if sys.version_info >= (3, 14):
    from compression import zstd
else:
    from backports import zstd

pytestmark = pytest.mark.integration

REPOSITORY_ROOT = Path(__file__).resolve().parents[2]
ADDRESS_SPACE_LIMIT_BYTES = 2 * 1024 * MIB
SUBPROCESS_TIMEOUT_S = 120
RUN = "crafted"
LIMITED_ENQUEUE = (
    "import resource, sys\n"
    f"resource.setrlimit(resource.RLIMIT_AS, ({ADDRESS_SPACE_LIMIT_BYTES}, {ADDRESS_SPACE_LIMIT_BYTES}))\n"
    "from producer.cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


@dataclass(frozen=True)
class Crafted:
    builder: str
    exit_code: int
    said: tuple[str, ...]  # in stderr for a refusal, in stdout for a success
    enqueued: frozenset[str] = frozenset()  # what the run holds afterwards
    pinned: bool = False


CASES = [
    Crafted("zstd-bomb", EXIT_USAGE, ("bomb.jsonl.zst: line 1 runs on past", "not a file of JSON lines")),
    Crafted("gzip-bomb", EXIT_USAGE, ("bomb.jsonl.gz: line 1 runs on past", "row limit of 8,126,464")),
    Crafted(
        "deep-nesting",
        EXIT_OK,
        ("rejected rows       1", "row 2: invalid row: nested deeper than the JSON decoder goes"),
        frozenset({"good"}),
        pinned=True,
    ),
    Crafted(
        "huge-row",
        EXIT_OK,
        ("rejected rows       1", "row 2: row is 52,428,82", "over the limit of 8,126,464"),
        frozenset({"good", "after"}),
        pinned=True,
    ),
    Crafted(
        "parquet-huge-cell",
        EXIT_USAGE,
        ("huge-cell.parquet: row group 0 (rows 1-1) holds 67,108,", "more than the row limit"),
    ),
    # Refused part-way (its first rows are good, each alone), within the rows read ahead to choose how many
    # processes enqueue (producer.settings.PROCESSES_MIN_ROWS): refused before the run is pinned.
    Crafted(
        "parquet-dictionary-bomb",
        EXIT_USAGE,
        ("dictionary.parquet: after row ", "over 1000 times", "decompression bomb"),
    ),
]


@pytest.fixture(scope="module")
def crafted_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("crafted")
    return {name: build(folder) for name, build in BUILDERS.items()}


def enqueue_limited(data: Path, redis_url: str, output: Path) -> subprocess.CompletedProcess[str]:
    clean = {name: value for name, value in os.environ.items() if not name.startswith("DRAFTGEN_")}
    argv = ["enqueue", str(data), "--run", RUN, "--output", str(output)]
    return subprocess.run(
        [sys.executable, "-c", LIMITED_ENQUEUE, *argv],
        env={**clean, "PYTHONPATH": str(REPOSITORY_ROOT), REDIS_URL_ENV: redis_url},
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
        check=False,
    )


@pytest.mark.parametrize("case", CASES, ids=[case.builder for case in CASES])
def test_a_crafted_file_is_read_within_bounds_and_refused_or_rejected_by_row(
    case: Crafted, crafted_files: dict[str, Path], redis_url: str, tmp_path: Path
) -> None:
    completed = enqueue_limited(crafted_files[case.builder], redis_url, tmp_path / "out")
    assert completed.returncode == case.exit_code, completed
    assert "Traceback" not in completed.stderr and "MemoryError" not in completed.stderr, completed.stderr
    said = completed.stdout if case.exit_code == EXIT_OK else completed.stderr
    for words in case.said:
        assert words in said, f"{words!r} not in: {said}"
    if case.exit_code != EXIT_OK:
        assert len(completed.stderr.strip().splitlines()) == 1, completed.stderr
    client = redis.Redis.from_url(redis_url)
    keys = RunKeys(RUN)
    assert RunLedger(client, keys.run).enqueued_ids() == case.enqueued
    assert bool(client.exists(keys.settings)) == case.pinned
    assert client.sismember(RUNS_KEY, RUN) == case.pinned
    assert (tmp_path / "out").exists() == case.pinned


LINE_OF_A_MEBIBYTE = b'{"prompt": "' + b"a" * (MIB - 16) + b'"}\n'
SHORT_LINES_BOMB_LINES = 300  # 300 MB of rows, each under the row limit, in a few KB of zstd


def test_a_compressed_file_of_rows_each_under_the_limit_is_refused_once_it_inflates_past_any_text_ratio(
    tmp_path: Path,
) -> None:
    path = tmp_path / "many.jsonl.zst"
    with zstd.ZstdFile(path, "wb") as stream:
        for _ in range(SHORT_LINES_BOMB_LINES):
            stream.write(LINE_OF_A_MEBIBYTE)
    read: list[object] = []
    with pytest.raises(SourceError, match=r"many\.jsonl\.zst: after row \d+: .* over 1000 times"):
        read.extend(open_rows(str(path)))
    assert 0 < len(read) < SHORT_LINES_BOMB_LINES
