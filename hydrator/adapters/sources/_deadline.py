"""A fetch's total deadline over ``requests``: what the DMAPI source (:mod:`.dmapi.client`) and the
Rucio source (:mod:`.rucio.wire`) share to end a request that per-read timeouts never end.

Per-read timeouts alone never fire on a server that sends a byte now and then (a status line,
then one header line a second), and requests offers no total timeout. So,
on requests' and urllib3's public extension points (no HTTP written here): every request of
one fetch shares its :class:`Run`, whose ``deadline`` bounds all of them together; while a
run is current in a thread (:func:`current_run`), the connections of a :class:`WatchedAdapter`
register themselves with it while they wait for an answer's headers (urllib3's connection
classes, subclassed: :class:`_WatchedHTTPConnection`), and a caller may register a connection
whose body it is reading (:meth:`Run.hold`); :meth:`Run.expire`, a timer at the deadline
(:meth:`Run.watchdog`), shuts down the socket of every registered connection, which ends the
read at once in the thread that is blocked in it. Closing the session would not: a
connection in use is not in its pool.
"""

from __future__ import annotations

import contextlib
import math
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import requests
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.response import HTTPResponse

from hydrator.adapters.sources.call_counts import CallCounts

__all__ = ["DeadlinePassed", "Run", "WatchedAdapter", "current", "current_run"]


@dataclass
class Run:
    """State shared by the requests of one fetch: its requests counted by name (``calls``),
    an abort flag and the fetch's deadline (``time.monotonic()`` seconds; infinite: none).

    Setting ``abort`` makes every pending retry wait end at once with TransientSourceError,
    so a fetch that already failed does not keep retrying in other threads. :meth:`expire`
    (called by :meth:`watchdog` at the deadline) sets it and unblocks every read still
    waiting for headers, and every read of a held connection (:meth:`hold`).
    """

    abort: threading.Event = field(default_factory=threading.Event)
    deadline: float = math.inf
    expired: bool = False
    calls: CallCounts = field(default_factory=CallCounts)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _waiting: set[HTTPConnection] = field(default_factory=set)
    _held: list[HTTPConnection] = field(default_factory=list)

    def left_s(self) -> float:
        """Seconds until the deadline (negative once passed)."""
        return self.deadline - time.monotonic()

    def passed(self) -> bool:
        """The deadline passed (or :meth:`expire` ran)."""
        return self.expired or self.left_s() <= 0

    @contextmanager
    def watchdog(self) -> Iterator[None]:
        """Within the block, :meth:`expire` runs at the deadline (in a timer thread)."""
        if math.isinf(self.deadline):
            yield
            return
        timer = threading.Timer(max(0.0, self.left_s()), self.expire)
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:
            timer.cancel()

    def expire(self) -> None:
        """The deadline passed: abort, and shut down the socket of every connection waiting
        for its answer's headers, which ends the blocked read with an error at once."""
        with self._lock:
            self.expired = True
            waiting = list(self._waiting)
        self.abort.set()
        for conn in waiting:
            sock = conn.sock
            if sock is not None:
                with contextlib.suppress(OSError):  # closed meanwhile
                    sock.shutdown(socket.SHUT_RDWR)

    def waiting(self, conn: HTTPConnection, waits: bool) -> None:
        with self._lock:
            if waits:
                self._waiting.add(conn)
            else:
                self._waiting.discard(conn)
        if waits and self.expired:
            self.expire()

    def hold(self, conn: HTTPConnection) -> None:
        """Watch ``conn`` (whose body the caller reads) until :meth:`let_go`."""
        with self._lock:
            self._held.append(conn)
        self.waiting(conn, True)

    def let_go(self) -> None:
        """Stop watching the connections :meth:`hold` registered."""
        with self._lock:
            held, self._held = self._held, []
        for conn in held:
            self.waiting(conn, False)


class DeadlinePassed(requests.RequestException):
    """The fetch's deadline passed while this request was under way."""


_current = threading.local()  # .run: the Run of the request this thread is sending


@contextmanager
def current_run(run: Run) -> Iterator[None]:
    """Within the block, ``run`` is the run of the requests this thread sends."""
    previous = current()
    _current.run = run
    try:
        yield
    finally:
        _current.run = previous


def current() -> Run | None:
    """The run current in this thread (:func:`current_run`), if any."""
    run: Run | None = getattr(_current, "run", None)
    return run


def _watched(conn: HTTPConnection, getresponse: Callable[[], HTTPResponse]) -> HTTPResponse:
    """``getresponse()`` (status line and headers) with ``conn`` registered with the
    :class:`Run` current in this thread, if any, so that :meth:`Run.expire` can shut its
    socket down (see the module docstring)."""
    run = current()
    if run is None:
        return getresponse()
    run.waiting(conn, True)
    try:
        return getresponse()
    finally:
        run.waiting(conn, False)


class _WatchedHTTPConnection(HTTPConnection):
    def getresponse(self) -> HTTPResponse:  # type: ignore[override]  # as urllib3 itself
        return _watched(self, super().getresponse)


class _WatchedHTTPSConnection(HTTPSConnection):
    def getresponse(self) -> HTTPResponse:  # type: ignore[override]  # as urllib3 itself
        return _watched(self, super().getresponse)


class _WatchedHTTPPool(HTTPConnectionPool):
    ConnectionCls = _WatchedHTTPConnection


class _WatchedHTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _WatchedHTTPSConnection


class WatchedAdapter(HTTPAdapter):
    """requests' transport adapter with urllib3 pools of watched connections (see the module
    docstring) and no retries of its own."""

    def __init__(self, pool_maxsize: int = 8) -> None:
        super().__init__(pool_connections=4, pool_maxsize=pool_maxsize, max_retries=0)

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        # urllib3: "Locally set the pool classes ... so other PoolManagers can override them"
        self.poolmanager.pool_classes_by_scheme = {
            "http": _WatchedHTTPPool,
            "https": _WatchedHTTPSPool,
        }
