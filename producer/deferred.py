"""Command handlers imported when they run: a command pays only for its own imports at start-up."""

from __future__ import annotations

import argparse
import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from producer.settings import ProducerSettings


@dataclass(frozen=True)
class Deferred:
    """`handler` of a sub-command parser: `module.function(args, settings)`, imported on the call."""

    module: str
    function: str

    def __call__(self, args: argparse.Namespace, settings: ProducerSettings) -> int:
        handler = getattr(importlib.import_module(self.module), self.function)
        return int(handler(args, settings))
