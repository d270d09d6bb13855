"""HTTP plumbing of the DMAPI source: bounded retries, ``Retry-After``, request counting, a
deadline per fetch and a size cap per answer.

Only the DMAPI source (:mod:`.dmapi`) uses this module (the Rucio source reaches ``requests``
through ``rucio-clients``, in its ``wire`` package). :meth:`HttpClient.send` retries what may
go away by itself (connection errors, timeouts, HTTP 408, 429, 500, 502, 503, 504) with
exponential backoff, honours a ``Retry-After`` hint on 429/503 when it is no longer than
``max_retry_after_s``, and logs every retry as
``attempt n/N`` (the retrying itself is :func:`hydrator.adapters.retry.call_with_retries`, on
tenacity).
Every other answer (2xx, 401, 404, other 4xx) is returned to the caller as an :class:`Answer`
whose body was read whole, but never more than ``max_answer_bytes`` (after decompression).

Deadline: every request of one fetch shares its :class:`Run`, whose ``deadline`` bounds all
of them together (connects, headers, bodies, token requests, retry waits). Per-read timeouts
alone never fire on a server that sends a byte now and then (a status line, then one header
line a second), and requests offers no total timeout, so three things
together keep it (all on requests' and urllib3's public extension points, no HTTP written
here): each request's timeout is at most the time left; a body is read one socket read at a
time (``read1``), the deadline checked between reads (:class:`_BoundedAdapter`); and
:meth:`Run.expire`, a timer at the deadline, shuts down the socket of every connection still
waiting for its headers, which ends that read at once in the thread that is blocked in it
(the run and the watched connections are in :mod:`.._deadline`, shared with the Rucio source).

Errors (``raise ... from`` the ``requests`` exception)::

    TransientSourceError   attempts exhausted, Retry-After too long, the deadline passed, or
                           the fetch was aborted
    PermanentSourceError   the request cannot be made at all (invalid URL, TLS setup, ...), or
                           the answer is larger than max_answer_bytes

Nothing here logs headers or bodies: they may carry bearer tokens or client secrets; library
error messages pass :func:`hydrator.redact.redact` before they go into an error.
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

import requests
import urllib3
from authlib.integrations.base_client import OAuthError
from authlib.integrations.requests_client import OAuth2Session
from urllib3.response import HTTPResponse

from hydrator.adapters.retry import RetryPolicy, call_with_retries, parse_retry_after
from hydrator.adapters.sources._deadline import (
    DeadlinePassed,
    Run,
    WatchedAdapter,
    current,
    current_run,
)
from hydrator.errors import PermanentSourceError, TransientSourceError
from hydrator.redact import redact

__all__ = ["REQUEST", "Answer", "HttpClient", "RetryPolicy", "Run", "parse_retry_after"]

log = logging.getLogger(__name__)
T = TypeVar("T")

RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
RETRY_AFTER_STATUSES = frozenset({429, 503})  # RFC 9110 §10.2.3: Retry-After on 503 and 429
CHUNK_BYTES = 64 * 1024  # at most this much per socket read of a body
UNLIMITED_BYTES = 1 << 62
REQUEST = "request"  # the one name every request is counted under (token, /nodes, locate)


@dataclass(frozen=True)
class Answer:
    """An HTTP answer, its body read whole (at most ``max_answer_bytes``, decompressed)."""

    status_code: int
    headers: Mapping[str, str]
    content: bytes

    def json(self) -> Any:
        """The body parsed as JSON (ValueError if it is not)."""
        return json.loads(self.content)


class AnswerTooLarge(requests.RequestException):
    """The answer's body is larger than ``max_answer_bytes``."""


class _BoundedAdapter(WatchedAdapter):
    """requests' transport adapter, with urllib3 pools of watched connections
    (:mod:`.._deadline`) and bodies read within the current run's deadline and at most
    ``max_bytes`` (after decompression), so one oversized answer cannot grow the daemon's memory
    without bound.

    The body is read here, one socket read at a time, and handed to requests as the
    response's ``raw`` file, which requests then reads as usual (``Response.content``).
    """

    def __init__(self, max_bytes: int, pool_maxsize: int = 8) -> None:
        self.max_bytes = max_bytes
        super().__init__(pool_maxsize)

    def send(self, request: requests.PreparedRequest, *args: Any, **kwargs: Any) -> Any:
        response = super().send(request, *args, **kwargs)
        raw = response.raw
        run = current()
        try:
            body = self._read(raw, run)
        finally:
            raw.release_conn()
        if run is not None and run.expired:  # a socket shut down mid-answer reads as its end
            raise DeadlinePassed("the fetch's deadline passed while reading the answer")
        response.raw = io.BytesIO(body)
        return response

    def _read(self, raw: HTTPResponse, run: Run | None) -> bytes:
        chunks: list[bytes] = []
        size = 0
        while chunk := self._read1(raw):
            size += len(chunk)
            if size > self.max_bytes:
                raw.close()
                raise AnswerTooLarge(f"answer larger than max_answer_bytes = {self.max_bytes}")
            if run is not None and (run.expired or run.left_s() <= 0):
                raw.close()
                raise DeadlinePassed("the fetch's deadline passed while reading the answer")
            chunks.append(chunk)
        return b"".join(chunks)

    @staticmethod
    def _read1(raw: HTTPResponse) -> bytes:
        """One socket read of the body (decompressed), as requests' own reading would raise."""
        try:
            return raw.read1(CHUNK_BYTES, decode_content=True)
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise requests.ConnectionError(f"reading the answer: {exc}") from exc


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
        max_answer_bytes: int = UNLIMITED_BYTES,
    ) -> None:
        self.policy = policy
        self.timeout_s = timeout_s
        self.max_answer_bytes = max_answer_bytes
        self.session = requests.Session()
        self.session.verify = verify
        self.session.headers["Accept"] = "application/json"
        self._mount(self.session, pool_maxsize)

    def _mount(self, session: requests.Session, pool_maxsize: int = 1) -> None:
        adapter = _BoundedAdapter(self.max_answer_bytes, pool_maxsize)
        session.mount("https://", adapter)
        session.mount("http://", adapter)

    def timeout(self, run: Run, label: str) -> float:
        """This request's timeout: ``timeout_s``, or the time left before the deadline."""
        left = run.left_s()
        if left <= 0:
            raise TransientSourceError(f"{label}: {self._deadline_passed(run)}")
        return min(self.timeout_s, left)

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
    ) -> Answer:
        """Send with retries; return the first answer that is not worth retrying.

        ``label`` names the request in logs and errors (never put secrets in it).
        """

        def attempt(n: int) -> Answer:
            self.check_abort(run, label)
            timeout = self.timeout(run, label)
            run.calls.count(REQUEST)
            try:
                with current_run(run):
                    resp = self.session.request(method, url, headers=headers, timeout=timeout)
            except requests.RequestException as exc:
                raise self.request_error(exc, label, n, run) from exc
            if resp.status_code in RETRY_STATUSES:
                raise self.status_error(resp, label, n)
            return Answer(resp.status_code, resp.headers, resp.content)

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
            timeout = self.timeout(run, label)
            run.calls.count(REQUEST)
            with OAuth2Session(client[0], client[1], default_timeout=timeout) as oauth:
                oauth.verify = self.session.verify
                self._mount(oauth)  # the same size cap and deadline as every other request
                oauth.register_compliance_hook(
                    "access_token_response", partial(self._token_answer, label=label, n=n)
                )
                try:
                    with current_run(run):
                        token = oauth.fetch_token(
                            token_url, grant_type="client_credentials", **form
                        )
                except requests.RequestException as exc:
                    raise self.request_error(exc, label, n, run) from exc
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
        self, exc: requests.RequestException, label: str, attempt: int, run: Run
    ) -> TransientSourceError | PermanentSourceError:
        """Connection errors and timeouts are transient, and so is the deadline; an answer
        over the size cap or a request that cannot be made is not."""
        if isinstance(exc, AnswerTooLarge):
            return PermanentSourceError(f"{label}: {exc}")
        if run.expired or isinstance(exc, DeadlinePassed):
            return TransientSourceError(f"{label}: {self._deadline_passed(run)}")
        if isinstance(exc, requests.ConnectionError | requests.Timeout):
            return TransientSourceError(f"{label}: {_describe(exc)}{self._of(attempt)}")
        return PermanentSourceError(f"{label}: cannot send request: {_describe(exc)}")

    @staticmethod
    def _deadline_passed(run: Run) -> str:
        run.abort.set()  # the other requests of this fetch stop too
        return "the fetch's deadline passed (deadline_s); abandoned"

    def status_error(
        self, resp: requests.Response, label: str, attempt: int
    ) -> TransientSourceError:  # resp: requests' (its body was read and capped by the adapter)
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

    @classmethod
    def check_abort(cls, run: Run, label: str) -> None:
        if run.expired or run.left_s() <= 0:
            raise TransientSourceError(f"{label}: {cls._deadline_passed(run)}")
        if run.abort.is_set():
            raise TransientSourceError(f"{label}: abandoned because another request failed")


def _json_error(resp: requests.Response | Answer) -> str | None:
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
