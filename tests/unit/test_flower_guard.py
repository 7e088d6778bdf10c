"""Flower's login guard: loopback or a login, never an empty user or password, only under `flower`."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from types import SimpleNamespace

import click
import pytest
from celery import Celery
from celery.signals import import_modules

from core.addresses import is_loopback
from devstack.local_stack import PROJECT_ROOT
from workers.flower_guard import (
    DEFAULT_ADDRESS,
    FlowerLogin,
    enforce_login,
    flower_is_starting,
    guard_flower,
    install_flower_guard,
    listen_address,
    login_from_options,
    refusal,
)

EVERY_INTERFACE = "0.0.0.0"
SECRET = "s3cret"


def flower_options(
    address: str = "", basic_auth: list[str] | None = None, auth: str = "", unix_socket: str = ""
) -> SimpleNamespace:
    """Stands in for Flower's tornado options: the attributes the guard reads and writes."""
    return SimpleNamespace(address=address, basic_auth=basic_auth, auth=auth, unix_socket=unix_socket)


@pytest.fixture
def celery_command_context(request: pytest.FixtureRequest) -> Iterator[click.Context]:
    """The `celery` group's Click context, as it is while `-A workers` loads, running `request.param`."""
    with click.Context(click.Group("celery")) as context:
        context.invoked_subcommand = request.param
        yield context


@pytest.mark.parametrize("address", ["127.0.0.1", "127.0.0.53", "::1", "localhost"])
def test_loopback_addresses_and_localhost_stay_on_this_machine(address: str) -> None:
    assert is_loopback(address)


@pytest.mark.parametrize("address", [EVERY_INTERFACE, "::", "", "10.0.0.5", "head.example.org"])
def test_every_interface_network_addresses_and_host_names_are_reachable_from_outside(address: str) -> None:
    assert not is_loopback(address)


def test_flower_given_no_address_listens_on_loopback() -> None:
    assert listen_address("") == DEFAULT_ADDRESS
    assert is_loopback(listen_address(""))


def test_flower_given_an_address_listens_on_it() -> None:
    assert listen_address(EVERY_INTERFACE) == EVERY_INTERFACE


def test_flower_on_loopback_without_a_login_may_start() -> None:
    assert refusal(FlowerLogin(address=DEFAULT_ADDRESS)) is None


def test_flower_on_every_interface_without_a_login_is_refused_in_one_line() -> None:
    reason = refusal(FlowerLogin(address=EVERY_INTERFACE))
    assert reason is not None
    assert f"on {EVERY_INTERFACE} without a login" in reason
    assert "FLOWER_BASIC_AUTH" in reason
    assert "\n" not in reason


def test_flower_on_a_host_name_without_a_login_is_refused() -> None:
    assert refusal(FlowerLogin(address="head.example.org")) is not None


def test_flower_on_every_interface_with_a_basic_auth_login_may_start() -> None:
    assert refusal(FlowerLogin(address=EVERY_INTERFACE, basic_auth=(f"ops:{SECRET}",))) is None


def test_flower_on_every_interface_with_oauth_may_start() -> None:
    assert refusal(FlowerLogin(address=EVERY_INTERFACE, oauth=r".*@example\.org")) is None


def test_flower_on_a_unix_socket_without_a_login_may_start() -> None:
    assert refusal(FlowerLogin(address="", unix_socket="/run/draftgen/flower.sock")) is None


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        ("admin:", "basic auth entry 1 has an empty password"),
        ("admin:   ", "basic auth entry 1 has an empty password"),
        (f":{SECRET}", "basic auth entry 1 has an empty user"),
        ("admin", "basic auth entry 1 has no password"),
        ("", "basic auth entry 1 is empty"),
    ],
)
def test_a_basic_auth_entry_missing_its_user_or_password_is_refused_by_name(entry: str, problem: str) -> None:
    reason = refusal(FlowerLogin(address=EVERY_INTERFACE, basic_auth=(entry,)))
    assert reason is not None
    assert problem in reason
    assert "\n" not in reason


def test_an_empty_password_in_a_comma_separated_list_is_refused_without_quoting_any_password() -> None:
    reason = refusal(
        FlowerLogin(address=EVERY_INTERFACE, basic_auth=(f"ops:{SECRET}", "admin:", f":{SECRET}"))
    )
    assert reason is not None
    assert "entry 2 has an empty password" in reason
    assert "entry 3 has an empty user" in reason
    assert "entry 1" not in reason
    assert SECRET not in reason


def test_an_empty_password_is_refused_on_loopback_too() -> None:
    assert refusal(FlowerLogin(address=DEFAULT_ADDRESS, basic_auth=("admin:",))) is not None


def test_enforcing_the_login_binds_flower_to_loopback_when_it_has_no_address() -> None:
    options = flower_options(address="")
    enforce_login(options)
    assert options.address == DEFAULT_ADDRESS


def test_enforcing_the_login_reads_flower_s_options_and_exits_with_the_refusal() -> None:
    with pytest.raises(SystemExit) as stopped:
        enforce_login(flower_options(address=EVERY_INTERFACE, basic_auth=["admin:"]))
    assert "entry 1 has an empty password" in str(stopped.value.code)


def test_enforcing_the_login_lets_flower_with_a_login_start() -> None:
    enforce_login(flower_options(address=EVERY_INTERFACE, basic_auth=[f"ops:{SECRET}"]))
    enforce_login(flower_options(address=EVERY_INTERFACE, auth=r".*@example\.org"))


def test_outside_a_celery_command_flower_is_not_starting() -> None:
    assert not flower_is_starting()


@pytest.mark.parametrize("celery_command_context", ["flower"], indirect=True)
def test_the_celery_flower_command_is_recognised_while_the_app_loads(
    celery_command_context: click.Context,
) -> None:
    assert flower_is_starting()


@pytest.mark.parametrize("celery_command_context", ["worker", "inspect", "beat", None], indirect=True)
def test_workers_and_the_other_celery_commands_get_no_guard(celery_command_context: click.Context) -> None:
    assert not install_flower_guard(Celery("draftgen-test"))


@pytest.mark.parametrize("celery_command_context", ["flower"], indirect=True)
def test_under_flower_the_app_refuses_when_flower_loads_its_modules_with_final_options(
    celery_command_context: click.Context,
) -> None:
    from flower.options import default_options  # Flower's tornado options, as its command parsed them

    app = Celery("draftgen-test")
    previous_address = default_options.address
    default_options.address = EVERY_INTERFACE
    try:
        assert install_flower_guard(app)
        with pytest.raises(SystemExit) as stopped:
            app.loader.import_default_modules()  # what Flower's application does before it binds
        assert "without a login" in str(stopped.value.code)
    finally:
        default_options.address = previous_address
        import_modules.disconnect(guard_flower, sender=app)


def test_importing_the_workers_app_loads_neither_tornado_nor_flower() -> None:
    script = "import sys, workers.celery; print(sorted({'tornado', 'flower'} & set(sys.modules)))"
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=PROJECT_ROOT,
        env={"DRAFTGEN_REDIS_URL": "redis://127.0.0.1:1/0", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert result.stdout.strip() == "[]"


def test_flower_with_its_api_opened_without_a_login_is_refused_even_on_loopback() -> None:
    reason = refusal(FlowerLogin(address="127.0.0.1", unauthenticated_api=True))
    assert reason is not None and "FLOWER_UNAUTHENTICATED_API opens its API with no login" in reason
    assert "DRAFTGEN_FLOWER_OPEN_API=1" in reason


def test_flower_with_its_api_opened_and_the_consent_given_may_start() -> None:
    assert (
        refusal(FlowerLogin(address="127.0.0.1", unauthenticated_api=True, open_api_consented=True)) is None
    )


def test_flower_with_its_api_opened_behind_a_login_may_start_as_the_login_guards_the_api() -> None:
    assert (
        refusal(FlowerLogin(address=EVERY_INTERFACE, basic_auth=("a:b",), unauthenticated_api=True)) is None
    )


def test_the_guard_reads_flowers_api_switch_and_the_consent_from_the_environment() -> None:
    login = login_from_options(
        flower_options(), {"FLOWER_UNAUTHENTICATED_API": "True", "DRAFTGEN_FLOWER_OPEN_API": "0"}
    )
    assert login.unauthenticated_api and not login.open_api_consented
