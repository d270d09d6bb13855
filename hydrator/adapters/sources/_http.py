"""HTTP plumbing of the DMAPI source: bounded retries, ``Retry-After``, request counting.

Only the sibling :mod:`.dmapi` uses this module; together they are the one adapter around
``requests``. :meth:`HttpClient.send` retries what may go away by itself (connection errors,
timeouts, HTTP 408, 429, 500, 502, 503, 504) with exponential backoff, honours a ``Retry-After``
hint on 429/503 when it is no longer than ``max_retry_after_s``, and logs every retry as
``attempt n/N``. Every other answer (2xx, 401, 404, other 4xx) is returned to the caller.

Errors (``raise ... from`` the ``requests`` exception)::

    TransientSourceError   attempts exhausted, Retry-After too long, or the fetch was aborted
    PermanentSourceError   the request cannot be made at all (invalid URL, TLS setup, ...)

Nothing here logs headers or bodies: they may carry bearer tokens or client secrets; library
error messages pass :func:`hydrator.redact.redact` before they go into an error.
"""

from __future__ import annotations

import email.utils
import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

import requests
from requests.adapters import HTTPAdapter

from hydrator.errors import PermanentSourceError, TransientSourceError
from hydrator.redact import redact

log = logging.getLogger(__name__)

RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
RETRY_AFTER_STATUSES = frozenset({429, 503})  # RFC 9110 §10.2.3: Retry-After on 503 and 429


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long to retry one request. All durations in seconds."""

    max_attempts: int = 3
    backoff_s: float = 1.0
    max_backoff_s: float = 30.0
    max_retry_after_s: float = 30.0

    def backoff(self, attempt: int) -> float:
        """Wait after failed attempt ``attempt`` (1-based): backoff_s x 2^(attempt-1), capped."""
        return float(min(self.backoff_s * 2 ** (attempt - 1), self.max_backoff_s))


@dataclass
class Run:
    """State shared by the requests of one fetch: a request counter and an abort flag.

    Setting ``abort`` makes every pending retry wait end at once with TransientSourceError,
    so a fetch that already failed does not keep retrying in other threads.
    """

    abort: threading.Event = field(default_factory=threading.Event)
    _calls: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def count(self) -> None:
        with self._lock:
            self._calls += 1

    @property
    def calls(self) -> int:
        with self._lock:
            return self._calls


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


class HttpClient:
    """A ``requests.Session`` with the retry policy above; safe to share between threads.

    The session is only used for connection pooling (no cookies or redirects matter for
    these APIs); ``pool_maxsize`` is sized for the caller's concurrency.
    """

    def __init__(
        self,
        policy: RetryPolicy,
        timeout_s: float,
        verify: bool | str = True,
        pool_maxsize: int = 8,
    ) -> None:
        self.policy = policy
        self.timeout_s = timeout_s
        self.session = requests.Session()
        self.session.verify = verify
        self.session.headers["Accept"] = "application/json"
        adapter = HTTPAdapter(pool_connections=4, pool_maxsize=pool_maxsize, max_retries=0)
        self.session.mount("https://", adapter)
        self.session.mount("http://", adapter)

    def close(self) -> None:
        self.session.close()

    def send(
        self,
        method: str,
        url: str,
        run: Run,
        *,
        label: str,
        headers: Mapping[str, str] | None = None,
        data: Mapping[str, str] | None = None,
        auth: tuple[str, str] | None = None,
    ) -> requests.Response:
        """Send with retries; return the first answer that is not worth retrying.

        ``label`` names the request in logs and errors (never put secrets in it).
        """
        attempts = self.policy.max_attempts
        for attempt in range(1, attempts + 1):
            self._check_abort(run, label)
            run.count()
            try:
                resp = self.session.request(
                    method, url, headers=headers, data=data, auth=auth, timeout=self.timeout_s
                )
            except (requests.ConnectionError, requests.Timeout) as exc:
                reason, hint = _describe(exc), None
                if attempt == attempts:
                    raise TransientSourceError(
                        f"{label}: {reason} (attempt {attempt}/{attempts})"
                    ) from exc
            except requests.RequestException as exc:
                raise PermanentSourceError(
                    f"{label}: cannot send request: {_describe(exc)}"
                ) from exc
            else:
                if resp.status_code not in RETRY_STATUSES:
                    return resp
                reason, hint = self._retryable(resp, label, attempt)
            delay = hint if hint is not None else self.policy.backoff(attempt)
            log.warning(
                "%s: %s; attempt %d/%d, retrying in %.2f s", label, reason, attempt, attempts, delay
            )
            if run.abort.wait(delay):
                self._check_abort(run, label)
        raise AssertionError("unreachable")  # pragma: no cover

    def _retryable(
        self, resp: requests.Response, label: str, attempt: int
    ) -> tuple[str, float | None]:
        """Reason and Retry-After hint of a retryable answer; raise if it is the last one."""
        status = resp.status_code
        hint = None
        if status in RETRY_AFTER_STATUSES:
            hint = parse_retry_after(resp.headers.get("Retry-After"))
        resp.close()
        reason = f"HTTP {status}" + (f" (Retry-After {hint:g} s)" if hint is not None else "")
        attempts = self.policy.max_attempts
        if hint is not None and hint > self.policy.max_retry_after_s:
            raise TransientSourceError(
                f"{label}: {reason} exceeds max_retry_after_s={self.policy.max_retry_after_s:g}",
                retry_after_s=hint,
            )
        if attempt == attempts:
            raise TransientSourceError(
                f"{label}: {reason} (attempt {attempt}/{attempts})", retry_after_s=hint
            )
        return reason, hint

    @staticmethod
    def _check_abort(run: Run, label: str) -> None:
        if run.abort.is_set():
            raise TransientSourceError(f"{label}: abandoned because another request failed")


def _describe(exc: requests.RequestException) -> str:
    """The exception's class and message, redacted: requests names URLs (which may carry
    credentials) and, when it refuses a header, the header's value (a bearer token)."""
    return redact(f"{type(exc).__name__}: {exc}")
