"""Where the run's Redis is, when Sentinels name it: the primary they name now and how often it changed.

A `sentinel://` URL (workers/state/redis_address.py) puts the fleet on whichever server the Sentinels
name; after a failover `status` says so: the primary's address, how many of the Sentinels answer, the
primary's configuration epoch (each failover raises it by one, so it counts the failovers since the
Sentinels began watching) and its replicas. A server named by a `redis://` URL has nothing to say here.
"""

from __future__ import annotations

import contextlib

import redis

from producer.status.model import RedisPlace
from workers.state.redis_address import is_sentinel_url, sentinel_address
from workers.state.redis_client import sentinel_kwargs

CONFIG_EPOCH = "config-epoch"
REPLICAS = "num-slaves"


def redis_place(url: str) -> RedisPlace | None:
    """What the Sentinels of `url` say of its primary; None for a server's URL or when none answers."""
    if not is_sentinel_url(url):
        return None
    address = sentinel_address(url)
    answers: list[dict[str, object]] = []
    for host, port in address.sentinels:
        sentinel = redis.Redis(host=host, port=port, decode_responses=True, **sentinel_kwargs(address))
        with contextlib.suppress(redis.RedisError), sentinel:
            answers.append(sentinel.sentinel_master(address.master_name))
    if not answers:
        return None
    newest = max(answers, key=lambda answer: int(str(answer.get(CONFIG_EPOCH, 0))))
    return RedisPlace(
        master_name=address.master_name,
        primary=f"{newest.get('ip')}:{newest.get('port')}",
        sentinels=len(address.sentinels),
        answering=len(answers),
        failovers=int(str(newest.get(CONFIG_EPOCH, 0))),
        replicas=int(str(newest.get(REPLICAS, 0))),
    )
