"""A secret in a URL is never shown: redacted wherever a URL is printed, refused where it has no place,
and a password typed on a command line is warned about (issue 26, item 4)."""

from __future__ import annotations

import io

import pytest

from core.exit_codes import EXIT_FAILED, EXIT_USAGE
from producer.cli import main
from workers.errors import InvalidSetting
from workers.settings import WorkerSettings, redacted_url

CLOSED_REDIS_WITH_PASSWORD = "redis://:s3cret@127.0.0.1:1/0"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
        ("redis://:s3cret@h:6379/0", "redis://***@h:6379/0"),
        (
            "rediss://worker:s3cret@h:6380/0?ssl_cert_reqs=required",
            "rediss://***@h:6380/0?ssl_cert_reqs=required",
        ),
        ("redis://h:6379/0?password=s3cret&db=2", "redis://h:6379/0?password=***&db=2"),
        ("https://h/x?X-Amz-Signature=s3cret&token=t0k", "https://h/x?X-Amz-Signature=***&token=***"),
        ("redis://:pa/ss@h:6379/0", "redis://***@h:6379/0"),
        ("redis://h/0?name=a@b", "redis://h/0?name=***"),  # an @ in the query is no user part
    ],
)
def test_a_url_is_shown_without_its_user_and_password_wherever_they_are_written(url: str, shown: str) -> None:
    assert redacted_url(url) == shown


@pytest.mark.parametrize(
    ("server_url", "said"),
    [
        ("file:///etc/passwd", "must be http://host:port or https://host:port"),
        ("http://", "must be http://host:port or https://host:port"),
        ("http://admin:s3cret@127.0.0.1:30000", "holds a user or password; SGLang authenticates with its"),
        ("http://127.0.0.1:30000/?token=s3cret", "holds a query or fragment (a token there would be printed"),
        ("http://127.0.0.1:30000/#s3cret", "holds a query or fragment"),
    ],
)
def test_a_server_url_that_is_no_http_server_or_carries_a_password_is_refused(
    server_url: str, said: str
) -> None:
    with pytest.raises(InvalidSetting, match="DRAFTGEN_SERVER_URL") as refused:
        WorkerSettings.from_env({"DRAFTGEN_SERVER_URL": server_url})
    assert said in str(refused.value) and "s3cret" not in str(refused.value)


@pytest.mark.parametrize("stdin", [io.StringIO(), None], ids=["a script or cron", "no stdin"])
def test_a_password_on_the_command_line_is_refused_wherever_it_is_typed_naming_the_variable_to_use(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], stdin: io.StringIO | None
) -> None:
    monkeypatch.setattr("sys.stdin", stdin)
    assert main(["--redis-url", CLOSED_REDIS_WITH_PASSWORD, "files", "--run", "r"]) == EXIT_USAGE
    said = capsys.readouterr().err
    assert said.startswith("error: --redis-url holds a password") and "set DRAFTGEN_REDIS_URL instead" in said
    assert "s3cret" not in said


def test_the_same_url_from_the_environment_is_used_and_never_shown(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DRAFTGEN_REDIS_URL", CLOSED_REDIS_WITH_PASSWORD)
    assert main(["files", "--run", "r"]) == EXIT_FAILED
    said = capsys.readouterr().err
    assert said.startswith("error: Redis at redis://***@127.0.0.1:1/0") and "s3cret" not in said
