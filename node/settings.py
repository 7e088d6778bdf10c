"""What `serve` runs, as one typed, validated object built at the CLI edge.

The defaults are the reference workload: Qwen3.6-27B in thinking mode, MTP heads run as NEXTN with
3 steps, top-k 1 and 4 draft tokens, 48 requests in flight per server, one server per GPU.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from inference.readiness import DEFAULT_READY_TIMEOUT_S
from inference.sglang_defaults import REFERENCE_MAX_RUNNING_REQUESTS, SGLANG_BASE_PORT
from node.errors import OptionError

DEFAULT_BASE_PORT = SGLANG_BASE_PORT
"""GPU i listens on DEFAULT_BASE_PORT + i; workers find their server the same way."""
DEFAULT_HOST = "127.0.0.1"
"""Workers run on the same node, so the API stays off the network unless asked."""
DEFAULT_REASONING_PARSER = "qwen3"
DEFAULT_CONTEXT_LENGTH_TOKENS = 40960
"""32,768 output tokens (the sampling default) plus 8,192 prompt tokens."""
DEFAULT_MAX_RUNNING_REQUESTS = REFERENCE_MAX_RUNNING_REQUESTS
DEFAULT_MEM_FRACTION_STATIC = 0.85
"""Share of GPU memory for weights and KV cache; the rest is for CUDA graphs and activations."""
DEFAULT_STREAM_INTERVAL_TOKENS = 32
"""SGLang's --stream-interval (1 by default: a chunk after every decode step, ~3.5 tokens with MTP): a
streamed request's output goes out whenever this many tokens are unsent, and at once when it finishes
(`output_streamer.py` in 0.5.23), so a conversation's next turn is not delayed. A worker reads the stream
to see a hung server and to keep its accounts, for which a chunk every ~0.7 s (48 running, ~48 tokens/s
each) is plenty; at 1, the server and the worker each handle ~650 chunks a second a GPU. SGLang's own
help: "a larger value makes the throughput higher"."""
DEFAULT_SPECULATIVE_NUM_STEPS = 3
DEFAULT_SPECULATIVE_EAGLE_TOPK = 1
DEFAULT_SPECULATIVE_NUM_DRAFT_TOKENS = 4
"""Loading 52 GB from a network file system took minutes per server; from /dev/shm under one."""
DEFAULT_LOG_DIR = Path("logs")
DEFAULT_API_KEY_ENV = "DRAFTGEN_API_KEY"
SGLANG_EXECUTABLE = "sglang"

LOWEST_PORT = 1024
HIGHEST_PORT = 65535


class SpeculativeAlgorithm(enum.StrEnum):
    """The values SGLang 0.5.23 accepts for MTP heads; `MTP` itself is rejected by SGLang."""

    NEXTN = "NEXTN"
    EAGLE = "EAGLE"


@dataclass(frozen=True, kw_only=True)
class SpeculativeSettings:
    algorithm: SpeculativeAlgorithm = SpeculativeAlgorithm.NEXTN
    num_steps: int = DEFAULT_SPECULATIVE_NUM_STEPS
    eagle_topk: int = DEFAULT_SPECULATIVE_EAGLE_TOPK
    num_draft_tokens: int = DEFAULT_SPECULATIVE_NUM_DRAFT_TOKENS
    draft_model_path: str | None = None

    def __post_init__(self) -> None:
        _require_positive("--speculative-num-steps", self.num_steps)
        _require_positive("--speculative-eagle-topk", self.eagle_topk)
        _require_positive("--speculative-num-draft-tokens", self.num_draft_tokens)


@dataclass(frozen=True, kw_only=True)
class ServeSettings:
    """Everything needed to start one SGLang server per GPU. `repr` never shows the API key."""

    model_path: str
    served_model_name: str
    gpus: tuple[int, ...]
    base_port: int = DEFAULT_BASE_PORT
    host: str = DEFAULT_HOST
    reasoning_parser: str = DEFAULT_REASONING_PARSER
    speculative: SpeculativeSettings | None = field(default_factory=SpeculativeSettings)
    context_length_tokens: int = DEFAULT_CONTEXT_LENGTH_TOKENS
    max_running_requests: int = DEFAULT_MAX_RUNNING_REQUESTS
    mem_fraction_static: float = DEFAULT_MEM_FRACTION_STATIC
    stream_interval_tokens: int = DEFAULT_STREAM_INTERVAL_TOKENS
    api_key: str | None = field(default=None, repr=False)
    log_dir: Path = DEFAULT_LOG_DIR
    sglang_executable: str = SGLANG_EXECUTABLE
    extra_args: tuple[str, ...] = ()
    ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S

    def __post_init__(self) -> None:
        if not self.model_path:
            raise OptionError(
                "--model-path is required (a folder with config.json and the shards), or DRAFTGEN_MODEL_PATH"
            )
        if ":" in self.served_model_name or not self.served_model_name:
            raise OptionError(
                f"--served-model-name {self.served_model_name!r} must be non-empty and contain no ':' "
                "(SGLang reads 'base:adapter' as a LoRA adapter)"
            )
        if not self.gpus:
            raise OptionError("--gpus names no GPU")
        if len(set(self.gpus)) != len(self.gpus) or min(self.gpus) < 0:
            raise OptionError(f"--gpus {self.gpus} must be distinct indexes of 0 or more")
        for gpu in self.gpus:
            port = self.port_for(gpu)
            if not LOWEST_PORT <= port <= HIGHEST_PORT:
                raise OptionError(
                    f"--base-port {self.base_port} puts GPU {gpu} on port {port}, "
                    f"outside {LOWEST_PORT}-{HIGHEST_PORT}"
                )
        _require_positive("--context-length", self.context_length_tokens)
        _require_positive("--max-running-requests", self.max_running_requests)
        _require_positive("--stream-interval", self.stream_interval_tokens)
        if not 0.0 < self.mem_fraction_static < 1.0:
            raise OptionError(
                f"--mem-fraction-static {self.mem_fraction_static} must be between 0 and 1 (exclusive)"
            )
        if self.api_key is not None and not self.api_key.strip():
            raise OptionError("the API key is empty; unset it or give a real key")
        if self.ready_timeout_s <= 0:
            raise OptionError(f"--ready-timeout {self.ready_timeout_s} must be more than 0 seconds")

    def port_for(self, gpu: int) -> int:
        return self.base_port + gpu

    def url_for(self, gpu: int) -> str:
        """Where a client on this node reaches the server of `gpu`."""
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port_for(gpu)}"

    def log_path_for(self, gpu: int) -> Path:
        return self.log_dir / f"sglang-gpu{gpu}.log"


def _require_positive(option: str, value: int) -> None:
    if value <= 0:
        raise OptionError(f"{option} {value} must be 1 or more")


def parse_gpus(spec: str) -> tuple[int, ...]:
    """`"0-6"`, `"0,2,5"` or `"1"` into GPU indexes, in the order given."""
    gpus: list[int] = []
    for part in spec.replace(" ", "").split(","):
        if not part:
            continue
        first, dash, last = part.partition("-")
        try:
            indexes = range(int(first), int(last) + 1) if dash else range(int(first), int(first) + 1)
        except ValueError:
            raise OptionError(f"--gpus {spec!r}: {part!r} is not an index or a range like 0-6") from None
        if not indexes:
            raise OptionError(f"--gpus {spec!r}: the range {part!r} is empty")
        gpus.extend(indexes)
    if not gpus:
        raise OptionError(f"--gpus {spec!r} names no GPU")
    return tuple(gpus)


def default_served_model_name(model_path: str) -> str:
    """The folder's name (`/dev/shm/Qwen3.6-27B` serves as `Qwen3.6-27B`)."""
    return PurePosixPath(model_path.rstrip("/")).name or model_path


def read_api_key(env_name: str | None, key_file: Path | None, environ: Mapping[str, str]) -> str | None:
    """The key from a file if one is given, else from the environment variable; None if neither is set."""
    if key_file is not None:
        try:
            key = key_file.read_text(encoding="utf-8").strip()
        except OSError as error:
            raise OptionError(f"--api-key-file {key_file}: cannot read it ({error.strerror})") from error
        if not key:
            raise OptionError(f"--api-key-file {key_file} is empty")
        return key
    if env_name:
        key = environ.get(env_name, "").strip()
        return key or None
    return None


def sibling_executable(name: str, python: str) -> str:
    """`name` in the same bin folder as `python` if it is there (a venv's console script), else bare."""
    candidate = Path(python).parent / name
    return str(candidate) if os.access(candidate, os.X_OK) else name
