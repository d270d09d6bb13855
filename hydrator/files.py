"""Reading a file the daemon was told to read: only a regular file, only up to a size cap.

Every file named in the configuration (the configuration itself, static inventories, ``*_file``
secrets) goes through :func:`open_regular` and :func:`read_capped`, because what sits at a
configured path is not always a file: a FIFO blocks ``open`` until someone writes (and then
SIGTERM waits for it), ``/dev/zero`` never ends and grows memory by gigabytes in seconds, a
200 MB file takes gigabytes once parsed.

The file is opened with ``O_NONBLOCK`` (so that opening a FIFO returns at once) and judged by
``fstat`` on that very descriptor (no window between a check and the open); symlinks are
followed, as Kubernetes ConfigMap and Secret mounts are symlinks. Errors are
:class:`FileRefused`, whose message says what is wrong without the file's content; callers
name the key.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO

from hydrator.errors import FileRefused

__all__ = ["FileRefused", "open_regular", "read_at_most", "read_capped"]

_KINDS = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISSOCK, "a socket"),
)


CHUNK_BYTES = 1024 * 1024


def kind_of(mode: int) -> str:
    """``a FIFO``, ``a character device``, ... for a mode that is not a regular file's."""
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def open_regular(path: Path) -> BinaryIO:
    """``path`` opened for reading in binary mode, if it is a regular file; else FileRefused.

    Never blocks: a FIFO is opened non-blocking and refused by its ``fstat``.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise FileRefused("no such file", missing=True) from None
    except OSError as exc:
        raise FileRefused(f"cannot read: {exc.strerror}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise FileRefused(f"not a regular file ({kind_of(mode)})")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_at_most(handle: BinaryIO, max_bytes: int) -> bytes:
    """The rest of ``handle``, or FileRefused when it holds more than ``max_bytes`` bytes
    (at most ``max_bytes + 1`` bytes are read, whatever the file's size says)."""
    chunks: list[bytes] = []
    size = 0
    try:
        while chunk := handle.read(min(CHUNK_BYTES, max_bytes + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
            if size > max_bytes:
                raise FileRefused(f"larger than the limit of {max_bytes} bytes")
    except OSError as exc:
        raise FileRefused(f"cannot read: {exc.strerror}") from None
    return b"".join(chunks)


def read_capped(path: Path, max_bytes: int) -> bytes:
    """The bytes of the regular file ``path``, at most ``max_bytes`` of them (FileRefused)."""
    with open_regular(path) as handle:
        return read_at_most(handle, max_bytes)
