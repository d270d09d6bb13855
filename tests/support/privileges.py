"""Run a command as root would be refused: without the capabilities that bypass file modes.

The suite usually runs as root (containers, CI), and root reads and writes any file whatever
its mode. ``setpriv`` (util-linux) drops CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH for the child,
so a ``chmod 000`` file or a ``chmod 555`` directory behave as they do for the daemon's user.
"""

from __future__ import annotations

import os
import shutil


def file_modes_enforced(command: list[str]) -> list[str]:
    """``command``, prefixed so that file permissions apply to it even when run as root."""
    if os.geteuid() != 0:
        return command
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        raise RuntimeError("running as root needs setpriv (util-linux) to test file permissions")
    caps = "-dac_override,-dac_read_search"
    return [setpriv, f"--bounding-set={caps}", f"--inh-caps={caps}", *command]


def as_user(uid: int, gid: int, command: list[str]) -> list[str]:
    """``command``, prefixed to run as ``uid``/``gid`` without supplementary groups: a real
    second (or third) local user, unprivileged, for tests about who may write where. Needs
    root (the suite's CI runs as root) and setpriv (util-linux)."""
    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or setpriv is None:
        raise RuntimeError("acting as another local user needs root and setpriv (util-linux)")
    return [setpriv, f"--reuid={uid}", f"--regid={gid}", "--clear-groups", *command]
