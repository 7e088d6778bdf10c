"""TLS settings of a broker URL as Celery's `broker_use_ssl`.

kombu and redis-py read `ssl_cert_reqs`, `ssl_ca_certs`, `ssl_certfile` and `ssl_keyfile` from a
`rediss://` URL's query, but Flower builds its own Redis client for the Broker tab from `broker_use_ssl`
alone: without it the tab fails to verify the server's certificate. A `sentinel://` URL's TLS reaches
kombu only this way. The URL stays the one place to say it.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, urlsplit

from workers.state.redis_address import is_sentinel_url, sentinel_address
from workers.state.redis_tls import tls_options

TLS_SCHEME = "rediss"


def broker_use_ssl(url: str) -> dict[str, Any] | None:
    """`broker_use_ssl` for a rediss:// URL or a Sentinel URL with TLS options (None for no TLS); an
    unknown `ssl_cert_reqs` is refused."""
    if is_sentinel_url(url):
        return sentinel_address(url).tls_options()
    parts = urlsplit(url)
    if parts.scheme != TLS_SCHEME:
        return None
    return tls_options({name: values[-1] for name, values in parse_qs(parts.query).items()})
