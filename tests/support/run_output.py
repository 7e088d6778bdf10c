"""A run's committed output written straight into a folder, as the uploader leaves it, for export tests."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import msgspec

from core.records import Completion, Message, Origin, Quality, SamplingSettings, Timings, Usage
from core.run_settings.model import RunSettings
from inference.server_facts import ServerFacts, encode_facts, facts_id
from workers.record.manifest import ManifestEntry, data_key, encode_entry, manifest_key, server_key
from workers.record.parquet_io import completions_to_parquet
from workers.record.storage import FolderStore
from workers.state.runs import encode_run_settings

IM_START, IM_END, THINK_OPEN, THINK_CLOSE, NEWLINE = 151644, 151645, 151667, 151668, 198
WORD_ID = 1000

FACTS = ServerFacts(
    server_url="http://10.0.0.7:30000",
    version="0.5.23",
    model_path="Qwen/Qwen3.6-27B",
    served_model_name="Qwen/Qwen3.6-27B",
    context_length=262144,
    reasoning_parser="qwen3",
    speculative_algorithm="EAGLE",
    speculative_draft_model_path=None,
    speculative_num_steps=3,
    speculative_eagle_topk=1,
    speculative_num_draft_tokens=4,
    tp_size=2,
    dp_size=1,
    dtype="bfloat16",
    kv_cache_dtype="auto",
)
SERVER_ID = facts_id(FACTS)


def completion(
    prompt_id: str,
    *,
    thinking_words: int = 60,
    answer_words: int = 12,
    quality: Quality = Quality.OK,
    thinking: bool = True,
    content: str | None = None,
    with_ids: bool = True,
) -> Completion:
    """A completion shaped as SGLang returns it: ids counted like the simulator's, usage consistent."""
    question = f"question {prompt_id}"
    prompt_ids = [
        IM_START,
        WORD_ID,
        NEWLINE,
        WORD_ID,
        WORD_ID,
        IM_END,
        IM_START,
        WORD_ID,
        NEWLINE,
        THINK_OPEN,
        NEWLINE,
    ]
    if thinking:
        reasoning: str | None = " ".join(["step"] * thinking_words) + "\n"
        response_ids = [WORD_ID] * thinking_words + [THINK_CLOSE]
    else:
        reasoning = None
        response_ids = []
    answer = content if content is not None else "\n\n" + " ".join(["word"] * answer_words)
    response_ids += [WORD_ID] * len(answer.split()) + [IM_END]
    return Completion(
        prompt_id=prompt_id,
        messages=[Message(role="user", content=question)],
        reasoning_content=reasoning,
        content=answer,
        finish_reason="stop",
        usage=Usage(
            prompt_tokens=len(prompt_ids),
            completion_tokens=len(response_ids),
            reasoning_tokens=thinking_words + 1 if thinking else 0,
        ),
        timings=Timings(started_at=1.0, finished_at=2.0, latency_s=1.0),
        model="Qwen/Qwen3.6-27B",
        sampling=SamplingSettings(model="Qwen/Qwen3.6-27B", enable_thinking=thinking),
        origin=Origin(host="gpu-node-1", gpu=0, server_url=FACTS.server_url, server=SERVER_ID),
        attempt=1,
        quality=quality,
        prompt_token_ids=prompt_ids if with_ids else None,
        response_token_ids=response_ids if with_ids else None,
    )


def conversation(prompt_id: str, *, turns: int = 3, thinking_words: int = 20) -> Completion:
    """A conversation regenerated turn by turn: turn j thinks `thinking_words + j` words, and its
    request holds the answers of the turns before it (their ids in the prompt, as the server counts)."""
    answered = [completion(prompt_id, thinking_words=thinking_words + turn) for turn in range(turns)]
    messages: list[Message] = []
    for turn, earlier in enumerate(answered[:-1]):
        messages += [
            Message(role="user", content=f"question {turn + 1}"),
            Message(role="assistant", content=earlier.content),
        ]
    messages.append(Message(role="user", content=f"question {turns}"))
    history_ids = [WORD_ID] * sum(len(c.content.split()) + 4 for c in answered[:-1])
    last = answered[-1]
    return msgspec.structs.replace(
        last,
        messages=messages,
        prompt_token_ids=history_ids + (last.prompt_token_ids or []),
        earlier_turns=[earlier.as_turn() for earlier in answered[:-1]],
        conversation_turns=turns,
    )


def write_run_output(
    folder: Path,
    run: str,
    parts: list[list[Completion]],
    *,
    thinking: bool = True,
    column_types: dict[str, str] | None = None,
) -> str:
    """The folder's file:// URL, holding `run.json`, the server's facts and one committed part per list
    (the completions' kept columns of `column_types`)."""
    store = FolderStore(folder)
    sampling = SamplingSettings(model="Qwen/Qwen3.6-27B", enable_thinking=thinking)
    settings = RunSettings(
        run=run,
        sampling=sampling,
        output=store.url,
        keep_columns=tuple(column_types) if column_types else None,
        column_types=column_types,
    )
    store.put("run.json", encode_run_settings(settings))
    store.put(server_key(SERVER_ID), encode_facts(FACTS))
    for part, completions in enumerate(parts):
        data = completions_to_parquet(completions, column_types)
        checksum = hashlib.sha256(data).hexdigest()
        store.put(data_key(part, checksum), data)
        entry = ManifestEntry(
            part=part,
            key=data_key(part, checksum),
            count=len(completions),
            bytes=len(data),
            sha256=checksum,
            committed_at=time.time(),
            run=run,
        )
        store.put(manifest_key(part), encode_entry(entry))
    return store.url


def files_under(folder: Path) -> dict[str, bytes]:
    """Every file's bytes by its path relative to `folder`."""
    return {
        str(path.relative_to(folder)): path.read_bytes()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


__all__ = ["FACTS", "SERVER_ID", "completion", "conversation", "files_under", "msgspec", "write_run_output"]
