"""The one way tests pick a port: :func:`free_port`."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the kernel's choice for port 0).

    Another process may take it before the caller binds it; servers started on it are checked
    for readiness by the caller, so a race shows as a clear start-up failure."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
