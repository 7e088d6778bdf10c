"""Poison prompts: a prompt that drops or hangs the server every time is dead-lettered with what happened,
its batch goes on, and a failure with the server down is not counted against the prompts in flight."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from inference.chat_stream import ChatResult, ProgressCallback
from inference.errors import FailureCause, InferenceUnavailable
from inference.records import Message, Origin, SamplingSettings
from tests.support.handover import Recorder
from tests.support.records import prompt
from tests.unit.test_generation import FakeServer
from workers.generate.generation import REASON_POISON, GenerationEngine, RetryPolicy
from workers.generate.silence import PROBE_RID_PREFIX
from workers.state.poison import PoisonPolicy, Strike, Verdict, describe

ATTEMPTS = 3  # the README's DRAFTGEN_MAX_ATTEMPTS
WINDOW = 4


class PoisonedServer(FakeServer):
    """Answers every prompt at once but drops the connection of some, every time; answers the one-token
    question unless it is `down`; records how many requests ran beside each one sent."""

    def __init__(self, *, drops: set[str], down: bool = False) -> None:
        super().__init__()
        self.drops = drops
        self.down = down
        self.running_beside: dict[str, list[int]] = {}

    async def chat(
        self,
        messages: list[Message],
        sampling: SamplingSettings,
        rid: str,
        on_progress: ProgressCallback | None = None,
    ) -> ChatResult:
        if rid.startswith(PROBE_RID_PREFIX):
            if self.down:
                raise InferenceUnavailable("connection refused", cause=FailureCause.REFUSED)
            return await super().chat(messages, sampling, f"{PROBE_RID_PREFIX}:probe", on_progress)
        prompt_id = rid.split(":")[1]
        self.running_beside.setdefault(prompt_id, []).append(self.running)
        if prompt_id in self.drops:
            await asyncio.sleep(0)
            raise InferenceUnavailable("the connection was reset", cause=FailureCause.DROPPED)
        return await super().chat(messages, sampling, rid, on_progress)


def engine_over(server: FakeServer, name: str) -> GenerationEngine:
    return GenerationEngine(
        lambda: server,
        max_in_flight=WINDOW,
        retry=RetryPolicy(max_attempts=ATTEMPTS, backoff_base_s=0.001, backoff_cap_s=0.001),
        origin=Origin(host="h", gpu=int(name[-1]), server_url=f"http://{name}"),
        server_identity=name,
    )


@pytest.fixture
def engines() -> Iterator[list[GenerationEngine]]:
    started: list[GenerationEngine] = []
    yield started
    for engine in started:
        engine.close()


def answering(server: FakeServer, *prompt_ids: str) -> None:
    for prompt_id in (*prompt_ids, "probe"):
        server.releaser(prompt_id).set()


def test_a_prompt_that_drops_its_connection_on_one_server_every_time_is_dead_lettered_and_its_batch_goes_on(
    engines: list[GenerationEngine],
) -> None:
    server = PoisonedServer(drops={"bad"})
    answering(server, "a", "b")
    engines.append(engine_over(server, "gpu0"))
    recorder = Recorder()
    batch = [prompt("a"), prompt("bad"), prompt("b")]

    first = engines[0].submit_batch("r", batch, SamplingSettings(), recorder).outcome()
    second = engines[0].submit_batch("r", [prompt("bad")], SamplingSettings(), recorder).outcome()

    assert sorted(c.prompt_id for c in recorder.staged) == ["a", "b"]
    assert first.unreachable == ["bad"]  # three strikes on one server: it may still be the server's
    assert second.dead_lettered == 1
    (letter,) = recorder.dead
    assert letter.reason == REASON_POISON
    assert letter.error == "no answer 5 times on 1 server: its connection dropped (5)"
    assert letter.attempts == 5


def test_three_drops_on_two_servers_dead_letter_a_prompt(engines: list[GenerationEngine]) -> None:
    recorder = Recorder()  # the strikes in Redis, which every worker shares
    for name in ("gpu0", "gpu1"):
        server = PoisonedServer(drops={"bad"})
        answering(server)
        engines.append(engine_over(server, name))

    first = engines[0].submit_batch("r", [prompt("bad")], SamplingSettings(), recorder).outcome()
    second = engines[1].submit_batch("r", [prompt("bad")], SamplingSettings(), recorder).outcome()

    assert first.unreachable == ["bad"]
    assert second.dead_lettered == 1
    assert recorder.dead[0].error == "no answer 4 times on 2 servers: its connection dropped (4)"


def test_a_drop_as_the_server_goes_down_is_not_held_against_the_prompt(
    engines: list[GenerationEngine],
) -> None:
    server = PoisonedServer(drops=set(), down=True)
    server.failures["p"] = [
        InferenceUnavailable("the connection was reset", cause=FailureCause.DROPPED),  # the crash
        *(InferenceUnavailable("connection refused", cause=FailureCause.REFUSED) for _ in range(2)),
    ]
    engines.append(engine_over(server, "gpu0"))
    recorder = Recorder()

    outcome = engines[0].submit_batch("r", [prompt("p")], SamplingSettings(), recorder).outcome()

    assert outcome.unreachable == ["p"]
    assert [s.on_its_own for s in recorder.strikes["p"]] == [False]
    assert recorder.dead == []


def test_a_prompt_in_flight_at_two_server_failures_is_sent_alone_next_time(
    engines: list[GenerationEngine],
) -> None:
    server = PoisonedServer(drops=set())
    answering(server, "a", "b", "suspect")
    engines.append(engine_over(server, "gpu0"))
    recorder = Recorder()
    for life in ("gpu0#x.0", "gpu0#x.1"):
        recorder.strike("suspect", Strike(life=life, cause=FailureCause.DROPPED.value, on_its_own=False))

    engines[0].submit_batch(
        "r", [prompt("a"), prompt("suspect"), prompt("b")], SamplingSettings(), recorder
    ).outcome()

    assert sorted(c.prompt_id for c in recorder.staged) == ["a", "b", "suspect"]
    assert server.running_beside["suspect"] == [0]


def test_the_policy_needs_strikes_on_two_servers_or_many_on_one() -> None:
    policy = PoisonPolicy()
    own = [Strike(life="gpu0#a.0", cause="silent", on_its_own=True)] * 3
    assert policy.judge(own) is Verdict.AS_USUAL
    assert policy.judge([*own, Strike(life="gpu1#b.0", cause="dropped", on_its_own=True)]) is Verdict.DEAD
    assert policy.judge(own * 2) is Verdict.DEAD
    together = [Strike(life="gpu0#a.0", cause="dropped", on_its_own=False)] * 2
    assert policy.judge(together) is Verdict.ALONE
    assert policy.judge(together * 10) is Verdict.ALONE  # never dead for failing with the server


def test_a_poison_prompt_s_reason_says_what_happened_where() -> None:
    strikes = [
        Strike(life="h/gpu0#a.0", cause="silent", on_its_own=True),
        Strike(life="h/gpu0#a.1", cause="silent", on_its_own=True),
        Strike(life="h/gpu1#b.0", cause="dropped", on_its_own=True),
        Strike(life="h/gpu1#b.0", cause="dropped", on_its_own=False),
    ]
    assert describe(strikes) == (
        "no answer 3 times on 2 servers (3 server lives): silent while the server generated (2), "
        "its connection dropped (1); 1 more with the server failing too"
    )
