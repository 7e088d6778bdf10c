"""Prompt ids: the row's own id, else a stable hash of the normalised conversation."""

from __future__ import annotations

import hashlib
import json
import random

import msgspec
import pytest

from core.records import Message, Prompt
from intake.prompt_ids import MAX_ID_CHARS, hashed_id
from intake.rejected import RejectedRow
from intake.rows import parse_row
from producer.enqueue.fingerprints import Fingerprint
from workers.record.enqueued import decode_enqueued


def id_of(raw: object) -> str:
    result = parse_row(raw, row=1)
    assert isinstance(result, Prompt), result
    return result.id


def rejection_of(raw: object) -> str:
    result = parse_row(raw, row=1)
    assert isinstance(result, RejectedRow), result
    return result.reason


QUESTION = "What is 2 + 2?"


def test_the_rows_own_string_id_is_used_as_written() -> None:
    assert id_of({"id": " q-1", "prompt": QUESTION}) == " q-1"


def test_an_integer_id_becomes_its_decimal_string() -> None:
    assert id_of({"id": 123, "prompt": QUESTION}) == "123"


def test_custom_id_then_uuid_are_used_when_id_is_absent_or_null() -> None:
    assert id_of({"custom_id": "batch-7", "uuid": "u", "prompt": QUESTION}) == "batch-7"
    assert id_of({"id": None, "uuid": "u-9", "prompt": QUESTION}) == "u-9"


@pytest.mark.parametrize(
    ("raw_id", "reason"),
    [
        (1.5, "id: must be a string or an integer, got float"),
        (True, "id: must be a string or an integer, got bool"),
        (["a"], "id: must be a string or an integer, got list"),
        ("", "id: is empty"),
        ("   ", "id: is empty"),
        ("x" * (MAX_ID_CHARS + 1), f"id: is {MAX_ID_CHARS + 1} characters long, more than {MAX_ID_CHARS}"),
    ],
)
def test_an_unusable_id_is_a_rejection_not_a_silent_fallback_to_the_hash(raw_id: object, reason: str) -> None:
    assert rejection_of({"id": raw_id, "prompt": QUESTION}) == reason


def test_a_row_without_an_id_gets_a_prefixed_sha256_of_its_canonical_messages() -> None:
    canonical = json.dumps([{"content": QUESTION, "role": "user"}], sort_keys=True, separators=(",", ":"))
    expected = "h-" + hashlib.sha256(canonical.encode()).hexdigest()[:32]
    assert id_of({"prompt": QUESTION}) == expected


def test_sharegpt_and_openai_rows_of_the_same_conversation_get_the_same_id() -> None:
    openai = {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
            {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": QUESTION},
            {"role": "assistant", "content": "4"},
        ]
    }
    sharegpt = {
        "conversations": [
            {"from": "system", "value": "Be brief."},
            {"from": "human", "value": "Hi"},
            {"from": "gpt", "value": "Hello!"},
            {"from": "human", "value": QUESTION},
        ]
    }
    assert id_of(openai) == id_of(sharegpt)


def test_a_prompt_row_and_a_one_turn_conversation_get_the_same_id() -> None:
    as_prompt = {"prompt": QUESTION, "system": "Be brief."}
    as_messages = {
        "messages": [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": QUESTION}]
    }
    as_sharegpt = {"system": "Be brief.", "conversations": [{"from": "human", "value": QUESTION}]}
    assert id_of(as_prompt) == id_of(as_messages) == id_of(as_sharegpt)


def test_whitespace_is_part_of_the_content_so_it_changes_the_id() -> None:
    assert id_of({"prompt": QUESTION}) != id_of({"prompt": QUESTION + "\n"})


def test_the_system_prompt_and_the_turn_order_are_part_of_the_id() -> None:
    assert id_of({"prompt": QUESTION}) != id_of({"prompt": QUESTION, "system": "Be brief."})
    swapped = [Message(role="user", content="a"), Message(role="user", content="b")]
    assert hashed_id(swapped) != hashed_id(list(reversed(swapped)))


def test_non_ascii_content_is_hashed_as_utf8_not_as_json_escapes() -> None:
    text = "Qu'est-ce qu'un trou noir ? 黑洞"
    canonical = json.dumps([{"content": text, "role": "user"}], separators=(",", ":"), ensure_ascii=False)
    assert id_of({"prompt": text}) == "h-" + hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:32]


def test_a_fingerprint_keeps_the_file_of_a_folder_row_even_one_whose_name_holds_the_separator() -> None:
    fingerprint = Fingerprint(digest="0123456789abcdef", enqueue_number=2, row=7, file="x|y.jsonl")

    assert Fingerprint.decode(fingerprint.encode().encode()) == fingerprint
    assert fingerprint.place() == "x|y.jsonl:7"


def test_a_fingerprint_written_before_files_were_kept_still_reads_with_its_row() -> None:
    assert Fingerprint.decode(b"0123456789abcdef|1|12") == Fingerprint("0123456789abcdef", 1, 12)


def test_a_prompt_of_a_one_file_source_travels_without_a_file_name() -> None:
    prompt = parse_row({"id": "q0", "prompt": "hi"}, row=3)

    assert b"file" not in msgspec.json.encode(prompt)


def test_an_enqueued_object_written_before_fingerprints_were_kept_still_reads_as_its_ids() -> None:
    chunk = decode_enqueued(b'["q0", "q1"]')

    assert (chunk.ids, chunk.fingerprints) == (["q0", "q1"], {})


RECIPE_SEED = 20261204
RECIPE_CONVERSATIONS = 5000
CHARACTERS = [chr(code) for code in range(0x800)] + ["\u2028", "\u2029", "\ufeff", "\uffff", "\U0001f600"]


def recipe_id(messages: list[Message]) -> str:
    """The id exactly as the module docstring's recipe writes it, with the standard library."""
    canonical = json.dumps(
        [{"content": m.content, "role": m.role} for m in messages],
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return "h-" + hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:32]


def test_a_hashed_id_is_the_documented_recipe_for_every_kind_of_character() -> None:
    # ids must never change across versions: a re-run would enqueue every prompt again
    print(f"seed {RECIPE_SEED}")
    rng = random.Random(RECIPE_SEED)
    for _ in range(RECIPE_CONVERSATIONS):
        texts = ["".join(rng.choices(CHARACTERS, k=rng.randint(0, 40))) for _ in range(rng.randint(1, 3))]
        messages = [Message(role=rng.choice(["system", "user", "assistant"]), content=t) for t in texts]
        assert hashed_id(messages) == recipe_id(messages), messages
