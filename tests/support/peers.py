"""Hostile STOMP peers for the listener's fault tests: plain sockets on 127.0.0.1 and a free
port, each connection served by a thread of its own.

* ``silent``: accepts TCP and never says a word (a load balancer in front of a dead broker).
* ``endless``: answers CONNECT with CONNECTED and SUBSCRIBE with nothing, then streams the start
  of a MESSAGE frame that never ends (no NUL), up to ``stream_bytes``.

:attr:`Peer.accepted` and :attr:`Peer.closed` count connections accepted and closed by the
client; :attr:`Peer.sent` the bytes streamed. :meth:`Peer.close` ends every thread.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Iterator

from tests.support.ports import free_port

CONNECTED = b"CONNECTED\nversion:1.2\nheart-beat:0,0\n\n\x00"
MESSAGE_START = b"MESSAGE\nsubscription:1\nmessage-id:1\nack:1\ndestination:/topic/x\n\n"


class Peer:
    def __init__(self, mode: str, stream_bytes: int = 0) -> None:
        self.mode, self.stream_bytes = mode, stream_bytes
        self.port = free_port()
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
                self._conns.append(conn)
            self._start(self._serve, conn)

    def _serve(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError):
            if self.mode == "endless":
                self._read_frame(conn)  # CONNECT
                conn.sendall(CONNECTED)
                self._read_frame(conn)  # SUBSCRIBE
                self._stream(conn)
            while conn.recv(65536):  # until the client closes
                pass
        with self._lock:
            self.closed += 1

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
def running_peer(mode: str, stream_bytes: int = 0) -> Iterator[Peer]:
    peer = Peer(mode, stream_bytes)
    try:
        yield peer
    finally:
        peer.close()
