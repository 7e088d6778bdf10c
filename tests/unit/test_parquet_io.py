"""Committed objects round-trip, and reading one never makes the process abort at exit."""

from __future__ import annotations

import subprocess
import sys

from devstack.local_stack import PROJECT_ROOT
from tests.support.records import completion
from workers.record.parquet_io import completions_to_parquet, prompt_ids_in, read_completions

EXIT_RUNS = 3
READ_AND_EXIT = """
from tests.support.records import completion
from workers.record.parquet_io import completions_to_parquet, prompt_ids_in
print(len(prompt_ids_in(completions_to_parquet([completion(f"p{i}") for i in range(500)]))))
"""


def test_completions_come_back_as_they_were_written() -> None:
    written = [completion("a", content="\n\nforty-two"), completion("b", size=3)]
    assert read_completions(completions_to_parquet(written)) == written
    assert prompt_ids_in(completions_to_parquet(written)) == ["a", "b"]


def test_a_process_that_read_an_object_exits_cleanly() -> None:
    # pyarrow 26 aborted at exit after a threaded read, which made `verify` fail at random
    for _ in range(EXIT_RUNS):
        result = subprocess.run(
            [sys.executable, "-c", READ_AND_EXIT],
            cwd=PROJECT_ROOT,
            capture_output=True,
            text=True,
            check=False,
        )
        assert (result.returncode, result.stdout.strip()) == (0, "500"), result.stderr
