"""Errors of the producer side, one tree. A bad row never raises: it becomes a `RejectedRow`.

Each branch says whether running the same command again can help, and sets the exit code:

ProducerError
├── UsageError          exit 2, retrying cannot help: the command, an option, the input or the
│   │                   environment is wrong; fix it, then run the command again
│   ├── SourceError     the DATA argument cannot be read at all (missing, empty, unknown type, unreadable)
│   ├── SettingsError   the run's settings are invalid, or differ from the ones pinned at its start
│   ├── OutputError     --output cannot hold a run (a file, a system folder, a URL without a bucket)
│   └── RunNotFound     the named run was never enqueued
├── Unavailable         exit 1, retrying helps once the cause clears: a service is down or busy
│   ├── RedisUnavailable   Redis could not be reached or refused a command (password, TLS)
│   ├── OutputUnavailable  the object store could not be reached or refused (credentials, bucket)
│   ├── InputUnavailable   DATA's object store, the same
│   └── EnqueueBusy        another `enqueue` of the same run is at work
└── RunStateBroken      exit 1, retrying cannot help: the run's state in Redis is unreadable;
                        `recover` from the output rebuilds it

The layers below raise their own trees; `as_producer_error` says where each lands, so that
`python -m producer` reports one tree:
  redis.RedisError               -> RedisUnavailable
  workers StoreUnavailable       -> OutputUnavailable
  workers RetryLater (any other) -> Unavailable
  workers OutputTaken            -> OutputError  (the output holds another run's run.json)
  workers Refused (the rest)     -> UsageError   (a run name, an output URL, a key, a DRAFTGEN_* variable)
  intake SourceUnavailable       -> InputUnavailable (with the same hint as OutputUnavailable)
  intake SourceError             -> SourceError  (DATA cannot be read at all, found while streaming it)
  core SettingsRefused           -> SettingsError
  workers WorkerError (the rest) -> RunStateBroken (an object a manifest names is missing, a run unreadable)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, TypeAlias

from core.errors import CoreError
from core.exit_codes import EXIT_FAILED, EXIT_USAGE
from intake import errors as intake_errors
from workers.errors import OutputTaken, Refused, RetryLater, StoreUnavailable, WorkerError

if TYPE_CHECKING:
    import redis

S3_HINT = " (check the AWS credentials, region, bucket and AWS_ENDPOINT_URL)"


class ProducerError(Exception):
    """Root of the producer-side errors. One outside the branches below (an export's) is a usage error."""

    exit_code: ClassVar[int] = EXIT_USAGE
    retry_helps: ClassVar[bool] = False


class UsageError(ProducerError):
    """The command as given can never work: something the user typed or provided must change."""


class SourceError(UsageError):
    """The DATA argument cannot be read at all: the whole source is unusable, not one row."""


class SettingsError(UsageError):
    """The run's settings are invalid, or differ from the ones pinned at its first enqueue."""


class OutputError(UsageError):
    """The output location cannot hold a run's output (not a folder, a system folder, a bad URL)."""


class RunNotFound(UsageError):
    """No run of that name exists in Redis."""


class Unavailable(ProducerError):
    """Something the command needs is down or busy; the same command can succeed later."""

    exit_code = EXIT_FAILED
    retry_helps = True


class RedisUnavailable(Unavailable):
    """Redis could not be reached, or refused a command."""


class OutputUnavailable(Unavailable):
    """The object store could not be reached, or refused (missing credentials, no such bucket)."""


class InputUnavailable(Unavailable):
    """DATA's object store could not be reached, or refused (missing credentials, no access)."""


class EnqueueBusy(Unavailable):
    """Another `enqueue` of the same run holds its enqueue lease: two at once could batch a prompt twice."""


class RunStateBroken(ProducerError):
    """The run's state cannot be read: in Redis (written by another version, or edited by hand), or an
    object its manifest names is missing."""

    exit_code = EXIT_FAILED


LowerError: TypeAlias = "WorkerError | intake_errors.IntakeError | CoreError | redis.RedisError"
"""What the layers below raise, each mapped into this tree by `as_producer_error`."""


def lower_errors() -> tuple[type[Exception], ...]:
    """The classes of `LowerError`, for an `except` clause: redis (a tenth of a second to import) loads only
    when an error is being handled, so a command refused before it needs Redis starts without it."""
    import redis

    return (WorkerError, intake_errors.IntakeError, CoreError, redis.RedisError)


# Redis's answers to a missing or wrong password (NOAUTH, WRONGPASS, HELLO without auth), in any version
LOGIN_REFUSALS = ("noauth", "wrongpass", "invalid username-password", "authentication required", "hello")
NO_LOGIN_ANSWERS = ("noauth", "authentication required", "hello must be called")
LOGIN_HINT = (
    ": set DRAFTGEN_REDIS_URL with the producer's user and password (the redis-producer.env "
    "deploy/redis-credentials.sh writes), not --redis-url, which any user sees in ps"
)


def _refused_login(error: Exception) -> bool:
    import redis

    text = str(error).lower()
    return isinstance(error, redis.AuthenticationError) or any(word in text for word in LOGIN_REFUSALS)


def _no_login_given(error: Exception) -> bool:
    text = str(error).lower()
    return any(word in text for word in NO_LOGIN_ANSWERS)


def as_producer_error(error: LowerError, *, redis_url: str) -> ProducerError:
    """A lower layer's error as the branch of this tree that says the same (see the table above)."""
    import redis

    from workers.settings import redacted_url
    from workers.state.redis_client import no_primary_reason

    if isinstance(error, intake_errors.SourceUnavailable):
        return InputUnavailable(f"{error}{S3_HINT}")
    if isinstance(error, intake_errors.IntakeError):
        return SourceError(str(error))
    if isinstance(error, CoreError):
        return SettingsError(str(error))
    if isinstance(error, redis.RedisError):
        shown = redacted_url(redis_url)
        if _refused_login(error):
            said = "it asks for a user and password" if _no_login_given(error) else str(error)
            return RedisUnavailable(f"Redis at {shown} refused the login ({said}){LOGIN_HINT}")
        return RedisUnavailable(f"Redis at {shown}: {no_primary_reason(error) or error}")
    message = str(error.args[0]) if error.args else type(error).__name__  # KeyError's str() adds quotes
    if isinstance(error, StoreUnavailable):
        return OutputUnavailable(f"{message}{S3_HINT if 's3://' in message else ''}")
    if isinstance(error, RetryLater):
        return Unavailable(message)
    if isinstance(error, OutputTaken):
        return OutputError(message)
    if isinstance(error, Refused):
        return UsageError(message)
    return RunStateBroken(message)
