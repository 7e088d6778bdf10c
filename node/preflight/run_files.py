"""A run's own files for preflight: `--config run.toml` and `--prompts DATA`, read as `enqueue` reads them.

The reading is the same code `enqueue` runs (core/run_settings/ and intake/reading.py), so a verdict on
these files is a verdict on what the run will send; its refusals become option errors here.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from core.errors import SettingsRefused
from core.records import SamplingSettings
from core.run_settings.layers import read_toml, stated_settings
from intake.errors import SourceError
from intake.rejected import RejectedRow
from node.errors import OptionError
from node.preflight.prompts import PreflightPrompt


def run_sampling(config: Path | None, options: Mapping[str, Any]) -> SamplingSettings:
    """The sampling `enqueue` would pin for a new run: defaults, then the file, then the options given."""
    try:
        file_values = {} if config is None else read_toml(config)
        return stated_settings(file_values, options, file_label=str(config)).sampling()
    except SettingsRefused as error:
        raise OptionError(str(error)) from error


def run_prompts(data: str, count: int) -> list[PreflightPrompt]:
    """The first `count` usable prompts of DATA (a rejected row is skipped with a line on stderr)."""
    from intake.reading import iter_prompts  # pyarrow loads only when a file is read, not for --help

    prompts: list[PreflightPrompt] = []
    try:
        items = iter_prompts(data)
        with contextlib.closing(items):  # closing the generator releases the file or connection
            for item in items:
                if isinstance(item, RejectedRow):
                    print(f"--prompts: skipping {item.describe()}", file=sys.stderr)
                    continue
                prompts.append(PreflightPrompt(item.place(), item.messages))
                if len(prompts) == count:
                    break
    except SourceError as error:
        raise OptionError(f"--prompts {data}: {error}") from error
    if not prompts:
        raise OptionError(f"--prompts {data} holds no usable prompt")
    return prompts
