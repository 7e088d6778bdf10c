"""The SGLang command line for one GPU, built by pure functions: the one place that knows flag names.

Launcher: `sglang serve --model-type llm`, not `python -m sglang.launch_server`. In SGLang 0.5.23
both end in the same `prepare_server_args` + `run_server`, so the flags are identical, but
`launch_server` warns that `sglang serve` is the recommended entry point (`sglang/launch_server.py`),
so it is the one likely to go. `--model-type llm` pins the LLM backend: without it `sglang serve`
probes whether the model is a diffusion pipeline, which for a name that is not a local folder means
asking Hugging Face (`sglang/cli/serve.py`, `sglang/cli/utils.py`). `--model-type` is read by the
`serve` dispatcher and removed before the server's own parser runs, so it is not a server flag.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from node.errors import OptionError
from node.settings import ServeSettings

LAUNCHER_ARGS = ("serve", "--model-type", "llm")
GPU_ENV_VAR = "CUDA_VISIBLE_DEVICES"
MASK = "***"

MODEL_PATH = "--model-path"
SERVED_MODEL_NAME = "--served-model-name"
HOST = "--host"
PORT = "--port"
REASONING_PARSER = "--reasoning-parser"
CONTEXT_LENGTH = "--context-length"
MAX_RUNNING_REQUESTS = "--max-running-requests"
MEM_FRACTION_STATIC = "--mem-fraction-static"
ENABLE_METRICS = "--enable-metrics"
STREAM_INTERVAL = "--stream-interval"
API_KEY = "--api-key"
CONFIG = "--config"  # SGLang merges this YAML file's keys into its flags, in its own process
SECRETS_FILE_SUFFIX = ".secrets.yaml"
SPECULATIVE_ALGORITHM = "--speculative-algorithm"
SPECULATIVE_NUM_STEPS = "--speculative-num-steps"
SPECULATIVE_EAGLE_TOPK = "--speculative-eagle-topk"
SPECULATIVE_NUM_DRAFT_TOKENS = "--speculative-num-draft-tokens"
SPECULATIVE_DRAFT_MODEL_PATH = "--speculative-draft-model-path"

MANAGED_FLAGS = frozenset(
    {
        MODEL_PATH,
        "--model",  # SGLang's alias of --model-path
        SERVED_MODEL_NAME,
        HOST,
        PORT,
        REASONING_PARSER,
        CONTEXT_LENGTH,
        MAX_RUNNING_REQUESTS,
        MEM_FRACTION_STATIC,
        STREAM_INTERVAL,
        ENABLE_METRICS,
        API_KEY,
        SPECULATIVE_ALGORITHM,
        SPECULATIVE_NUM_STEPS,
        SPECULATIVE_EAGLE_TOPK,
        SPECULATIVE_NUM_DRAFT_TOKENS,
        SPECULATIVE_DRAFT_MODEL_PATH,
        "--speculative-draft-model",  # SGLang's alias of --speculative-draft-model-path
    }
)
"""Flags `serve` sets itself; repeating one after `--` would silently override it, so it is refused."""

SECRET_FLAGS = frozenset({API_KEY, "--admin-api-key", "--ssl-keyfile-password"})


@dataclass(frozen=True)
class SecretsFile:
    """Flags that must not show in `ps`: written (mode 0600) just before the server starts, and given
    to SGLang as `--config PATH`, whose YAML keys it turns into flags inside its own process."""

    path: Path
    values: Mapping[str, str]  # YAML key (the flag's dest, e.g. api_key) -> value

    def content(self) -> str:
        return "".join(f"{key}: {json.dumps(value)}\n" for key, value in self.values.items())


@dataclass(frozen=True)
class ServerCommand:
    """One server: its argv, the variables set on top of the inherited environment, its log and URL."""

    gpu: int
    argv: tuple[str, ...]
    env: Mapping[str, str]
    log_path: Path
    url: str
    secrets_file: SecretsFile | None = None

    def render(self) -> str:
        """A shell line that runs exactly this, with secrets masked."""
        assignments = [f"{name}={shlex.quote(value)}" for name, value in self.env.items()]
        argv = shlex.join(mask_secrets(self.argv))
        return f"{' '.join(assignments)} {argv} >>{shlex.quote(str(self.log_path))} 2>&1"

    def secrets(self) -> list[str]:
        """The values of secret flags, to mask wherever this server's output is shown."""
        found = list(self.secrets_file.values.values()) if self.secrets_file else []
        for index, arg in enumerate(self.argv):
            name, equals, value = arg.partition("=")
            if equals and name in SECRET_FLAGS:
                found.append(value)
            elif arg in SECRET_FLAGS and index + 1 < len(self.argv):
                found.append(self.argv[index + 1])
        return found


def sglang_flags(settings: ServeSettings, gpu: int) -> list[str]:
    """The server flags for `gpu`, in a stable order: managed ones first, then the pass-through ones."""
    flags = [
        MODEL_PATH, settings.model_path,
        SERVED_MODEL_NAME, settings.served_model_name,
        HOST, settings.host,
        PORT, str(settings.port_for(gpu)),
        REASONING_PARSER, settings.reasoning_parser,
        CONTEXT_LENGTH, str(settings.context_length_tokens),
        MAX_RUNNING_REQUESTS, str(settings.max_running_requests),
        MEM_FRACTION_STATIC, str(settings.mem_fraction_static),
        STREAM_INTERVAL, str(settings.stream_interval_tokens),
        ENABLE_METRICS,
    ]  # fmt: skip
    speculative = settings.speculative
    if speculative is not None:
        flags += [
            SPECULATIVE_ALGORITHM, speculative.algorithm.value,
            SPECULATIVE_NUM_STEPS, str(speculative.num_steps),
            SPECULATIVE_EAGLE_TOPK, str(speculative.eagle_topk),
            SPECULATIVE_NUM_DRAFT_TOKENS, str(speculative.num_draft_tokens),
        ]  # fmt: skip
        if speculative.draft_model_path is not None:
            flags += [SPECULATIVE_DRAFT_MODEL_PATH, speculative.draft_model_path]
    secrets = secrets_file(settings, gpu)
    if secrets is not None:
        flags += [CONFIG, str(secrets.path)]
    check_extra_args(settings.extra_args, secrets_file=secrets is not None)
    return flags + list(settings.extra_args)


def secrets_file(settings: ServeSettings, gpu: int) -> SecretsFile | None:
    """The API key travels in a file beside the server's log, never on its command line."""
    if settings.api_key is None:
        return None
    log_path = settings.log_path_for(gpu)
    return SecretsFile(log_path.with_name(log_path.stem + SECRETS_FILE_SUFFIX), {"api_key": settings.api_key})


def build_command(settings: ServeSettings, gpu: int) -> ServerCommand:
    return ServerCommand(
        gpu=gpu,
        argv=(settings.sglang_executable, *LAUNCHER_ARGS, *sglang_flags(settings, gpu)),
        env={GPU_ENV_VAR: str(gpu)},
        log_path=settings.log_path_for(gpu),
        url=settings.url_for(gpu),
        secrets_file=secrets_file(settings, gpu),
    )


def build_commands(settings: ServeSettings) -> list[ServerCommand]:
    return [build_command(settings, gpu) for gpu in settings.gpus]


def check_extra_args(extra_args: tuple[str, ...], *, secrets_file: bool = False) -> None:
    """Refuse pass-through flags that would override a managed one (argparse lets the last one win)."""
    for arg in extra_args:
        name = arg.split("=", 1)[0]
        if secrets_file and name == CONFIG:
            raise OptionError(
                f"{CONFIG} after '--': serve gives SGLang the API key through its own {CONFIG} file "
                "(one is allowed); pass those settings as flags after '--' instead"
            )
        if name in MANAGED_FLAGS:
            raise OptionError(
                f"{name} after '--' would override the value serve sets itself; "
                f"use serve's own option for it (see `python -m node serve --help`)"
            )


def mask_secrets(argv: tuple[str, ...] | list[str]) -> list[str]:
    """A copy of argv with the value of every secret flag replaced by `***`."""
    masked: list[str] = []
    hide_next = False
    for arg in argv:
        name, equals, _ = arg.partition("=")
        if hide_next:
            masked.append(MASK)
        elif equals and name in SECRET_FLAGS:
            masked.append(f"{name}={MASK}")
        else:
            masked.append(arg)
        hide_next = arg in SECRET_FLAGS
    return masked
