"""Hostile STOMP peers for the listener's fault tests: plain sockets on 127.0.0.1 and a free
port, each connection served by a thread of its own.

* ``silent``: accepts TCP and never says a word (a load balancer in front of a dead broker).
* ``endless``: answers CONNECT with CONNECTED and SUBSCRIBE with nothing, then streams the start
  of a MESSAGE frame that never ends (no NUL), up to ``stream_bytes``.
* ``cutting``: passes every byte on to a real broker (``upstream``, a port on 127.0.0.1) and
  back, and cuts each connection ``cut_after_s`` after accepting it (a proxy or load balancer
  that drops connections soon after the broker granted the subscription).
  :attr:`Peer.accepted_at` holds when each was accepted, :attr:`Peer.cut_at` when each was cut.

:attr:`Peer.accepted` and :attr:`Peer.closed` count connections accepted and closed by the
client; :attr:`Peer.sent` the bytes streamed. :meth:`Peer.close` ends every thread.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator

from tests.support.ports import free_port

CONNECTED = b"CONNECTED\nversion:1.2\nheart-beat:0,0\n\n\x00"
MESSAGE_START = b"MESSAGE\nsubscription:1\nmessage-id:1\nack:1\ndestination:/topic/x\n\n"


class Peer:
    def __init__(
        self, mode: str, stream_bytes: int = 0, upstream: int = 0, cut_after_s: float = 0.0
    ) -> None:
        self.mode, self.stream_bytes = mode, stream_bytes
        self.upstream, self.cut_after_s = upstream, cut_after_s
        self.port = free_port()
        self.accepted_at: list[float] = []
        self.cut_at: list[float] = []
        self.accepted = 0
        self.closed = 0
        self.sent = 0
        self._lock = threading.Lock()
        self._server = socket.create_server(("127.0.0.1", self.port))
        self._conns: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._done = threading.Event()
        self._start(self._accept)

    @property
    def broker(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _start(self, target: Callable[..., object], *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _accept(self) -> None:
        while not self._done.is_set():
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            with self._lock:
                self.accepted += 1
                self.accepted_at.append(time.monotonic())
                self._conns.append(conn)
            self._start(self._serve, conn)

    def _serve(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError):
            if self.mode == "cutting":
                self._forward(conn)
            if self.mode == "endless":
                self._read_frame(conn)  # CONNECT
                conn.sendall(CONNECTED)
                self._read_frame(conn)  # SUBSCRIBE
                self._stream(conn)
            while conn.recv(65536):  # until the client closes
                pass
        with self._lock:
            self.closed += 1

    def openings_and_cuts(self) -> tuple[list[float], list[float]]:
        """Copies of :attr:`accepted_at` and :attr:`cut_at` (monotonic seconds)."""
        with self._lock:
            return list(self.accepted_at), list(self.cut_at)

    def _forward(self, conn: socket.socket) -> None:
        """Both ways to the upstream broker until ``cut_after_s`` has passed, then cut both."""
        broker = socket.create_connection(("127.0.0.1", self.upstream), timeout=10)
        with self._lock:
            self._conns.append(broker)
        self._start(self._pump, broker, conn)
        self._start(self._pump, conn, broker)
        self._done.wait(self.cut_after_s)
        with self._lock:
            self.cut_at.append(time.monotonic())
        for end in (conn, broker):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)

    def _read_frame(self, conn: socket.socket) -> None:
        data = b""
        while b"\x00" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                raise OSError("closed")
            data += chunk

    def _stream(self, conn: socket.socket) -> None:
        conn.sendall(MESSAGE_START)
        block = b"x" * 65536
        while self.sent < self.stream_bytes and not self._done.is_set():
            conn.sendall(block)
            self.sent += len(block)

    def close(self) -> None:
        self._done.set()
        with contextlib.suppress(OSError):
            self._server.shutdown(socket.SHUT_RDWR)  # wakes accept(); close() alone does not
        self._server.close()
        with self._lock:
            for conn in self._conns:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
                conn.close()
        for thread in self._threads:
            thread.join(10)


@contextlib.contextmanager
def running_peer(
    mode: str, stream_bytes: int = 0, upstream: int = 0, cut_after_s: float = 0.0
) -> Iterator[Peer]:
    peer = Peer(mode, stream_bytes, upstream, cut_after_s)
    try:
        yield peer
    finally:
        peer.close()
