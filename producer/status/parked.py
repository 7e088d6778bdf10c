"""`python -m producer parked`: the malformed messages the workers parked instead of ending on them, and the
one line `status` warns with while there are any (workers/broker/parked_messages.py keeps them)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import msgspec

from core.exit_codes import EXIT_OK
from producer.run_access import connect_redis
from producer.settings import ProducerSettings
from producer.status.view import clock
from workers.broker.parked_messages import ParkedCount, parked_counts, recent_parked
from workers.state.keys import PARKED_COUNTS_KEY, PARKED_MESSAGES_KEY

PARKED_COMMAND = "python -m producer parked"


def parked_warning(counts: Sequence[ParkedCount]) -> str | None:
    """`status`'s warning while malformed messages were parked: how many, from which queue, and why."""
    if not counts:
        return None
    total = sum(count.count for count in counts)
    kinds = ", ".join(f"{count.queue} {count.reason} {count.count:,}" for count in counts)
    return f"{total:,} malformed messages parked, never delivered ({kinds}): `{PARKED_COMMAND}` lists them"


def cmd_parked(args: argparse.Namespace, settings: ProducerSettings) -> int:
    client = connect_redis(args, settings)
    counts, records = parked_counts(client), recent_parked(client, args.limit)
    if args.json:
        document = {"counts": counts, "newest": records}
        sys.stdout.write(msgspec.json.encode(document).decode() + "\n")
        return EXIT_OK
    print(parked_warning(counts) or "no malformed message was parked")
    for record in records:
        said = f"{record.reason}: {record.detail}"
        print(f"{clock(record.at)}  {record.queue}  {said}  ({record.size:,} bytes)")
        print(f"    {record.preview!r}")
    if records:
        print(f"(newest first; an admin clears them: DEL {PARKED_MESSAGES_KEY} {PARKED_COUNTS_KEY})")
    return EXIT_OK
