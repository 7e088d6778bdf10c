"""A seated generate worker cut off from Redis by a network partition: when its seat becomes free, what the
cut-off worker does meanwhile, and what it does once the network heals.

The worker's side runs in a network namespace of its own, joined to this host by a veth pair; Redis (the
shipped deploy/redis.conf, `tcp-keepalive 60`) listens on this host's end. The partition drops every
packet both ways on both ends (a queue of length 0 on each end of the veth pair: every packet sent is
dropped): no reset, no FIN, as when a switch or a route dies.
Timeline, from the moment of the cut:
  - the worker's batch: its lease keeper's own clock says when it stops sending that batch's requests;
  - Redis: when it closes the worker's connection (TCP keepalive gives up) and the seat's subscription
    with it;
  - a newcomer on the same GPU label, started again every second as systemd restarts a refused worker
    (`RestartSec=5` in practice): when it is given the seat;
  - the network heals a few seconds later: when the cut-off worker learns its seat is taken and stops.

    sudo .venv/bin/python benchmarks/bench_seat_partition.py   (needs root: ip netns, tc)

Last line: seat_free_after_s=<cut to newcomer seated> subscription_dropped_after_s=<cut to Redis closing>.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from devstack.local_stack import free_port, redis_process
from devstack.partition import HOST_ADDRESS, NodeBehindRouter, partition_supported
from workers.errors import SeatHeld
from workers.recovery.seat import Seat
from workers.state.keys import seat_channel

LABEL = "cut-off-node/gpu0"
NEWCOMER_EVERY_S = 1.0
HEAL_AFTER_TAKEN_S = 5.0
SETTLE_S = 3.0  # after seating, before the cut: the holder's last acknowledgements are out (delayed ACKs)
GIVE_UP_S = 600.0
POLL_S = 0.1

# The cut-off worker: seated, holding a batch's lease; it says on stdout what it sees, with its clock.
HOLDER = """
import sys, time
from producer.enqueue.enqueuer import Enqueuer, pin_settings
from core.records import Message, Prompt, SamplingSettings
from workers.recovery.leases import LeaseKeeper
from workers.recovery.seat import Seat
from workers.state.redis_client import connect
from core.run_settings.model import RunSettings

url, label = sys.argv[1], sys.argv[2]
client = connect(url)
settings = RunSettings(run="cut", sampling=SamplingSettings(), output="file:///tmp/cut", batch_size=1)
pin_settings(client, settings)
batches = []
one = Prompt(id="p0", messages=[Message(role="user", content="a question")])
Enqueuer(client, settings, lambda _r, ids: batches.extend(ids), source="bench").enqueue([one])
seat = Seat(client, label, on_lost=lambda reason: print(f"{time.monotonic():.3f} lost {reason}", flush=True))
taken = seat.take()
keeper = LeaseKeeper(client, worker=label, seat=taken.token).start()
_, lease = keeper.acquire("cut", batches[0])
print(f"{time.monotonic():.3f} seated {taken.token}", flush=True)
held = True
while True:
    if held and not keeper.held(lease):
        held = False
        print(f"{time.monotonic():.3f} lease-stopped", flush=True)
    time.sleep(0.1)
"""


class HolderEvents:
    """What the cut-off worker says, as it says it: word -> (its clock, the rest of the line)."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self._seen: dict[str, tuple[float, str]] = {}
        self._changed = threading.Condition()
        threading.Thread(target=self._read, args=(process,), daemon=True).start()

    def _read(self, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            at, word, *rest = line.rstrip("\n").split(" ", 2)
            with self._changed:
                self._seen.setdefault(word, (float(at), " ".join(rest)))
                self._changed.notify_all()

    def wait(self, word: str, timeout_s: float = GIVE_UP_S) -> tuple[float, str]:
        with self._changed:
            if not self._changed.wait_for(lambda: word in self._seen, timeout=timeout_s):
                raise RuntimeError(f"the cut-off worker did not say {word!r} in {timeout_s:.0f} s")
            return self._seen[word]


def say(cut: float, what: str) -> None:
    print(f"{time.monotonic() - cut:7.1f} s  {what}", flush=True)


def main() -> None:
    argparse.ArgumentParser(description=__doc__).parse_args()
    refused = partition_supported()
    if refused is not None:
        sys.exit(f"{refused}: run it with sudo")
    root = Path(tempfile.mkdtemp(prefix="bench-partition-"))
    node = NodeBehindRouter("dg").__enter__()
    port = free_port()
    server = redis_process(port, root / "data", root)
    server.argv = [*server.argv, "--bind", f"127.0.0.1 {HOST_ADDRESS}"]
    server.start()
    server.wait_for_log("Ready to accept connections")
    admin = redis.Redis.from_url(server.url)
    remote_url = server.url.replace("127.0.0.1", HOST_ADDRESS)
    holder = subprocess.Popen(
        node.inside([sys.executable, "-c", HOLDER, remote_url, LABEL]),
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parent.parent,
    )
    events = HolderEvents(holder)
    try:
        _, token = events.wait("seated")
        channel = seat_channel(LABEL, token)
        time.sleep(SETTLE_S)
        node.cut()
        cut = time.monotonic()
        say(cut, "the network is cut")
        dropped = taken = None
        attempts = 0
        next_newcomer = cut
        while taken is None and time.monotonic() - cut < GIVE_UP_S:
            now = time.monotonic()
            if dropped is None and admin.pubsub_numsub(channel)[0][1] == 0:
                dropped = now
                say(cut, "Redis has closed the cut-off worker's subscription")
            if now >= next_newcomer:
                attempts += 1
                try:
                    Seat(redis.Redis.from_url(server.url), LABEL, on_lost=print).take()
                    taken = time.monotonic()
                    say(cut, f"a newcomer is given the seat ({attempts} tries)")
                except SeatHeld:
                    next_newcomer = time.monotonic() + NEWCOMER_EVERY_S
            time.sleep(POLL_S)
        if taken is None or dropped is None:
            sys.exit(f"the seat was not free {GIVE_UP_S:.0f} s after the cut")
        lease_stopped, _ = events.wait("lease-stopped")
        time.sleep(HEAL_AFTER_TAKEN_S)
        node.heal()
        healed = time.monotonic()
        say(cut, "the network heals")
        stopped, reason = events.wait("lost")
        say(cut, f"the cut-off worker stops: {reason}")
        print(f"cut-off worker stops its batch's requests  {lease_stopped - cut:6.1f} s after the cut")
        print(f"Redis drops its subscription               {dropped - cut:6.1f} s after the cut")
        print(f"a newcomer is given the seat               {taken - cut:6.1f} s after the cut")
        print(f"the cut-off worker learns it and stops     {stopped - healed:6.1f} s after the network heals")
        print(f"seat_free_after_s={taken - cut:.1f} subscription_dropped_after_s={dropped - cut:.1f}")
    finally:
        holder.kill()
        server.stop()
        node.remove()


if __name__ == "__main__":
    main()
