"""Child processes of the tests: started so they die with the test process, stopped politely."""

from __future__ import annotations

import shutil
import subprocess


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
