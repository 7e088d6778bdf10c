"""The status figures as pure functions of what Redis holds and of a fake clock."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from core.records import Quality
from inference.metrics_reader import parse_metrics
from inference.server_probe import accept_length_from_server_info
from producer.errors import SettingsError
from producer.status.command import resolve_price
from producer.status.figures import (
    MIN_COMPLETIONS_FOR_ETA,
    STATE_DRAINING,
    STATE_FINISHED,
    STATE_PAUSED,
    STATE_RUNNING,
    STATE_UPLOADING,
    STATE_WAITING,
    Event,
    dead_letters_by_reason,
    estimate_cost,
    estimate_eta,
    gpu_rows,
    held_work,
    make_progress,
    parse_events,
    quality_figures,
    rates_over,
    recent_window_s,
    run_started_s,
    run_state,
    split_unacked,
    stranded_warning,
    stream_id_s,
    window_rates,
)
from producer.status.model import (
    Cost,
    QueueDepth,
    RunStatus,
)
from producer.status.parser import PRICE_ENV
from producer.status.view import duration, held_line, render_status, size
from tests.support.status_samples import START_S, heartbeat, paused_young_status
from workers.recovery.seat_view import SeatReading, WorkerLife, worker_life
from workers.state.heartbeats import decode_heartbeat, encode_heartbeat
from workers.state.stats_fields import RATE_WINDOW_S, parse_counters


def steady_events(*, per_s: float, seconds: float, tokens: int = 2_000, gpus: int = 1) -> list[Event]:
    """Completions arriving evenly from START_S, round-robin over `gpus` GPUs."""
    count = int(per_s * seconds)
    return [Event(at_s=START_S + i / per_s, tokens=tokens, gpu=f"node/gpu{i % gpus}") for i in range(count)]


def test_a_stream_id_is_its_redis_clock_milliseconds() -> None:
    assert stream_id_s(b"1800000000123-4") == pytest.approx(1_800_000_000.123)


def test_stream_entries_become_events_and_odd_fields_do_not_break_them() -> None:
    events = parse_events([(b"1000-0", {b"tokens": b"42", b"gpu": b"a/gpu0"}), (b"2000-0", {})])
    assert events == [Event(1.0, 42, "a/gpu0"), Event(2.0, 0, "?")]


def test_counters_keep_the_integer_fields_only_and_one_past_64_bits_is_none() -> None:
    huge = b"9" * 5_000  # int() refuses past 4,300 digits: one written into Redis must not stop status
    odd = {b"x": b"abc", b"turns": huge, b"dashes": b"--5", b"empty": b""}
    assert parse_counters({b"completions": b"7", b"neg": b"-2", **odd}) == {
        "completions": 7,
        "neg": -2,
    }


def test_the_run_starts_at_the_oldest_event_while_the_stream_still_holds_the_first_second() -> None:
    assert run_started_s(1_800_000_000, 1_800_000_000.75) == 1_800_000_000.75
    assert run_started_s(1_800_000_000, 1_800_000_500.0) == 1_800_000_000.0  # trimmed: the second it is
    assert run_started_s(None, None) is None


def test_the_recent_window_is_a_minute_or_the_run_age_when_younger() -> None:
    assert recent_window_s(START_S + 25, START_S) == 25
    assert recent_window_s(START_S + 600, START_S) == RATE_WINDOW_S
    assert recent_window_s(START_S + 600, None) == 0


def test_recent_rates_count_only_the_last_minute() -> None:
    events = steady_events(per_s=5, seconds=300)  # 5 completions/s for five minutes
    now = START_S + 300
    rates = window_rates(events, now_s=now, window_s=recent_window_s(now, START_S))
    assert rates.window_s == RATE_WINDOW_S
    assert rates.completions_per_s == pytest.approx(5, rel=0.02)
    assert rates.output_tokens_per_s == pytest.approx(10_000, rel=0.02)


def test_a_young_run_rates_over_its_age_not_a_full_minute() -> None:
    events = steady_events(per_s=4, seconds=15)
    now = START_S + 15
    rates = window_rates(events, now_s=now, window_s=recent_window_s(now, START_S))
    assert rates.completions_per_s == pytest.approx(4, rel=0.02)


def test_a_stalled_run_rates_fall_to_zero_within_a_minute() -> None:
    events = steady_events(per_s=4, seconds=100)
    now = START_S + 100 + RATE_WINDOW_S + 1
    assert window_rates(events, now_s=now, window_s=RATE_WINDOW_S).completions == 0


def test_eta_is_remaining_prompts_over_the_recent_rate_on_a_fake_clock() -> None:
    # Given a steady run of 1,000 prompts at 5 completions/s, observed at 40% done
    total, per_s = 1_000, 5.0
    done_at_40 = int(total * 0.4)
    now = START_S + done_at_40 / per_s
    events = steady_events(per_s=per_s, seconds=done_at_40 / per_s)
    recent = window_rates(events, now_s=now, window_s=recent_window_s(now, START_S))
    # Then the ETA is the real time to the end, and names its basis
    eta = estimate_eta(total - done_at_40, recent, now_s=now, paused=False)
    real_remaining = (total - done_at_40) / per_s
    assert eta.seconds == pytest.approx(real_remaining, rel=0.02)
    assert eta.finishes_at == pytest.approx(now + real_remaining, rel=1e-9)
    assert "600 remaining" in eta.basis


def test_eta_is_unknown_before_enough_completions_and_while_paused() -> None:
    few = rates_over(MIN_COMPLETIONS_FOR_ETA - 1, 1000, 10.0)
    assert estimate_eta(100, few, now_s=START_S, paused=False).seconds is None
    assert "unknown until" in estimate_eta(100, few, now_s=START_S, paused=False).basis
    plenty = rates_over(MIN_COMPLETIONS_FOR_ETA * 10, 1000, 10.0)
    assert estimate_eta(100, plenty, now_s=START_S, paused=True).seconds is None
    assert estimate_eta(0, few, now_s=START_S, paused=True).seconds == 0


def test_the_reference_run_costs_what_the_design_says() -> None:
    # 7 GPUs for 45 hours at $3.80 per GPU-hour: about $1,200.
    cost = estimate_cost(
        gpus=7, elapsed_s=20 * 3600, eta_s=25 * 3600, price_per_gpu_hour=3.80, price_source="test"
    )
    assert cost.gpu_hours == pytest.approx(140)
    assert cost.so_far_usd == pytest.approx(532)
    assert cost.projected_gpu_hours == pytest.approx(315)
    assert cost.projected_total_usd == pytest.approx(1197)
    assert "7 GPUs" in cost.assumption and "$3.80" in cost.assumption


def test_without_a_price_cost_stays_in_gpu_hours_and_says_how_to_set_one() -> None:
    cost = estimate_cost(gpus=2, elapsed_s=1800, eta_s=None, price_per_gpu_hour=None, price_source="")
    assert (cost.gpu_hours, cost.so_far_usd, cost.projected_gpu_hours) == (1.0, None, None)
    assert PRICE_ENV in cost.assumption


def test_the_price_comes_from_the_option_then_the_environment() -> None:
    assert resolve_price(2.5, {PRICE_ENV: "9"}) == (2.5, "--price-per-gpu-hour")
    assert resolve_price(None, {PRICE_ENV: "9"}) == (9.0, f"${PRICE_ENV}")
    assert resolve_price(None, {}) == (None, "not set")
    with pytest.raises(SettingsError):
        resolve_price(None, {PRICE_ENV: "cheap"})


def test_each_gpu_gets_a_row_with_its_own_rate_and_its_heartbeat() -> None:
    events = steady_events(per_s=2, seconds=60, tokens=1_000, gpus=2)
    beats = [heartbeat("node/gpu0", in_flight=47, updated_at=START_S + 57), heartbeat("node/gpu2")]
    rows = gpu_rows(events, 60.0, beats, {"node/gpu0", "node/gpu1"}, now_s=START_S + 60)
    assert [row.worker for row in rows] == ["node/gpu0", "node/gpu1", "node/gpu2"]
    gpu0, gpu1, gpu2 = rows
    assert gpu0.output_tokens_per_s == pytest.approx(1_000) and gpu0.in_flight == 47
    assert gpu0.heartbeat_age_s == pytest.approx(3)
    assert gpu1.in_flight is None and gpu1.heartbeat_age_s is None  # served the run, no live worker now
    assert gpu2.output_tokens_per_s == 0 and gpu2.server_health == 200  # alive, idle for this run


def test_in_flight_messages_are_split_by_routing_key() -> None:
    values = [
        json.dumps([{"body": "…"}, "", "generate"]).encode(),
        json.dumps([{"body": "…"}, "", "generate"]).encode(),
        json.dumps([{"body": "…"}, "", "upload"]).encode(),
        b"not json",
    ]
    assert split_unacked(values) == {"generate": 2, "upload": 1}


def test_quality_rates_count_truncations_a_drop_policy_dead_lettered() -> None:
    counters = {
        "completions": 90,
        "quality:ok": 60,
        "quality:empty_answer": 10,
        "quality:truncated_in_thinking": 15,
        "quality:truncated_in_answer": 5,
        "dead:truncated_in_thinking": 10,
        "finish:stop": 70,
        "finish:length": 20,
    }
    figures = quality_figures(counters)
    assert figures.judged == 100
    assert figures.counts[Quality.TRUNCATED_IN_THINKING] == 25
    assert figures.rates[Quality.EMPTY_ANSWER] == pytest.approx(0.10)
    assert figures.rates[Quality.NO_REASONING] == 0
    assert figures.finish_reasons == {"length": 20, "stop": 70}
    assert dead_letters_by_reason(counters) == {"truncated_in_thinking": 10}


def test_progress_and_state_follow_the_counts() -> None:
    progress = make_progress(enqueued=100, committed=60, staged=10, dead=5, rejected=3)
    assert (progress.remaining, progress.committed_fraction) == (25, 0.6)
    assert run_state(progress, completions=70, paused=False) == STATE_RUNNING
    assert run_state(progress, completions=70, paused=True) == STATE_PAUSED
    nothing_yet = make_progress(enqueued=100, committed=0, staged=0, dead=0, rejected=0)
    assert run_state(nothing_yet, completions=0, paused=False) == STATE_WAITING
    uploading = make_progress(enqueued=100, committed=90, staged=10, dead=0, rejected=0)
    assert run_state(uploading, completions=100, paused=False) == STATE_UPLOADING
    done = make_progress(enqueued=100, committed=95, staged=0, dead=5, rejected=0)
    assert run_state(done, completions=95, paused=False) == STATE_FINISHED


def test_a_run_is_finished_only_once_its_dead_letters_are_committed_and_its_batches_closed() -> None:
    letters_in_redis_only = make_progress(
        enqueued=100, committed=95, staged=0, dead=5, rejected=0, dead_pending=5
    )
    assert run_state(letters_in_redis_only, completions=95, paused=False) == STATE_UPLOADING
    batch_still_open = make_progress(enqueued=100, committed=95, staged=0, dead=5, rejected=0, open_batches=1)
    assert run_state(batch_still_open, completions=95, paused=False) == STATE_DRAINING


def test_prompts_left_with_no_generate_message_anywhere_are_flagged_as_stranded() -> None:
    progress = make_progress(enqueued=100, committed=60, staged=0, dead=0, rejected=0)
    empty = [
        QueueDepth(queue="generate", waiting=0, in_flight=0),
        QueueDepth(queue="upload", waiting=0, in_flight=0),
    ]
    busy = [QueueDepth(queue="generate", waiting=0, in_flight=2)]
    warning = stranded_warning(progress, empty, paused=False)
    assert warning is not None and "40 prompts" in warning
    assert stranded_warning(progress, busy, paused=False) is None
    assert stranded_warning(progress, empty, paused=True) is None
    done = make_progress(enqueued=100, committed=100, staged=0, dead=0, rejected=0)
    assert stranded_warning(done, empty, paused=False) is None


def test_a_heartbeat_round_trips_and_junk_is_ignored() -> None:
    beat = heartbeat("node/gpu0")
    assert decode_heartbeat(encode_heartbeat(beat)) == beat
    assert decode_heartbeat(b"{not json") is None
    assert decode_heartbeat(b'{"worker": 1}') is None


def test_the_accept_length_is_read_from_server_info_or_metrics_text() -> None:
    assert accept_length_from_server_info({"internal_states": [{"avg_spec_accept_length": 3.41}]}) == 3.41
    assert accept_length_from_server_info({"internal_states": []}) is None
    text = (
        "# HELP sglang:spec_accept_length The average acceptance length.\n"
        "sglang:spec_accept_length_bucket 9\n"
        'sglang:spec_accept_length{model_name="qwen"} 3.52\n'
    )
    assert parse_metrics(text).spec_accept_length == 3.52
    assert parse_metrics("sglang:spec_accept_length 2.5\n").spec_accept_length == 2.5
    assert parse_metrics("other 1\n").spec_accept_length is None


def test_durations_and_sizes_read_naturally() -> None:
    assert [duration(s) for s in (None, 45, 725, 12_000, 200_000)] == [
        "unknown",
        "45 s",
        "12 min 5 s",
        "3 h 20 min",
        "2 d 7 h",
    ]
    assert [size(n) for n in (512, 2048, 5 * 1024**3)] == ["512 B", "2.0 KiB", "5.0 GiB"]


def rendered(status: RunStatus, width: int) -> str:
    console = Console(width=width, record=True, file=io.StringIO())
    console.print(render_status(status))
    return console.export_text()


def test_the_view_renders_a_paused_young_run_with_unknown_eta() -> None:
    status = paused_young_status(rates_over(3, 6_000, 4.0))
    text = rendered(status, width=120)
    assert "PAUSED by quality-gate" in text and "3 of the last 3 hit max_tokens" in text
    assert "ETA   unknown" in text and "node/gpu0" in text and "WARNING: something odd" in text
    assert isinstance(status.cost, Cost)


def test_rates_over_a_few_seconds_are_not_shown_as_figures() -> None:
    text = rendered(paused_young_status(rates_over(5, 6_000, 0.09)), width=120)
    assert "too early" in text
    assert "66,667" not in text and "55.56" not in text  # 6,000 tokens / 0.09 s, 5 completions / 0.09 s


def test_a_run_rated_over_a_minute_shows_its_rates() -> None:
    text = rendered(paused_young_status(rates_over(120, 240_000, 60.0)), width=120)
    assert "too early" not in text
    assert "4,000" in text and "2.00" in text


def test_every_gpu_column_title_fits_an_80_column_terminal() -> None:
    text = rendered(paused_young_status(rates_over(3, 6_000, 4.0)), width=80)
    header = next(line for line in text.splitlines() if line.lstrip().startswith("GPU "))
    for title in ("tokens/s", "in flight", "/health", "heartbeat"):
        assert title in header, header


def test_a_worker_lives_while_its_seat_is_subscribed_and_is_dead_once_its_stamp_is_old() -> None:
    def life(subscribers: int | None, stamp_age_s: float | None, heartbeat_age_s: float | None) -> WorkerLife:
        return worker_life(SeatReading(subscribers, stamp_age_s), heartbeat_age_s)

    assert life(1, 0.2, 3.0) is WorkerLife.ALIVE
    assert life(0, 1.0, 3.0) is WorkerLife.SILENT  # a Redis restart, or a kill not 5 s old
    assert life(0, 30.0, 3.0) is WorkerLife.DEAD  # killed: no stamp for 30 s, whatever the last beat said
    assert life(0, None, 3.0) is WorkerLife.SILENT  # no stamp to read: the heartbeat's word
    assert life(0, None, 30.0) is WorkerLife.DEAD
    assert life(None, 30.0, 3.0) is WorkerLife.ALIVE  # a Redis user that may not ask: the heartbeat's word
    assert life(None, None, None) is WorkerLife.DEAD


def test_held_batches_are_counted_by_gpu_and_come_back_one_reconcile_after_their_last_lease() -> None:
    leases = [("b1", START_S + 50), ("b2", START_S + 60), ("b3", START_S + 40)]
    holders = {"b1": "node/gpu0", "b2": "node/gpu0", "b3": "node/gpu1"}
    held = held_work(leases, holders, {"node/gpu0": "dead", "node/gpu1": "alive"}, reconcile_interval_s=15)
    assert [(work.worker, work.life, work.batches, work.back_by) for work in held] == [
        ("node/gpu0", "dead", 2, START_S + 75),
        ("node/gpu1", "alive", 1, START_S + 55),
    ]
    dead = held_line(held[0], now_s=START_S + 15)
    assert dead.startswith(
        "node/gpu0: 2 batches held by a dead worker, not lost: taken back at once by a worker"
    )
    assert "(in 1 min 0 s)" in dead and "the reconciler sends them to the other GPUs" in dead
    assert held_line(held[1], now_s=START_S) == "node/gpu1: 1 batch being generated"


def test_prompts_held_by_a_dead_workers_leases_are_not_called_stranded() -> None:
    progress = make_progress(enqueued=100, committed=10, staged=0, dead=0, rejected=0)
    empty = [QueueDepth(queue="generate", waiting=0, in_flight=0)]
    assert stranded_warning(progress, empty, paused=False) is not None
    assert stranded_warning(progress, empty, paused=False, held_batches=3) is None
