"""Child processes of the tests: started so they die with the test process, stopped politely."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol


def die_with_parent() -> list[str]:
    """A command prefix that sends the command SIGTERM when the test process dies (even by
    SIGKILL), so a killed pytest leaves no server behind (``setpriv --pdeathsig``, util-linux;
    empty without it)."""
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "TERM"] if setpriv else []


def stop(proc: subprocess.Popen[bytes], timeout_s: float = 20.0) -> int:
    """SIGTERM unless it has exited, then SIGKILL after ``timeout_s`` seconds; its exit code."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def stop_group(proc: subprocess.Popen[bytes], timeout_s: float = 20.0) -> None:
    """Stop a server started with ``start_new_session=True`` and everything in its process
    group: SIGTERM, then SIGKILL after ``timeout_s`` seconds; children that outlived the
    leader (none expected) go with the group at the end. Quiet when it has already exited."""
    if proc.poll() is not None:
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=timeout_s)
            break
        except subprocess.TimeoutExpired:
            continue
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


class Server(Protocol):
    """A test server that a developer may also run by hand (Rucio, ActiveMQ)."""

    process: subprocess.Popen[bytes] | None

    def setup(self) -> None: ...
    def start(self) -> None: ...
    def stop(self) -> None: ...


def serve_in_foreground(server: Server, directory: Path, banner: Callable[[], str]) -> int:
    """Set up and start ``server``, print ``banner()``, and wait until it exits (1) or the
    user interrupts (0); then stop it and remove ``directory``. SIGTERM (e.g. from
    ``timeout``) runs that cleanup too, or the server would be orphaned."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        server.setup()
        server.start()
        print(f"{banner()}\nCtrl-C stops it.", flush=True)
        while server.process is not None and server.process.poll() is None:
            time.sleep(1)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        server.stop()
        shutil.rmtree(directory, ignore_errors=True)
