"""A run's own files for preflight: `--config run.toml` and `--prompts DATA`, read by the producer.

The producer reads those files for `enqueue` (its settings layering, its JSONL/Parquet/S3 readers);
preflight must read them the same way, yet the GPU-node tools sit below the producer and import none
of it. So the producer registers its readers under the entry point group below (pyproject.toml), and
preflight finds them there only when a file is given.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Protocol, cast

from inference.node.errors import OptionError
from inference.node.preflight.prompts import PreflightPrompt
from inference.records import SamplingSettings

RUN_FILES_GROUP = "draftgen.run_files"


class RunFiles(Protocol):
    """Reads what a run reads. Both raise OptionError naming the option and the reason."""

    def sampling(self, config: Path, options: Mapping[str, Any]) -> SamplingSettings:
        """The settings enqueue would pin: defaults, then the file, then the options given."""
        ...

    def prompts(self, data: str, count: int) -> list[PreflightPrompt]:
        """The first `count` usable prompts of DATA (rejected rows are skipped with a line on stderr)."""
        ...


def registered_run_files() -> RunFiles:
    found = sorted(entry_points(group=RUN_FILES_GROUP), key=lambda point: point.name)
    if not found:
        raise OptionError(
            "--config and --prompts are read by draftgen's producer, which is not installed with this "
            "copy of the node tools: install the draftgen package (pip install -e /path/to/draftgen)"
        )
    return cast(RunFiles, found[0].load())
