"""`python -m node preflight --url URL [run settings]`: a few real completions, a verdict, advice.

The sampling options are the ones `python -m producer enqueue` takes (and `--config run.toml` is read
the same way), so the settings checked here are the settings the run will use.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from collections.abc import Iterable
from itertools import cycle, islice
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from core.exit_codes import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from core.records import SamplingSettings
from core.run_settings.model import RunSettings
from core.run_settings.options import add_column_options, add_sampling_options, stated_reading_options
from inference.client_settings import DEFAULT_REQUEST_TIMEOUT_S
from intake.row_fields import RowFields
from node.errors import OptionError
from node.preflight.judging import Level, Verdict
from node.preflight.outcomes import PromptOutcome
from node.preflight.prompts import BUILTIN_PROMPTS, DEFAULT_PROMPT_COUNT, PreflightPrompt
from node.preflight.report import PreflightReport, report_to_json
from node.preflight.run_files import run_prompts, run_settings
from node.settings import DEFAULT_API_KEY_ENV, read_api_key

REPORT_WIDTH_COLUMNS = 120
"""Width of the report when stdout is not a terminal (a file, a pipe, CI logs)."""
QUIET_LOGGERS = ("httpx", "httpcore", "openai")
"""They log every request at INFO; the report already shows each one."""

LEVEL_STYLES = {Level.FAIL: "bold red", Level.WARN: "yellow", Level.NOTE: "cyan"}
VERDICT_STYLES = {
    Verdict.FAIL: "bold white on red",
    Verdict.WARN: "bold black on yellow",
    Verdict.PASS: "bold white on green",
}

PREFLIGHT_EPILOG = f"""examples:
  python -m node preflight --url http://127.0.0.1:30000
  python -m node preflight --url http://127.0.0.1:30000 --model Qwen3.6-27B --max-tokens 32768
  python -m node preflight --url http://gpu-3:30000 --config run.toml --prompts prompts.jsonl --json

Sends {DEFAULT_PROMPT_COUNT} varied prompts (math, code, explanation, multi-turn) at once, or the first
--count of --prompts, with exactly the settings a run sends, and judges the answers: reasoning
present when thinking is on, answers non-empty, finish reasons, <think> tags in answers, output
tokens/s and speculative accept length. Exit 0 on PASS or WARN, 1 on FAIL, 2 on a usage error.
The API key is read from ${DEFAULT_API_KEY_ENV} (or --api-key-env NAME, or --api-key-file PATH)."""


def register_preflight(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "preflight",
        help="send a few real prompts with a run's settings and judge the answers",
        epilog=PREFLIGHT_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--url", required=True, help="the server, e.g. http://127.0.0.1:30000 (no /v1)")
    parser.add_argument(
        "--prompts",
        metavar="DATA",
        help="prompts to send instead of the built-in set: JSONL/Parquet file or folder, or s3://...",
    )
    parser.add_argument(
        "--count", type=int, default=DEFAULT_PROMPT_COUNT, help="prompts sent at once (%(default)s)"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_REQUEST_TIMEOUT_S,
        help="seconds per request; a 32k-token thinking trace takes minutes (%(default)s)",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON for scripts")
    _add_sampling_arguments(parser)
    parser.add_argument(
        "--api-key-env",
        default=DEFAULT_API_KEY_ENV,
        help="environment variable holding the API key (%(default)s)",
    )
    parser.add_argument("--api-key-file", type=Path, help="file holding the API key (wins over the variable)")
    parser.set_defaults(handler=preflight_command)


def _add_sampling_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `python -m producer enqueue`, with the same names and meanings."""
    add_sampling_options(
        parser,
        title="run settings (as for `python -m producer enqueue`)",
        thinking_help="chat_template_kwargs.enable_thinking (default on); off expects no reasoning",
        seed_help="sent as the run sends it",
    )
    add_column_options(parser)


def settings_from_args(args: argparse.Namespace) -> RunSettings:
    """Defaults, then the TOML file, then the options: the layering `enqueue` uses for a new run."""
    return run_settings(args.config, stated_reading_options(args))


def sampling_from_args(args: argparse.Namespace) -> SamplingSettings:
    return settings_from_args(args).sampling


def prompts_from_args(args: argparse.Namespace, settings: RunSettings) -> list[PreflightPrompt]:
    """The built-in prompts, or the first of --prompts read with the run's columns and chat shape."""
    if args.count < 1:
        raise OptionError(f"--count must be at least 1, got {args.count}")
    if args.prompts is None:
        return _builtin_prompts(args.count)
    return run_prompts(args.prompts, args.count, RowFields.of(settings))


def _builtin_prompts(count: int) -> list[PreflightPrompt]:
    """The built-in set, repeated under new names when more are asked for than it holds."""
    chosen = list(islice(cycle(BUILTIN_PROMPTS), count))
    return [
        prompt
        if index < len(BUILTIN_PROMPTS)
        else PreflightPrompt(f"{prompt.name} #{index // len(BUILTIN_PROMPTS) + 1}", prompt.messages)
        for index, prompt in enumerate(chosen)
    ]


def preflight_command(args: argparse.Namespace) -> int:
    try:
        settings = settings_from_args(args)
        sampling = settings.sampling
        prompts = prompts_from_args(args, settings)
        api_key = read_api_key(args.api_key_env, args.api_key_file, os.environ)
    except OptionError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_USAGE
    if args.timeout <= 0:
        print(f"error: --timeout {args.timeout} must be more than 0 seconds", file=sys.stderr)
        return EXIT_USAGE
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    from node.preflight.run import run_preflight  # openai: only when asking a server

    report = asyncio.run(
        run_preflight(args.url, prompts, sampling, api_key=api_key, request_timeout_s=args.timeout)
    )
    if args.json:
        print(json.dumps(report_to_json(report), indent=2))
    else:
        console = Console()
        if not console.is_terminal:
            console.width = REPORT_WIDTH_COLUMNS
        render_report(report, console)
    return EXIT_FAILED if report.verdict is Verdict.FAIL else EXIT_OK


def render_report(report: PreflightReport, console: Console) -> None:
    """The table of prompts, the totals, every finding with its advice, and the verdict."""
    sampling = report.sampling
    console.print(
        f"Preflight of {report.url}: {report.totals.prompts} prompts at once, model '{sampling.model}'\n"
        f"thinking {'on' if sampling.enable_thinking else 'off'}, max_tokens {sampling.max_tokens}, "
        f"temperature {sampling.temperature}, top_p {sampling.top_p}, top_k {sampling.top_k}, "
        f"min_p {sampling.min_p}",
        highlight=False,
    )
    console.print(_outcome_table(report.outcomes))
    for line in _total_lines(report):
        console.print(line, highlight=False)
    for finding in report.findings:
        console.print(
            Text.assemble((f"{finding.level.value} ", LEVEL_STYLES[finding.level]), finding.problem)
        )
        console.print(Text(f"     → {finding.advice}"))
    verdict = report.verdict
    console.print(
        Text.assemble("Verdict: ", (f" {verdict.value} ", VERDICT_STYLES[verdict]), " ", _summary(report))
    )


def _outcome_table(outcomes: Iterable[PromptOutcome]) -> Table:
    table = Table(show_edge=False, pad_edge=False)
    for header in ("#", "prompt", "finish", "quality"):
        table.add_column(header, no_wrap=True)
    for header in ("reasoning\ntokens", "output\ntokens", "answer\nchars", "latency\ns", "accept\nlength"):
        table.add_column(header, justify="right", no_wrap=True)
    for number, outcome in enumerate(outcomes, start=1):
        if not outcome.answered:
            status = "no answer" if outcome.error_status is None else f"HTTP {outcome.error_status}"
            table.add_row(str(number), outcome.name, Text("error", "red"), status, "", "", "", "", "")
            continue
        quality = str(outcome.quality)
        table.add_row(
            str(number),
            outcome.name,
            str(outcome.finish_reason),
            Text(quality, "green" if quality == "ok" else "yellow"),
            f"{outcome.reasoning_tokens:,}",
            f"{outcome.completion_tokens:,}",
            f"{len(outcome.content):,}",
            f"{outcome.latency_s:.2f}",
            "" if outcome.spec_accept_length is None else f"{outcome.spec_accept_length:.2f}",
        )
    return table


def _total_lines(report: PreflightReport) -> list[str]:
    totals, server = report.totals, report.server
    finishes = ", ".join(f"{reason} {count}" for reason, count in sorted(totals.finish_reasons.items()))
    qualities = ", ".join(f"{quality} {count}" for quality, count in sorted(totals.qualities.items()))
    responses = "n/a" if totals.accept_length_tokens is None else f"{totals.accept_length_tokens:.2f}"
    average = "n/a" if server.avg_spec_accept_length is None else f"{server.avg_spec_accept_length:.2f}"
    lines = [
        f"answered {totals.answered} of {totals.prompts}; "
        f"finish: {finishes or '-'}; quality: {qualities or '-'}",
        f"tokens: {totals.completion_tokens:,} output, {totals.reasoning_tokens:,} of them reasoning",
        f"throughput: {totals.output_tokens_per_s:,.0f} output tokens/s over {totals.wall_s:.2f} s "
        f"with {totals.prompts} in flight (not the server's capacity)",
        f"speculative accept length: {responses} tokens/step in these responses, {average} in /server_info",
        f"server: speculative algorithm {server.speculative_algorithm or 'none reported'}, "
        f"reasoning parser {server.reasoning_parser or 'none reported'}",
    ]
    if server.error is not None:
        lines.append(f"server info unavailable: {server.error}")
    return lines


def _summary(report: PreflightReport) -> str:
    if report.verdict is Verdict.PASS:
        return "the settings give usable completions: start the run with the same options"
    counts = {
        level: sum(1 for f in report.findings if f.level is level) for level in (Level.FAIL, Level.WARN)
    }
    parts = [f"{count} {level.value}" for level, count in counts.items() if count]
    action = "fix these before starting the run" if report.verdict is Verdict.FAIL else "read the warnings"
    return f"{', '.join(parts)}: {action}"
