"""A local stand-in for SKA SRCNet's IAM token endpoint, Data Management API and Site
Capabilities API, for tests (no public DMAPI server exists).

It follows what the public callers of these services show (see the docstring of
:mod:`hydrator.adapters.sources.dmapi` for the sources):

- ``POST /token``: OAuth2 client-credentials grant (RFC 6749 §4.4) with form fields
  ``grant_type``, ``audience``, ``scope``; client authentication by HTTP Basic or by
  ``client_id``/``client_secret`` form fields (§2.3.1). Answers ``{"access_token",
  "token_type": "Bearer", "expires_in", "scope"}`` or an RFC 6749 §5.2 error
  (``invalid_client`` 401, ``unsupported_grant_type``/``invalid_request``/``invalid_scope`` 400).
- ``GET /api/v1/data/locate/{namespace}/{name}`` (bearer, audience ``data-management-api``,
  scope ``data-management-api-service``): a JSON list of ``{"identifier",
  "associated_storage_area_id", "replicas", "is_dataset"}``; 404 for an unknown DID.
- ``GET /api/v1/nodes`` (bearer, audience ``site-capabilities-api``, scope
  ``site-capabilities-api-service``): nodes -> sites -> storages -> areas. Sites, storages and
  storage areas carry ``downtime`` (a list of ``{"date_range": "<ISO> to <ISO>", "type":
  "Planned"|"Unplanned", "reason"}``) and ``is_force_disabled``; as the real API (its
  ``list_nodes`` router and the Mongo backend's ``_remove_inactive_elements``,
  ska-telescope/src-site-directory), the answer leaves out every element in a current
  downtime (``start < now < end``) or force-disabled, unless ``?include_inactive=true``.
  ``nodes_queries`` records the query strings asked.

Missing, unknown or expired tokens get 401 (``WWW-Authenticate: Bearer error="invalid_token"``,
RFC 6750 §3.1); a valid token for another audience or without the scope gets 403. Those two
statuses are this fake's choice; the real services' docs do not state them.

Failure injection: :meth:`FakeSrcnet.fail_next` (any status, optional ``Retry-After``),
:meth:`FakeSrcnet.malformed_next` (a 200 whose body is not JSON), :meth:`expire_tokens`,
``reject_tokens`` (every bearer token refused), ``access_token`` (the token endpoint answers
this string, e.g. one with a line break, instead of minting one), ``broken`` (DIDs whose locate
always fails with 500), ``locate_delay_s`` (to observe concurrency),
:meth:`FakeSrcnet.trickle_next` (a server that sends its status line and then one header line,
or one body byte, a second, for ever), ``content_type`` (what a 200 locate answer is
labelled), ``raw_locate_body`` (the exact bytes of every 200 locate answer, e.g. 62 MB),
``token_lifetime_s`` (the ``expires_in`` the token endpoint answers); ``counts`` (per endpoint, and
``http_401``/``http_403`` refusals), ``located`` and ``max_in_flight`` record what clients did.
Listens on 127.0.0.1, on a free port.
"""

from __future__ import annotations

import base64
import binascii
import json
import secrets
import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

DM_AUDIENCE = "data-management-api"
DM_SCOPE = "data-management-api-service"
SC_AUDIENCE = "site-capabilities-api"
SC_SCOPE = "site-capabilities-api-service"
LOCATE_PREFIX = "/api/v1/data/locate/"


@dataclass
class IssuedToken:
    audience: str
    scopes: frozenset[str]
    expires_at: float  # time.monotonic() seconds


@dataclass(frozen=True)
class Fault:
    status: int
    retry_after: str | None = None
    body: bytes | None = None  # None: a JSON error body
    trickle: str | None = None  # "headers" or "body": one line or byte a second, for ever


API_TIME = "%Y-%m-%dT%H:%M:%S.000Z"  # as the API's examples write date_range ends


def downtime(
    start: datetime, end: datetime, kind: str = "Planned", reason: str = "maintenance"
) -> dict[str, Any]:
    """A downtime entry as the API's ``Downtime`` model holds it."""
    return {
        "date_range": f"{start.strftime(API_TIME)} to {end.strftime(API_TIME)}",
        "type": kind,
        "reason": reason,
        "id": str(uuid.uuid4()),
    }


def area(
    area_id: str | None = None,
    name: str = "",
    area_type: str = "rse",
    downtimes: list[dict[str, Any]] | None = None,
    disabled: bool = False,
) -> dict[str, Any]:
    """A storage area as /nodes lists it."""
    return {
        "id": area_id or str(uuid.uuid4()),
        "name": name,
        "type": area_type,
        "relative_path": "/",
        "tier": 1,
        "other_attributes": {},
        "downtime": downtimes or [],
        "is_force_disabled": disabled,
    }


def storage(
    areas: list[dict[str, Any]],
    name: str = "",
    downtimes: list[dict[str, Any]] | None = None,
    disabled: bool = False,
) -> dict[str, Any]:
    return {
        "id": str(uuid.uuid4()),
        "name": name,
        "host": "storage.example.org",
        "base_path": "/data",
        "srm": "storm",
        "device_type": "hdd",
        "size_in_terabytes": 10,
        "supported_protocols": [{"prefix": "https", "port": 443}],
        "areas": areas,
        "downtime": downtimes or [],
        "is_force_disabled": disabled,
    }


def site(
    name: str,
    storages: list[dict[str, Any]],
    downtimes: list[dict[str, Any]] | None = None,
    disabled: bool = False,
) -> dict[str, Any]:
    return {
        "id": str(uuid.uuid4()),
        "name": name,
        "description": f"{name} test site",
        "country": "GB",
        "storages": storages,
        "compute": [],
        "downtime": downtimes or [],
        "is_force_disabled": disabled,
    }


def _in_downtime(entries: Any, now: datetime) -> bool:
    """The real backend's ``_is_element_in_downtime``: some ``date_range`` holds ``now``
    strictly inside it."""
    for entry in entries if isinstance(entries, list) else ():
        if isinstance(entry, dict) and entry.get("date_range"):
            start, end = (
                datetime.fromisoformat(part.replace("Z", "+00:00"))
                for part in entry["date_range"].split(" to ")
            )
            if start < now < end:
                return True
    return False


def active_only(element: Any, now: datetime) -> Any:
    """The real backend's ``_remove_inactive_elements``: every dict in downtime or
    force-disabled removed, recursively (None for a removed or emptied dict)."""
    if isinstance(element, dict):
        if _in_downtime(element.get("downtime", []), now) or element.get("is_force_disabled"):
            return None
        kept = {}
        for key, value in element.items():
            child = active_only(value, now)
            if child:
                kept[key] = child
        return kept or None
    if isinstance(element, list):
        return [c for c in (active_only(item, now) for item in element) if c is not None]
    return element


def node(name: str, sites: list[dict[str, Any]]) -> dict[str, Any]:
    return {"name": name, "description": f"{name} Node", "sites": sites, "version": 1}


class FakeSrcnet:
    """The three services on one ``ThreadingHTTPServer``; start with :meth:`running`."""

    def __init__(
        self,
        client_id: str = "hydrator-test-client",
        client_secret: str = "s3cret-for-tests-only",
        token_lifetime_s: float = 3600.0,
    ) -> None:
        self.client_id = client_id
        self.client_secret = client_secret
        self.token_lifetime_s = token_lifetime_s
        self.allowed_scopes = {DM_SCOPE, SC_SCOPE, "openid", "profile"}
        self.audiences = {DM_AUDIENCE, SC_AUDIENCE}
        self.catalogue: dict[tuple[str, str], list[Any]] = {}
        self.nodes: list[dict[str, Any]] = []
        self.nodes_queries: list[str] = []
        self.locate_delay_s = 0.0
        self.content_type = "application/json"  # of 200 locate answers
        self.raw_locate_body: bytes | None = None  # every 200 locate answer is exactly this
        self.trickle_interval_s = 1.0
        self.trickles_ended_by_client = 0  # trickles the client hung up on
        self.stopping = threading.Event()
        self.reject_tokens = False
        self.access_token: str | None = None  # answered by /token instead of a minted token
        self.broken: set[tuple[str, str]] = set()  # DIDs whose locate always answers 500
        self.counts: Counter[str] = Counter()
        self.located: list[tuple[str, str]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.lock = threading.Lock()
        self._tokens: dict[str, IssuedToken] = {}
        self._faults: dict[str, deque[Fault]] = {}
        self._server: ThreadingHTTPServer | None = None

    # ---- lifecycle

    @contextmanager
    def running(self) -> Iterator[FakeSrcnet]:
        server = _Server(("127.0.0.1", 0), _Handler, self)
        server.daemon_threads = True
        thread = threading.Thread(
            target=server.serve_forever, args=(0.05,), name="fake-srcnet", daemon=True
        )
        self._server = server
        thread.start()
        try:
            yield self
        finally:
            self.stopping.set()  # ends trickles still running
            server.shutdown()
            server.server_close()
            thread.join(timeout=10)
            self._server = None

    @property
    def root_url(self) -> str:
        assert self._server is not None, "server not running"
        port = self._server.server_address[1]
        return f"http://127.0.0.1:{port}"

    @property
    def base_url(self) -> str:
        return f"{self.root_url}/api/v1"

    @property
    def token_url(self) -> str:
        return f"{self.root_url}/token"

    # ---- content

    def add_dataset(self, scope: str, name: str, *locations: tuple[str, str | None]) -> None:
        """A DID located at ``(rse, storage_area_id)`` pairs (none: known but nowhere)."""
        self.catalogue[(scope, name)] = [
            {
                "identifier": rse,
                "associated_storage_area_id": area_id,
                "replicas": [f"davs://{rse.lower()}.example.org:443/data/{scope}/{name}"],
                "is_dataset": True,
            }
            for rse, area_id in locations
        ]

    def set_raw_entries(self, scope: str, name: str, entries: list[Any]) -> None:
        """Answer a locate of this DID with exactly ``entries`` (for malformed records)."""
        self.catalogue[(scope, name)] = entries

    def issue_token(self, audience: str, scope: str, lifetime_s: float | None = None) -> str:
        """Mint a token as if by the token endpoint (for static-token-file tests)."""
        token = secrets.token_urlsafe(24)
        lifetime = self.token_lifetime_s if lifetime_s is None else lifetime_s
        with self.lock:
            self._tokens[token] = IssuedToken(
                audience, frozenset(scope.split()), time.monotonic() + lifetime
            )
        return token

    # ---- failure injection

    def fail_next(self, endpoint: str, n: int, status: int, retry_after: str | None = None) -> None:
        """The next ``n`` requests to ``endpoint`` (token/locate/nodes) get ``status``."""
        with self.lock:
            queue = self._faults.setdefault(endpoint, deque())
            queue.extend(Fault(status, retry_after) for _ in range(n))

    def malformed_next(self, endpoint: str, n: int) -> None:
        """The next ``n`` requests to ``endpoint`` get a 200 whose body is not JSON."""
        with self.lock:
            queue = self._faults.setdefault(endpoint, deque())
            queue.extend(Fault(200, body=b"<html>gateway says hi</html>") for _ in range(n))

    def trickle_next(self, endpoint: str, n: int, phase: str = "headers") -> None:
        """The next ``n`` requests to ``endpoint`` get a status line, then (``headers``) one
        header line every ``trickle_interval_s`` for ever, or (``body``) complete headers
        announcing a 1 MB body and then one byte of it every ``trickle_interval_s``; until
        the client hangs up (counted in ``trickles_ended_by_client``) or the fake stops."""
        with self.lock:
            queue = self._faults.setdefault(endpoint, deque())
            queue.extend(Fault(200, trickle=phase) for _ in range(n))

    def expire_tokens(self) -> None:
        """Every token issued so far is expired from now on."""
        with self.lock:
            for issued in self._tokens.values():
                issued.expires_at = 0.0

    def take_fault(self, endpoint: str) -> Fault | None:
        with self.lock:
            queue = self._faults.get(endpoint)
            return queue.popleft() if queue else None

    # ---- checks used by the handler

    def check_bearer(self, header: str | None, audience: str, scope: str) -> int:
        """200 if the Authorization header carries a live token for audience+scope, else 401/403."""
        if not header or not header.startswith("Bearer "):
            return 401
        with self.lock:
            issued = self._tokens.get(header.removeprefix("Bearer ").strip())
        if self.reject_tokens or issued is None or issued.expires_at <= time.monotonic():
            return 401
        if issued.audience != audience or scope not in issued.scopes:
            return 403
        return 200


class _Server(ThreadingHTTPServer):
    """The HTTP server of one :class:`FakeSrcnet`, which its handlers answer from."""

    def __init__(
        self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], fake: FakeSrcnet
    ) -> None:
        super().__init__(address, handler)
        self.fake = fake


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as behind a real gateway
    # headers and body go out in two writes; without TCP_NODELAY, Nagle plus the client's
    # delayed ACK add ~40 ms to every answer, which no real server would
    disable_nagle_algorithm = True
    server_version = "FakeSrcnet/1.0"

    @property
    def fake(self) -> FakeSrcnet:
        server = self.server
        assert isinstance(server, _Server)
        return server.fake

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet: tests assert on counts, not on logs

    # ---- routing

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        path = urlsplit(self.path).path
        if path != "/token":
            self._send(404, {"detail": "Not Found"})
            return
        if not self._count_and_maybe_fault("token"):
            self._token(body)

    def do_GET(self) -> None:
        path = urlsplit(self.path).path
        if path.startswith(LOCATE_PREFIX):
            if not self._count_and_maybe_fault("locate"):
                self._locate(path)
        elif path == "/api/v1/nodes":
            if not self._count_and_maybe_fault("nodes"):
                self._nodes(urlsplit(self.path).query)
        else:
            self._send(404, {"detail": "Not Found"})

    def _count_and_maybe_fault(self, endpoint: str) -> bool:
        with self.fake.lock:
            self.fake.counts[endpoint] += 1
        fault = self.fake.take_fault(endpoint)
        if fault is None:
            return False
        if fault.trickle is not None:
            self._trickle(fault.trickle)
            return True
        headers = {"Retry-After": fault.retry_after} if fault.retry_after is not None else {}
        if fault.body is not None:
            self._send_raw(fault.status, fault.body, "text/html", headers)
        else:
            self._send(fault.status, {"detail": f"injected HTTP {fault.status}"}, headers)
        return True

    def _trickle(self, phase: str) -> None:
        fake = self.fake
        self.close_connection = True
        try:
            self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n")
            if phase == "body":
                self.wfile.write(b"Content-Length: 1000000\r\n\r\n[")
            self.wfile.flush()
            n = 0
            while not fake.stopping.wait(fake.trickle_interval_s):
                n += 1
                self.wfile.write(b" " if phase == "body" else f"X-Trickle-{n}: 1\r\n".encode())
                self.wfile.flush()
        except OSError:  # the client hung up: what a deadline must make it do
            with fake.lock:
                fake.trickles_ended_by_client += 1

    # ---- endpoints

    def _token(self, body: bytes) -> None:
        form = {k: v[-1] for k, v in parse_qs(body.decode("ascii", "replace")).items()}
        client_id, secret = self._client_auth(form)
        fake = self.fake
        if client_id != fake.client_id or secret != fake.client_secret:
            self._send(401, {"error": "invalid_client"}, {"WWW-Authenticate": 'Basic realm="iam"'})
            return
        if form.get("grant_type") != "client_credentials":
            self._send(400, {"error": "unsupported_grant_type"})
            return
        if form.get("audience") not in fake.audiences:
            self._send(400, {"error": "invalid_request", "error_description": "bad audience"})
            return
        scopes = form.get("scope", "").split()
        if not set(scopes) <= fake.allowed_scopes:
            self._send(400, {"error": "invalid_scope"})
            return
        token = fake.access_token or fake.issue_token(form["audience"], " ".join(scopes))
        answer = {
            "access_token": token,
            "token_type": "Bearer",
            "expires_in": int(fake.token_lifetime_s),
            "scope": " ".join(scopes),
        }
        self._send(200, answer, {"Cache-Control": "no-store", "Pragma": "no-cache"})

    def _client_auth(self, form: dict[str, str]) -> tuple[str | None, str | None]:
        header = self.headers.get("Authorization", "")
        if header.startswith("Basic "):
            try:
                decoded = base64.b64decode(header[6:], validate=True).decode("utf-8")
            except (binascii.Error, UnicodeDecodeError):
                return None, None
            client_id, _, secret = decoded.partition(":")
            return unquote(client_id), unquote(secret)  # RFC 6749 §2.3.1 form-encodes both
        return form.get("client_id"), form.get("client_secret")

    def _locate(self, path: str) -> None:
        fake = self.fake
        status = fake.check_bearer(self.headers.get("Authorization"), DM_AUDIENCE, DM_SCOPE)
        if status != 200:
            self._auth_error(status)
            return
        namespace, sep, name = path[len(LOCATE_PREFIX) :].partition("/")
        key = (unquote(namespace), unquote(name))
        with fake.lock:
            fake.in_flight += 1
            fake.max_in_flight = max(fake.max_in_flight, fake.in_flight)
            fake.located.append(key)
        try:
            if fake.locate_delay_s:
                time.sleep(fake.locate_delay_s)
            entries = fake.catalogue.get(key) if sep else None
        finally:
            with fake.lock:
                fake.in_flight -= 1
        if key in fake.broken:
            self._send(500, {"detail": "Internal Server Error"})
        elif entries is None:
            self._send(404, {"detail": f"Data identifier {key[0]}:{key[1]} not found"})
        elif fake.raw_locate_body is not None:
            self._send_raw(200, fake.raw_locate_body, fake.content_type, None)
        else:
            self._send_raw(200, json.dumps(entries).encode(), fake.content_type, None)

    def _nodes(self, query: str) -> None:
        status = self.fake.check_bearer(self.headers.get("Authorization"), SC_AUDIENCE, SC_SCOPE)
        if status != 200:
            self._auth_error(status)
            return
        with self.fake.lock:
            self.fake.nodes_queries.append(query)
        flags = parse_qs(query).get("include_inactive", ["false"])
        if flags[-1].lower() == "true":
            self._send(200, self.fake.nodes)
        else:
            self._send(200, active_only(self.fake.nodes, datetime.now(UTC)) or [])

    # ---- responses

    def _auth_error(self, status: int) -> None:
        with self.fake.lock:
            self.fake.counts[f"http_{status}"] += 1
        if status == 401:
            challenge = 'Bearer error="invalid_token"'
            self._send(401, {"detail": "Invalid or expired token"}, {"WWW-Authenticate": challenge})
        else:
            self._send(403, {"detail": "Token audience or scope not allowed"})

    def _send(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
        self._send_raw(status, json.dumps(payload).encode(), "application/json", headers)

    def _send_raw(
        self, status: int, body: bytes, content_type: str, headers: dict[str, str] | None
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)
