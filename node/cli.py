"""`serve`, `stage` and `wait`: parse at the edge, build settings, call the library, map errors to exits."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import Any

from core.addresses import is_loopback
from core.command_line import commands_parser, run_command
from core.exit_codes import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from inference.errors import ServerNotReady
from inference.readiness import (
    DEFAULT_PROBE_INTERVAL_S,
    DEFAULT_READY_TIMEOUT_S,
    Probe,
    ReadinessTarget,
    wait_until_ready,
)
from node.command import build_commands
from node.errors import NodeError, OptionError, ServerExited
from node.launcher import StopRequest, run_fleet, stop_on_signals
from node.model_sources import open_source
from node.preflight_cli import register_preflight
from node.progress import RichStageProgress
from node.settings import (
    DEFAULT_API_KEY_ENV,
    DEFAULT_BASE_PORT,
    DEFAULT_CONTEXT_LENGTH_TOKENS,
    DEFAULT_HOST,
    DEFAULT_LOG_DIR,
    DEFAULT_MAX_RUNNING_REQUESTS,
    DEFAULT_MEM_FRACTION_STATIC,
    DEFAULT_REASONING_PARSER,
    DEFAULT_SPECULATIVE_EAGLE_TOPK,
    DEFAULT_SPECULATIVE_NUM_DRAFT_TOKENS,
    DEFAULT_SPECULATIVE_NUM_STEPS,
    DEFAULT_STREAM_INTERVAL_TOKENS,
    SGLANG_EXECUTABLE,
    ServeSettings,
    SpeculativeAlgorithm,
    SpeculativeSettings,
    default_served_model_name,
    parse_gpus,
    read_api_key,
    sibling_executable,
)
from node.staging import default_destination, stage_model
from node.units import human_bytes

logger = logging.getLogger(__name__)

EXIT_SERVER_EXITED = 3  # a server died while serving or loading
EXIT_NOT_READY = 4  # a server did not generate before the readiness timeout

ENV_MODEL_PATH = "DRAFTGEN_MODEL_PATH"
ENV_SERVED_MODEL_NAME = "DRAFTGEN_SERVED_MODEL_NAME"
ENV_BASE_PORT = "DRAFTGEN_BASE_PORT"
ENV_HOST = "DRAFTGEN_SGLANG_HOST"
ENV_MAX_RUNNING_REQUESTS = "DRAFTGEN_MAX_IN_FLIGHT"
"""The generate worker's in-flight window: the server's slots and the worker's window stay equal."""

SERVE_EPILOG = f"""examples:
  python -m node serve --model-path /dev/shm/Qwen3.6-27B --gpus 0-6 --dry-run
  python -m node serve --gpu 3                    # one GPU, as the systemd unit runs it
  python -m node serve --gpus 0,1 -- --log-requests --cuda-graph-max-bs-decode 64

Options fall back to ${ENV_MODEL_PATH}, ${ENV_SERVED_MODEL_NAME}, ${ENV_BASE_PORT}, ${ENV_HOST}
and ${ENV_MAX_RUNNING_REQUESTS} (for --max-running-requests). Flags after '--' go to SGLang verbatim.
The API key is read from ${DEFAULT_API_KEY_ENV} (or --api-key-env NAME, or --api-key-file PATH)
and never printed."""


def register(subparsers: Any) -> None:
    serve = subparsers.add_parser(
        "serve",
        help="start one SGLang server per GPU",
        epilog=SERVE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_serve_arguments(serve)
    serve.set_defaults(handler=serve_command)

    stage = subparsers.add_parser("stage", help="copy a model folder (local or s3://) to fast local storage")
    stage.add_argument("source", metavar="SRC", help="a local folder or s3://bucket/prefix")
    stage.add_argument(
        "destination",
        metavar="DEST",
        nargs="?",
        type=Path,
        help="where to put it (default: /dev/shm/<name of SRC>)",
    )
    stage.set_defaults(handler=stage_command)

    wait = subparsers.add_parser("wait", help="wait until an SGLang server generates")
    wait.add_argument("--url", required=True, help="the server, e.g. http://127.0.0.1:30000")
    wait.add_argument("--timeout", type=float, default=DEFAULT_READY_TIMEOUT_S, help="seconds (%(default)s)")
    wait.add_argument(
        "--interval",
        type=float,
        default=DEFAULT_PROBE_INTERVAL_S,
        help="seconds between probes (%(default)s)",
    )
    wait.add_argument("--log", type=Path, help="the server's log, whose tail is shown if it never gets ready")
    wait.add_argument("--model", default="default", help="the model name to send (SGLang does not check it)")
    _add_api_key_arguments(wait)
    wait.set_defaults(handler=wait_command)
    register_preflight(subparsers)


def _add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    env = os.environ
    parser.add_argument("--model-path", default=env.get(ENV_MODEL_PATH, ""), help="the staged model folder")
    parser.add_argument(
        "--served-model-name", default=env.get(ENV_SERVED_MODEL_NAME), help="default: the model folder's name"
    )
    parser.add_argument("--gpus", "--gpu", dest="gpus", default="0", help="e.g. 0-6 or 0,2,5 (%(default)s)")
    parser.add_argument(
        "--base-port",
        type=int,
        default=env.get(ENV_BASE_PORT, str(DEFAULT_BASE_PORT)),  # a str default goes through type=int
        help="GPU i listens on base+i (%(default)s)",
    )
    parser.add_argument("--host", default=env.get(ENV_HOST, DEFAULT_HOST), help="(%(default)s)")
    parser.add_argument("--reasoning-parser", default=DEFAULT_REASONING_PARSER, help="(%(default)s)")
    parser.add_argument(
        "--speculative-algorithm",
        type=str.upper,
        choices=[algorithm.value for algorithm in SpeculativeAlgorithm],
        default=SpeculativeAlgorithm.NEXTN.value,
        help="how SGLang runs the model's MTP heads; SGLang rejects 'MTP' itself (%(default)s)",
    )
    parser.add_argument("--speculative-num-steps", type=int, default=DEFAULT_SPECULATIVE_NUM_STEPS)
    parser.add_argument("--speculative-eagle-topk", type=int, default=DEFAULT_SPECULATIVE_EAGLE_TOPK)
    parser.add_argument(
        "--speculative-num-draft-tokens", type=int, default=DEFAULT_SPECULATIVE_NUM_DRAFT_TOKENS
    )
    parser.add_argument(
        "--speculative-draft-model-path", help="only if SGLang cannot find the MTP heads itself"
    )
    parser.add_argument("--no-speculative", action="store_true", help="serve without speculative decoding")
    parser.add_argument(
        "--context-length", type=int, default=DEFAULT_CONTEXT_LENGTH_TOKENS, help="tokens (%(default)s)"
    )
    parser.add_argument(
        "--max-running-requests",
        type=int,
        default=env.get(ENV_MAX_RUNNING_REQUESTS, str(DEFAULT_MAX_RUNNING_REQUESTS)),
        help="(%(default)s)",
    )
    parser.add_argument(
        "--mem-fraction-static", type=float, default=DEFAULT_MEM_FRACTION_STATIC, help="(%(default)s)"
    )
    parser.add_argument(
        "--stream-interval",
        type=int,
        default=DEFAULT_STREAM_INTERVAL_TOKENS,
        help="SGLang's --stream-interval: a streamed request's output goes out in chunks of at least this "
        "many tokens, and at once when it ends (%(default)s; SGLang's own default 1 sends every step)",
    )
    _add_api_key_arguments(parser)
    parser.add_argument(
        "--log-dir", type=Path, default=DEFAULT_LOG_DIR, help="one sglang-gpu<i>.log per GPU (%(default)s)"
    )
    parser.add_argument(
        "--sglang-executable",
        default=sibling_executable(SGLANG_EXECUTABLE, sys.executable),
        help="(%(default)s)",
    )
    parser.add_argument("--dry-run", action="store_true", help="print the command lines and exit")
    parser.add_argument("--no-wait", action="store_true", help="do not wait until every server generates")
    parser.add_argument(
        "--ready-timeout", type=float, default=DEFAULT_READY_TIMEOUT_S, help="seconds (%(default)s)"
    )
    parser.add_argument(
        "sglang_args", nargs="*", metavar="-- SGLANG_FLAG", help="flags passed to SGLang verbatim, after '--'"
    )


def _add_api_key_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--api-key-env",
        default=DEFAULT_API_KEY_ENV,
        help="environment variable holding the API key (%(default)s)",
    )
    parser.add_argument("--api-key-file", type=Path, help="file holding the API key (wins over the variable)")


def settings_from_args(args: argparse.Namespace) -> ServeSettings:
    speculative = None
    if not args.no_speculative:
        speculative = SpeculativeSettings(
            algorithm=SpeculativeAlgorithm(args.speculative_algorithm),
            num_steps=args.speculative_num_steps,
            eagle_topk=args.speculative_eagle_topk,
            num_draft_tokens=args.speculative_num_draft_tokens,
            draft_model_path=args.speculative_draft_model_path,
        )
    return ServeSettings(
        model_path=args.model_path,
        served_model_name=args.served_model_name or default_served_model_name(args.model_path),
        gpus=parse_gpus(args.gpus),
        base_port=args.base_port,
        host=args.host,
        reasoning_parser=args.reasoning_parser,
        speculative=speculative,
        context_length_tokens=args.context_length,
        max_running_requests=args.max_running_requests,
        mem_fraction_static=args.mem_fraction_static,
        stream_interval_tokens=args.stream_interval,
        api_key=read_api_key(args.api_key_env, args.api_key_file, os.environ),
        log_dir=args.log_dir,
        sglang_executable=args.sglang_executable,
        extra_args=tuple(args.sglang_args),
        ready_timeout_s=args.ready_timeout,
    )


def wide_bind_warning(host: str, api_key: str | None) -> str | None:
    """What to say when the servers listen beyond this machine with no API key: anyone who reaches them
    generates on the fleet's GPUs, and reads /server_info."""
    if api_key or is_loopback(host):
        return None
    return (
        f"the servers listen on {host or 'every interface'} without an API key: anyone who reaches them can "
        "use the GPUs; give --api-key-env or --api-key-file (or bind 127.0.0.1)"
    )


def serve_command(args: argparse.Namespace) -> int:
    try:
        settings = settings_from_args(args)
        commands = build_commands(settings)
    except OptionError as error:
        return _fail(error, EXIT_USAGE)
    warning = wide_bind_warning(settings.host, settings.api_key)
    if warning is not None:
        print(f"warning: {warning}", file=sys.stderr)
    if args.dry_run:
        for command in commands:
            print(command.render())
        return EXIT_OK
    stop = StopRequest()
    try:
        with stop_on_signals(stop):
            run_fleet(
                commands,
                stop=stop,
                wait_ready=not args.no_wait,
                model=settings.served_model_name,
                api_key=settings.api_key,
                ready_timeout_s=settings.ready_timeout_s,
                observer=_StageLogger(),
            )
    except ServerExited as error:
        return _fail(error, EXIT_SERVER_EXITED)
    except ServerNotReady as error:
        return _fail(error, EXIT_NOT_READY)
    except NodeError as error:
        return _fail(error, EXIT_FAILED)
    return EXIT_OK


def stage_command(args: argparse.Namespace) -> int:
    try:
        source = open_source(args.source)
        destination = args.destination or default_destination(source)
        report = stage_model(source, destination, progress=RichStageProgress(f"staging {source.name}"))
    except NodeError as error:
        return _fail(error, EXIT_FAILED)
    print(
        f"{report.destination}: {len(report.copied)} files copied ({human_bytes(report.bytes_copied)}), "
        f"{len(report.skipped)} already there, all verified"
    )
    return EXIT_OK


def wait_command(args: argparse.Namespace) -> int:
    try:
        target = ReadinessTarget(
            url=args.url,
            model=args.model,
            api_key=read_api_key(args.api_key_env, args.api_key_file, os.environ),
            log_path=args.log,
        )
        probe = wait_until_ready(
            target, timeout_s=args.timeout, interval_s=args.interval, observer=_StageLogger()
        )
    except ServerNotReady as error:
        return _fail(error, EXIT_NOT_READY)
    except NodeError as error:
        return _fail(error, EXIT_USAGE if isinstance(error, OptionError) else EXIT_FAILED)
    print(f"{probe.url} is ready: {probe.detail}")
    return EXIT_OK


class _StageLogger:
    """Logs each server's progress once per stage rather than once per probe."""

    def __init__(self) -> None:
        self.last: dict[str, str] = {}

    def __call__(self, probe: Probe) -> None:
        if self.last.get(probe.url) != probe.stage:
            self.last[probe.url] = probe.stage
            logger.info("%s: %s %s", probe.url, probe.stage.value, probe.detail)


def _fail(error: NodeError | ServerNotReady, exit_code: int) -> int:
    print(f"error: {error}", file=sys.stderr)
    return exit_code


DESCRIPTION = "The tools a GPU node runs around SGLang: stage the model, serve it, wait for it, judge a run."
EPILOG = """on a GPU node, in order:
  python -m node stage s3://bucket/models/Qwen3.6-27B              # to /dev/shm, verified, resumable
  python -m node serve --model-path /dev/shm/Qwen3.6-27B --gpus 0-6  # one server per GPU, until ready
  python -m node wait --url http://127.0.0.1:30000                  # a server started some other way
  python -m node preflight --url http://127.0.0.1:30000 --max-tokens 32768  # a verdict before the run
without a GPU, `python -m inference simulate --port 30000` stands in for SGLang.
docs/gpu-nodes.md and docs/simulator.md tell more.
"""


def build_parser() -> argparse.ArgumentParser:
    parser, subparsers = commands_parser("python -m node", DESCRIPTION, EPILOG)
    register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """`python -m node <command>`."""
    return run_command(build_parser(), argv)
