"""TLS options of a Redis URL's query, one reading for every client that connects: redis-py's, kombu's
(Celery's `broker_use_ssl`) and Flower's Broker page.

A `rediss://` URL is TLS by its scheme; a `sentinel://` URL is TLS, to the Sentinels and to the primary
alike, when its query names any of these options (workers/state/redis_address.py). `ssl_cert_reqs` is
`required` unless the URL says otherwise, so a certificate is checked against `ssl_ca_certs` (or the
system's CAs) by default.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from typing import Any

from workers.errors import InvalidSetting

CERT_REQS_PARAMETER = "ssl_cert_reqs"
PATH_PARAMETERS = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile")
TLS_PARAMETERS = (CERT_REQS_PARAMETER, *PATH_PARAMETERS)
CERT_REQS = {"required": ssl.CERT_REQUIRED, "optional": ssl.CERT_OPTIONAL, "none": ssl.CERT_NONE}
DEFAULT_CERT_REQS = "required"


def tls_options(query: Mapping[str, str]) -> dict[str, Any]:
    """The TLS options a URL's query gives, `ssl_cert_reqs` as an `ssl` constant (what kombu, redis-py and
    Flower all take); an unknown `ssl_cert_reqs` is refused."""
    options: dict[str, Any] = {name: query[name] for name in PATH_PARAMETERS if name in query}
    reqs = query.get(CERT_REQS_PARAMETER, DEFAULT_CERT_REQS).lower().removeprefix("cert_")
    if reqs not in CERT_REQS:
        raise InvalidSetting(
            f"{CERT_REQS_PARAMETER}={reqs!r} in the Redis URL: use one of {', '.join(CERT_REQS)}"
        )
    options[CERT_REQS_PARAMETER] = CERT_REQS[reqs]
    return options
