"""Reading a run's status from Redis: `gather_status` reads, the figures module computes."""

from __future__ import annotations

import redis

from producer.run_access import require_run
from producer.status.figures import (
    MS_PER_S,
    STATE_DRAINING,
    STATE_FINISHED,
    STATE_UPLOADING,
    dead_letters_by_reason,
    estimate_cost,
    estimate_eta,
    events_in_window,
    gate_figures,
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
    token_ids_warning,
    window_rates,
)
from producer.status.model import PauseFigures, QueueDepth, RunStatus, Throughput, UploadBacklog
from producer.status.parked import parked_warning
from producer.status.quarantine_figures import quarantine_warning, read_quarantine
from producer.status.suspects import read_suspects
from workers.broker.kombu_layout import waiting_messages
from workers.broker.parked_messages import parked_counts
from workers.record.manifest import decode_entry
from workers.recovery.leases import decode_holder
from workers.recovery.reconciler import DEFAULT_RECONCILE_INTERVAL_S
from workers.recovery.seat_view import read_seat, worker_life
from workers.state.control import pause_state
from workers.state.exit_notes import read_exit_notes
from workers.state.gate_reading import read_gate
from workers.state.heartbeats import read_heartbeats
from workers.state.keys import RunKeys
from workers.state.poison import PoisonPolicy
from workers.state.queues import KOMBU_UNACKED_KEY, QUEUES
from workers.state.redis_client import redis_now_s
from workers.state.stats_fields import (
    COMPLETION_TOKENS,
    COMPLETIONS,
    FIRST_COMPLETION_AT,
    RATE_WINDOW_S,
    generated_turns,
    parse_counters,
)

GPU_SAMPLE_EVENTS = 5_000  # most recent completions read to learn which GPUs served the run
UNACKED_SCAN_COUNT = 1000
IN_FLIGHT_NOTE = (
    "in flight = delivered to a worker and not yet acknowledged (running, prefetched, or held for a "
    "retry countdown), all runs together; Flower's Broker tab shows only the waiting ones"
)


def queue_depths(client: redis.Redis) -> list[QueueDepth]:
    in_flight = split_unacked(
        value for _tag, value in client.hscan_iter(KOMBU_UNACKED_KEY, count=UNACKED_SCAN_COUNT)
    )
    return [
        QueueDepth(queue=queue, waiting=waiting_messages(client, queue), in_flight=in_flight.get(queue, 0))
        for queue in QUEUES
    ]


def read_leases(client: redis.Redis, keys: RunKeys) -> tuple[list[tuple[str, float]], dict[str, str]]:
    """The run's leases (batch id, expiry on the Redis clock) and each batch's holder's GPU label."""
    with client.pipeline(transaction=False) as pipe:
        pipe.zrange(keys.leases, 0, -1, withscores=True)
        pipe.hgetall(keys.lease_owners)
        raw_leases, raw_owners = pipe.execute()
    leases = [(member.decode(errors="replace"), float(expiry)) for member, expiry in raw_leases]
    holders = {
        batch.decode(errors="replace"): holder.worker
        for batch, raw in raw_owners.items()
        if (holder := decode_holder(raw)) is not None
    }
    return leases, holders


def gather_status(
    client: redis.Redis,
    run: str,
    *,
    price_per_gpu_hour: float | None = None,
    price_source: str = "given",
    now_s: float | None = None,
) -> RunStatus:
    """One consistent-enough snapshot of the run (each group of figures is read in one round trip)."""
    settings = require_run(client, run)
    keys = RunKeys(run)
    now = redis_now_s(client) if now_s is None else now_s
    with client.pipeline(transaction=False) as pipe:
        pipe.get(keys.enqueued_count)
        pipe.scard(keys.done)
        pipe.zcard(keys.staged_index)
        pipe.hlen(keys.dead)
        pipe.hlen(keys.rejected)
        pipe.hgetall(keys.stats)
        pipe.get(keys.staged_bytes)
        pipe.zrange(keys.staged_index, 0, 0, withscores=True)
        pipe.lrange(keys.manifest, 0, -1)
        pipe.xrange(keys.events, min=str(int((now - RATE_WINDOW_S) * MS_PER_S)), max="+")
        pipe.xrange(keys.events, min="-", max="+", count=1)
        pipe.xrevrange(keys.events, max="+", min="-", count=GPU_SAMPLE_EVENTS)
        pipe.zcard(keys.dead_pending)
        pipe.zcard(keys.open_batches)
        replies = pipe.execute()
    enqueued, committed, staged, dead, rejected, stats_raw, staged_bytes, oldest = replies[:8]
    manifest, window_raw, oldest_raw, recent_raw, dead_pending, open_batches = replies[8:]
    counters = parse_counters(stats_raw)
    progress = make_progress(
        enqueued=int(enqueued or 0),
        committed=committed,
        staged=staged,
        dead=dead,
        rejected=rejected,
        dead_pending=dead_pending,
        open_batches=open_batches,
    )
    recent_events = parse_events(recent_raw)
    oldest_events = parse_events(oldest_raw)
    started = run_started_s(
        counters.get(FIRST_COMPLETION_AT), oldest_events[0].at_s if oldest_events else None
    )
    last_completion = recent_events[0].at_s if recent_events else None
    paused = pause_state(client, run)
    state = run_state(progress, completions=counters.get(COMPLETIONS, 0), paused=paused is not None)
    generated = (STATE_FINISHED, STATE_UPLOADING, STATE_DRAINING)
    ended = last_completion if state in generated and last_completion else now
    window = recent_window_s(now, started)
    window_events = events_in_window(parse_events(window_raw), now_s=now, window_s=window)
    last_minute = window_rates(window_events, now_s=now, window_s=window)
    completions, turns = counters.get(COMPLETIONS, 0), generated_turns(counters)
    output_tokens = counters.get(COMPLETION_TOKENS, 0)
    elapsed = max(0.0, ended - started) if started is not None else 0.0
    eta = estimate_eta(progress.remaining, last_minute, now_s=now, paused=paused is not None)
    heartbeats = read_heartbeats(client)
    leases, holders = read_leases(client, keys)
    ages = {beat.worker: max(0.0, now - beat.updated_at) for beat in heartbeats}
    known = {event.gpu for event in recent_events} | set(holders.values())
    lives = {
        worker: worker_life(read_seat(client, worker, now_s=now), ages.get(worker)).value
        for worker in known | set(ages)
    }
    gpus = gpu_rows(window_events, window, heartbeats, known, now_s=now, lives=lives)
    held = held_work(leases, holders, lives, reconcile_interval_s=DEFAULT_RECONCILE_INTERVAL_S)
    entries = [decode_entry(raw) for raw in manifest]
    queues = queue_depths(client)
    stranded = stranded_warning(
        progress, queues, paused=paused is not None, held_batches=sum(work.batches for work in held)
    )
    quarantine = read_quarantine(client, run)
    quarantined = quarantine_warning(
        quarantine, remaining=progress.remaining, open_batches=progress.open_batches
    )
    parked = parked_counts(client)
    suspects = read_suspects(client, run, heartbeats, now, PoisonPolicy())
    return RunStatus(
        run=run,
        now=now,
        state=state,
        progress=progress,
        throughput=Throughput(
            last_minute=last_minute,
            whole_run=rates_over(completions, output_tokens, elapsed),
            mean_output_tokens=output_tokens / turns if turns else None,
            first_completion_at=started,
            last_completion_at=last_completion,
            turns=turns,
        ),
        eta=eta,
        cost=estimate_cost(
            gpus=len(gpus),
            elapsed_s=elapsed,
            eta_s=eta.seconds,
            price_per_gpu_hour=price_per_gpu_hour,
            price_source=price_source,
        ),
        gpus=gpus,
        queues=queues,
        queues_note=IN_FLIGHT_NOTE,
        upload=UploadBacklog(
            staged=staged,
            staged_bytes=int(staged_bytes or 0),
            oldest_staged_age_s=max(0.0, now - oldest[0][1]) if oldest else None,
            objects_committed=len(entries),
            committed_bytes=sum(entry.bytes for entry in entries),
        ),
        dead_letters=dead_letters_by_reason(counters),
        quality=quality_figures(counters),
        gate=gate_figures(read_gate(client, run, settings.gate), settings),
        paused=(
            PauseFigures(reason=paused.reason, by=paused.by, at=paused.at, for_s=max(0.0, now - paused.at))
            if paused is not None
            else None
        ),
        warnings=[
            warning
            for warning in (stranded, token_ids_warning(counters), quarantined, parked_warning(parked))
            if warning
        ]
        + [f"restarted itself within the hour: {note}" for note in read_exit_notes(client).values()],
        quarantine=quarantine,
        parked_messages=parked,
        output=settings.output,
        held=held,
        suspects=suspects,
    )
