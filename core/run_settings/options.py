"""The command-line options of a run's settings: the sampling ones shared by `producer enqueue` and
`inference preflight`, the rest `enqueue`'s. Each option is named by its key (keys.py) and stores under the
key's name, so what a parser read is `stated_options(args, names)` as it stands; all default to None
(unstated)."""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from core.records import Turns
from core.run_settings.keys import COLUMN_NAMES, KEYS, SAMPLING_NAMES
from core.run_settings.model import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_OUTPUT_ROOT,
    KEEP_ALL_COLUMNS,
    QualityGate,
    TruncationPolicy,
)

GATE = QualityGate()
LIST_SEPARATOR = ","
ROLE_SEPARATOR = "="


def _add(group: argparse._ArgumentGroup, name: str, **options: Any) -> None:
    group.add_argument(KEYS[name].flag, dest=name, **options)


def add_sampling_options(
    parser: argparse.ArgumentParser, *, title: str, thinking_help: str, seed_help: str
) -> argparse._ArgumentGroup:
    """`--config` and one option per sampling setting."""
    group = parser.add_argument_group(title)
    group.add_argument("--config", type=Path, help="the run's TOML file (options override it)")
    _add(group, "model", help="model name sent in every request (the server's served name)")
    _add(group, "temperature", type=float)
    _add(group, "top_p", type=float)
    _add(group, "top_k", type=int)
    _add(group, "min_p", type=float)
    _add(group, "max_tokens", type=int, help="budget including thinking")
    _add(group, "enable_thinking", action=argparse.BooleanOptionalAction, default=None, help=thinking_help)
    _add(group, "seed", type=int, help=seed_help)
    return group


def add_run_options(parser: argparse.ArgumentParser) -> None:
    """Every setting a run pins: the sampling ones, the batch, the output, turns, the dataset's columns
    and the data quality policy."""
    group = add_sampling_options(
        parser,
        title="generation settings (pinned at the run's first enqueue)",
        thinking_help="chat_template_kwargs.enable_thinking (default on)",
        seed_help="recorded; SGLang honours it only with deterministic inference",
    )
    _add(
        group,
        "batch_size",
        type=int,
        help="requests per message: prompts, a conversation counting its turns "
        f"(default {DEFAULT_BATCH_SIZE})",
    )
    _add(
        group,
        "output",
        help="the run's own s3://bucket/prefix or folder, no other run's and none inside one "
        f"(default {DEFAULT_OUTPUT_ROOT}/RUN, or $DRAFTGEN_OUTPUT/RUN)",
    )
    _add(
        group,
        "turns",
        choices=[turns.value for turns in Turns],
        help="conversations: all (default) regenerates every assistant turn in order, each request "
        "holding the answers regenerated before it; last answers only the last user turn, the history "
        "as the dataset gives it",
    )
    add_column_options(parser)
    quality = parser.add_argument_group("data quality (pinned too)")
    _add(
        quality,
        "truncated_thinking",
        choices=[policy.value for policy in TruncationPolicy],
        help="completions whose thinking hit max_tokens: keep (default), drop (dead-letter), "
        "or retry with double the budget up to --retry-max-tokens-cap",
    )
    _add(quality, "retry_max_tokens_cap", type=int)
    _add(
        quality,
        "gate_min_completions",
        type=int,
        help=f"judge after this many (default {GATE.min_completions})",
    )
    _add(
        quality,
        "gate_max_empty_answer_rate",
        type=float,
        help=f"pause above (default {GATE.max_empty_answer_rate})",
    )
    _add(
        quality,
        "gate_max_truncated_rate",
        type=float,
        help=f"pause above (default {GATE.max_truncated_rate})",
    )


def add_column_options(parser: argparse.ArgumentParser) -> None:
    """The options that say how a row of the dataset is read (its columns, its chat shape)."""
    columns = parser.add_argument_group(
        "your dataset's columns (pinned; default: messages or conversations, else prompt; system; "
        "id, custom_id or uuid)"
    )
    _add(columns, "prompt_field", metavar="NAME", help="the column of one user prompt's text")
    _add(
        columns,
        "messages_field",
        metavar="NAME",
        help="the column of a list of turns ({role, content} or ShareGPT {from, value})",
    )
    _add(columns, "system_field", metavar="NAME", help="a system prompt's")
    _add(columns, "id_field", metavar="NAME", help="each row's own id's")
    _add(
        columns,
        "turn_keys",
        metavar="ROLE,TEXT",
        type=turn_keys_option,
        help="a turn's role key and text key, e.g. speaker,text (default: role,content or from,value)",
    )
    _add(
        columns,
        "roles",
        metavar="NAME=ROLE,...",
        type=roles_option,
        help="your role names, e.g. human=user,bot=assistant (each stands for system, user or assistant)",
    )
    _add(
        columns,
        "keep_columns",
        metavar="NAME,...",
        type=kept_columns_option,
        help="columns each completion keeps as they are (its Parquet `columns`, every export's rows), e.g. "
        f"lang,source; {KEEP_ALL_COLUMNS!r} keeps every column but the prompt's and the id's",
    )


def turn_keys_option(text: str) -> list[str]:
    """`speaker,text` -> the role's key and the text's key."""
    keys = [key.strip() for key in text.split(LIST_SEPARATOR)]
    if len(keys) != len(("role", "text")) or not all(keys):
        raise argparse.ArgumentTypeError(f"{text!r}: must be ROLE_KEY,TEXT_KEY (e.g. speaker,text)")
    return keys


def kept_columns_option(text: str) -> list[str]:
    """`lang,source` -> the column names; `*` alone keeps every column."""
    names = [name.strip() for name in text.split(LIST_SEPARATOR)]
    if not all(names):
        raise argparse.ArgumentTypeError(f"{text!r}: must be NAME,NAME,... (e.g. lang,source) or '*'")
    return names


def roles_option(text: str) -> dict[str, str]:
    """`human=user,bot=assistant` -> each of the dataset's role names and the role it stands for."""
    roles: dict[str, str] = {}
    for pair in text.split(LIST_SEPARATOR):
        name, equals, role = (part.strip() for part in pair.partition(ROLE_SEPARATOR))
        if not equals or not name or not role:
            raise argparse.ArgumentTypeError(f"{pair!r}: must be NAME=ROLE (e.g. human=user,bot=assistant)")
        roles[name] = role
    return roles


def stated_options(args: argparse.Namespace, names: Iterable[str] = KEYS) -> dict[str, Any]:
    """The settings a parser read, by name (None where the option was not given)."""
    return {name: getattr(args, name) for name in names}


def stated_reading_options(args: argparse.Namespace) -> dict[str, Any]:
    """What `add_sampling_options` and `add_column_options` read: how rows are read and answered."""
    return stated_options(args, (*SAMPLING_NAMES, *COLUMN_NAMES))
