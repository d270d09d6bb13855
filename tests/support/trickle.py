"""A server that never finishes an answer: for whatever it is asked, it sends a status line and
then one header line every ``interval_s``, for ever (per-read timeouts never
fire on it). Stands in for a catalogue behind a broken proxy; no HTTP is parsed beyond the end
of the request's headers. Listens on 127.0.0.1, on a free port.
"""

from __future__ import annotations

import socketserver
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class _Trickle(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        server = self.server
        assert isinstance(server, TrickleServer)
        self.request.settimeout(10)
        seen = b""
        try:
            while b"\r\n\r\n" not in seen and len(seen) < 65536:
                chunk = self.request.recv(4096)
                if not chunk:
                    return
                seen += chunk
            server.count("requests")
            self.request.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n")
            n = 0
            while not server.stopping.wait(server.interval_s):
                n += 1
                self.request.sendall(f"X-Trickle-{n}: 1\r\n".encode())
        except OSError:
            server.count("hung_up")


class TrickleServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, interval_s: float = 0.5) -> None:
        super().__init__(("127.0.0.1", 0), _Trickle)
        self.interval_s = interval_s
        self.stopping = threading.Event()
        self.counts = {"requests": 0, "hung_up": 0}
        self._lock = threading.Lock()

    def count(self, what: str) -> None:
        with self._lock:
            self.counts[what] += 1

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


@contextmanager
def trickling(interval_s: float = 0.5) -> Iterator[TrickleServer]:
    """A running :class:`TrickleServer`, stopped (and its trickles ended) on exit."""
    server = TrickleServer(interval_s)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.stopping.set()
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
