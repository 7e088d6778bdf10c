"""TLS settings of a `rediss://` broker URL as Celery's `broker_use_ssl`.

kombu and redis-py read `ssl_cert_reqs`, `ssl_ca_certs`, `ssl_certfile` and `ssl_keyfile` from the
URL's query, but Flower builds its own Redis client for the Broker tab from `broker_use_ssl` alone:
without it the tab fails to verify the server's certificate. The URL stays the one place to say it.
"""

from __future__ import annotations

import ssl
from typing import Any
from urllib.parse import parse_qs, urlsplit

from workers.errors import InvalidSetting

TLS_SCHEME = "rediss"
CERT_REQS = {"required": ssl.CERT_REQUIRED, "optional": ssl.CERT_OPTIONAL, "none": ssl.CERT_NONE}
PATH_PARAMETERS = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile")


def broker_use_ssl(url: str) -> dict[str, Any] | None:
    """`broker_use_ssl` for a rediss:// URL (None for redis://); an unknown `ssl_cert_reqs` is refused."""
    parts = urlsplit(url)
    if parts.scheme != TLS_SCHEME:
        return None
    query = {name: values[-1] for name, values in parse_qs(parts.query).items()}
    options: dict[str, Any] = {name: query[name] for name in PATH_PARAMETERS if name in query}
    reqs = query.get("ssl_cert_reqs", "required").lower().removeprefix("cert_")
    if reqs not in CERT_REQS:
        raise InvalidSetting(f"ssl_cert_reqs={reqs!r} in the Redis URL: use one of {', '.join(CERT_REQS)}")
    options["ssl_cert_reqs"] = CERT_REQS[reqs]
    return options
