"""Wait until an SGLang server really generates: port open, `/health` 200, then a 1-token chat completion.

SGLang refuses connections while it loads weights, answers `/health` with 503 while it warms up,
and only then generates; `/health` itself runs a 1-token generation, but a chat completion also
proves the chat template, the served name and the API key work.
"""

from __future__ import annotations

import enum
import os
import socket
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from inference.client_settings import PLACEHOLDER_API_KEY
from inference.errors import ServerNotReady
from inference.server_probe import HEALTH_PATH, ServerProbe

if TYPE_CHECKING:  # openai takes most of a second to import: only a wait for a server pays it
    import openai

DEFAULT_READY_TIMEOUT_S = 1800.0  # loading a large model's weights from fast local storage
DEFAULT_PROBE_INTERVAL_S = 2.0
PORT_CONNECT_TIMEOUT_S = 2.0
HEALTH_REQUEST_TIMEOUT_S = 30.0
"""SGLang's own /health generation gives up after 20 s (SGLANG_HEALTH_CHECK_TIMEOUT)."""
CHAT_REQUEST_TIMEOUT_S = 120.0
LOG_TAIL_LINES = 40
LOG_TAIL_READ_BYTES = 256 * 1024
"""Server logs grow to hundreds of MB over a run; the tail is always within the last few KB."""
HTTP_OK = 200
HTTP_DEFAULT_PORT = 80
HTTPS_DEFAULT_PORT = 443
READY_PROMPT = "Reply with OK."
READY_MAX_TOKENS = 1
REDACTED = "***"


class Stage(enum.StrEnum):
    PORT_CLOSED = "port closed (loading weights)"
    WARMING_UP = "/health not 200 yet (warming up)"
    NOT_GENERATING = "/health 200 but the chat completion failed"
    READY = "ready"


@dataclass(frozen=True)
class Probe:
    url: str
    stage: Stage
    detail: str = ""


@dataclass(frozen=True)
class ReadinessTarget:
    """One server to wait for; `log_path` is shown (tail, secrets masked) when it never gets ready."""

    url: str
    model: str = "default"
    api_key: str | None = None
    log_path: Path | None = None


def probe_once(target: ReadinessTarget, client: openai.OpenAI, budget_s: float) -> Probe:
    """Look once, spending at most about `budget_s`; report how far the server got."""
    import openai

    url = target.url.rstrip("/")
    parts = urlsplit(url)
    host = parts.hostname or "127.0.0.1"
    port = parts.port or (HTTPS_DEFAULT_PORT if parts.scheme == "https" else HTTP_DEFAULT_PORT)
    try:
        with socket.create_connection((host, port), timeout=min(PORT_CONNECT_TIMEOUT_S, budget_s)):
            pass
    except OSError as error:
        return Probe(target.url, Stage.PORT_CLOSED, f"{host}:{port}: {error}")
    try:
        status, _ = ServerProbe(url, target.api_key).get(HEALTH_PATH, min(HEALTH_REQUEST_TIMEOUT_S, budget_s))
    except OSError as error:
        return Probe(target.url, Stage.WARMING_UP, f"/health: {error}")
    if status != HTTP_OK:
        return Probe(target.url, Stage.WARMING_UP, f"/health answered {status}")
    try:
        completion = client.with_options(
            timeout=min(CHAT_REQUEST_TIMEOUT_S, budget_s)
        ).chat.completions.create(
            model=target.model,
            messages=[{"role": "user", "content": READY_PROMPT}],
            max_tokens=READY_MAX_TOKENS,
            temperature=0.0,
            extra_body={"chat_template_kwargs": {"enable_thinking": False}},
        )
    except openai.APIError as error:
        return Probe(target.url, Stage.NOT_GENERATING, f"{type(error).__name__}: {error}")
    generated = completion.usage.completion_tokens if completion.usage is not None else 0
    if not completion.choices or generated < READY_MAX_TOKENS:
        return Probe(target.url, Stage.NOT_GENERATING, f"the completion generated {generated} tokens")
    return Probe(target.url, Stage.READY, f"generated {generated} token(s)")


def wait_until_ready(
    target: ReadinessTarget,
    *,
    timeout_s: float = DEFAULT_READY_TIMEOUT_S,
    interval_s: float = DEFAULT_PROBE_INTERVAL_S,
    observer: Callable[[Probe], None] | None = None,
    check: Callable[[], None] | None = None,
    sleep: Callable[[float], object] = time.sleep,
    deadline: float | None = None,
) -> Probe:
    """Probe until the server generates; raise ServerNotReady, with the log's tail, at the deadline.

    `check` runs before every probe and may raise to stop waiting (the launcher uses it to notice a
    server process that died); `sleep` may return early (the launcher wakes it on SIGTERM).
    """
    import openai  # a second or more on a loaded machine: the timeout counts from the first probe

    with openai.OpenAI(
        base_url=f"{target.url.rstrip('/')}/v1",
        api_key=target.api_key or PLACEHOLDER_API_KEY,
        max_retries=0,
        timeout=CHAT_REQUEST_TIMEOUT_S,
    ) as client:
        end = deadline if deadline is not None else time.monotonic() + timeout_s
        last: Probe | None = None
        while True:
            if check is not None:
                check()
            remaining_s = end - time.monotonic()
            if remaining_s <= 0:
                raise _not_ready(target, last)
            last = probe_once(target, client, remaining_s)
            if observer is not None:
                observer(last)
            if last.stage is Stage.READY:
                return last
            sleep(max(0.0, min(interval_s, end - time.monotonic())))


def wait_all_ready(
    targets: Sequence[ReadinessTarget],
    *,
    timeout_s: float = DEFAULT_READY_TIMEOUT_S,
    interval_s: float = DEFAULT_PROBE_INTERVAL_S,
    observer: Callable[[Probe], None] | None = None,
    check: Callable[[], None] | None = None,
    sleep: Callable[[float], object] = time.sleep,
) -> list[Probe]:
    """Wait for every server under one shared deadline; they load in parallel, so in turn is as fast."""
    deadline = time.monotonic() + timeout_s
    return [
        wait_until_ready(
            target, interval_s=interval_s, observer=observer, check=check, sleep=sleep, deadline=deadline
        )
        for target in targets
    ]


def _not_ready(target: ReadinessTarget, last: Probe | None) -> ServerNotReady:
    reason = "the deadline passed before the first probe"
    if last is not None:
        reason = f"still '{last.stage.value}' at the deadline ({last.detail})"
    tail = None
    if target.log_path is not None:
        tail = log_tail(target.log_path, secrets=[target.api_key] if target.api_key else [])
    return ServerNotReady(target.url, reason, tail)


def log_tail(path: Path, lines: int = LOG_TAIL_LINES, secrets: Iterable[str] = ()) -> str:
    """The last `lines` lines of a log, with every secret masked (SGLang logs its server args)."""
    try:
        with path.open("rb") as log:
            size = log.seek(0, os.SEEK_END)
            log.seek(max(0, size - LOG_TAIL_READ_BYTES))
            text = log.read().decode("utf-8", errors="replace")
    except OSError as error:
        return f"(cannot read {path}: {error.strerror})"
    tail = "\n".join(text.splitlines()[-lines:])
    for secret in secrets:
        tail = tail.replace(secret, REDACTED)
    return tail
