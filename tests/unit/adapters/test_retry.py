"""hydrator.adapters.retry: which errors are retried, how long it waits, what it logs (no
network)."""

from __future__ import annotations

import logging
import threading

import pytest

from hydrator.adapters.retry import RetryPolicy, call_with_retries
from hydrator.errors import PermanentSourceError, TransientSourceError

log = logging.getLogger("test.retry")


class Script:
    """An attempt function that raises the given errors in turn, then returns "ok"."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.attempts: list[int] = []

    def __call__(self, n: int) -> str:
        self.attempts.append(n)
        if self.errors:
            raise self.errors.pop(0)
        return "ok"


def run(script: Script, policy: RetryPolicy) -> tuple[str, list[float]]:
    waits: list[float] = []
    result = call_with_retries(script, policy, logger=log, sleep=waits.append)
    return result, waits


def test_backoff_doubles_up_to_the_cap_and_each_retry_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    script = Script(*(TransientSourceError(f"down {i}") for i in range(4)))
    result, waits = run(script, RetryPolicy(5, backoff_s=1.0, max_backoff_s=3.0))
    assert result == "ok" and script.attempts == [1, 2, 3, 4, 5]
    assert waits == [1.0, 2.0, 3.0, 3.0]
    assert "down 0; attempt 1/5, retrying in 1.00 s" in caplog.text
    assert "attempt 4/5" in caplog.text and "attempt 5/5" not in caplog.text


def test_retry_after_replaces_the_backoff() -> None:
    script = Script(TransientSourceError("busy", retry_after_s=7), TransientSourceError("busy"))
    _, waits = run(script, RetryPolicy(3, backoff_s=0.5, max_retry_after_s=10))
    assert waits == [7.0, 1.0]  # the hint, then the second backoff step


def test_retry_after_beyond_the_limit_is_raised_at_once() -> None:
    error = TransientSourceError("busy", retry_after_s=120)
    script = Script(error)
    with pytest.raises(TransientSourceError) as info:
        run(script, RetryPolicy(3, max_retry_after_s=30))
    assert info.value is error and script.attempts == [1]


def test_attempts_are_bounded_and_the_last_error_is_raised() -> None:
    errors = [TransientSourceError(f"down {i}") for i in range(3)]
    script = Script(*errors)
    with pytest.raises(TransientSourceError) as info:
        run(script, RetryPolicy(3, backoff_s=0))
    assert info.value is errors[-1] and script.attempts == [1, 2, 3]


def test_permanent_errors_are_not_retried() -> None:
    script = Script(PermanentSourceError("bad password"))
    with pytest.raises(PermanentSourceError):
        run(script, RetryPolicy(3))
    assert script.attempts == [1]


def test_abort_ends_the_retries() -> None:
    abort = threading.Event()
    first = TransientSourceError("down")

    def attempt(n: int) -> str:
        abort.set()  # another request failed meanwhile
        raise first

    waits: list[float] = []
    with pytest.raises(TransientSourceError) as info:
        call_with_retries(attempt, RetryPolicy(5), logger=log, sleep=waits.append, abort=abort)
    assert info.value is first and waits == []
