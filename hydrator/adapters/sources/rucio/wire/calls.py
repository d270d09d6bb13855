"""The Rucio wire's calls: :class:`RucioWire`, one Rucio server's API as the source calls it,
each call with bounded retries and every library error translated into the hydrator's own.

The two bulk listings (``list_datasets_per_rse``, ``list_replication_rules``), the per-RSE
deep checks (``list_dataset_replicas(deep=True)``) and one dataset's rules (``list_did_rules``,
for event cycles) are sent as rucio-clients sends them (its URL, session, token and headers:
:meth:`RucioWire.get`) but their bodies are handed back as bytes and parsed by
:mod:`..listing`, instead of rucio-clients' ``json.loads`` per line with a date-parsing hook,
which was most of a fetch at a million rows. The other calls use
rucio-clients' methods. The client they use, its session and the bounded reading of answers
are :mod:`.session`.

Bounds: a fetch ends by itself within ``deadline_s``
(:meth:`RucioWire.begin`): every call's timeout is at most the time left, no call or retry
starts after it, and the deadline watchdog mounted on the client's session cuts a read still
under way at it. The listings read here are bounded per answer (``max_answer_bytes``) and per
line (``max_line_bytes``) as they stream in; over a cap, the source fails naming the RSE.

Errors (all translated here, never classified by message text)::

    requests ConnectionError, Timeout, broken stream, OSError,
    Rucio errors from an HTTP 5xx/429 answer, ServerConnectionException  -> TransientSourceError
    CannotAuthenticate, NoAuthInformation, AccessDenied, HTTP 401/403,
    TLS (SSLError), a bad client configuration, other Rucio errors        -> PermanentSourceError
    InvalidRSEExpression from list_rses    -> InvalidExpression (a PermanentSourceError)
    any error once the fetch's deadline passed                           -> TransientSourceError
    a listing over max_answer_bytes or max_line_bytes (not retried)      -> PermanentSourceError
    a listing's line that is not JSON (:class:`~..listing.NotJsonLine`)  -> TransientSourceError

Transient errors are retried ``max_attempts`` times per call with exponential backoff from
``backoff_s``, or after the server's ``Retry-After`` up to ``max_retry_after_s`` (by
:mod:`hydrator.adapters.retry`; logged ``attempt n/N``); rucio-clients' own retries are
reduced (it still resends once at once after a connection error) so that a dead server fails
a fetch within about ``max_attempts x (timeout + backoff)``.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack
from functools import partial
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote, quote_plus

import requests
from rucio.common import exception as rucio_exc
from rucio.common.utils import build_url

from hydrator.adapters.retry import RetryPolicy, call_with_retries, parse_retry_after
from hydrator.adapters.sources._deadline import Run, current_run
from hydrator.adapters.sources.rucio.listing import line_blocks
from hydrator.adapters.sources.rucio.wire.session import (
    TooLarge,
    bounded_blocks,
    make_client,
    read_rucio_secret,
)
from hydrator.config import RucioSourceConfig
from hydrator.domain import DatasetId
from hydrator.errors import PermanentSourceError, SourceError, TransientSourceError
from hydrator.logs import adopt_library_loggers
from hydrator.redact import redact

log = logging.getLogger("hydrator.adapters.sources.rucio")
adopt_library_loggers()  # rucio's own stderr handler would bypass the redacting formatter

T = TypeVar("T")

ClientFactory = Callable[[], Any]
"""Builds a connected rucio-clients ``Client`` (or a stand-in with its attributes)."""

_AUTH_ERRORS: tuple[type[Exception], ...] = (
    rucio_exc.CannotAuthenticate,
    rucio_exc.NoAuthInformation,
    rucio_exc.AccessDenied,
)
_CLIENT_CONFIG_ERRORS: tuple[type[Exception], ...] = (
    rucio_exc.MissingClientParameter,
    rucio_exc.ConfigNotFound,
    rucio_exc.ClientProtocolNotSupported,
    rucio_exc.ClientProtocolNotFound,
)


class _TokenRejected(Exception):
    """Raised by the response hook when the server refuses the OIDC bearer token (HTTP 401)."""


class _NotFound(Exception):
    """A listing GET answered HTTP 404 (translated as any other error status, unless the
    caller reads it as an empty answer)."""


_CALL_ERRORS: tuple[type[Exception], ...] = (
    rucio_exc.RucioException,
    requests.RequestException,
    OSError,
    json.JSONDecodeError,
    _TokenRejected,
    _NotFound,
)
_REPLICAS, _RULES = "replicas", "rules"  # rucio-clients' REPLICAS_BASEURL and RULE_BASEURL
_DIDS = "dids"  # rucio-clients' DIDS_BASEURL


class InvalidExpression(PermanentSourceError):
    """``list_rses`` refused an RSE expression (invalid, or it matches no RSE)."""


class RucioWire:
    """One Rucio server's API as the source calls it: a client built on first use (and again
    after a permanent error), each call counted by method in the fetch's :class:`Run`
    (:attr:`calls`, new at each :meth:`begin`; ``connect`` counts client constructions,
    ``auth`` tokens obtained).

    ``sleep`` is the backoff clock (seconds); ``client_factory`` replaces building a
    rucio-clients ``Client`` from the config (tests). Calls are made one at a time (the
    read-ahead worker of a fetch calls while its caller does not)."""

    def __init__(
        self,
        config: RucioSourceConfig,
        *,
        sleep: Callable[[float], None] = time.sleep,
        client_factory: ClientFactory | None = None,
    ) -> None:
        self.config = config
        self._sleep = sleep
        self._factory = client_factory or self._make_client
        self._client: Any = None
        self._token_dir: Path | None = None
        self._last_status: int | None = None
        self._retry_after_s: float | None = None
        self._token_seen: str | None = None
        self.run = Run()  # the current fetch's (see begin)
        self._watchdog = ExitStack()
        self._closed = False

    @property
    def calls(self) -> dict[str, int]:
        """The current fetch's calls so far, by method (a copy)."""
        return self.run.calls.counts()

    def begin(self, deadline_s: float = math.inf) -> None:
        """Start counting the calls of a new fetch, which must end within ``deadline_s``
        seconds from now: every call's timeout is at most the time left, no call starts
        after it, and at it (a timer) the reads still under way are cut (:mod:`._deadline`).
        :meth:`end` must follow."""
        self.run = Run(deadline=time.monotonic() + deadline_s)
        self._watchdog.enter_context(self.run.watchdog())

    def end(self) -> None:
        """The fetch :meth:`begin` started has ended (stop its timer). After :meth:`close`
        (the daemon stopped while this fetch ran on), remove the token directory again:
        rucio-clients may have re-created it meanwhile."""
        self._watchdog.close()
        if self._closed:
            self._remove_token_dir()

    def forget_client(self) -> None:
        """Build the client again at the next call (a password file is re-read then)."""
        self._client = None

    def close(self) -> None:
        """Drop the client and remove the private token directory; no client is built again.

        Safe while a fetch runs (the daemon stopping with this source's fetch abandoned):
        that fetch's reads are cut at once (:meth:`Run.expire`), and its end removes the
        directory again (:meth:`end`), so none is left in the temporary directory."""
        self._closed = True
        self.run.expire()
        self._client = None
        self._remove_token_dir()

    def _remove_token_dir(self) -> None:
        token_dir, self._token_dir = self._token_dir, None
        if token_dir is not None:
            shutil.rmtree(token_dir, ignore_errors=True)

    # -- the calls a fetch makes -------------------------------------------------------

    def list_rses(self, expression: str | None) -> list[Any]:
        """The RSE records (untrusted dicts) an expression names (``{"rse": name}`` each);
        with None every RSE's full record (``availability_read`` included); raises
        :class:`InvalidExpression` when the server refuses the expression."""
        client = self.connected()
        try:
            return self.call("list_rses", partial(_as_list, client.list_rses, expression))
        except PermanentSourceError as exc:
            if isinstance(exc.__cause__, rucio_exc.InvalidRSEExpression):
                raise InvalidExpression(str(exc)) from exc.__cause__
            raise

    def rse_attributes(self, rse: str) -> Any:
        """``list_rse_attributes(rse)``: the RSE's attributes (an untrusted dict)."""
        client = self.connected()
        return self.call("list_rse_attributes", partial(client.list_rse_attributes, rse))

    def summary(self, rse: str) -> bytes:
        """``list_datasets_per_rse(rse)``: the RSE's dataset summary table, JSON lines."""
        path = f"{_REPLICAS}/rse/{quote(rse, safe='')}"
        return self.call("list_datasets_per_rse", partial(self._body, path, f"RSE {rse}"))

    def rules(self, state: str, read: Callable[[Iterator[list[bytes]]], T]) -> T:
        """``read`` applied to the rules in state ``state`` (one-letter code) as they stream
        in, as blocks of JSON lines (:func:`~.listing.line_blocks`), inside the retry loop: a
        broken stream is retried from the start."""

        def stream() -> T:
            with self.get(f"{_RULES}/", {"state": state}, stream=True) as response:
                return read(line_blocks(self._chunks(response, f"rules in state {state}")))

        return self.call("list_replication_rules", stream)

    def dataset_replicas(self, dataset: DatasetId, parse: Callable[[list[bytes]], T]) -> T:
        """``parse`` applied to the lines of ``list_dataset_replicas(scope, name, deep=True)``
        (exact file counts per RSE) inside the retry loop."""
        path = f"{_REPLICAS}/{quote_plus(dataset.scope)}/{quote_plus(dataset.name)}/datasets"

        def lines() -> T:
            body = self._body(path, f"dataset {dataset}", {"deep": "True"})
            return parse(list(filter(None, body.splitlines())))

        return self.call("list_dataset_replicas", lines)

    def did_rules(self, dataset: DatasetId, parse: Callable[[list[bytes]], T]) -> T:
        """``parse`` applied to the lines of ``list_did_rules(scope, name)`` (every rule on
        the dataset itself, in any state) inside the retry loop. The server answers HTTP 404
        for a DID it does not know: no rules (``parse`` of no line)."""
        path = f"{_DIDS}/{quote_plus(dataset.scope)}/{quote_plus(dataset.name)}/rules"

        def lines() -> T:
            try:
                body = self._body(path, f"the rules of dataset {dataset}")
            except _NotFound:
                return parse([])
            return parse(list(filter(None, body.splitlines())))

        return self.call("list_did_rules", lines)

    def file_replicas(self, dataset: DatasetId) -> list[Any]:
        """``list_replicas(all_states=True)``: one untrusted record per file of the dataset,
        with its state at each RSE."""
        client = self.connected()
        did = {"scope": dataset.scope, "name": dataset.name}
        return self.call(
            "list_replicas", partial(_as_list, client.list_replicas, [did], all_states=True)
        )

    def bad_replicas(self, state: str, limit: int) -> list[Any]:
        """``GET /replicas/bad/states``: up to ``limit`` untrusted records (``scope``,
        ``name``, ``rse``, ...) of the bad-replicas table in ``state`` (one-letter code: ``B``
        bad, ``T`` temporarily unavailable). rucio-clients 41 has no method for it; the
        server's ``list_bad_replicas_status`` answers JSON lines, in no particular order."""
        params = {"state": state, "limit": str(limit)}

        def records() -> list[Any]:
            body = self._body(f"{_REPLICAS}/bad/states", f"bad replicas ({state})", params)
            return [_json_or_none(line) for line in body.splitlines() if line]

        return self.call("list_bad_replicas_status", records)

    def parent_dids(self, scope: str, name: str) -> list[Any]:
        """``list_parent_dids(scope, name)``: the untrusted records (``scope``, ``name``,
        ``type``) of the collections a file is attached to."""
        client = self.connected()
        return self.call(
            "list_parent_dids", partial(_as_list, client.list_parent_dids, scope, name)
        )

    def export(self, max_bytes: int) -> Any:
        """``GET /export/?distance=True``: every RSE (with its attributes) and every distance
        between RSEs (``{"rses": {name: {...}}, "distances": {source: {destination: {...}}}}``,
        untrusted), in one request of at most ``max_bytes``. rucio-clients' ``export_data``
        reads it unbounded; the server allows it to the accounts its policy lets export
        (root, in the generic policy): others get AccessDenied, a permanent error."""

        def document() -> Any:
            with self.get("export/", {"distance": "True"}, stream=True) as response:
                blocks = bounded_blocks(response, "the export", max_bytes, self.run)
                return json.loads(b"".join(blocks))

        return self.call("export_data", document)

    # -- requests --------------------------------------------------------------------------

    def get(
        self, path: str, params: dict[str, str] | None = None, stream: bool = False
    ) -> requests.Response:
        """One listing GET exactly as rucio-clients sends it (its URL, session, token and
        headers), whose body the caller reads. A 401 gets the client a new token (through
        ``whoami``) and one resend; another error status raises a ``RucioException`` (404:
        :class:`_NotFound`) classified by :meth:`_translate` (when made inside :meth:`call`)."""
        client = self.connected()
        url = build_url(client.host, path=path, params=params)
        for attempt in (1, 2):
            headers = {
                "X-Rucio-Auth-Token": client.auth_token,
                "X-Rucio-VO": client.vo,
                "X-Rucio-Account": client.account,
                "User-Agent": client.user_agent,
                "X-Rucio-Script": client.script_id,
            }
            response: requests.Response = client.session.get(
                url,
                headers={k: v for k, v in headers.items() if v is not None},
                timeout=client.timeout,
                verify=client.ca_cert or False,
                stream=stream,
            )
            self._last_status = response.status_code
            if response.status_code != 401 or attempt == 2:
                break
            response.close()
            client.whoami()  # rucio-clients renews the token on the 401 this gets
        if response.status_code != 200:
            response.close()
            error = _NotFound if response.status_code == 404 else rucio_exc.RucioException
            raise error(f"HTTP {response.status_code} from {path}")
        return response

    def _body(self, path: str, what: str, params: dict[str, str] | None = None) -> bytes:
        """A listing's whole answer (``what`` names it in errors), read in blocks of
        ``READ_BYTES`` (``Response.content`` reads in small blocks, which costs more CPU on a
        large listing: docs/performance.md) and bounded by :meth:`_chunks`."""
        with self.get(path, params, stream=True) as response:
            return b"".join(self._chunks(response, what))

    def _chunks(self, response: requests.Response, what: str) -> Iterator[bytes]:
        """The streamed answer's bytes as they arrive, bounded by ``max_line_bytes`` and the
        fetch's deadline (:func:`.session.bounded_blocks`)."""
        return bounded_blocks(response, what, self.config.max_line_bytes, self.run)

    # -- calls, retries, errors ----------------------------------------------------------

    def call(self, method: str, fn: Callable[[], T]) -> T:
        """Run one API call with bounded retries on transient errors; translate all errors.

        Within the fetch's deadline (:meth:`begin`): no attempt starts after it, each one's
        timeout is at most the time left, no backoff waits past it, and the reads of an
        attempt under way at it are cut (its connections watched while it runs)."""
        run = self.run

        def attempt(n: int) -> T:
            self._check_deadline(method)
            self.run.calls.count(method)
            self._last_status = self._retry_after_s = None
            self._watch(self._client)
            try:
                with current_run(run):
                    result = fn()
                self._check_deadline(method)  # a read cut at the deadline may look complete
                return result
            except SourceError:
                raise
            except Exception as exc:
                self._check_deadline(method)
                if isinstance(exc, TooLarge):
                    raise PermanentSourceError(f"rucio: {method}: {exc}") from exc
                if isinstance(exc, _CALL_ERRORS):
                    raise self._translate(method, exc) from exc
                raise
            finally:
                run.let_go()
                self._note_token(self._client)

        cfg = self.config
        policy = RetryPolicy(
            cfg.max_attempts, cfg.backoff_s, max_retry_after_s=cfg.max_retry_after_s
        )
        return call_with_retries(
            attempt,
            policy,
            logger=log,
            sleep=lambda s: self._sleep(min(s, max(0.0, run.left_s()))),
            abort=run.abort,
        )

    def _check_deadline(self, method: str) -> None:
        """Raise once the fetch's deadline passed; else set the client's timeout (seconds,
        for connect and each read) to at most the time left."""
        if self.run.passed():
            self.run.abort.set()  # no retry either
            raise TransientSourceError(
                f"rucio: {method}: the fetch's deadline passed "
                f"(deadline_s = {self.config.deadline_s:g} s); abandoned"
            )
        if self._client is not None:
            self._client.timeout = self._timeout_s()

    def _timeout_s(self) -> float:
        """One request's timeout: ``timeout_s``, or the time left before the deadline."""
        return min(self.config.timeout_s, max(self.run.left_s(), 0.001))

    def _translate(self, method: str, exc: Exception) -> SourceError:
        """The hydrator's error for a library exception, by its class and HTTP status."""
        where = redact(self.config.rucio_host or "the server in $RUCIO_CONFIG")  # user:pw@
        kind = type(exc).__name__
        status = self._last_status
        if isinstance(exc, (*_AUTH_ERRORS, _TokenRejected)) or status in (401, 403):
            return PermanentSourceError(
                f"rucio: authentication failed at {where} for account "
                f"{self.config.account or '(from rucio.cfg)'} ({kind}); check the credentials"
            )
        if isinstance(exc, _CLIENT_CONFIG_ERRORS):
            return PermanentSourceError(f"rucio: bad client configuration ({kind}): {_line(exc)}")
        if isinstance(exc, requests.exceptions.SSLError):
            return PermanentSourceError(f"rucio: TLS failure talking to {where}; check ca_cert")
        if isinstance(exc, requests.RequestException | OSError | json.JSONDecodeError):
            return TransientSourceError(f"rucio: {method}: cannot reach {where} ({kind})")
        if isinstance(exc, rucio_exc.ServerConnectionException) or (
            status is not None and (status >= 500 or status == 429)
        ):
            return TransientSourceError(
                f"rucio: {method}: server error {status} ({kind})", self._retry_after_s
            )
        return PermanentSourceError(f"rucio: {method} failed ({kind}, HTTP {status}): {_line(exc)}")

    # -- the client ----------------------------------------------------------------------

    def connected(self) -> Any:
        """The client, built (and authenticated) on first use or after a permanent error.

        With ``auth_type = "oidc"`` the bearer token is re-read from ``token_file`` every
        fetch (:meth:`refresh`), so a token renewed by an external agent is picked up without
        a restart.
        """
        if self._client is None:
            if self._closed:
                raise TransientSourceError("rucio: the source is closed (the daemon is stopping)")
            client = self.call("connect", self._factory)
            client.request_retries = 0  # one immediate resend inside rucio-clients; ours follow
            self._client = client
            self._note_token(client)
        return self._client

    def refresh(self) -> None:
        """Connect if needed, else re-read an OIDC token (at the start of each fetch)."""
        if self._client is not None and self.config.auth_type == "oidc":
            self._client.auth_token = read_rucio_secret(self.config.token_file, "token_file")
        self._note_token(self.connected())

    def _make_client(self) -> Any:
        """A rucio ``Client`` from the config (:func:`.session.make_client`), its tokens in a
        private directory of this wire's, and a hook (:meth:`_on_response`, added by
        :meth:`_watch`) on its session that records each answer's status and stops at a
        rejected bearer token."""
        if self._token_dir is None:
            self._token_dir = Path(tempfile.mkdtemp(prefix="hydrator-rucio-"))
        return make_client(
            self.config,
            token_dir=self._token_dir,
            timeout_s=self._timeout_s(),
            max_answer_bytes=lambda: self.config.max_answer_bytes,
        )

    def _watch(self, client: Any) -> None:
        """Hook :meth:`_on_response` into the client's session (rucio-clients replaces its
        session after an HTTP 401, so this runs before every call)."""
        if client is not None and self._on_response not in client.session.hooks["response"]:
            client.session.hooks["response"].append(self._on_response)

    def _on_response(self, resp: requests.Response, *args: Any, **kwargs: Any) -> None:
        """Record the status and ``Retry-After`` of each answer; with OIDC, end at a 401.

        rucio-clients answers a 401 by fetching a new token, which for OIDC is its interactive
        browser flow: a daemon must stop there instead (the token comes from ``token_file``).
        """
        self._last_status = resp.status_code
        self._retry_after_s = None
        if resp.status_code in (429, 503):
            self._retry_after_s = parse_retry_after(resp.headers.get("Retry-After"))
        if resp.status_code == 401 and self.config.auth_type == "oidc":
            resp.close()
            raise _TokenRejected

    def _note_token(self, client: Any) -> None:
        """Count a token obtained since the last look (as the call ``auth``)."""
        token = getattr(client, "auth_token", None) if client is not None else None
        if token and token != self._token_seen:
            self.run.calls.count("auth")
            self._token_seen = token


def _as_list(fn: Callable[..., Iterable[Any]], *args: Any, **kwargs: Any) -> list[Any]:
    """Call a listing method and read its whole (streamed) answer inside the retry loop."""
    return list(fn(*args, **kwargs))


def _line(exc: Exception) -> str:
    """The first line of a library error, redacted (it may quote a header or a URL)."""
    text = str(exc).strip().splitlines()
    return redact(text[0])[:200] if text else type(exc).__name__


def _json_or_none(line: bytes) -> Any:
    """One JSON line of an answer, or None where it is not JSON (the caller counts it as a
    malformed record instead of failing the whole listing)."""
    try:
        return json.loads(line)
    except ValueError:
        return None
