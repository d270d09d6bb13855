"""Run a process under the process-level restrictions of deploy/systemd/hydrator.service.

Without systemd as PID 1 the unit cannot be started here, but its process-level sandbox can be
rebuilt from the same definitions, so the real daemon is tested under it:

- ``NoNewPrivileges=yes``: ``prctl(PR_SET_NO_NEW_PRIVS)``.
- ``MemoryDenyWriteExecute=yes``: ``prctl(PR_SET_MDWE)``, which systemd >= 254 uses as well.
- ``SystemCallFilter=@system-service`` / ``~@privileged`` with ``SystemCallErrorNumber=EPERM``:
  a seccomp filter over the syscall lists that ``systemd-analyze syscall-filter`` prints (the
  same tables systemd compiles in), denied calls failing with EPERM.
- ``RestrictAddressFamilies=``: ``socket()`` for any other family fails with EAFNOSUPPORT.

Mount, user and namespace settings are not reproduced (they need privileges or PID 1).
The filter is built with pyseccomp (ctypes over the system's libseccomp).
"""

from __future__ import annotations

import ctypes
import errno
import re
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path

import pyseccomp as seccomp  # type: ignore[import-untyped]  # no stubs, no py.typed

PR_SET_NO_NEW_PRIVS, PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN = 38, 65, 1


def unit_settings(unit: Path) -> dict[str, list[str]]:
    """[Service] key -> values (in order) of a unit file."""
    values: dict[str, list[str]] = {}
    section = ""
    for raw in unit.read_text().splitlines():
        line = raw.strip()
        if line.startswith("["):
            section = line
        elif section == "[Service]" and line and not line.startswith("#"):
            key, _, value = line.partition("=")
            values.setdefault(key, []).append(value)
    return values


def expand_syscall_group(systemd_analyze: str, group: str) -> set[str]:
    """Syscall names of a systemd ``@group``, nested groups expanded."""
    out = subprocess.run(
        [systemd_analyze, "syscall-filter", group], capture_output=True, text=True, check=True
    ).stdout
    names: set[str] = set()
    for line in out.splitlines()[1:]:
        item = line.strip()
        if not item or item.startswith("#"):
            continue
        if item.startswith("@"):
            names |= expand_syscall_group(systemd_analyze, item)
        elif re.fullmatch(r"[a-z0-9_]+", item):
            names.add(item)
    return names


def allowed_syscalls(systemd_analyze: str, unit: Path) -> set[str]:
    """The syscalls the unit's SystemCallFilter= lines allow (allow list, then ~deny lists)."""
    allowed: set[str] = set()
    for entry in unit_settings(unit)["SystemCallFilter"]:
        deny = entry.startswith("~")
        for item in entry.removeprefix("~").split():
            names = expand_syscall_group(systemd_analyze, item) if item.startswith("@") else {item}
            allowed = allowed - names if deny else allowed | names
    return allowed


def address_families(unit: Path) -> list[int]:
    names = unit_settings(unit)["RestrictAddressFamilies"][0].split()
    return [int(getattr(socket, name)) for name in names]


def preexec(syscalls: set[str], families: list[int]) -> Callable[[], None]:
    """A ``subprocess`` preexec_fn applying the sandbox in the child before it execs."""
    rules = seccomp.SyscallFilter(defaction=seccomp.ERRNO(errno.EPERM))
    for name in sorted(syscalls - {"socket"}):
        try:
            rules.add_rule(seccomp.ALLOW, name)
        except OSError as exc:  # a name this architecture lacks (arm_fadvise64_64...): skipped
            if exc.errno != errno.EINVAL:  # by systemd as well
                raise
    if "socket" in syscalls:
        denied = [f for f in range(64) if f not in families]
        for family in denied:
            rules.add_rule(
                seccomp.ERRNO(errno.EAFNOSUPPORT), "socket", seccomp.Arg(0, seccomp.EQ, family)
            )
        for family in families:
            rules.add_rule(seccomp.ALLOW, "socket", seccomp.Arg(0, seccomp.EQ, family))

    def apply() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS")
        if libc.prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "PR_SET_MDWE")
        rules.load()

    return apply
