"""A forwarding HTTP proxy on 127.0.0.1 (a free port) in front of a real server, which can
replace one line of the answers to one path by a line that is not JSON: a catalogue behind a
broken gateway, or an answer altered on its way. Everything else is passed on as it came
(status, headers, body; the body read whole by ``requests`` and sent with its length).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import requests

BROKEN_LINE = b'{"scope": "$(HOME)", "name": '  # cut short: not JSON, and holding a "$"
_NOT_PASSED = {"connection", "content-encoding", "content-length", "keep-alive",
               "transfer-encoding", "host"}  # fmt: skip


class _Forward(BaseHTTPRequestHandler):
    server: CorruptingProxy

    def _forward(self) -> None:
        proxy = self.server
        length = int(self.headers.get("Content-Length") or 0)
        answer = requests.request(
            self.command,
            proxy.upstream + self.path,
            headers={k: v for k, v in self.headers.items() if k.lower() not in _NOT_PASSED},
            data=self.rfile.read(length) if length else None,
            timeout=30,
        )
        body = proxy.altered(self.path, answer.content)
        self.send_response(answer.status_code)
        for key, value in answer.headers.items():
            if key.lower() not in _NOT_PASSED:
                self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_DELETE = _forward

    def log_message(self, format: str, *args: object) -> None:
        pass  # quiet: pytest shows the test's own output


class CorruptingProxy(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, upstream: str) -> None:
        super().__init__(("127.0.0.1", 0), _Forward)
        self.upstream = upstream.rstrip("/")
        self._lock = threading.Lock()
        self._broken: dict[str, int] = {}  # path (without the query) -> 1-based line number
        self.altered_answers = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def break_line(self, path: str, number: int) -> None:
        """From now on, line ``number`` of each answer to ``path`` is :data:`BROKEN_LINE`."""
        with self._lock:
            self._broken[path] = number

    def mend(self) -> None:
        """Pass every answer on unchanged again."""
        with self._lock:
            self._broken.clear()

    def altered(self, path: str, body: bytes) -> bytes:
        with self._lock:
            number = self._broken.get(path.partition("?")[0])
            if number is None:
                return body
            lines = body.split(b"\n")
            if len(lines) <= number:
                return body
            lines[number - 1] = BROKEN_LINE
            self.altered_answers += 1
            return b"\n".join(lines)


@contextmanager
def corrupting_proxy(upstream: str) -> Iterator[CorruptingProxy]:
    """A running :class:`CorruptingProxy` in front of ``upstream``, stopped on exit."""
    proxy = CorruptingProxy(upstream)
    thread = threading.Thread(target=proxy.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield proxy
    finally:
        proxy.shutdown()
        proxy.server_close()
        thread.join(timeout=10)
