"""Whether an address a server is told to listen on stays on this machine."""

from __future__ import annotations

import ipaddress

LOOPBACK_HOST_NAMES = frozenset({"localhost"})


def is_loopback(address: str) -> bool:
    """A loopback IP (IPv4 or IPv6) or `localhost`; any other host name, or "" (every interface), is not."""
    if address in LOOPBACK_HOST_NAMES:
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False  # a host name other than localhost, or "" (every interface): reachable from outside
