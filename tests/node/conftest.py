"""Fixtures for the GPU-node tools: a fake `sglang` executable, a tiny SGLang-shaped HTTP server,
a tiny model folder, and moto's S3 server on a free port."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from devstack.local_stack import free_port, wait_until
from tests.support.aws import use_fake_aws

FLAGS_FILE = Path(__file__).parent / "fixtures" / "sglang-0.5.23-flags.txt"
WAIT_DEADLINE_S = 10.0
POLL_S = 0.02
SHARD_BYTES = 300_000


def _wait_for(condition: Callable[[], bool], what: str, deadline_s: float = WAIT_DEADLINE_S) -> None:
    wait_until(condition, timeout_s=deadline_s, what=what)


@pytest.fixture
def wait_for() -> Callable[..., None]:
    """`wait_for(condition, what)`: poll until the condition holds, failing the test at a deadline."""
    return _wait_for


@pytest.fixture
def unused_url() -> str:
    """A URL where nothing listens (the port was free a moment ago)."""
    return f"http://127.0.0.1:{free_port()}"


@pytest.fixture
def sglang_flags() -> set[str]:
    return set(FLAGS_FILE.read_text().split())


FAKE_SGLANG = """#!{python}
# Stands in for `sglang serve`: logs its argv and GPU, then runs until SIGTERM/SIGINT. A GPU named in
# FAKE_SGLANG_CRASH_GPUS crashes as it loads, once those in FAKE_SGLANG_CRASH_AFTER run (markers in
# FAKE_SGLANG_MARKERS), as a server runs out of memory while the others load: they have a stop to take.
import os, pathlib, signal, sys, time

gpu = os.environ.get("CUDA_VISIBLE_DEVICES", "")
markers = pathlib.Path(os.environ.get("FAKE_SGLANG_MARKERS", "."))
print("fake sglang argv:", " ".join(sys.argv[1:]), flush=True)
print("fake sglang CUDA_VISIBLE_DEVICES=" + gpu, flush=True)
if gpu in os.environ.get("FAKE_SGLANG_CRASH_GPUS", "").split(","):
    waited_for = [g for g in os.environ.get("FAKE_SGLANG_CRASH_AFTER", "").split(",") if g]
    deadline = time.monotonic() + {wait_s}
    while not all((markers / g).exists() for g in waited_for) and time.monotonic() < deadline:
        time.sleep(0.05)
    print("loading weights", flush=True)
    print("torch.OutOfMemoryError: CUDA out of memory", flush=True)
    sys.exit(7)
def stop(signum, frame):
    print("received " + signal.Signals(signum).name, flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGINT, stop)
print("fake sglang running", flush=True)
if os.environ.get("FAKE_SGLANG_MARKERS"):
    (markers / gpu).touch()
while True:
    signal.pause()
"""


@pytest.fixture
def fake_sglang(tmp_path: Path) -> Path:
    script = tmp_path / "bin" / "sglang"
    script.parent.mkdir()
    script.write_text(FAKE_SGLANG.format(python=sys.executable, wait_s=WAIT_DEADLINE_S))
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


class FakeSGLangServer:
    """An SGLang-shaped HTTP server: /health 503 for the first `warmup_probes` calls, then 200;
    chat completions in SGLang's response shape, 401 `{"error": "Unauthorized"}` on a wrong key."""

    def __init__(self, port: int, warmup_probes: int = 2, api_key: str | None = None) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.warmup_probes = warmup_probes
        self.api_key = api_key
        self.health_calls = 0
        self.chat_requests: list[dict[str, Any]] = []
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    async def _health(self, _request: web.Request) -> web.Response:
        self.health_calls += 1
        return web.Response(status=503 if self.health_calls <= self.warmup_probes else 200)

    async def _chat(self, request: web.Request) -> web.Response:
        if self.api_key is not None and request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return web.json_response({"error": "Unauthorized"}, status=401)
        body = await request.json()
        self.chat_requests.append(body)
        prompt_tokens, completion_tokens = 12, 1
        return web.json_response(
            {
                "id": uuid.uuid4().hex,
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body.get("model", "default"),
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "OK", "reasoning_content": None},
                        "logprobs": None,
                        "finish_reason": "length",
                        "matched_stop": None,
                    }
                ],
                "usage": {
                    "prompt_tokens": prompt_tokens,
                    "total_tokens": prompt_tokens + completion_tokens,
                    "completion_tokens": completion_tokens,
                    "prompt_tokens_details": None,
                    "reasoning_tokens": 0,
                    "completion_tokens_details": None,
                },
                "metadata": {"weight_version": "default"},
            }
        )

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_get("/health", self._health)
        app.router.add_post("/v1/chat/completions", self._chat)
        self._runner = web.AppRunner(app, handle_signals=False, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    def start(self) -> None:
        """Begin accepting connections (until now the port refuses them, as while SGLang loads)."""
        if not self._thread.is_alive():
            self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(WAIT_DEADLINE_S)

    def close(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(WAIT_DEADLINE_S)
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(WAIT_DEADLINE_S)
        self._loop.close()


@pytest.fixture
def fake_server_factory() -> Iterator[Callable[..., FakeSGLangServer]]:
    servers: list[FakeSGLangServer] = []

    def make(**kwargs: Any) -> FakeSGLangServer:
        server = FakeSGLangServer(free_port(), **kwargs)
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.close()


SHARDS = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")
INDEX = "model.safetensors.index.json"


def write_model_folder(root: Path) -> Path:
    """A tiny model folder in the Hugging Face layout: config, tokenizer, two shards and their index."""
    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"]}))
    (root / "tokenizer.json").write_text(json.dumps({"version": "1.0"}))
    (root / "extra").mkdir()
    (root / "extra" / "notes.txt").write_text("nested files are staged too\n")
    for number, shard in enumerate(SHARDS):
        (root / shard).write_bytes(os.urandom(SHARD_BYTES + number))
    weight_map = {"model.embed_tokens.weight": SHARDS[0], "lm_head.weight": SHARDS[1]}
    (root / INDEX).write_text(
        json.dumps({"metadata": {"total_size": 2 * SHARD_BYTES}, "weight_map": weight_map})
    )
    return root


@pytest.fixture
def model_folder(tmp_path: Path) -> Path:
    return write_model_folder(tmp_path / "source" / "TinyModel")


@pytest.fixture
def s3_env(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    """Point boto3's standard configuration at moto's server, as for a real S3-compatible store."""
    use_fake_aws(monkeypatch, tmp_path, endpoint_url=s3_endpoint)
    return s3_endpoint
