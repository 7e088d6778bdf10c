"""Reading records back from Redis: a ceiling on every blob and JSON value, and each staged record held
against its field and the run before it is trusted."""

from __future__ import annotations

import sys
import tracemalloc

import msgspec
import pytest

from core.records import Completion, DeadLetter
from producer.status.quarantine_figures import QuarantineFigures, quarantine_warning
from tests.support.records import completion
from workers.errors import RecordUnreadable
from workers.record.record_checks import RunView, judge_dead_letter, judge_staged
from workers.state.codec import OVER_LIMIT, UNREADABLE, decode_blob, decode_json, encode_blob, inflate
from workers.state.record_limits import (
    RECORD_LIMIT_BYTES,
    REQUEST_RECORD_BYTES,
    SMALL_RECORD_LIMIT_BYTES,
)

if sys.version_info >= (3, 14):
    from compression import zstd
else:
    from backports import zstd

LIMIT_BYTES = 1 << 20  # a small ceiling: the tests inflate at most a few of it
MIB = 1 << 20
RUNS = RunView(accepted=True, done=False, dead=False, staged=True)


def streamed(data_chunks: int, chunk: bytes = b"a" * MIB) -> bytes:
    """A frame that declares no size, as a streaming writer leaves it."""
    compressor = zstd.ZstdCompressor(level=3)
    return b"".join(compressor.compress(chunk) for _ in range(data_chunks)) + compressor.flush()


def peak_while(action: object) -> int:
    tracemalloc.start()
    try:
        with pytest.raises(RecordUnreadable) as refused:
            inflate(action, limit_bytes=LIMIT_BYTES)  # type: ignore[arg-type]
        _now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert refused.value.reason == OVER_LIMIT
    return peak


def test_the_record_limit_holds_a_request_filling_the_longest_context_with_its_text_and_ids() -> None:
    assert REQUEST_RECORD_BYTES == 16 * MIB
    assert RECORD_LIMIT_BYTES > 4 * REQUEST_RECORD_BYTES  # and a conversation's earlier turns
    assert decode_blob(encode_blob(completion("p")), Completion, limit_bytes=LIMIT_BYTES).prompt_id == "p"


def test_a_frame_declaring_more_than_the_ceiling_is_refused_before_a_byte_is_inflated() -> None:
    bomb = zstd.compress(b"a" * (4 * LIMIT_BYTES))
    assert zstd.get_frame_info(bomb).decompressed_size == 4 * LIMIT_BYTES

    assert peak_while(bomb) < LIMIT_BYTES // 4


def test_a_streamed_frame_inflating_past_the_ceiling_is_cut_off_one_byte_past_it() -> None:
    bomb = streamed(data_chunks=64)  # 64 MiB from a few KB
    assert len(bomb) < 64 * 1024

    assert peak_while(bomb) < 3 * LIMIT_BYTES


@pytest.mark.parametrize(
    "blob",
    [
        b"",
        b"\x00not a frame",
        encode_blob(completion("p"))[:-4],  # cut short
        encode_blob(completion("p")) + encode_blob(completion("q")),  # a second frame after it
        zstd.compress(b"[1, 2"),  # a frame, not JSON
        zstd.compress(b'{"prompt_id": "p"}'),  # JSON, not a completion
    ],
    ids=["empty", "garbage", "cut-short", "two-frames", "not-json", "not-a-completion"],
)
def test_what_is_not_one_whole_frame_of_the_record_is_unreadable(blob: bytes) -> None:
    with pytest.raises(RecordUnreadable) as refused:
        decode_blob(blob, Completion, limit_bytes=LIMIT_BYTES)
    assert refused.value.reason == UNREADABLE


def test_a_json_record_past_its_ceiling_is_refused_without_decoding() -> None:
    letter = DeadLetter(prompt_id="p", row=1, reason="x", error="e" * SMALL_RECORD_LIMIT_BYTES, attempts=1)
    with pytest.raises(RecordUnreadable) as refused:
        decode_json(msgspec.json.encode(letter), DeadLetter, limit_bytes=SMALL_RECORD_LIMIT_BYTES)
    assert refused.value.reason == OVER_LIMIT


@pytest.mark.parametrize(
    ("field", "blob", "view", "reason"),
    [
        ("p1", None, RUNS, "missing_record"),
        ("p1", b"junk", RUNS, "unreadable"),
        ("p1", encode_blob(completion("p2")), RUNS, "prompt_id_mismatch"),
        ("p9", encode_blob(completion("p9")), RunView(False, False, False, True), "not_accepted"),
        ("p1", encode_blob(completion("p1")), RunView(True, True, False, True), "already_committed"),
        ("p1", encode_blob(completion("p1")), RunView(True, False, True, True), "already_dead_lettered"),
    ],
)
def test_a_staged_record_is_quarantined_with_the_first_reason_that_applies(
    field: str, blob: bytes | None, view: RunView, reason: str
) -> None:
    checked = judge_staged(field, blob, view)

    assert checked.record is None and checked.quarantined is not None
    assert (checked.quarantined.kind, checked.quarantined.id, checked.quarantined.reason) == (
        "staged",
        field,
        reason,
    )
    assert checked.real_prompt is view.accepted


def test_a_staged_record_of_its_own_accepted_unsettled_prompt_is_committed() -> None:
    checked = judge_staged("p1", encode_blob(completion("p1")), RUNS)

    assert checked.record is not None and checked.quarantined is None and checked.inflated_bytes > 0


def test_a_quarantined_record_keeps_a_bounded_preview_of_what_it_held() -> None:
    checked = judge_staged("p1", encode_blob(completion("p2", size=10_000)), RUNS)

    assert checked.quarantined is not None
    assert checked.quarantined.preview.startswith('{"prompt_id":"p2"')
    assert len(checked.quarantined.preview) <= 256


def test_a_dead_letter_of_a_committed_prompt_is_not_committed_as_dead_too() -> None:
    letter = DeadLetter(prompt_id="p1", row=1, reason="x", error="e", attempts=1)

    checked = judge_dead_letter("p1", msgspec.json.encode(letter), RunView(True, True, True, False))

    assert checked.quarantined is not None and checked.quarantined.reason == "already_committed"


def test_status_names_the_quarantine_and_what_the_operator_must_do() -> None:
    figures = QuarantineFigures(
        records=2, reasons={"not_accepted": 1, "unreadable": 1}, awaiting_regeneration=1, read=2
    )

    line = quarantine_warning(figures, remaining=1, open_batches=0)

    assert line is not None
    assert line.startswith("2 records quarantined (not_accepted 1, unreadable 1)")
    assert "1 real prompts of theirs are to be generated again" in line
    assert "re-run `enqueue` with the same data" in line
    assert quarantine_warning(None, remaining=0, open_batches=0) is None
    assert "re-run" not in (quarantine_warning(figures, remaining=1, open_batches=1) or "")


def test_a_staged_record_with_kept_columns_parquet_cannot_write_is_quarantined_not_wedging_its_part() -> None:
    types = {"lang": "string"}
    fits = msgspec.structs.replace(completion("p1"), columns={"lang": "en"})
    wrong = msgspec.structs.replace(completion("p1"), columns={"lang": 3})
    unkept = msgspec.structs.replace(completion("p1"), columns={"other": "x"})

    assert judge_staged("p1", encode_blob(fits), RUNS, types).record == fits
    for record, detail in ((wrong, "column 'lang' holds an integer"), (unkept, "holds column 'other'")):
        checked = judge_staged("p1", encode_blob(record), RUNS, types)
        assert checked.record is None and checked.quarantined is not None
        assert checked.quarantined.reason == "unreadable" and detail in checked.quarantined.detail
