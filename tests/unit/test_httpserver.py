"""The asyncio HTTP/1.1 server on a real socket, spoken to byte by byte as squids and hooks do."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from http import HTTPStatus

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hydrator.httpserver import (
    Deferred,
    HttpServer,
    Request,
    Response,
    _BadRequest,
    _parse_head,
    listen,
)

BIG = b"x" * (1 << 20)


def handler(request: Request) -> Response | Deferred:
    """``/fast``: from memory; ``/slow``: deferred 0.2 s; ``/big``: 1 MiB; ``/boom``: a bug."""
    if request.path == "/fast":
        return Response(
            HTTPStatus.OK,
            b"fast\n",
            headers=(("X-Seen-Accept", request.headers.get("accept", "")),),
        )
    if request.path == "/slow":
        return lambda: (time.sleep(0.2), Response(HTTPStatus.OK, b"slow\n"))[1]
    if request.path == "/big":
        return Response(HTTPStatus.OK, BIG)
    if request.path == "/boom":
        raise ValueError("a bug in a handler")
    if request.path == "/slow-boom":
        return lambda: 1 / 0  # type: ignore[return-value,operator]
    return Response(HTTPStatus.NOT_FOUND, b"not found\n")


@pytest.fixture
def server() -> Iterator[HttpServer]:
    http = HttpServer(handler, listen("127.0.0.1", 0), timeout_s=1.0)
    http.start()
    yield http
    http.stop()


def connect(server: HttpServer) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=5)


class Reader:
    """Reads responses off a socket: status, headers (lower-case names), body by Content-Length."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""

    def _fill(self) -> bool:
        data = self.sock.recv(1 << 16)
        self.buffer += data
        return bool(data)

    def response(self, head: bool = False) -> tuple[int, dict[str, str], bytes]:
        while b"\r\n\r\n" not in self.buffer:
            if not self._fill():
                raise EOFError("connection closed before a response")
        raw, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        lines = raw.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ")[1])
        headers = {k.lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
        size = 0 if head or status == 304 else int(headers.get("content-length", "0"))
        while len(self.buffer) < size:
            if not self._fill():
                raise EOFError("connection closed inside a body")
        body, self.buffer = self.buffer[:size], self.buffer[size:]
        return status, headers, body

    def closed(self) -> bool:
        """True if the server closes the connection (within the socket timeout)."""
        try:
            return not self._fill() and not self.buffer
        except ConnectionResetError:
            return True


def get(path: str, *extra: str, method: str = "GET", version: str = "HTTP/1.1") -> bytes:
    return "\r\n".join([f"{method} {path} {version}", "Host: t", *extra, "", ""]).encode()


def test_keep_alive_serves_many_requests_on_one_connection(server: HttpServer) -> None:
    with connect(server) as sock:
        reader = Reader(sock)
        for _ in range(3):
            sock.sendall(get("/fast", "Accept: text/plain"))
            status, headers, body = reader.response()
            assert (status, body) == (200, b"fast\n")
            assert headers["content-length"] == "5" and "connection" not in headers
            assert headers["date"].endswith(" GMT") and headers["x-seen-accept"] == "text/plain"
        sock.sendall(get("/fast", "Connection: close"))
        status, headers, _ = reader.response()
        assert headers["connection"] == "close" and reader.closed()


def test_http_1_0_closes_unless_it_asks_for_keep_alive(server: HttpServer) -> None:
    with connect(server) as sock:
        reader = Reader(sock)
        sock.sendall(get("/fast", "Connection: keep-alive", version="HTTP/1.0"))
        assert reader.response()[1]["connection"] == "keep-alive"
        sock.sendall(get("/fast", version="HTTP/1.0"))
        assert reader.response()[1]["connection"] == "close" and reader.closed()


def test_empty_lines_before_a_request_are_ignored(server: HttpServer) -> None:
    with connect(server) as sock:
        reader = Reader(sock)
        sock.sendall(get("/fast") + b"\r\n" + get("/fast"))  # as some clients send after a body
        assert [reader.response()[0] for _ in range(2)] == [200, 200]


def test_pipelined_requests_are_answered_in_order_around_a_deferred_one(
    server: HttpServer,
) -> None:
    with connect(server) as sock:
        reader = Reader(sock)
        sock.sendall(get("/fast") + get("/slow") + get("/fast") + get("/nope"))
        bodies = [reader.response()[2] for _ in range(4)]
        assert bodies == [b"fast\n", b"slow\n", b"fast\n", b"not found\n"]


def test_a_deferred_answer_does_not_hold_up_other_connections(server: HttpServer) -> None:
    with connect(server) as slow, connect(server) as fast:
        slow.sendall(get("/slow"))
        t0 = time.monotonic()
        fast.sendall(get("/fast"))
        assert Reader(fast).response()[2] == b"fast\n"
        assert time.monotonic() - t0 < 0.15  # did not wait for the 0.2 s deferred answer
        assert Reader(slow).response()[2] == b"slow\n"


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b"GARBAGE\r\n\r\n", 400),
        (b"GET /fast HTTP/2.0\r\n\r\n", 505),
        (b"GET /fast HTTP/1.1\r\nNoColonHere\r\n\r\n", 400),
        (b"GET /fast HTTP/1.1\r\n folded: header\r\n\r\n", 400),
        (b"GET fast HTTP/1.1\r\n\r\n", 400),
        (b"GET /fa\nst HTTP/1.1\r\n\r\n", 400),
        (b"GET /fa\x00st HTTP/1.1\r\n\r\n", 400),
        ("GET /f\u00e4st HTTP/1.1\r\n\r\n".encode(), 400),
        (b"GET /fast HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello", 400),
        (b"GET /fast HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400),
        (b"GET /fast HTTP/1.1\r\nX-Pad: " + b"a" * 20_000 + b"\r\n\r\n", 431),
        (b"GET /fast HTTP/1.1\r\nX-Pad: " + b"a" * 20_000, 431),  # no end in sight
    ],
)
def test_malformed_requests_get_a_status_and_the_connection_closes(
    server: HttpServer, raw: bytes, status: int
) -> None:
    with connect(server) as sock:
        reader = Reader(sock)
        sock.sendall(raw)
        got, headers, body = reader.response()
        assert got == status and headers["connection"] == "close"
        assert body.endswith(b"\n") and body.count(b"\n") == 1  # one line saying what is wrong
        assert reader.closed()
    with connect(server) as sock:  # and the server goes on serving
        sock.sendall(get("/fast"))
        assert Reader(sock).response()[0] == 200


def test_other_methods_get_405_and_the_connection_stays_open(server: HttpServer) -> None:
    with connect(server) as sock:
        reader = Reader(sock)
        sock.sendall(get("/fast", "Content-Length: 0", method="POST"))
        status, headers, _ = reader.response()
        assert status == 405 and headers["allow"] == "GET, HEAD"
        sock.sendall(get("/fast"))
        assert reader.response()[0] == 200


def test_head_sends_the_length_but_no_body_and_absolute_targets_and_queries_work(
    server: HttpServer,
) -> None:
    with connect(server) as sock:
        reader = Reader(sock)
        sock.sendall(get("/big", method="HEAD") + get("http://t:9620/fast?x=1"))
        status, headers, body = reader.response(head=True)
        assert (status, headers["content-length"], body) == (200, str(len(BIG)), b"")
        assert reader.response()[2] == b"fast\n"  # the next response, not 1 MiB of x


def test_idle_and_slowly_sent_requests_are_cut_off_after_the_timeout(server: HttpServer) -> None:
    with connect(server) as idle:
        t0 = time.monotonic()
        assert Reader(idle).closed()
        assert 0.9 < time.monotonic() - t0 < 3.0
    with connect(server) as slowloris:
        t0 = time.monotonic()
        with pytest.raises(OSError):  # reset or broken pipe once the server gave up
            for byte in get("/fast"):
                slowloris.sendall(bytes([byte]))
                time.sleep(0.1)  # a byte every 0.1 s never finishes a head within 1 s
        assert time.monotonic() - t0 < 3.0


def test_bugs_answer_500_are_logged_and_hang_ups_are_not_errors(
    server: HttpServer, caplog: pytest.LogCaptureFixture
) -> None:
    with connect(server) as sock:
        reader = Reader(sock)
        sock.sendall(get("/boom") + get("/slow-boom") + get("/fast"))
        assert [reader.response()[0] for _ in range(3)] == [500, 500, 200]
    for _ in range(3):  # clients that hang up mid-answer or with a reset
        with connect(server) as sock:
            sock.sendall(get("/slow") + get("/big"))
            sock.setsockopt(
                socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00"
            )
    time.sleep(0.4)
    errors = [r for r in caplog.records if r.levelname == "ERROR"]
    assert [r.exc_info[0] for r in errors if r.exc_info] == [ValueError, ZeroDivisionError]
    with connect(server) as sock:
        sock.sendall(get("/fast"))
        assert Reader(sock).response()[0] == 200


def test_a_client_that_does_not_read_is_not_buffered_without_bound(server: HttpServer) -> None:
    with connect(server) as sock:
        sock.sendall(get("/big") * 100)  # 100 MiB of answers asked for, none read yet
        time.sleep(0.5)
        (connection,) = server.connections
        assert connection.transport is not None
        assert connection.transport.get_write_buffer_size() < 4 * len(BIG)
        reader = Reader(sock)
        assert all(reader.response()[2] == BIG for _ in range(100))


def test_stop_closes_open_connections_and_frees_the_port() -> None:
    http = HttpServer(handler, listen("127.0.0.1", 0))
    http.start()
    port = http.port
    with connect(http) as sock:
        reader = Reader(sock)
        sock.sendall(get("/fast"))
        assert reader.response()[0] == 200
        done = threading.Event()
        threading.Thread(target=lambda: (http.stop(), done.set()), daemon=True).start()
        assert done.wait(5) and reader.closed()
    http.stop()  # twice is fine
    again = HttpServer(handler, listen("127.0.0.1", port))
    again.stop()  # never started: also fine
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1)


def test_a_busy_port_fails_when_listening() -> None:
    with listen("127.0.0.1", 0) as sock, pytest.raises(OSError):
        listen("127.0.0.1", sock.getsockname()[1])


REQUEST_PIECES = st.sampled_from(
    [b"GET", b"HEAD", b"POST", b" ", b"/", b"/fast", b"http://h/", b"?q", b"HTTP/1.1", b"HTTP/1.0",
     b"\r\n", b"\n", b":", b"Connection", b"close", b"keep-alive", b"Content-Length", b"0", b"5",
     b"Transfer-Encoding", b"\x00", b"\xff", b"\t", b"%2F", b"x" * 100]
)  # fmt: skip
HEADS = st.one_of(st.binary(max_size=300), st.lists(REQUEST_PIECES, max_size=30).map(b"".join))


@given(HEADS)
@settings(max_examples=2000, deadline=None)
def test_any_request_head_parses_to_a_clean_request_or_a_bad_request_error(head: bytes) -> None:
    try:
        request, _ = _parse_head(head)
    except _BadRequest as exc:
        assert exc.status in (400, 505) and "\n" not in str(exc)
        return
    assert request.method and request.path.startswith("/")
    assert all(0x21 <= ord(c) <= 0x7E for c in request.path)


@given(st.lists(HEADS, min_size=1, max_size=3))
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_whatever_a_client_sends_the_server_answers_or_closes_and_keeps_serving(
    server: HttpServer, caplog: pytest.LogCaptureFixture, heads: list[bytes]
) -> None:
    with connect(server) as sock:
        sock.settimeout(2)
        with contextlib.suppress(OSError):
            sock.sendall(b"\r\n\r\n".join(heads) + b"\r\n\r\n")
            sock.shutdown(socket.SHUT_WR)
            data = b""
            while chunk := sock.recv(1 << 16):
                data += chunk
            assert not data or data.startswith(b"HTTP/1.1 ")
    with connect(server) as sock:
        sock.sendall(get("/fast"))
        assert Reader(sock).response()[0] == 200
    assert not [r for r in caplog.records if r.levelname == "ERROR"]


@contextlib.contextmanager
def big_answer_over_small_buffers() -> Iterator[tuple[HttpServer, socket.socket]]:
    """A server (1 s timeout) and a client that asked for /big, both with 4 KiB socket buffers,
    so the answer stays in the server's own buffer until the client reads it."""
    listener = listen("127.0.0.1", 0)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)  # inherited by connections
    http = HttpServer(handler, listener, timeout_s=1.0)
    http.start()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(5)
    try:
        sock.connect(("127.0.0.1", http.port))
        sock.sendall(get("/big"))
        yield http, sock
    finally:
        sock.close()
        http.stop()


def test_a_slow_download_is_not_cut_off_as_idle() -> None:
    with big_answer_over_small_buffers() as (_, sock):
        received, t0 = b"", time.monotonic()
        while len(received) < len(BIG) + 100:
            chunk = sock.recv(4096)
            if not chunk:
                break
            received += chunk
            time.sleep(0.012)  # over 3 s for 1 MiB: several times the 1 s timeout
        assert received.endswith(BIG), f"cut off after {len(received)} bytes"
        assert time.monotonic() - t0 > 3


def test_a_client_that_stops_reading_mid_answer_is_cut_off() -> None:
    with big_answer_over_small_buffers() as (http, sock):
        sock.recv(4096)
        time.sleep(3.5)  # stalled: nothing read for several timeouts
        assert not http.connections  # the server gave up and freed the connection


def test_listening_on_every_ipv6_address_also_takes_ipv4() -> None:
    with listen("::", 0) as sock:
        port = sock.getsockname()[1]
        for address in ("::1", "127.0.0.1"):
            socket.create_connection((address, port), timeout=2).close()
