"""Flower's settings for draftgen. Flower reads ./flowerconfig.py when started as `celery -A workers flower`
from the project folder (the Procfile, the systemd unit and the demo all do).

Flower bound beyond loopback must ask for a login: it shows every prompt batch id and can revoke tasks.
Give one with FLOWER_BASIC_AUTH=user:password (or --basic-auth=..., or OAuth with --auth=...).
"""

import ipaddress
import sys

from tornado.options import options

LOOPBACK_NAMES = ("localhost", "")

# Bounded memory on long runs (Flower keeps tasks in memory), and offline workers leave the view.
max_tasks = 10000
purge_offline_workers = 3600


def _is_loopback(address: str) -> bool:
    if address in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False  # a host name other than localhost: treat as reachable from outside


_address = options.address or "127.0.0.1"
if not _is_loopback(_address) and not (options.basic_auth or options.auth):
    sys.exit(
        f"refusing to start Flower on {_address} without a login: set FLOWER_BASIC_AUTH=user:password "
        "(or pass --basic-auth=user:password, or --auth for OAuth), or bind to 127.0.0.1"
    )
