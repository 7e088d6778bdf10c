"""Flat memory: a large source is streamed, never loaded whole.

Two proofs per format, on files of 100k rows of about 1 KB:
- the first prompt arrives after reading a bounded prefix of the file (its OS file offset);
- in a child process, peak memory after the whole file is hardly above the peak after its first
  quarter (a reader that kept rows grows by more than the size of the last three quarters), and
  Arrow never holds more than a small share of the file at once.

The child uses Arrow's jemalloc pool: mimalloc, Arrow's default, keeps freed pages for reuse, so
its resident size creeps for a few hundred thousand rows before levelling off (bounded, but it
would hide what the reader itself holds); jemalloc hands them back.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from intake.input_stores import READ_BUFFER_BYTES
from intake.reading import iter_prompts

ROW_COUNT = 100_000
PARQUET_ROWS_PER_GROUP = 5_000
PARQUET_ROW_GROUPS_READ_AHEAD = 2  # the first prompt may need the first row group, plus slack
MAX_LATE_GROWTH_SHARE_OF_FILE = 0.15
MAX_ARROW_PEAK_SHARE_OF_FILE = 0.1
KIB = 1024
FILLER = "Please explain each step of the derivation carefully, then check the result. " * 12
REPO_ROOT = Path(__file__).resolve().parents[2]
MEMORY_PROFILE_SCRIPT = textwrap.dedent(
    """
    import resource, sys
    import pyarrow
    from intake.reading import iter_prompts

    def peak_kib():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    quarter = int(sys.argv[2]) // 4
    count = 0
    for count, _ in enumerate(iter_prompts(sys.argv[1]), start=1):
        if count == quarter:
            peak_after_quarter = peak_kib()
    print(count, peak_kib() - peak_after_quarter, pyarrow.default_memory_pool().max_memory() // 1024)
    """
)

needs_proc = pytest.mark.skipif(not Path("/proc/self/fdinfo").exists(), reason="needs Linux /proc")


def question(index: int) -> str:
    return f"Question {index}: what is {index} squared? {FILLER}"


def write_large_jsonl(path: Path) -> Path:
    with path.open("w") as file:
        file.writelines(
            f'{{"id": "row-{index}", "messages": [{{"role": "user", "content": "{question(index)}"}}]}}\n'
            for index in range(ROW_COUNT)
        )
    return path


def write_large_parquet(path: Path) -> Path:
    table = pa.table(
        {
            "id": [f"row-{index}" for index in range(ROW_COUNT)],
            "prompt": [question(i) for i in range(ROW_COUNT)],
        }
    )
    pq.write_table(table, path, row_group_size=PARQUET_ROWS_PER_GROUP, compression="none")
    return path


WRITERS: dict[str, Callable[[Path], Path]] = {
    "large.jsonl": write_large_jsonl,
    "large.parquet": write_large_parquet,
}


@pytest.fixture(scope="module", params=sorted(WRITERS))
def large_file(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    name: str = request.param
    return WRITERS[name](tmp_path_factory.mktemp("large") / name)


def file_offset_of(path: Path) -> int:
    """How far this process has read into the file it has open at `path` (Linux /proc)."""
    for descriptor in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{descriptor}") == str(path):
                fdinfo = Path(f"/proc/self/fdinfo/{descriptor}").read_text()
                offset: int = int(fdinfo.split("pos:")[1].split()[0])
                return offset
        except OSError:
            continue
    raise AssertionError(f"{path} is not open")


def bounded_prefix_bytes(path: Path) -> int:
    if path.suffix == ".parquet":
        first_groups = range(PARQUET_ROW_GROUPS_READ_AHEAD)
        metadata = pq.ParquetFile(path).metadata
        row_group_bytes: int = sum(metadata.row_group(group).total_byte_size for group in first_groups)
        return READ_BUFFER_BYTES + row_group_bytes
    return READ_BUFFER_BYTES


@needs_proc
def test_the_first_prompt_of_a_large_file_arrives_after_reading_a_bounded_prefix(large_file: Path) -> None:
    prompts = iter_prompts(str(large_file))
    first = next(prompts)
    assert first.row == 1
    bound = bounded_prefix_bytes(large_file)
    assert file_offset_of(large_file) <= bound < large_file.stat().st_size // 4
    prompts.close()


def test_peak_memory_stays_flat_while_the_rest_of_a_large_file_is_read(large_file: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", MEMORY_PROFILE_SCRIPT, str(large_file), str(ROW_COUNT)],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "ARROW_DEFAULT_MEMORY_POOL": "jemalloc"},
        capture_output=True,
        text=True,
        check=True,
    )
    count, late_growth_kib, arrow_peak_kib = map(int, result.stdout.split())
    assert count == ROW_COUNT
    file_kib = large_file.stat().st_size // KIB
    assert late_growth_kib < file_kib * MAX_LATE_GROWTH_SHARE_OF_FILE, (late_growth_kib, file_kib)
    assert arrow_peak_kib < file_kib * MAX_ARROW_PEAK_SHARE_OF_FILE, (arrow_peak_kib, file_kib)
