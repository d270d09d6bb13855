"""A small HTTP/1.1 server for GET and HEAD on one asyncio event loop in one thread.

Why not ``http.server``: its ``ThreadingHTTPServer`` runs a thread per connection, and 50
keep-alive connections meant 50 threads contending for the GIL on 2 CPUs; a request could wait
several switch intervals (5 ms each) for its turn, which put the conditional-GET p99 at 30-140 ms
(``benchmarks/RESULTS.md``). Here one thread answers every connection from memory, so a request
waits only for the requests ahead of it (tens of microseconds each). Handlers that take longer
(JSON documents, the metrics text) are *deferred*: they run in a small thread pool while the loop
keeps answering the others, and their connection reads no further request until they are done, so
responses stay in request order (pipelining) without buffering.

What it accepts, and what a client gets otherwise (one line of text, then the connection closes
for malformed requests):

- ``GET`` and ``HEAD`` with no body, origin-form (``/path?query``) or absolute-form targets;
  other methods get ``405`` with ``Allow``; a body (``Content-Length`` other than 0, or
  ``Transfer-Encoding``) gets ``400``.
- ``HTTP/1.1`` keep-alive unless ``Connection: close``; ``HTTP/1.0`` closes unless it asks for
  ``keep-alive``; other versions get ``505``.
- A request head of at most :data:`MAX_HEAD_BYTES` (else ``431``), complete within
  ``timeout_s`` of its first byte; an idle keep-alive connection is closed after ``timeout_s``.
- A client that stops reading its responses stops being read (transport flow control).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import re
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from email.utils import formatdate
from http import HTTPStatus

log = logging.getLogger(__name__)

MAX_HEAD_BYTES = 16 * 1024
"""Largest request line + headers accepted; a hook or squid sends a few hundred bytes."""

_ALLOWED = ("GET", "HEAD")
_TARGET = re.compile(r"[\x21-\x7e]+")  # visible ASCII: no spaces, controls or raw UTF-8 (RFC 3986)


@dataclass(frozen=True, slots=True)
class Request:
    """A parsed request: ``path`` without the query string, header names lower-case."""

    method: str
    path: str
    headers: dict[str, str]

    @property
    def head(self) -> bool:
        return self.method == "HEAD"


@dataclass(frozen=True, slots=True)
class Response:
    """What to send: ``body`` is never sent for ``HEAD`` or ``304``, but its length is for HEAD."""

    status: HTTPStatus
    body: bytes = b""
    content_type: str | None = "text/plain; charset=utf-8"
    headers: tuple[tuple[str, str], ...] = field(default=())


Deferred = Callable[[], Response]
"""A handler's slow part, run in the thread pool; its result is sent when it returns."""
Handler = Callable[[Request], Response | Deferred]
"""Answers a request from memory (a :class:`Response`) or hands back a :data:`Deferred`."""
Observer = Callable[[Request, HTTPStatus], None]
"""Told of every response as it is sent (a malformed request has the path ``""``)."""


class _Clock:
    """The ``Date`` header value, formatted once per second, not once per request."""

    def __init__(self) -> None:
        self._second = -1
        self._value = ""

    def date(self) -> str:
        now = int(time.time())
        if now != self._second:
            self._second, self._value = now, formatdate(now, usegmt=True)
        return self._value


class _BadRequest(Exception):
    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


def _parse_head(head: bytes) -> tuple[Request, bool]:
    """``(request, keep_alive)`` from the bytes before the blank line.

    Raises :class:`_BadRequest` with the status and one line for the client.
    """
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[0] or not parts[1]:
        raise _BadRequest(HTTPStatus.BAD_REQUEST, "malformed request line")
    method, target, version = parts
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        raise _BadRequest(
            HTTPStatus.HTTP_VERSION_NOT_SUPPORTED, f"unsupported version {version[:16]!r}"
        )
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip() or line[0] in " \t":
            raise _BadRequest(HTTPStatus.BAD_REQUEST, "malformed header line")
        key, value = name.lower(), value.strip()
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    if "transfer-encoding" in headers or headers.get("content-length", "0").strip() != "0":
        raise _BadRequest(HTTPStatus.BAD_REQUEST, "request bodies are not accepted")
    if not _TARGET.fullmatch(target):
        raise _BadRequest(HTTPStatus.BAD_REQUEST, "request target has characters not allowed")
    if target.startswith(("http://", "https://")):
        target = "/" + target.split("/", 3)[3] if target.count("/") >= 3 else "/"
    elif not target.startswith("/"):
        raise _BadRequest(HTTPStatus.BAD_REQUEST, "request target must be a path")
    tokens = {t.strip().lower() for t in headers.get("connection", "").split(",")}
    keep_alive = "close" not in tokens if version == "HTTP/1.1" else "keep-alive" in tokens
    return Request(method, target.split("?", 1)[0], headers), keep_alive


class _Connection(asyncio.Protocol):
    """One client connection: parse requests in order, answer each, keep-alive or close."""

    def __init__(self, server: HttpServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.busy = False  # a deferred response is being computed
        self.write_paused = False  # the client is not reading what we send
        self.closing = False
        self.deadline = 0.0  # monotonic time after which the connection is idle or too slow
        self.pending = 0  # bytes not yet sent, when last looked at
        self.timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.server.connections.add(self)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        self.closing = True
        if self.timer is not None:
            self.timer.cancel()
        if exc is not None:
            log.debug("client went away: %s", exc)

    def pause_writing(self) -> None:
        self.write_paused = True
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        self.write_paused = False
        self._arm()  # the client is reading: a slow download is not an idle connection
        if self.transport is not None and not self.busy and not self.closing:
            self.transport.resume_reading()
            self._process()  # pipelined requests already read

    def data_received(self, data: bytes) -> None:
        if not self.buffer:
            self._arm()  # the first byte of a request head starts its clock
        self.buffer += data
        self._process()

    def _process(self) -> None:
        while not self.busy and not self.closing and not self.write_paused:
            while self.buffer.startswith(b"\r\n"):  # RFC 9112 2.2: ignore CRLF before a request
                del self.buffer[:2]
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(self.buffer) > MAX_HEAD_BYTES:
                    self._fail(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "request head too large")
                return
            head = bytes(self.buffer[:end])
            del self.buffer[: end + 4]
            if end > MAX_HEAD_BYTES:
                self._fail(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "request head too large")
                return
            try:
                request, keep_alive = _parse_head(head)
            except _BadRequest as exc:
                self._fail(exc.status, str(exc))
                return
            self._answer(request, keep_alive)
            self._arm()

    def _answer(self, request: Request, keep_alive: bool) -> None:
        if request.method not in _ALLOWED:
            allow = (("Allow", ", ".join(_ALLOWED)),)
            response = Response(
                HTTPStatus.METHOD_NOT_ALLOWED, b"method not allowed\n", headers=allow
            )
            self._send(request, response, keep_alive)
            return
        try:
            answer = self.server.handler(request)
        except Exception:
            log.exception("error while answering %s %s", request.method, request.path)
            answer = _INTERNAL_ERROR
        if isinstance(answer, Response):
            self._send(request, answer, keep_alive)
            return
        self.busy = True
        assert self.transport is not None
        self.transport.pause_reading()
        future = self.server.loop.run_in_executor(self.server.pool, answer)
        future.add_done_callback(lambda f: self._deferred_done(f, request, keep_alive))

    def _deferred_done(
        self, future: asyncio.Future[Response], request: Request, keep: bool
    ) -> None:
        self.busy = False
        if self.closing or future.cancelled():
            return
        exc = future.exception()
        if exc is not None:
            log.error("error while answering %s %s", request.method, request.path, exc_info=exc)
        self._send(request, _INTERNAL_ERROR if exc is not None else future.result(), keep)
        if not self.closing and not self.write_paused and self.transport is not None:
            self.transport.resume_reading()
            self._arm()
            self._process()

    def _send(self, request: Request, response: Response, keep_alive: bool) -> None:
        assert self.transport is not None
        if self.server.observer is not None:
            self.server.observer(request, response.status)
        status = response.status
        lines = [f"HTTP/1.1 {status.value} {status.phrase}", f"Date: {self.server.clock.date()}"]
        lines.append("Server: hydrator")
        if response.content_type and status != HTTPStatus.NOT_MODIFIED:
            lines.append(f"Content-Type: {response.content_type}")
        lines.extend(f"{name}: {value}" for name, value in response.headers)
        if status != HTTPStatus.NOT_MODIFIED:
            lines.append(f"Content-Length: {len(response.body)}")
        if not keep_alive:
            lines.append("Connection: close")
        elif request.headers.get("connection", "").lower() == "keep-alive":
            lines.append("Connection: keep-alive")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        if request.head or status == HTTPStatus.NOT_MODIFIED or not response.body:
            self.transport.write(head)
        else:
            self.transport.writelines((head, response.body))
        self.pending = self.transport.get_write_buffer_size()
        if not keep_alive:
            self._close()

    def _fail(self, status: HTTPStatus, message: str) -> None:
        """Answer a malformed request and close: what follows it cannot be trusted."""
        log.debug("bad request: %s", message)
        request = Request("GET", "", {})
        self._send(request, Response(status, message.encode() + b"\n"), keep_alive=False)

    def _close(self) -> None:
        self.closing = True
        if self.transport is not None:
            self.transport.close()  # after what is buffered has been written

    def _arm(self) -> None:
        self.deadline = time.monotonic() + self.server.timeout_s
        if self.timer is None:
            self.timer = self.server.loop.call_later(self.server.timeout_s, self._expire)

    def _expire(self) -> None:
        self.timer = None
        if self.closing or self.transport is None:
            return
        pending = self.transport.get_write_buffer_size()
        if 0 < pending < self.pending:  # the client reads a long answer: not idle, just slow
            self._arm()
        self.pending = pending
        left = self.deadline - time.monotonic()
        if left > 0 or self.busy:
            self.timer = self.server.loop.call_later(max(left, 1.0), self._expire)
            return
        log.debug("closing a connection idle or stalled for %.0f s", self.server.timeout_s)
        self.transport.abort()


_INTERNAL_ERROR = Response(HTTPStatus.INTERNAL_SERVER_ERROR, b"internal error\n")


def listen(host: str, port: int, backlog: int = 1024) -> socket.socket:
    """A listening TCP socket on ``host:port`` (port 0: any free one); ``OSError`` if busy.
    ``::`` listens on IPv6 and IPv4 alike (``[http] listen = "[::]:9620"``).

    The backlog absorbs a burst of new connections (a squid, a wave of glideins): a full accept
    queue drops SYNs, which clients retry after 1 s, and that shows as a 1 s tail.
    """
    if host == "::":  # every address: IPv6 and, where the system can, IPv4 on the same socket
        dualstack = socket.has_dualstack_ipv6()
        return socket.create_server(
            (host, port), family=socket.AF_INET6, backlog=backlog, dualstack_ipv6=dualstack
        )
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family, backlog=backlog)


class HttpServer:
    """Serves ``handler`` on the listening socket ``sock`` (see :func:`listen`).

    :meth:`start` runs the loop in a daemon thread; :meth:`stop` closes the listener and every
    connection, and waits for the thread.
    """

    def __init__(
        self,
        handler: Handler,
        sock: socket.socket,
        *,
        timeout_s: float = 30.0,
        deferred_workers: int = 2,
        observer: Observer | None = None,
    ) -> None:
        self.handler = handler
        self.observer = observer
        self.timeout_s = timeout_s
        self.clock = _Clock()
        self.connections: set[_Connection] = set()
        self.sock = sock
        self.address: tuple[str, int] = self.sock.getsockname()[:2]
        self.port = self.address[1]
        self.loop = asyncio.new_event_loop()
        self.pool = concurrent.futures.ThreadPoolExecutor(deferred_workers, "http-deferred")
        self._server: asyncio.base_events.Server | None = None
        self._thread = threading.Thread(target=self._run, name="http", daemon=True)
        self._started = threading.Event()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def start(self) -> None:
        self._thread.start()
        self._started.wait()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self._server = self.loop.run_until_complete(
            self.loop.create_server(lambda: _Connection(self), sock=self.sock)
        )
        self.loop.call_soon(self._started.set)
        try:
            self.loop.run_forever()
        finally:
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.loop.run_until_complete(self.loop.shutdown_default_executor())
            self.loop.close()

    def stop(self) -> None:
        """Close the listener and all connections; idempotent; safe before :meth:`start`."""
        if self._thread.is_alive():
            self.loop.call_soon_threadsafe(self._shutdown)
            self._thread.join(timeout=10)
        elif not self.loop.is_closed():
            self.loop.close()
        self.sock.close()
        self.pool.shutdown(wait=False, cancel_futures=True)  # no-op once the loop thread did it

    def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        for connection in list(self.connections):
            if connection.transport is not None:
                connection.transport.abort()
        self.loop.stop()
