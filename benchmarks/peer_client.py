"""A plain client of the peer's design (SpecForge's `scripts/regenerate_train_data.py`; see the peer survey):
a thread pool of `concurrency × servers` threads making synchronous, non-streamed openai calls, one whole
conversation per thread (its turns one after the other, each request holding the answers this client
generated for the turns before it, their reasoning left out), each conversation given to the next server
round robin, with at most `concurrency` conversations in flight per server: when the picked server is
full, dispatch waits for one of *its* conversations to end, however idle the other servers are (the
peer's head-of-line blocking). A conversation with an empty answer or an empty reasoning is dropped whole
from there on (the peer's error row).

Two kindnesses to the peer, neither of which makes it slower: dispatch blocks on the picked server's
futures instead of polling them in a busy loop, and each request carries a rid naming its conversation
(`<run>:<prompt id>:<8 hex>`, as draftgen's do) so the server's log can tell the turns apart.

Run as its own process (so its CPU is its own), by benchmarks/bench_peer.py:

    python -m benchmarks.peer_client --prompts FILE --run NAME --concurrency 48 --server URL [--server URL]
        [--cpu N]

It prints one JSON object: the CPU seconds it used from its first request to its last answer, and how
many conversations it finished and dropped.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

import msgspec
import openai

from core.records import Message, Prompt, SamplingSettings

PEER_API_KEY = "None"  # what the peer sends; the simulator asks for none


class PeerOutcome(msgspec.Struct, frozen=True):
    cpu_s: float
    finished: int
    dropped: int


def peer_request(messages: Sequence[Message], sampling: SamplingSettings, rid: str) -> dict[str, Any]:
    """The peer's request (`--reasoning save`): non-streamed, thinking on, `max_tokens`."""
    return {
        "model": sampling.model,
        "messages": [{"role": m.role, "content": m.content} for m in messages],
        "max_tokens": sampling.max_tokens,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "stream": False,
        "extra_body": {
            "top_k": sampling.top_k,
            "chat_template_kwargs": {"enable_thinking": sampling.enable_thinking},
            "rid": rid,
        },
    }


def reasoning_of(message: Any) -> str | None:
    extra = getattr(message, "model_extra", None) or {}
    reasoning = getattr(message, "reasoning_content", None) or extra.get("reasoning_content")
    return reasoning if isinstance(reasoning, str) else None


def conversation(base_url: str, prompt: Prompt, run: str, sampling: SamplingSettings) -> bool:
    """Every turn of `prompt` in order; False when one failed or came back empty (the rest are not sent)."""
    client = openai.OpenAI(base_url=base_url, api_key=PEER_API_KEY)  # the peer makes one per conversation
    answers: list[str] = []
    for _turn in range(prompt.turn_count):
        rid = f"{run}:{prompt.id}:{uuid.uuid4().hex[:8]}"
        try:
            response = client.chat.completions.create(
                **peer_request(prompt.request_messages(answers), sampling, rid)
            )
        except openai.OpenAIError:  # the peer writes an error row and goes on
            return False
        message = response.choices[0].message
        reasoning = reasoning_of(message)
        if not message.content or not message.content.strip() or not reasoning or not reasoning.strip():
            return False
        answers.append(message.content)
    return True


def run_peer(
    base_urls: Sequence[str],
    prompts: Sequence[Prompt],
    run: str,
    concurrency: int,
    sampling: SamplingSettings,
) -> PeerOutcome:
    in_flight: dict[str, set[Future[bool]]] = {url: set() for url in base_urls}
    ended: list[bool] = []
    cpu_before = time.process_time()
    with ThreadPoolExecutor(max_workers=concurrency * len(base_urls)) as pool:
        for index, prompt in enumerate(prompts):
            url = base_urls[index % len(base_urls)]
            while len(in_flight[url]) >= concurrency:
                done, in_flight[url] = wait(in_flight[url], return_when=FIRST_COMPLETED)
                ended.extend(future.result() for future in done)
            in_flight[url].add(pool.submit(conversation, url, prompt, run, sampling))
        ended.extend(future.result() for futures in in_flight.values() for future in futures)
    return PeerOutcome(
        cpu_s=time.process_time() - cpu_before, finished=sum(ended), dropped=len(ended) - sum(ended)
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--prompts", type=Path, required=True, help="a JSON list of prompts (msgspec)")
    parser.add_argument("--run", required=True, help="the first part of every rid")
    parser.add_argument("--concurrency", type=int, required=True, help="conversations in flight per server")
    parser.add_argument("--server", action="append", required=True, help="a server's /v1 URL (repeat)")
    parser.add_argument("--sampling", default="{}", help="SamplingSettings as JSON (its defaults otherwise)")
    parser.add_argument("--cpu", type=int, default=None, help="pin this process to that core")
    args = parser.parse_args(argv)
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})  # before the pool starts: every thread inherits it
    prompts = msgspec.json.decode(args.prompts.read_bytes(), type=list[Prompt])
    sampling = msgspec.json.decode(args.sampling, type=SamplingSettings)
    outcome = run_peer(args.server, prompts, args.run, args.concurrency, sampling)
    sys.stdout.write(msgspec.json.encode(outcome).decode() + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
