"""The simulator's settings: one frozen dataclass, the only source of its command-line options.

Every field becomes the flag `--field-name` (as SGLang spells its flags). The argparse options
(`add_settings_arguments`) and the reverse mapping (`settings_to_argv`, used by the process helper)
are both derived from the dataclass fields, so the option list exists once.

Durations of the performance model are in *model* seconds (what a GPU would take) and are divided
by `--speedup`. The start-up phases (`--load-seconds`, `--warmup-seconds`) and the log/stream
cadences marked "wall" are wall-clock seconds and are not scaled.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from fractions import Fraction
from typing import Any

from inference.sglang_defaults import REFERENCE_MAX_RUNNING_REQUESTS, SGLANG_BASE_PORT
from inference.simulator.length_mix import LENGTH_MIX_CHOICES, SINGLE
from inference.simulator.prompt_faults import parse_prompt_faults

# Served model and server identity (SGLang 0.5.23 serving Qwen3.6-27B with MTP).
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = SGLANG_BASE_PORT
DEFAULT_MODEL_PATH = "Qwen/Qwen3.6-27B"
DEFAULT_CONTEXT_LENGTH_TOKENS = 262_144
DEFAULT_MAX_TOTAL_NUM_TOKENS = 1_048_576
DEFAULT_MAX_RUNNING_REQUESTS = REFERENCE_MAX_RUNNING_REQUESTS
DEFAULT_REASONING_PARSER = "qwen3"
REASONING_PARSER_CHOICES = ("qwen3", "qwen3-thinking", "none")

# Speculative decoding (NEXTN, auto-chosen (3, 1, 4) for Qwen) and the accept length it achieves.
DEFAULT_SPECULATIVE_NUM_STEPS = 3
DEFAULT_SPECULATIVE_EAGLE_TOPK = 1
DEFAULT_SPECULATIVE_NUM_DRAFT_TOKENS = 4
DEFAULT_ACCEPT_LENGTH_TOKENS = 3.5

# Throughput model, calibrated to a B200: 48 running -> ~2,300 output tokens/s, 1 running -> ~170.
DEFAULT_DECODE_STEP_BASE_S = 0.0195
DEFAULT_DECODE_STEP_PER_REQUEST_S = 0.0011
DEFAULT_PREFILL_BASE_S = 0.005
# Prefill is compute-bound: prompt tokens/s = MFU x peak FLOP/s / (2 x parameters). An H100 SXM gives
# 989 TFLOP/s dense BF16 (NVIDIA's H100 datasheet); at the ~55% MFU of a large prefill batch, a dense 27B
# model (54 GFLOP per token) prefills about 10,000 tokens/s. A B200 would be ~2x; the H100-class figure
# keeps the cost of an uncached prompt on the safe (dear) side.
DEFAULT_PREFILL_TOKENS_PER_S = 10_000.0
DEFAULT_PREFILL_PER_TOKEN_S = 1.0 / DEFAULT_PREFILL_TOKENS_PER_S
# SGLang's auto `--chunked-prefill-size` (memory_hook.py): 8192 on an H100 or H200, 16384 on a B200.
DEFAULT_CHUNKED_PREFILL_SIZE_TOKENS = 8192
DEFAULT_SPEEDUP = 1.0
DEFAULT_HEALTH_LATENCY_S = 1.0

# Thinking model: lognormal lengths, mean total near 2,300 tokens, a tail past 4,096.
DEFAULT_SEED = 0
DEFAULT_THINKING_TOKENS_MEAN = 1900.0
DEFAULT_THINKING_TOKENS_SIGMA = 0.6
DEFAULT_ANSWER_TOKENS_MEAN = 400.0
DEFAULT_ANSWER_TOKENS_SIGMA = 0.5

# Logging and streaming cadence (wall clock).
DEFAULT_DECODE_LOG_INTERVAL_STEPS = 40
DEFAULT_LOG_MIN_INTERVAL_WALL_S = 0.5
DEFAULT_STREAM_MIN_INTERVAL_WALL_S = 0.01
DEFAULT_STREAM_INTERVAL_TOKENS = 1  # SGLang's `--stream-interval` default: a chunk after every decode step
STREAM_CHUNKING_STEP = "step"  # SGLang's chunks, each its own (one per decode step at --stream-interval 1)
STREAM_CHUNKING_WALL = (
    "wall"  # SGLang's chunks, those of one write (one per --stream-min-interval-wall-s) merged
)
STREAM_CHUNKING_CHOICES = (STREAM_CHUNKING_STEP, STREAM_CHUNKING_WALL)

# Faults.
DEFAULT_ERROR_STATUS = 500
ERROR_STATUS_CHOICES = (500, 503)
DEFAULT_REQUEST_LOG_SIZE = 100_000


def _option(help_text: str, **extra: Any) -> Any:
    """A dataclass field default carrying its CLI help text."""
    default = extra.pop("default")
    return dataclasses.field(default=default, metadata={"help": help_text, **extra})


@dataclasses.dataclass(frozen=True, kw_only=True)
class SimulatorSettings:
    """Everything the simulator is configured with; built once from the CLI and passed down."""

    host: str = _option("Address to bind.", default=DEFAULT_HOST)
    port: int = _option("Port to bind.", default=DEFAULT_PORT)
    model_path: str = _option("Model path reported by the info routes.", default=DEFAULT_MODEL_PATH)
    served_model_name: str | None = _option("Served model name (default: the model path).", default=None)
    api_key: str | None = _option(
        "Require 'Authorization: Bearer KEY' (not on /health, /ready, /metrics).", default=None
    )
    enable_metrics: bool = _option("Mount /metrics (Prometheus text).", default=False)
    context_length: int = _option("Context length in tokens.", default=DEFAULT_CONTEXT_LENGTH_TOKENS)
    max_total_tokens: int = _option(
        "KV pool size in tokens (max_total_num_tokens).", default=DEFAULT_MAX_TOTAL_NUM_TOKENS
    )
    max_running_requests: int = _option(
        "Requests decoded at once; the rest wait in the queue.", default=DEFAULT_MAX_RUNNING_REQUESTS
    )
    max_queued_requests: int | None = _option(
        "Waiting-queue bound; beyond it 503 (default: unbounded).", default=None
    )
    reasoning_parser: str = _option(
        "qwen3 (thinking unless enable_thinking is false), qwen3-thinking "
        "(always thinks) or none (raw text in content).",
        default=DEFAULT_REASONING_PARSER,
        choices=REASONING_PARSER_CHOICES,
    )
    stream_response_default_include_usage: bool = _option(
        "Send the usage chunk on every stream.", default=False
    )
    speculative_num_steps: int = _option(
        "Speculative steps per verify.", default=DEFAULT_SPECULATIVE_NUM_STEPS
    )
    speculative_eagle_topk: int = _option("Speculative top-k.", default=DEFAULT_SPECULATIVE_EAGLE_TOPK)
    speculative_num_draft_tokens: int = _option(
        "Draft tokens per verify (incl. the bonus).", default=DEFAULT_SPECULATIVE_NUM_DRAFT_TOKENS
    )
    accept_length: float = _option(
        "Mean tokens per request per decode step.", default=DEFAULT_ACCEPT_LENGTH_TOKENS
    )
    decode_step_base_s: float = _option(
        "Decode step time, fixed part (model s).", default=DEFAULT_DECODE_STEP_BASE_S
    )
    decode_step_per_request_s: float = _option(
        "Decode step time added per running request (model s).", default=DEFAULT_DECODE_STEP_PER_REQUEST_S
    )
    prefill_base_s: float = _option(
        "Prefill batch time, fixed part (model s).", default=DEFAULT_PREFILL_BASE_S
    )
    prefill_per_token_s: float = _option(
        "Prefill time per prompt token not in the prefix cache (model s; 1e-4 is 10,000 tokens/s).",
        default=DEFAULT_PREFILL_PER_TOKEN_S,
    )
    chunked_prefill_size: int = _option(
        "Most new (uncached) prompt tokens in one prefill batch; a longer prompt is prefilled in chunks "
        "of this size, each a batch (SGLang's flag).",
        default=DEFAULT_CHUNKED_PREFILL_SIZE_TOKENS,
    )
    disable_radix_cache: bool = _option(
        "No prefix cache: every prompt is prefilled whole (SGLang's flag).", default=False
    )
    enable_cache_report: bool = _option(
        "Report usage.prompt_tokens_details.cached_tokens (SGLang's flag).", default=False
    )
    speedup: float = _option("Divide every model duration by this factor.", default=DEFAULT_SPEEDUP)
    health_latency_s: float = _option(
        "Latency of /health's one-token generation (model s).", default=DEFAULT_HEALTH_LATENCY_S
    )
    seed: int = _option(
        "Seed of the thinking model (outcomes depend on seed and messages only).", default=DEFAULT_SEED
    )
    length_mix: str = _option(
        "Output lengths: single (the four length options below) or reasoning (a heavy-tailed mix of "
        "long reasoning and short chat answers; see length_mix.py).",
        default=SINGLE,
        choices=LENGTH_MIX_CHOICES,
    )
    thinking_tokens_mean: float = _option(
        "Mean thinking length in tokens (lognormal).", default=DEFAULT_THINKING_TOKENS_MEAN
    )
    thinking_tokens_sigma: float = _option(
        "Lognormal sigma of the thinking length.", default=DEFAULT_THINKING_TOKENS_SIGMA
    )
    answer_tokens_mean: float = _option(
        "Mean answer length in tokens (lognormal).", default=DEFAULT_ANSWER_TOKENS_MEAN
    )
    answer_tokens_sigma: float = _option(
        "Lognormal sigma of the answer length.", default=DEFAULT_ANSWER_TOKENS_SIGMA
    )
    stop_in_thinking_rate: float = _option(
        "Fraction of thinking requests that end (EOS) inside thinking.", default=0.0
    )
    think_nothing_rate: float = _option(
        "Fraction of thinking requests whose think block is empty.", default=0.0
    )
    decode_log_interval: int = _option(
        "Decode steps between 'Decode batch' log lines.", default=DEFAULT_DECODE_LOG_INTERVAL_STEPS
    )
    log_min_interval_wall_s: float = _option(
        "Least wall time between two scheduler log lines of a kind.", default=DEFAULT_LOG_MIN_INTERVAL_WALL_S
    )
    stream_interval: int = _option(
        "SGLang's --stream-interval, in tokens: 1 sends a chunk after every decode step; N > 1 sends the "
        "first token at once, then a chunk whenever at least N tokens are unsent.",
        default=DEFAULT_STREAM_INTERVAL_TOKENS,
    )
    stream_chunking: str = _option(
        "wall: SGLang's chunks, but those of one stream closer than --stream-min-interval-wall-s merged into "
        "one (the same as SGLang's while a decode step is longer than that, e.g. at speedup 1; above, the "
        "chunk rate stays bounded); step: every SGLang chunk its own, at any speedup, so the chunk rate is "
        "speedup x a real server's (a client loaded as by that many GPUs).",
        default=STREAM_CHUNKING_WALL,
        choices=STREAM_CHUNKING_CHOICES,
    )
    stream_min_interval_wall_s: float = _option(
        "Least wall time between two writes of one stream (with step chunking, the chunks of the steps in "
        "between go out together in one write).",
        default=DEFAULT_STREAM_MIN_INTERVAL_WALL_S,
    )
    load_seconds: float = _option("Wall seconds with the port closed before serving (loading).", default=0.0)
    warmup_seconds: float = _option("Wall seconds of warm-up: /health 503, /model_info 200.", default=0.0)
    skip_server_warmup: bool = _option(
        "No warm-up request at start (SGLang's flag): /metrics has no realtime_tokens_total series until "
        "the first request's forward pass.",
        default=False,
    )
    error_rate: float = _option("Fraction of chat requests answered with --error-status.", default=0.0)
    error_status: int = _option(
        "Status of injected errors.", default=DEFAULT_ERROR_STATUS, choices=ERROR_STATUS_CHOICES
    )
    hang_rate: float = _option("Fraction of chat requests that never answer.", default=0.0)
    drop_rate: float = _option(
        "Fraction of chat requests whose connection is closed mid-request.", default=0.0
    )
    crash_after_requests: int | None = _option(
        "SIGKILL the process when chat request N+1 arrives.", default=None
    )
    crash_every_s: float | None = _option(
        "SIGKILL the process this many wall seconds after it is up, whatever it serves (a flaky server; "
        "each restart fails again as long).",
        default=None,
    )
    server_hang: bool = _option("Start hung: /health 200 but no token is produced.", default=False)
    prompt_faults: str | None = _option(
        'Faults keyed by prompt content, a JSON object: {"SUBSTRING": "drop"|"hang"|"wedge"|"crash"}, '
        '{"SUBSTRING": {"fault": "hang", "times": N}}, {"SUBSTRING": {"fault": "retract", "pause_s": S}} or '
        '{"SUBSTRING": {"fault": "crash", "after_s": S}} (docs/simulator.md).',
        default=None,
    )
    request_log_size: int = _option(
        "Finished requests kept for GET /admin/requests.", default=DEFAULT_REQUEST_LOG_SIZE
    )
    log_request_messages: bool = _option(
        "Keep each request's messages in GET /admin/requests too (to check what a client sent).",
        default=False,
    )

    def __post_init__(self) -> None:
        problems = [
            message
            for failed, message in (
                (self.speedup <= 0, "--speedup must be positive"),
                (self.max_running_requests < 1, "--max-running-requests must be at least 1"),
                (self.context_length < 2, "--context-length must be at least 2"),
                (
                    not 1 <= self.accept_length <= self.speculative_num_draft_tokens,
                    "--accept-length must be in [1, --speculative-num-draft-tokens]",
                ),
                (
                    min(self.decode_step_base_s, self.decode_step_per_request_s) < 0
                    or self.decode_step_base_s + self.decode_step_per_request_s <= 0,
                    "decode step times must be non-negative with a positive sum",
                ),
                (
                    min(self.prefill_base_s, self.prefill_per_token_s) < 0,
                    "prefill times must be non-negative",
                ),
                (
                    min(self.thinking_tokens_mean, self.answer_tokens_mean) < 1,
                    "length means must be at least 1",
                ),
                (
                    min(self.thinking_tokens_sigma, self.answer_tokens_sigma) < 0,
                    "sigmas must be non-negative",
                ),
                (self.stream_interval < 1, "--stream-interval must be at least 1"),
                (self.stream_chunking not in STREAM_CHUNKING_CHOICES, "unknown --stream-chunking"),
                (self.stream_min_interval_wall_s < 0, "--stream-min-interval-wall-s must be non-negative"),
                (self.chunked_prefill_size < 1, "--chunked-prefill-size must be at least 1"),
                (self.error_status not in ERROR_STATUS_CHOICES, "--error-status must be 500 or 503"),
                (
                    self.crash_every_s is not None and self.crash_every_s <= 0,
                    "--crash-every-s must be positive",
                ),
                (self.reasoning_parser not in REASONING_PARSER_CHOICES, "unknown --reasoning-parser"),
                (
                    self.served_model_name is not None and ":" in self.served_model_name,
                    "--served-model-name must not contain ':'",
                ),
            )
            if failed
        ]
        for name in ("stop_in_thinking_rate", "think_nothing_rate", "error_rate", "hang_rate", "drop_rate"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                problems.append(f"--{name.replace('_', '-')} must be in [0, 1]")
        if self.error_rate + self.hang_rate + self.drop_rate > 1.0:
            problems.append("--error-rate + --hang-rate + --drop-rate must not exceed 1")
        try:
            parse_prompt_faults(self.prompt_faults)
        except ValueError as error:
            problems.append(str(error))
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model_path

    @property
    def accept_length_fraction(self) -> Fraction:
        """The accept length as an exact fraction, so token counts never drift with float error."""
        return Fraction(self.accept_length).limit_denominator(1000)

    @property
    def num_reserved_tokens(self) -> int:
        """Tokens SGLang adds to the input count for speculative decoding before the context check."""
        return max(
            self.speculative_eagle_topk * self.speculative_num_steps, self.speculative_num_draft_tokens
        )

    def decode_step_s(self, running: int) -> float:
        """Model seconds of one decode step with `running` requests in the batch."""
        return self.decode_step_base_s + self.decode_step_per_request_s * running

    def capacity_output_tokens_per_s(self) -> float:
        """Output tokens per model second with every slot busy (decode only)."""
        slots = self.max_running_requests
        return slots * self.accept_length / self.decode_step_s(slots)

    def capacity_output_tokens_per_wall_s(self) -> float:
        return self.capacity_output_tokens_per_s() * self.speedup


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _field_types() -> dict[str, Any]:
    return typing.get_type_hints(SimulatorSettings)


def _scalar_type(annotation: Any) -> type:
    """The concrete type of `T` or `T | None`."""
    args = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
    result: type = args[0] if args else annotation
    return result


def add_settings_arguments(parser: argparse.ArgumentParser) -> None:
    """Add one option per settings field."""
    types = _field_types()
    for field in dataclasses.fields(SimulatorSettings):
        kind = _scalar_type(types[field.name])
        help_text = f"{field.metadata['help']} Default: {field.default}."
        if kind is bool:
            parser.add_argument(
                _flag(field.name),
                action=argparse.BooleanOptionalAction,
                default=field.default,
                help=help_text,
            )
            continue
        parser.add_argument(
            _flag(field.name),
            type=kind,
            default=field.default,
            choices=field.metadata.get("choices"),
            help=help_text,
        )


def settings_from_args(args: argparse.Namespace) -> SimulatorSettings:
    values = {field.name: getattr(args, field.name) for field in dataclasses.fields(SimulatorSettings)}
    return SimulatorSettings(**values)


def settings_to_argv(settings: SimulatorSettings) -> list[str]:
    """The command-line options that rebuild `settings` (only those that differ from the default)."""
    argv: list[str] = []
    for field in dataclasses.fields(SimulatorSettings):
        value = getattr(settings, field.name)
        if value == field.default:
            continue
        if isinstance(value, bool):
            argv.append(_flag(field.name) if value else "--no-" + _flag(field.name)[2:])
        elif value is not None:
            argv.extend([_flag(field.name), repr(value) if isinstance(value, float) else str(value)])
    return argv
