"""Typed settings for the worker processes, read from `DRAFTGEN_*` environment variables once, at the edge."""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import socket
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlparse

from core.backoff import DEFAULT_BACKOFF_BASE_S, DEFAULT_BACKOFF_CAP_S
from inference.client_settings import DEFAULT_CONNECT_TIMEOUT_S, DEFAULT_REQUEST_TIMEOUT_S, ClientSettings
from inference.sglang_defaults import REFERENCE_MAX_RUNNING_REQUESTS, SGLANG_BASE_PORT
from workers.broker.broker import BrokerOptions
from workers.errors import InvalidSetting
from workers.generate.liveness import DEFAULT_LIVENESS_POLL_S, DEFAULT_LIVENESS_STALL_S
from workers.generate.silence import DEFAULT_SILENCE_LIMIT_S
from workers.record.upload_settings import UploadSettings
from workers.recovery.consumer_watch import DEFAULT_NOT_CONSUMING_LIMIT_S
from workers.recovery.leases import DEFAULT_LEASE_RENEW_S, DEFAULT_LEASE_TTL_S
from workers.recovery.reconciler import (
    DEFAULT_RECONCILE_INTERVAL_S,
    DEFAULT_STRANDED_GRACE_S,
    ReconcileSettings,
)
from workers.state.queues import LONGEST_COUNTDOWN_S
from workers.state.redis_address import SENTINEL_AUTH_KEY, BadRedisAddress, is_sentinel_url, sentinel_address

ENV_PREFIX = "DRAFTGEN_"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
DEFAULT_SERVER_HOST = "127.0.0.1"
DEFAULT_BASE_PORT = SGLANG_BASE_PORT
DEFAULT_MAX_IN_FLIGHT = REFERENCE_MAX_RUNNING_REQUESTS  # requests kept at the server
DEFAULT_MAX_ATTEMPTS = 3
# Batches held at once. A batch's task ends once every prompt of it is sent, so what a worker holds
# beyond its window waits: one batch refills the window while the next is fetched. More only keeps work
# from the other GPUs as the queue empties: bench_peer (2 GPUs, 600 single prompts, 200 conversations),
# holding 8: wall / ideal 1.163 and 1.678, the GPUs finishing 0.6 and 13 requests apart; 2: 1.139 and
# 1.345, 0.0 and 4.4 apart; 1: 1.205 and 1.207 (a window starves between batches of single prompts).
DEFAULT_BATCHES_IN_FLIGHT = 2
DEFAULT_VISIBILITY_TIMEOUT_S = 7200  # a backstop above any batch's lifetime; see docs/failures.md
DEFAULT_UNACKED_RESTORE_INTERVAL_S = 10
DEFAULT_SERVER_DOWN_RETRY_S = 30.0  # how soon a batch refused for an unreachable server comes back
# A server exporting only completion counters (the simulator, older SGLang) shows progress only when a
# request finishes. With 48 running they finish about once a second, but a run's first 48 requests start
# together, and if all think long (40,960-token context at ~48 tokens/s each: ~14 min) none finishes for
# minutes. The window must exceed the longest legitimate request, and the client's own 1200 s timeout.
DEFAULT_LIVENESS_COMPLETION_STALL_S = 1500.0
# On SIGTERM (systemctl stop, a spot notice: AWS gives 120 s, GCP 30 s) requests in flight get this long
# to finish; the rest of the held batches go back to the queue at once.
DEFAULT_SHUTDOWN_GRACE_S = 25.0


_FALSE_WORDS = frozenset({"0", "false", "no", "off"})


SERVER_URL_SCHEMES = ("http", "https")
SECRET_QUERY_KEYS = frozenset({"password", "pass", "passwd", "pwd", "token", "secret", "api_key", "apikey"})
# A URL's query values are shown only for these connection options, none of them a secret; any other value
# (a password, a token, a signature, whatever it is called) is printed as REDACTED.
SHOWN_QUERY_KEYS = frozenset(
    {
        "db",
        "protocol",
        "ssl_cert_reqs",
        "ssl_check_hostname",
        "ssl_ca_certs",
        "ssl_certfile",
        "ssl_keyfile",
        "socket_timeout",
        "socket_connect_timeout",
        "health_check_interval",
        "client_name",
        "master_name",  # the name a Sentinel URL's primary is monitored by
        SENTINEL_AUTH_KEY,  # whether it logs in to the Sentinels: true or false, no secret
    }
)
REDACTED = "***"


def redacted_url(url: str) -> str:
    """The URL to print: without its user and password, nor any query value but a connection option's."""
    scheme, separator, rest = url.partition("://")
    if not separator:
        return url
    if "@" in rest.split("/", 1)[0] or ("@" in rest and "?" not in rest.split("@", 1)[0]):
        rest = f"{REDACTED}@{rest.rpartition('@')[2]}"
    base, question, query = rest.partition("?")
    if question:
        fields = [field.partition("=") for field in query.split("&")]
        query = "&".join(
            f"{key}{equals}{value if key.lower() in SHOWN_QUERY_KEYS or not equals else REDACTED}"
            for key, equals, value in fields
        )
    return f"{scheme}{separator}{base}{question}{query}"


def has_password(url: str) -> bool:
    """Whether the URL carries a password: in its user part, or as a query value of a secret's name."""
    parsed = urlparse(url)
    if parsed.password is not None or (parsed.username and parsed.username != REDACTED):
        return True
    return any(key.lower() in SECRET_QUERY_KEYS for key, _ in parse_qsl(parsed.query, keep_blank_values=True))


@dataclass(frozen=True)
class WorkerSettings:
    redis_url: str = DEFAULT_REDIS_URL
    server_url: str = f"http://{DEFAULT_SERVER_HOST}:{DEFAULT_BASE_PORT}"
    gpu: int | None = None
    api_key: str | None = None
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT
    batches_in_flight: int = DEFAULT_BATCHES_IN_FLIGHT
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    backoff_base_s: float = DEFAULT_BACKOFF_BASE_S
    backoff_cap_s: float = DEFAULT_BACKOFF_CAP_S
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S
    server_down_retry_s: float = DEFAULT_SERVER_DOWN_RETRY_S
    visibility_timeout_s: int = DEFAULT_VISIBILITY_TIMEOUT_S
    unacked_restore_interval_s: int = DEFAULT_UNACKED_RESTORE_INTERVAL_S
    hostname: str = field(default_factory=socket.gethostname)
    # Obey Celery's commands that change a worker (shutdown, cancel_consumer, revoke...): any Redis user
    # who can publish on the control channel could send them (workers/control_commands.py).
    remote_control_commands: bool = False
    upload: UploadSettings = field(default_factory=UploadSettings)
    liveness_enabled: bool = True
    liveness_poll_s: float = DEFAULT_LIVENESS_POLL_S
    liveness_stall_s: float = DEFAULT_LIVENESS_STALL_S
    liveness_completion_stall_s: float = DEFAULT_LIVENESS_COMPLETION_STALL_S
    server_restart_command: str | None = None  # e.g. "systemctl restart draftgen-sglang@0"; run on a hang
    lease_ttl_s: float = DEFAULT_LEASE_TTL_S
    lease_renew_s: float = DEFAULT_LEASE_RENEW_S
    reconcile_interval_s: float = DEFAULT_RECONCILE_INTERVAL_S
    stranded_grace_s: float = DEFAULT_STRANDED_GRACE_S
    shutdown_grace_s: float = DEFAULT_SHUTDOWN_GRACE_S
    silence_limit_s: float = DEFAULT_SILENCE_LIMIT_S  # this long without a chunk, others streaming: hung
    not_consuming_limit_s: float = DEFAULT_NOT_CONSUMING_LIMIT_S  # idle beside waiting work: exit, restart

    def client_settings(self) -> ClientSettings:
        return ClientSettings(
            server_url=self.server_url,
            api_key=self.api_key,
            request_timeout_s=self.request_timeout_s,
            connect_timeout_s=self.connect_timeout_s,
            max_connections=self.max_in_flight * 2,
        )

    @property
    def broker(self) -> BrokerOptions:
        return BrokerOptions(self.redis_url, self.visibility_timeout_s, self.unacked_restore_interval_s)

    def reconcile_settings(self) -> ReconcileSettings:
        return ReconcileSettings(
            upload_max_age_s=self.upload.max_age_s,
            interval_s=self.reconcile_interval_s,
            stranded_grace_s=self.stranded_grace_s,
        )

    def __repr__(self) -> str:
        return (
            f"WorkerSettings(redis_url={redacted_url(self.redis_url)!r}, server_url={self.server_url!r}, "
            f"gpu={self.gpu}, api_key={'***' if self.api_key else None}, max_in_flight={self.max_in_flight}, "
            f"max_attempts={self.max_attempts}, visibility_timeout_s={self.visibility_timeout_s})"
        )

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> WorkerSettings:
        """Build from `DRAFTGEN_*` variables, one per field (`upload`'s as DRAFTGEN_UPLOAD_*); unset or
        empty keeps the default. The server is DRAFTGEN_SERVER_URL, or GPU index + base port. An unknown
        DRAFTGEN_* variable, or a value its field cannot take, raises InvalidSetting naming it."""
        source = os.environ if env is None else env
        check_environment(source)
        values = _field_values(cls, source, ENV_PREFIX)
        if "server_url" not in values:
            values["server_url"] = _server_url(source, values.get("gpu"))
        _check_server_url(values["server_url"])
        _check_redis_url(values.get("redis_url", DEFAULT_REDIS_URL))
        return cls(**values)


# DRAFTGEN_* variables read by other parts of draftgen: known, so never refused as unknown.
OTHER_VARIABLES = {
    "SERVER_HOST": "with GPU and BASE_PORT, the server's URL (here)",
    "BASE_PORT": "GPU i's server listens on BASE_PORT + i (here, and `python -m node serve`)",
    "OUTPUT": "the default --output of a new run (producer/settings.py)",
    "FLOWER_OPEN_API": "1: Flower's API may stay open without a login (workers/flower_guard.py)",
    "PRICE_PER_GPU_HOUR": "the cost figures of `producer status` (producer/status/command.py)",
    "MODEL_SOURCE": "where `inference stage` copies the model from (deploy/ units)",
    "MODEL_PATH": "the staged model `inference serve` loads (Procfile, deploy/ units)",
    "SERVED_MODEL_NAME": "`inference serve` (node/cli.py)",
    "SGLANG_HOST": "the address SGLang listens on, `inference serve` (node/cli.py)",
    "SERVE_ARGS": "more options of `inference serve` (deploy/systemd/draftgen-sglang@.service)",
}
MAX_PORT = 65535
_TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
# Settings that must be at least this (every other number: finite and 0 or more).
MINIMUMS: dict[str, int] = {
    "MAX_IN_FLIGHT": 1,
    "BATCHES_IN_FLIGHT": 1,
    "MAX_ATTEMPTS": 1,
    "VISIBILITY_TIMEOUT_S": 1,
    "UNACKED_RESTORE_INTERVAL_S": 1,
    "UPLOAD_MAX_COMPLETIONS": 1,
    "UPLOAD_MAX_BYTES": 1,
}
# Settings that must be at most this.
MAXIMUMS: dict[str, float] = {
    "SERVER_DOWN_RETRY_S": LONGEST_COUNTDOWN_S,  # a message's eta beyond it is parked as not draftgen's
}
MEANINGS = {  # said with a bad value of these
    "GPU": " (the GPU's index: 0, 1, ...; its server is at DRAFTGEN_BASE_PORT + index)",
    "BASE_PORT": " (GPU i's server listens on this + i)",
}
# Intervals and timeouts that loop or fail at once when 0: strictly positive.
POSITIVE = frozenset(
    {
        "REQUEST_TIMEOUT_S",
        "CONNECT_TIMEOUT_S",
        "LEASE_TTL_S",
        "LEASE_RENEW_S",
        "RECONCILE_INTERVAL_S",
        "LIVENESS_POLL_S",
        "UPLOAD_LOCK_S",
        "SILENCE_LIMIT_S",
        "NOT_CONSUMING_LIMIT_S",
    }
)


def _fields(cls: type[Any], prefix: str) -> Iterator[tuple[str, str, Any, bool]]:
    """Each field's name, variable and type, and whether it is a nested group (its own prefix)."""
    hints = typing.get_type_hints(cls)
    for item in dataclasses.fields(cls):
        hint = hints[item.name]
        group = isinstance(hint, type) and dataclasses.is_dataclass(hint)
        yield item.name, prefix + item.name.upper(), hint, group


def _field_variables(cls: type[Any], prefix: str) -> list[str]:
    """The variable of each field, nested dataclasses' fields under their own prefix."""
    names: list[str] = []
    for _name, variable, hint, group in _fields(cls, prefix):
        names.extend(_field_variables(hint, variable + "_") if group else [variable])
    return names


def known_variables() -> frozenset[str]:
    """Every DRAFTGEN_* variable some part of draftgen reads."""
    others = {ENV_PREFIX + name for name in OTHER_VARIABLES}
    return frozenset(_field_variables(WorkerSettings, ENV_PREFIX)) | others


def check_environment(env: Mapping[str, str]) -> None:
    """Refuse a DRAFTGEN_* variable nothing reads (a typo would silently keep a default), naming the
    nearest known one. Called where settings are built from the environment: the process edge."""
    known = known_variables()
    for name in sorted(env):
        if name.startswith(ENV_PREFIX) and name not in known:
            nearest = difflib.get_close_matches(name, sorted(known), n=1)
            hint = f"; did you mean {nearest[0]}?" if nearest else ""
            raise InvalidSetting(
                f"{name} is not a draftgen setting{hint} (the settings: docs/configuration.md); unset it"
            )


def _field_values(cls: type[Any], env: Mapping[str, str], prefix: str) -> dict[str, Any]:
    """The fields whose variable is set (and not empty), parsed to the field's type."""
    values: dict[str, Any] = {}
    for name, variable, hint, group in _fields(cls, prefix):
        if group:
            values[name] = hint(**_field_values(hint, env, variable + "_"))
        elif env.get(variable):
            values[name] = _parsed(variable, env[variable], hint)
    return values


def _parsed(variable: str, text: str, hint: object) -> Any:
    if hint in (str, str | None):
        return text
    if hint is bool:
        return _boolean(variable, text)
    if hint in (int, int | None):
        return _number(variable, text, int, "a whole number")
    if hint is float:
        return _number(variable, text, float, "a number")
    raise TypeError(f"{variable}: no parser for a setting of type {hint}")


def _boolean(variable: str, text: str) -> bool:
    word = text.strip().lower()
    if word in _TRUE_WORDS or word in _FALSE_WORDS:
        return word in _TRUE_WORDS
    words = "/".join(sorted(_TRUE_WORDS)) + " or " + "/".join(sorted(_FALSE_WORDS))
    raise InvalidSetting(f"{variable}={text!r}: must be {words}")


def _number(variable: str, text: str, kind: type[float] | type[int], what: str) -> float | int:
    name = variable.removeprefix(ENV_PREFIX)
    meaning = MEANINGS.get(name, "")
    try:
        value = kind(text)
    except ValueError:
        raise InvalidSetting(f"{variable}={text!r}: must be {what}{meaning}") from None
    if not math.isfinite(value):
        raise InvalidSetting(f"{variable}={text!r}: must be a finite number{meaning}")
    if name in POSITIVE and value <= 0:
        raise InvalidSetting(f"{variable}={text!r}: must be above 0{meaning}")
    lowest = MINIMUMS.get(name, 0)
    if value < lowest:
        raise InvalidSetting(f"{variable}={text!r}: must be {lowest} or more{meaning}")
    highest = MAXIMUMS.get(name, math.inf)
    if value > highest:
        raise InvalidSetting(f"{variable}={text!r}: must be {highest:g} or less{meaning}")
    return value


def _check_redis_url(url: str) -> None:
    """A Sentinel URL that cannot name a primary is refused at start, naming what it lacks."""
    if is_sentinel_url(url):
        try:
            sentinel_address(url)
        except BadRedisAddress as error:
            raise InvalidSetting(f"{ENV_PREFIX}REDIS_URL: {error}") from None


def _check_server_url(url: str) -> None:
    """An SGLang server is reached over HTTP(S), and authenticated by its API key, not a URL's password
    (which every log line and `status` naming the server would show)."""
    variable = ENV_PREFIX + "SERVER_URL"
    parsed = urlparse(url)
    if parsed.scheme not in SERVER_URL_SCHEMES or not parsed.hostname:
        raise InvalidSetting(
            f"{variable}={redacted_url(url)!r}: must be http://host:port or https://host:port"
        )
    if parsed.username is not None or parsed.password is not None:
        raise InvalidSetting(
            f"{variable}={redacted_url(url)!r}: holds a user or password; SGLang authenticates with its "
            f"--api-key: set {ENV_PREFIX}API_KEY instead"
        )
    if parsed.query or parsed.fragment:
        shown = redacted_url(url.partition("?")[0].partition("#")[0])
        raise InvalidSetting(
            f"{variable}={shown!r}: holds a query or fragment "
            f"(a token there would be printed with the URL); SGLang takes its key as --api-key: set "
            f"{ENV_PREFIX}API_KEY instead"
        )


def _server_url(env: Mapping[str, str], gpu: int | None) -> str:
    """http://SERVER_HOST:(BASE_PORT + GPU), the port checked to be one."""
    host = env.get(ENV_PREFIX + "SERVER_HOST") or DEFAULT_SERVER_HOST
    base_variable = ENV_PREFIX + "BASE_PORT"
    base_text = env.get(base_variable)
    base = int(_number(base_variable, base_text, int, "a port")) if base_text else DEFAULT_BASE_PORT
    port = base + (gpu or 0)
    if not 1 <= port <= MAX_PORT:
        raise InvalidSetting(
            f"{ENV_PREFIX}BASE_PORT ({base}) + {ENV_PREFIX}GPU ({gpu or 0}) is port {port}: "
            f"a port is 1 to {MAX_PORT}"
        )
    return f"http://{host}:{port}"
