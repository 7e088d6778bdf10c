"""Readiness: a server counts as ready only once it really generates, and a failure shows its log."""

from __future__ import annotations

import argparse
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from core.exit_codes import EXIT_OK
from inference.errors import ServerNotReady
from inference.readiness import Probe, ReadinessTarget, Stage, log_tail, wait_until_ready
from node.cli import EXIT_NOT_READY, register

FAST_PROBE_S = 0.05
SHORT_TIMEOUT_S = 0.6
LONG_TIMEOUT_S = 15.0


def write_log(path: Path, secret: str) -> None:
    lines = [f"line {number:03d}" for number in range(1, 101)]
    lines[95] = f"server_args=ServerArgs(api_key='{secret}')"
    path.write_text("\n".join(lines) + "\n")


def test_waiting_goes_from_refused_to_warming_up_to_a_real_generation(
    fake_server_factory: Callable[..., Any],
) -> None:
    # Given a server whose port refuses connections, as while SGLang loads weights
    server = fake_server_factory(warmup_probes=2)
    seen: list[Probe] = []
    port_was_closed = threading.Event()

    def observe(probe: Probe) -> None:
        seen.append(probe)
        if probe.stage is Stage.PORT_CLOSED:
            port_was_closed.set()

    result: list[Probe] = []
    waiter = threading.Thread(
        target=lambda: result.append(
            wait_until_ready(
                ReadinessTarget(url=server.url, model="Qwen3.6-27B"),
                timeout_s=LONG_TIMEOUT_S,
                interval_s=FAST_PROBE_S,
                observer=observe,
            )
        )
    )
    waiter.start()

    # When the port opens only after the waiter found it closed
    assert port_was_closed.wait(LONG_TIMEOUT_S)
    server.start()
    waiter.join(LONG_TIMEOUT_S)

    # Then it saw the port closed, then /health 503, then generated one token
    stages = [probe.stage for probe in seen]
    assert stages[0] is Stage.PORT_CLOSED
    assert Stage.WARMING_UP in stages
    assert stages.index(Stage.WARMING_UP) > stages.index(Stage.PORT_CLOSED)
    assert result and result[0].stage is Stage.READY
    assert server.health_calls == 3

    # And the one chat completion was a real, explicit 1-token request
    [request] = server.chat_requests
    assert request["max_tokens"] == 1
    assert request["model"] == "Qwen3.6-27B"
    assert request["chat_template_kwargs"] == {"enable_thinking": False}


def test_a_server_that_never_leaves_warm_up_fails_with_the_tail_of_its_log(
    fake_server_factory: Callable[..., Any], tmp_path: Path
) -> None:
    # Given a server stuck at /health 503, and its log holding the API key
    server = fake_server_factory(warmup_probes=10**9)
    server.start()
    log = tmp_path / "sglang-gpu0.log"
    write_log(log, secret="sk-hidden")

    # When I wait with a short timeout
    with pytest.raises(ServerNotReady) as caught:
        wait_until_ready(
            ReadinessTarget(url=server.url, api_key="sk-hidden", log_path=log),
            timeout_s=SHORT_TIMEOUT_S,
            interval_s=FAST_PROBE_S,
        )

    # Then the error says where it got stuck and shows the last 40 lines, key masked
    message = str(caught.value)
    assert server.url in message
    assert "/health answered 503" in message
    assert "line 100" in message and "line 061" in message
    assert "line 060" not in message
    assert "api_key='***'" in message
    assert "sk-hidden" not in message


def test_a_wrong_api_key_keeps_the_server_not_ready_and_says_why(
    fake_server_factory: Callable[..., Any],
) -> None:
    server = fake_server_factory(warmup_probes=0, api_key="right")
    server.start()

    with pytest.raises(ServerNotReady, match="AuthenticationError"):
        wait_until_ready(
            ReadinessTarget(url=server.url, api_key="wrong"),
            timeout_s=SHORT_TIMEOUT_S,
            interval_s=FAST_PROBE_S,
        )


def test_the_right_api_key_gets_through(fake_server_factory: Callable[..., Any]) -> None:
    server = fake_server_factory(warmup_probes=0, api_key="right")
    server.start()

    probe = wait_until_ready(
        ReadinessTarget(url=server.url, api_key="right"), timeout_s=LONG_TIMEOUT_S, interval_s=FAST_PROBE_S
    )
    assert probe.stage is Stage.READY


def test_a_server_that_never_opens_its_port_fails_at_the_deadline(unused_url: str) -> None:
    with pytest.raises(ServerNotReady, match=r"still 'port closed \(loading weights\)' at the deadline"):
        wait_until_ready(ReadinessTarget(url=unused_url), timeout_s=SHORT_TIMEOUT_S, interval_s=FAST_PROBE_S)


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(argv)


def test_the_wait_command_exits_zero_once_the_server_generates(
    fake_server_factory: Callable[..., Any], capsys: pytest.CaptureFixture[str]
) -> None:
    server = fake_server_factory(warmup_probes=1)
    server.start()
    args = parse(
        ["wait", "--url", server.url, "--timeout", str(LONG_TIMEOUT_S), "--interval", str(FAST_PROBE_S)]
    )

    assert args.handler(args) == EXIT_OK
    assert f"{server.url} is ready" in capsys.readouterr().out


def test_the_wait_command_exits_non_zero_with_the_log_when_the_server_never_generates(
    fake_server_factory: Callable[..., Any], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    server = fake_server_factory(warmup_probes=10**9)
    server.start()
    log = tmp_path / "server.log"
    write_log(log, secret="unused")
    args = parse(
        ["wait", "--url", server.url, "--timeout", str(SHORT_TIMEOUT_S), "--interval", str(FAST_PROBE_S),
         "--log", str(log)]
    )  # fmt: skip

    assert args.handler(args) == EXIT_NOT_READY
    error = capsys.readouterr().err
    assert "is not ready" in error
    assert "line 100" in error


def test_the_log_tail_reads_only_the_end_of_a_large_log(tmp_path: Path) -> None:
    log = tmp_path / "big.log"
    log.write_text("".join(f"decode batch {number}\n" for number in range(200_000)))
    tail = log_tail(log, lines=2)
    assert tail == "decode batch 199998\ndecode batch 199999"
    assert "cannot read" in log_tail(tmp_path / "missing.log")
