"""What the benchmarks and the tests share to drive servers of their own on this machine:
the cache of the test pool's binaries (:data:`TEST_CACHE`), a free port (:func:`free_port`)
and the one way to wait for a server's effect (:func:`wait_for`). It lives beside the
benchmarks, not in ``tests/``, so that a benchmark does not import the tests; the tests take
them through ``tests/support/ports.py`` and ``tests/support/wait.py``.

:func:`wait_for`'s contract: call ``probe()`` every ``interval_s`` seconds until
``done(value)`` is truthy (by default the value itself) and return that value; once
``timeout_s`` seconds (monotonic) have passed without it, raise ``AssertionError`` naming
``what`` and the last value seen. Exceptions of the types in ``ignore`` (e.g. a server not
listening yet) count as a value that is not done; any other exception propagates at once.
The probe runs at least once, also with ``timeout_s = 0``.

Tests poll because most effects are not acknowledged: e.g. the collector may answer a query (in
a forked worker) before it has read every ad of the connection a publish just closed, so what a
publish sent is visible a moment later, not at once.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

TEST_CACHE = Path(os.environ.get("HYDRATOR_TEST_CACHE", "/var/cache/hydrator-test"))
"""Where the test suite keeps what it builds once (the pool's chroot, images, schemas):
``$HYDRATOR_TEST_CACHE``, by default ``/var/cache/hydrator-test``."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the kernel's choice for port 0).

    Another process may take it before the caller binds it; servers started on it are checked
    for readiness by the caller, so a race shows as a clear start-up failure."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for(
    what: str,
    probe: Callable[[], T],
    *,
    timeout_s: float,
    done: Callable[[T], object] = bool,
    ignore: tuple[type[BaseException], ...] = (),
    interval_s: float = 0.25,
) -> T:
    """The first value of ``probe()`` that is ``done``; AssertionError naming ``what`` and the
    last value (or ignored exception) after ``timeout_s`` seconds (the contract above)."""
    deadline = time.monotonic() + timeout_s
    last: object = "(not called)"
    while True:
        try:
            value = probe()
        except ignore as exc:
            last = exc
        else:
            if done(value):
                return value
            last = value
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what}: not within {timeout_s}s; last value: {last!r}")
        time.sleep(interval_s)
