"""deploy/systemd: the unit verifies cleanly, is hardened, and its hardening does not break us.

``systemd-analyze verify`` works without a running systemd, but needs the ExecStart binary to
exist: the unit is copied to a temporary directory with ExecStart pointing at a stub there.
Any line it prints about the unit (unknown keys, bad values) fails the test, since verify
exits 0 on such warnings.
"""

from __future__ import annotations

import ctypes
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.deploy.sandbox import address_families, allowed_syscalls, preexec, unit_settings
from tests.support.deploy import DEPLOY

UNIT = DEPLOY / "systemd" / "hydrator.service"
SYSUSERS = DEPLOY / "systemd" / "hydrator.sysusers.conf"
TMPFILES = DEPLOY / "systemd" / "hydrator.tmpfiles.conf"
INSTALLED_BINARY = "/usr/local/bin/hydrator"
MAX_EXPOSURE = 2.0


def _verify(systemd_analyze: str, unit_text: str, workdir: Path) -> str:
    """Run ``systemd-analyze verify`` on ``unit_text``; return everything it printed."""
    stub = workdir / "hydrator"
    stub.write_text("#!/bin/sh\nexit 0\n")
    stub.chmod(0o755)
    unit = workdir / "hydrator.service"
    unit.write_text(unit_text.replace(INSTALLED_BINARY, str(stub)))
    result = subprocess.run(
        [systemd_analyze, "verify", "--man=no", str(unit)],
        capture_output=True,
        text=True,
        cwd=workdir,
        check=False,
    )
    return f"rc={result.returncode}\n{result.stdout}{result.stderr}".strip()


def test_unit_verifies_without_any_warning(systemd_analyze: str, tmp_path: Path) -> None:
    assert UNIT.read_text().count(INSTALLED_BINARY) >= 1
    assert _verify(systemd_analyze, UNIT.read_text(), tmp_path) == "rc=0"


def test_verify_check_catches_a_misspelt_directive(systemd_analyze: str, tmp_path: Path) -> None:
    # Guards the check above: a typo only warns (exit 0), and the test must still see it.
    broken = UNIT.read_text().replace("ProtectHome=yes", "ProtectHome=yes\nProtectHomes=yes")
    output = _verify(systemd_analyze, broken, tmp_path)
    assert "Unknown key 'ProtectHomes'" in output


def test_unit_runs_as_dedicated_user_with_hardening() -> None:
    service = unit_settings(UNIT)
    expected = {
        "Type": "exec",
        "User": "hydrator",
        "StateDirectory": "hydrator",
        "ConfigurationDirectory": "hydrator",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "NoNewPrivileges": "yes",
        "CapabilityBoundingSet": "",
        "MemoryDenyWriteExecute": "yes",
        "Restart": "on-failure",
        "KillSignal": "SIGTERM",
    }
    for key, value in expected.items():
        assert service.get(key) == [value], key
    assert service["SystemCallFilter"][0] == "@system-service"
    assert set(service["RestrictAddressFamilies"][0].split()) <= {
        "AF_INET",
        "AF_INET6",
        "AF_UNIX",
        "AF_NETLINK",
    }
    credentials = service["LoadCredential"]
    assert any(v.startswith("hydrator:/etc/hydrator/credentials") for v in credentials)
    assert "TimeoutStopSec" in service
    # the config it starts with is the daemon's default path, inside ConfigurationDirectory
    assert service["ExecStart"] == [f"{INSTALLED_BINARY} run --config /etc/hydrator/hydrator.toml"]


def test_security_exposure_is_low(systemd_analyze: str) -> None:
    result = subprocess.run(
        [systemd_analyze, "security", "--offline=true", "--no-pager", str(UNIT)],
        capture_output=True,
        text=True,
        check=False,
    )
    match = re.search(r"Overall exposure level for hydrator\.service: ([0-9.]+)", result.stdout)
    assert match, result.stdout + result.stderr
    assert float(match.group(1)) <= MAX_EXPOSURE, result.stdout


def test_sysusers_creates_the_hydrator_user(systemd_analyze: str, tmp_path: Path) -> None:
    # systemd_analyze: the fixture installs the systemd package, which ships systemd-sysusers
    (tmp_path / "etc").mkdir()
    sysusers = subprocess.run(
        ["systemd-sysusers", f"--root={tmp_path}", str(SYSUSERS)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert sysusers.returncode == 0, sysusers.stderr
    passwd = (tmp_path / "etc" / "passwd").read_text()
    entry = next(line for line in passwd.splitlines() if line.startswith("hydrator:"))
    uid = int(entry.split(":")[2])
    assert 0 < uid < 1000  # a system user
    assert entry.endswith(":/var/lib/hydrator:/usr/sbin/nologin")


def test_tmpfiles_creates_private_secret_directories(systemd_analyze: str, tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    subprocess.run(["systemd-sysusers", f"--root={tmp_path}", str(SYSUSERS)], check=True)
    result = subprocess.run(
        ["systemd-tmpfiles", f"--root={tmp_path}", "--create", str(TMPFILES)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    credentials = tmp_path / "etc" / "hydrator" / "credentials"
    assert (credentials.stat().st_mode & 0o777, credentials.stat().st_uid) == (0o700, 0)
    tokens = tmp_path / "etc" / "hydrator" / "tokens.d"
    passwd = (tmp_path / "etc" / "passwd").read_text()
    uid = next(int(x.split(":")[2]) for x in passwd.splitlines() if x.startswith("hydrator:"))
    assert (tokens.stat().st_mode & 0o777, tokens.stat().st_uid) == (0o700, uid)


MDWE_PROBE = """
import ctypes, mmap, sys
libc = ctypes.CDLL(None, use_errno=True)
PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN = 65, 1
if libc.prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN, 0, 0, 0) != 0:
    sys.exit("PR_SET_MDWE failed: errno %d" % ctypes.get_errno())
try:
    mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    sys.exit("W+X mapping was allowed: the probe does not work")
except OSError:
    pass
import classad2, htcondor2, pydantic, prometheus_client, apscheduler, requests, sqlite3
import rucio.client
ad = classad2.ClassAd({"AvailableDatasets": ["ska:obs_1"], "DataLocalitySite": "SITE_A"})
expr = classad2.ExprTree('member("ska:obs_1", AvailableDatasets)')
assert expr.eval(ad) is True
print("ok")
"""


def test_memory_deny_write_execute_does_not_break_python_or_htcondor() -> None:
    # systemd implements MemoryDenyWriteExecute= with seccomp, and since v254 with the kernel's
    # PR_SET_MDWE, which refuses the same thing (W+X mappings, making memory executable).
    # The probe sets it and then loads every native library the daemon uses.
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(66, 0, 0, 0, 0) < 0:  # PR_GET_MDWE
        pytest.fail("this kernel lacks PR_SET_MDWE (Linux >= 6.3): cannot check the unit's MDWE")
    result = subprocess.run(
        [sys.executable, "-c", MDWE_PROBE], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


SANDBOX_PROBE = """
import errno, os, socket
def attempt(call):
    try:
        call()
        return "allowed"
    except OSError as exc:
        return errno.errorcode[exc.errno]
print(attempt(lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM).close()))
print(attempt(lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW).close()))
print(attempt(lambda: os.chown(".", os.getuid(), os.getgid())))
print(attempt(lambda: os.setuid(os.getuid())))
"""


def test_unit_sandbox_denies_what_the_unit_denies(systemd_analyze: str, tmp_path: Path) -> None:
    # Guards test_daemon.py, which runs the daemon in this sandbox: it must not be a no-op.
    sandbox = preexec(allowed_syscalls(systemd_analyze, UNIT), address_families(UNIT))
    result = subprocess.run(
        [sys.executable, "-c", SANDBOX_PROBE],
        preexec_fn=sandbox,
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
    )
    assert result.stdout.split() == ["allowed", "EAFNOSUPPORT", "EPERM", "EPERM"], result.stderr


def test_reload_sends_sighup_to_the_daemon() -> None:
    # `systemctl reload hydrator`: the daemon reloads its configuration on SIGHUP
    # (tests/e2e/test_reload.py); without ExecReload systemd refuses the reload.
    assert unit_settings(UNIT)["ExecReload"] == ["/bin/kill -HUP $MAINPID"]
