"""HTTP plumbing of the DMAPI source: bounded retries, ``Retry-After``, request counting.

Only the sibling :mod:`.dmapi` uses this module; together they are the one adapter around
``requests``. :meth:`HttpClient.send` retries what may go away by itself (connection errors,
timeouts, HTTP 408, 429, 500, 502, 503, 504) with exponential backoff, honours a ``Retry-After``
hint on 429/503 when it is no longer than ``max_retry_after_s``, and logs every retry as
``attempt n/N`` (the retrying itself is :func:`hydrator.adapters.retry.call_with_retries`, on
tenacity).
Every other answer (2xx, 401, 404, other 4xx) is returned to the caller.

Errors (``raise ... from`` the ``requests`` exception)::

    TransientSourceError   attempts exhausted, Retry-After too long, or the fetch was aborted
    PermanentSourceError   the request cannot be made at all (invalid URL, TLS setup, ...)

Nothing here logs headers or bodies: they may carry bearer tokens or client secrets; library
error messages pass :func:`hydrator.redact.redact` before they go into an error.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import TypeVar

import requests
from authlib.integrations.base_client import OAuthError
from authlib.integrations.requests_client import OAuth2Session
from requests.adapters import HTTPAdapter

from hydrator.adapters.retry import RetryPolicy, call_with_retries, parse_retry_after
from hydrator.errors import PermanentSourceError, TransientSourceError
from hydrator.redact import redact

__all__ = ["HttpClient", "RetryPolicy", "Run", "parse_retry_after"]

log = logging.getLogger(__name__)
T = TypeVar("T")

RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
RETRY_AFTER_STATUSES = frozenset({429, 503})  # RFC 9110 §10.2.3: Retry-After on 503 and 429


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
    ) -> requests.Response:
        """Send with retries; return the first answer that is not worth retrying.

        ``label`` names the request in logs and errors (never put secrets in it).
        """

        def attempt(n: int) -> requests.Response:
            self.check_abort(run, label)
            run.count()
            try:
                resp = self.session.request(method, url, headers=headers, timeout=self.timeout_s)
            except requests.RequestException as exc:
                raise self.request_error(exc, label, n) from exc
            if resp.status_code in RETRY_STATUSES:
                raise self.status_error(resp, label, n)
            return resp

        return self.retrying(attempt, run)

    def client_credentials(
        self,
        token_url: str,
        run: Run,
        *,
        label: str,
        client: tuple[str, str],
        form: Mapping[str, str],
    ) -> Mapping[str, object]:
        """An OAuth2 client-credentials grant (RFC 6749 §4.4) by authlib, with this client's
        retries: the token endpoint's JSON answer, or raise Transient/PermanentSourceError.

        ``client`` is (client id, secret), sent as HTTP Basic (§2.3.1, authlib's default);
        ``form`` adds fields such as ``audience`` and ``scope``. A non-200 answer is an error
        naming the status and the RFC 6749 §5.2 ``error`` code (a fixed word, safe to log).
        """

        def attempt(n: int) -> Mapping[str, object]:
            self.check_abort(run, label)
            run.count()
            with OAuth2Session(client[0], client[1], default_timeout=self.timeout_s) as oauth:
                oauth.verify = self.session.verify
                oauth.register_compliance_hook(
                    "access_token_response", partial(self._token_answer, label=label, n=n)
                )
                try:
                    token = oauth.fetch_token(token_url, grant_type="client_credentials", **form)
                except requests.RequestException as exc:
                    raise self.request_error(exc, label, n) from exc
                except (OAuthError, ValueError) as exc:  # a 200 that is not a token answer
                    raise PermanentSourceError(
                        f"{label}: token endpoint answer is not a token ({type(exc).__name__})"
                    ) from exc
            return dict(token)

        return self.retrying(attempt, run)

    def _token_answer(self, resp: requests.Response, *, label: str, n: int) -> requests.Response:
        """authlib's ``access_token_response`` hook: only a 200 goes on to authlib's parser."""
        if resp.status_code in RETRY_STATUSES:
            raise self.status_error(resp, label, n)
        if resp.status_code != 200:
            code = _json_error(resp)
            raise PermanentSourceError(
                f"{label}: token endpoint answered HTTP {resp.status_code} {code or ''}".rstrip()
            )
        return resp

    def retrying(self, attempt: Callable[[int], T], run: Run) -> T:
        """``attempt(n)`` with this client's retry policy; ``run.abort`` ends the waits."""
        return call_with_retries(
            attempt, self.policy, logger=log, sleep=run.abort.wait, abort=run.abort
        )

    def request_error(
        self, exc: requests.RequestException, label: str, attempt: int
    ) -> TransientSourceError | PermanentSourceError:
        """Connection errors and timeouts are transient; a request that cannot be made is not."""
        if isinstance(exc, requests.ConnectionError | requests.Timeout):
            return TransientSourceError(f"{label}: {_describe(exc)}{self._of(attempt)}")
        return PermanentSourceError(f"{label}: cannot send request: {_describe(exc)}")

    def status_error(
        self, resp: requests.Response, label: str, attempt: int
    ) -> TransientSourceError:
        """The error for a retryable answer (one of RETRY_STATUSES), with its Retry-After hint."""
        status = resp.status_code
        hint = None
        if status in RETRY_AFTER_STATUSES:
            hint = parse_retry_after(resp.headers.get("Retry-After"))
        resp.close()
        reason = f"HTTP {status}" + (f" (Retry-After {hint:g} s)" if hint is not None else "")
        if self.policy.too_long(hint):
            return TransientSourceError(
                f"{label}: {reason} exceeds max_retry_after_s={self.policy.max_retry_after_s:g}",
                retry_after_s=hint,
            )
        return TransientSourceError(f"{label}: {reason}{self._of(attempt)}", retry_after_s=hint)

    def _of(self, attempt: int) -> str:
        """``(attempt n/N)`` on the last attempt's error (earlier ones are logged with it)."""
        attempts = self.policy.max_attempts
        return f" (attempt {attempt}/{attempts})" if attempt == attempts else ""

    @staticmethod
    def check_abort(run: Run, label: str) -> None:
        if run.abort.is_set():
            raise TransientSourceError(f"{label}: abandoned because another request failed")


def _json_error(resp: requests.Response) -> str | None:
    """The RFC 6749 §5.2 ``error`` code of an error answer, if it is a plain word."""
    try:
        body = resp.json()
    except ValueError:
        return None
    value = body.get("error") if isinstance(body, dict) else None
    return value if isinstance(value, str) and value.isidentifier() else None


def _describe(exc: requests.RequestException) -> str:
    """The exception's class and message, redacted: requests names URLs (which may carry
    credentials) and, when it refuses a header, the header's value (a bearer token)."""
    return redact(f"{type(exc).__name__}: {exc}")
