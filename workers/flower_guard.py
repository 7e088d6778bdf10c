"""Flower's login guard: Flower bound beyond loopback must ask for a login, and no login may be empty;
its API (revoke tasks, stop consumers, shut workers down) is never opened without one by
FLOWER_UNAUTHENTICATED_API, even on loopback, unless OPEN_API_CONSENT_VARIABLE says so explicitly.

Flower shows every prompt batch id and can revoke tasks. `make_app` calls `install_flower_guard`, which
does something only when the command being run is `celery -A workers flower`, whatever the working
folder or `--conf` says:

- Celery imports the app (`-A workers`) inside its `celery` command group, after Click has resolved
  the subcommand, so the current Click context already names "flower" (and names "worker", "inspect",
  ... for the other subcommands, which the guard leaves alone).
- The guard then listens to Celery's `import_modules` signal for this app. Flower sends it from its
  application's constructor (`capp.loader.import_default_modules()`), once it has applied the
  FLOWER_* environment, the --conf file and the command line, and before it binds its socket.
  A tornado parse callback would fire too early: Flower runs them after its first pass over the
  command line, before it reads the config file.

Tornado (and Flower) are imported only inside the signal handler, so a worker never loads them.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import click
from celery import Celery
from celery.signals import import_modules

from core.addresses import is_loopback

FLOWER_COMMAND = "flower"
DEFAULT_ADDRESS = "127.0.0.1"  # Flower's own default, "", listens on every interface
EVERY_INTERFACE_WORDING = "every interface"  # how the refusal names the address ""
CREDENTIAL_SEPARATOR = ":"
FIRST_ENTRY_NUMBER = 1
LOGIN_HINT = (
    "set FLOWER_BASIC_AUTH=user:password (or pass --basic-auth=user:password, or --auth for OAuth), "
    f"or bind to {DEFAULT_ADDRESS}"
)
ENTRY_HINT = "give every FLOWER_BASIC_AUTH / --basic-auth entry as user:password with both parts set"
UNAUTHENTICATED_API_VARIABLE = "FLOWER_UNAUTHENTICATED_API"  # Flower's own switch
OPEN_API_CONSENT_VARIABLE = "DRAFTGEN_FLOWER_OPEN_API"  # ours: "1" says yes, anyone here may control it
TRUE_WORDS = frozenset({"1", "true", "yes", "on", "y", "t"})  # what Flower's strtobool reads as true


@dataclass(frozen=True)
class FlowerLogin:
    """What Flower will listen on and which logins it will ask for, as its options say."""

    address: str
    unix_socket: str = ""
    basic_auth: tuple[str, ...] = ()
    oauth: str = ""
    unauthenticated_api: bool = False  # FLOWER_UNAUTHENTICATED_API is set
    open_api_consented: bool = False  # and DRAFTGEN_FLOWER_OPEN_API says that is meant


def listen_address(address: str) -> str:
    """The address Flower should bind: the one given, or loopback when none is."""
    return address or DEFAULT_ADDRESS


def basic_auth_entry_problem(entry: str) -> str | None:
    """What is wrong with one `user:password` entry, never quoting its password; None when nothing is."""
    user, separator, password = entry.partition(CREDENTIAL_SEPARATOR)
    if not entry.strip():
        return "is empty"
    if not separator:
        return "has no password (no ':')"
    if not user.strip():
        return "has an empty user"
    if not password.strip():
        return "has an empty password"
    return None


def basic_auth_problems(entries: Sequence[str]) -> list[str]:
    """One line fragment per faulty entry, naming it by its position in the list (counted from 1)."""
    problems = []
    for number, entry in enumerate(entries, start=FIRST_ENTRY_NUMBER):
        problem = basic_auth_entry_problem(entry)
        if problem is not None:
            problems.append(f"basic auth entry {number} {problem}")
    return problems


def has_login(login: FlowerLogin) -> bool:
    return bool(login.basic_auth or login.oauth)


def bound_beyond_loopback(login: FlowerLogin) -> bool:
    """A unix socket stays on this machine; a TCP address does unless it is a loopback one."""
    return not login.unix_socket and not is_loopback(login.address)


def refusal(login: FlowerLogin) -> str | None:
    """The one-line reason Flower must not start with these options, or None when it may."""
    problems = basic_auth_problems(login.basic_auth)
    if problems:
        return f"refusing to start Flower: {'; '.join(problems)}; {ENTRY_HINT}"
    if bound_beyond_loopback(login) and not has_login(login):
        where = login.address or EVERY_INTERFACE_WORDING
        return f"refusing to start Flower on {where} without a login: {LOGIN_HINT}"
    if login.unauthenticated_api and not has_login(login) and not login.open_api_consented:
        return (
            f"refusing to start Flower: {UNAUTHENTICATED_API_VARIABLE} opens its API with no login, so "
            "anyone who reaches it (every user of this host, on loopback) can revoke tasks, stop consumers "
            f"and shut workers down; set FLOWER_BASIC_AUTH, or unset it ({OPEN_API_CONSENT_VARIABLE}=1 "
            "keeps it open anyway)"
        )
    return None


def login_from_options(options: Any, env: Mapping[str, str] | None = None) -> FlowerLogin:
    """Flower's tornado options (or anything with the same attributes) and environment as a `FlowerLogin`."""
    source = os.environ if env is None else env
    return FlowerLogin(
        address=options.address or "",
        unix_socket=options.unix_socket or "",
        basic_auth=tuple(options.basic_auth or ()),
        oauth=options.auth or "",
        unauthenticated_api=_true(source.get(UNAUTHENTICATED_API_VARIABLE, "")),
        open_api_consented=_true(source.get(OPEN_API_CONSENT_VARIABLE, "")),
    )


def _true(text: str) -> bool:
    return text.strip().lower() in TRUE_WORDS


def enforce_login(options: Any) -> None:
    """Bind Flower to loopback unless told otherwise, then exit with the refusal if there is one."""
    options.address = listen_address(options.address)
    reason = refusal(login_from_options(options))
    if reason is not None:
        sys.exit(reason)


def flower_is_starting() -> bool:
    """Whether the running Celery command is `celery ... flower` (Click resolves it before -A loads)."""
    context = click.get_current_context(silent=True)
    return context is not None and context.invoked_subcommand == FLOWER_COMMAND


def guard_flower(**_: object) -> None:
    """The `import_modules` receiver: Flower's options are final when its application sends it."""
    from tornado.options import options  # only in Flower's process, which has loaded tornado already

    enforce_login(options)


def install_flower_guard(app: Celery) -> bool:
    """Under `celery -A workers flower`, check Flower's login once its options are final.

    Returns whether the guard was installed (it is not for workers and the other subcommands).
    """
    if not flower_is_starting():
        return False
    import_modules.connect(guard_flower, sender=app, weak=False)
    return True
