"""A real squid (Debian's package, installed by ``scripts/squid``) as a forward proxy on loopback.

:func:`running_squid` starts a private instance on 127.0.0.1 and a free port, memory cache only,
logging into its own directory, and stops it when the context exits (also after a failure). The
configuration is the one docs/platform.md describes ("The test parts"), plus what a site running
glidein hooks would set (``collapsed_forwarding``, see docs/http.md).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.support.ports import free_port
from tests.support.process import stop
from tests.support.wait import wait_for

REPO = Path(__file__).resolve().parents[2]

CONFIG = """\
http_port 127.0.0.1:{port}
http_access allow localhost
http_access deny all
cache_mem 16 MB
collapsed_forwarding on
pid_filename {dir}/squid.pid
access_log stdio:{dir}/access.log
cache_log {dir}/cache.log
cache_store_log none
coredump_dir {dir}
refresh_pattern . 0 20% 4320
shutdown_lifetime 1 second
visible_hostname localhost
icp_port 0
htcp_port 0
pinger_enable off
netdb_filename none
"""


def squid_binary() -> str:
    """The squid binary, installed with ``scripts/squid`` (apt-get) if missing."""
    subprocess.run([str(REPO / "scripts" / "squid")], check=True)  # quick when installed
    return shutil.which("squid") or "/usr/sbin/squid"  # sbin is not on every PATH


@dataclass(frozen=True)
class Squid:
    port: int
    directory: Path

    @property
    def proxy(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> list[list[str]]:
        """The access log so far, one list of fields per request (native format: time,
        elapsed, client, code/status, bytes, method, URL, user, hierarchy/peer, type)."""
        path = self.directory / "access.log"
        return [line.split() for line in path.read_text().splitlines()] if path.exists() else []

    def codes(self) -> list[str]:
        """The ``code/status`` field of every request, e.g. ``TCP_REFRESH_UNMODIFIED/304``."""
        return [fields[3] for fields in self.log() if len(fields) > 3]


@contextlib.contextmanager
def running_squid() -> Iterator[Squid]:
    """A private squid on 127.0.0.1; stopped (SIGTERM, then SIGKILL) when the context exits."""
    binary = squid_binary()
    # Not under pytest's tmp_path: squid drops to the `proxy` user, which cannot enter it.
    directory = Path(tempfile.mkdtemp(prefix="hydrator-squid-"))
    directory.chmod(0o755)
    if os.geteuid() == 0:
        entry = pwd.getpwnam("proxy")
        os.chown(directory, entry.pw_uid, entry.pw_gid)
    port = free_port()
    conf = directory / "squid.conf"
    conf.write_text(CONFIG.format(port=port, dir=directory))
    proc = subprocess.Popen(
        [binary, "-N", "-f", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        squid = Squid(port, directory)
        _wait_listening(squid, proc)
        yield squid
    finally:
        stop(proc)
        shutil.rmtree(directory, ignore_errors=True)


def _wait_listening(squid: Squid, proc: subprocess.Popen[bytes], timeout_s: float = 20) -> None:
    """Until squid accepts a connection on its port; RuntimeError with its log's tail if it
    exits first, AssertionError after ``timeout_s`` seconds."""

    def listening() -> bool:
        if proc.poll() is not None:
            log = squid.directory / "cache.log"
            tail = log.read_text()[-2000:] if log.exists() else ""
            raise RuntimeError(f"squid exited with status {proc.returncode}:\n{tail}")
        with socket.create_connection(("127.0.0.1", squid.port), 1):
            return True

    what = f"squid listening on 127.0.0.1:{squid.port}"
    wait_for(what, listening, timeout_s=timeout_s, ignore=(OSError,), interval_s=0.1)
