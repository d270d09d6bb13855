"""Bounded retries with exponential backoff and ``Retry-After``: the one adapter around tenacity.

Sources call :func:`call_with_retries` with a function that makes ONE attempt and raises

* :class:`~hydrator.errors.TransientSourceError` for what may go away by itself: it is retried
  after ``retry_after_s`` (the server's ``Retry-After`` hint) when the error carries one, else
  after ``backoff_s x 2^(attempt-1)`` capped at ``max_backoff_s``; a hint longer than
  ``max_retry_after_s`` is not waited for (the error is raised at once);
* anything else (:class:`~hydrator.errors.PermanentSourceError`, ...), which is raised at once.

Every retry is logged as ``<error>; attempt n/N, retrying in x s`` on the caller's logger. When
the attempts are used up, or ``abort`` is set, the last error is raised unchanged.
Why tenacity and not urllib3's ``Retry``: see docs/dependencies.md.
"""

from __future__ import annotations

import email.utils
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import TypeVar

import tenacity

from hydrator.errors import TransientSourceError

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long to retry one call. All durations in seconds."""

    max_attempts: int = 3
    backoff_s: float = 1.0
    max_backoff_s: float = math.inf
    max_retry_after_s: float = math.inf

    def backoff(self, attempt: int) -> float:
        """Wait after failed attempt ``attempt`` (1-based): backoff_s x 2^(attempt-1), capped."""
        return float(min(self.backoff_s * 2 ** (attempt - 1), self.max_backoff_s))

    def too_long(self, retry_after_s: float | None) -> bool:
        """Whether a server's ``Retry-After`` hint is longer than this policy waits."""
        return retry_after_s is not None and retry_after_s > self.max_retry_after_s


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` value (delta-seconds or HTTP-date), else None."""
    if value is None:
        return None
    text = value.strip()
    if text.isdigit():
        return float(text)
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # RFC 9110 HTTP-dates are GMT
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())


class _WaitRetryAfter(tenacity.wait.wait_base):
    """The server's ``Retry-After`` hint when the error carries one, else the policy's backoff."""

    def __init__(self, policy: RetryPolicy) -> None:
        self.policy = policy

    def __call__(self, retry_state: tenacity.RetryCallState) -> float:
        error = retry_state.outcome.exception() if retry_state.outcome else None
        hint = error.retry_after_s if isinstance(error, TransientSourceError) else None
        return hint if hint is not None else self.policy.backoff(retry_state.attempt_number)


def _wait(sleep: Callable[[float], object], seconds: float) -> None:
    sleep(seconds)  # tenacity wants a sleep returning None; Event.wait returns a bool


def call_with_retries(
    attempt: Callable[[int], T],
    policy: RetryPolicy,
    *,
    logger: logging.Logger,
    sleep: Callable[[float], object] = time.sleep,
    abort: threading.Event | None = None,
    retry_on: tuple[type[BaseException], ...] = (TransientSourceError,),
) -> T:
    """``attempt(n)`` for n = 1, 2, ... until it returns, raises a non-retryable error, the
    attempts are used up, or ``abort`` is set; ``sleep`` waits between attempts (seconds).
    ``retry_on`` are the exception classes worth another attempt."""

    def retryable(error: BaseException) -> bool:
        hint = error.retry_after_s if isinstance(error, TransientSourceError) else None
        return isinstance(error, retry_on) and not policy.too_long(hint)

    def log_retry(state: tenacity.RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome else None
        delay = state.next_action.sleep if state.next_action else 0.0
        logger.warning(
            "%s; attempt %d/%d, retrying in %.2f s",
            error,
            state.attempt_number,
            policy.max_attempts,
            delay,
        )

    stop: tenacity.stop.stop_base = tenacity.stop_after_attempt(policy.max_attempts)
    if abort is not None:
        stop = stop | tenacity.stop_when_event_set(abort)
    retrying = tenacity.Retrying(
        stop=stop,
        wait=_WaitRetryAfter(policy),
        retry=tenacity.retry_if_exception(retryable),
        before_sleep=log_retry,
        sleep=partial(_wait, sleep),
        reraise=True,
    )
    for state in retrying:
        with state:
            return attempt(state.retry_state.attempt_number)
    raise AssertionError("unreachable")  # pragma: no cover
