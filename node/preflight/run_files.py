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
from core.run_settings.layers import read_toml, resolve, stated_settings
from core.run_settings.model import RunSettings
from intake.errors import SourceError
from intake.rejected import RejectedRow
from intake.row_fields import RowFields
from node.errors import OptionError
from node.preflight.prompts import PreflightPrompt

PREFLIGHT_RUN = "preflight"  # the name the settings are resolved under; nothing of it is pinned
NO_OUTPUT = ""  # preflight writes no output


def run_settings(config: Path | None, options: Mapping[str, Any]) -> RunSettings:
    """The settings `enqueue` would pin for a new run: defaults, then the file, then the options given
    (its output aside: preflight writes nothing)."""
    try:
        file_values = {} if config is None else read_toml(config)
        stated = stated_settings(file_values, options, file_label=str(config))
        return resolve(PREFLIGHT_RUN, pinned=None, stated=stated, new_run_output=NO_OUTPUT)
    except SettingsRefused as error:
        raise OptionError(str(error)) from error


def run_prompts(data: str, count: int, fields: RowFields) -> list[PreflightPrompt]:
    """The first `count` usable prompts of DATA, its rows read as the run reads them (a rejected row is
    skipped with a line on stderr)."""
    from intake.reading import iter_prompts  # pyarrow loads only when a file is read, not for --help

    prompts: list[PreflightPrompt] = []
    try:
        items = iter_prompts(data, fields=fields)
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
