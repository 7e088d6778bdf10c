"""Preflight's `--config` and `--prompts`, read exactly as `enqueue` reads them.

Registered for `python -m inference preflight` under the entry point group
`draftgen.run_files` (see inference/node/preflight/run_files.py): the node tools call in here only
when the user names a file.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from inference.node.errors import OptionError
from inference.node.preflight.prompts import PreflightPrompt
from inference.records import SamplingSettings
from producer.errors import SettingsError, SourceError
from producer.reading import iter_prompts
from producer.run_config import read_toml, resolve_run_settings
from workers.record.rejections import RejectedRow

PREFLIGHT_RUN_NAME = "preflight"
"""resolve_run_settings wants a run name; only its sampling part is used here."""


class ProducerRunFiles:
    def sampling(self, config: Path, options: Mapping[str, Any]) -> SamplingSettings:
        try:
            run = resolve_run_settings(
                PREFLIGHT_RUN_NAME,
                pinned=None,
                file_values=read_toml(config),
                option_values=options,
                file_label=str(config),
            )
        except SettingsError as error:
            raise OptionError(str(error)) from error
        return run.sampling

    def prompts(self, data: str, count: int) -> list[PreflightPrompt]:
        try:
            items = iter_prompts(data)
        except SourceError as error:
            raise OptionError(f"--prompts {data}: {error}") from error
        prompts: list[PreflightPrompt] = []
        with contextlib.closing(items):  # closing the generator releases the file or connection
            try:
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


RUN_FILES = ProducerRunFiles()
