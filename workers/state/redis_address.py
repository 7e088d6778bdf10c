"""Where Redis is: one URL for both the broker and the state client, a server's or its Sentinels'.

`redis://` and `rediss://` name one server. `sentinel://` names the Sentinels that watch a primary and its
replicas, so that every process follows the primary through a failover without a restart:

    sentinel://[user:password@]host1:26379[/db][?master_name=NAME];sentinel://host2:26379;sentinel://host3:26379

The user and password are the Redis user's on the primary (the ACL users of docs/security.md, as on
a `redis://` URL); the db, `master_name` (the name the Sentinels know the primary by, `sentinel monitor
NAME ...`), `sentinel_auth` and the TLS options may be given on any one of the addresses. The Sentinels
are asked without a login, or with the same user and password with `sentinel_auth=true` (the users of
deploy/sentinel-users.acl, which may only ask where the primary is). TLS: the options of a `rediss://`
URL (`ssl_ca_certs`, `ssl_cert_reqs`, `ssl_certfile`, `ssl_keyfile`; workers/state/redis_tls.py), any of
them, make every connection TLS, to the Sentinels and to the primary alike (one CA for the group, as
deploy/multi-node.md sets it up).
Celery's broker reads the same addresses (kombu's Sentinel transport, with `master_name` in its transport
options); the state client asks the Sentinels with redis-py's `Sentinel.master_for`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from workers.errors import InvalidSetting, Refused
from workers.state.redis_tls import TLS_PARAMETERS, tls_options

SENTINEL_SCHEME = "sentinel"
SENTINEL_SEPARATOR = ";"
MASTER_NAME_KEY = "master_name"
DEFAULT_SENTINEL_PORT = 26379
DEFAULT_DB = 0
SENTINEL_EXAMPLE = "sentinel://user:password@host1:26379/0?master_name=draftgen;sentinel://host2:26379"
SSL_FLAG = "ssl"  # redis-py's keyword: TLS on, the options beside it say how
SENTINEL_AUTH_KEY = "sentinel_auth"
FLAGS = {"true": True, "false": False}


class BadRedisAddress(Refused):
    """A `sentinel://` URL that does not say where the Sentinels are or which primary they watch."""


@dataclass(frozen=True)
class SentinelAddress:
    sentinels: tuple[tuple[str, int], ...]
    master_name: str
    db: int = DEFAULT_DB
    username: str | None = None
    password: str | None = None
    tls: tuple[tuple[str, str], ...] = ()  # the URL's TLS options as written; none: plain TCP
    sentinel_auth: bool = False  # the Sentinels are asked with the same login

    def tls_options(self) -> dict[str, Any] | None:
        """The TLS options as kombu's `broker_use_ssl` takes them; None without TLS."""
        return tls_options(dict(self.tls)) if self.tls else None

    def ssl_kwargs(self) -> dict[str, Any]:
        """redis-py's keyword arguments of a TLS connection (to a Sentinel or the primary); {} without."""
        options = self.tls_options()
        return {} if options is None else {SSL_FLAG: True, **options}

    def sentinel_login(self) -> dict[str, str]:
        """redis-py's keyword arguments of the login a Sentinel is asked with; {} without."""
        if not self.sentinel_auth:
            return {}
        login = {"username": self.username, "password": self.password}
        return {key: value for key, value in login.items() if value is not None}

    def broker_url(self) -> str:
        """The addresses as kombu's Sentinel transport reads them: the first carries the login and the db."""
        login = ""
        if self.username or self.password:
            login = f"{self.username or ''}:{self.password or ''}@"
        first, *others = self.sentinels
        urls = [f"{SENTINEL_SCHEME}://{login}{first[0]}:{first[1]}/{self.db}"]
        urls += [f"{SENTINEL_SCHEME}://{host}:{port}" for host, port in others]
        return SENTINEL_SEPARATOR.join(urls)


def is_sentinel_url(url: str) -> bool:
    return url.strip().lower().startswith(f"{SENTINEL_SCHEME}://")


@dataclass
class _QueryOptions:
    """What the addresses' queries say, gathered: each option may be given on any one of them."""

    master_names: set[str] = field(default_factory=set)
    sentinel_auth: set[str] = field(default_factory=set)
    tls: dict[str, str] = field(default_factory=dict)

    def add(self, query: str) -> None:
        values = parse_qs(query)
        self.master_names.update(values.get(MASTER_NAME_KEY, []))
        self.sentinel_auth.update(value.lower() for value in values.get(SENTINEL_AUTH_KEY, []))
        for name in TLS_PARAMETERS:
            for value in values.get(name, []):
                if self.tls.setdefault(name, value) != value:
                    raise BadRedisAddress(f"the Sentinel URL gives {name} twice, differently")

    def master_name(self) -> str:
        if len(self.master_names) != 1:
            said = "names no primary" if not self.master_names else "names more than one primary"
            raise BadRedisAddress(
                f"the Sentinel URL {said}: add ?{MASTER_NAME_KEY}=NAME, the name the Sentinels monitor it by "
                f"(e.g. {SENTINEL_EXAMPLE})"
            )
        return next(iter(self.master_names))

    def asks_with_login(self, password: str | None) -> bool:
        if len(self.sentinel_auth) > 1 or not self.sentinel_auth <= set(FLAGS):
            raise BadRedisAddress(f"the Sentinel URL's {SENTINEL_AUTH_KEY} must be true or false, once")
        asks = FLAGS[next(iter(self.sentinel_auth))] if self.sentinel_auth else False
        if asks and password is None:
            raise BadRedisAddress(f"the Sentinel URL says {SENTINEL_AUTH_KEY}=true but gives no login")
        return asks

    def tls_pairs(self) -> tuple[tuple[str, str], ...]:
        try:
            tls_options(self.tls)
        except InvalidSetting as error:
            raise BadRedisAddress(str(error)) from None
        return tuple(sorted(self.tls.items()))


def sentinel_address(url: str) -> SentinelAddress:
    """The Sentinels, primary name, db and login a `sentinel://` URL gives; BadRedisAddress says what is
    missing or wrong, never quoting the password."""
    sentinels: list[tuple[str, int]] = []
    db: int | None = None
    username = password = None
    options = _QueryOptions()
    for number, part in enumerate(url.strip().split(SENTINEL_SEPARATOR), start=1):
        split = urlsplit(part.strip())
        if split.scheme.lower() != SENTINEL_SCHEME or not split.hostname:
            raise BadRedisAddress(
                f"address {number} of the Sentinel URL is not sentinel://host:port (e.g. {SENTINEL_EXAMPLE})"
            )
        try:
            port = split.port or DEFAULT_SENTINEL_PORT
        except ValueError as error:
            raise BadRedisAddress(f"address {number} of the Sentinel URL has a bad port") from error
        sentinels.append((split.hostname, port))
        if split.username or split.password:
            username = unquote(split.username) if split.username else None
            password = unquote(split.password) if split.password else None
        path = split.path.strip("/")
        if path:
            if not path.isdecimal():
                raise BadRedisAddress(f"address {number} of the Sentinel URL names db {path!r}, not a number")
            db = int(path)
        options.add(split.query)
    return SentinelAddress(
        sentinels=tuple(sentinels),
        master_name=options.master_name(),
        db=DEFAULT_DB if db is None else db,
        username=username,
        password=password,
        tls=options.tls_pairs(),
        sentinel_auth=options.asks_with_login(password),
    )
