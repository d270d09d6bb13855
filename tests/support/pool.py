"""A real HTCondor pool for tests: Python over ``scripts/condor-pool``.

How it is built: ``scripts/condor-pool`` (why each setting: docs/platform.md, "The test
parts"). One central manager, schedd and startd in a Debian sid chroot (``minicondor`` 25.14.x),
collector on ``127.0.0.1:9618``; four
slots standing in for sites::

    slot1@<host>  static         GLIDEIN_Site = "SITE_A"
    slot2@<host>  static         GLIDEIN_Site = "SITE_B"
    slot3@<host>  static         GLIDEIN_Site = "SITE_C"
    slot4@<host>  partitionable  GLIDEIN_Site = "SITE_C"   (its job runs in dynamic slot slot4_1)

Use from any test directory::

    from tests.support.pool import condor_pool  # noqa: F401  (session fixture)

``condor_pool`` builds the chroot if needed (cached, ~40 s the first time), starts the pool
(~4 s), yields a :class:`Pool`, and stops it and unmounts ``proc``/``dev`` at the end, also
after a failure. A file lock (``$HYDRATOR_TEST_CACHE/condor-pool.lock``) is held for the whole
session, so two test runs never share the pool: the second waits.

Run ``python -m tests.support.pool`` to get a running pool in the foreground for manual work.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import classad2
import htcondor2
import pytest

from benchmarks.local_servers import TEST_CACHE
from tests.support.wait import wait_for

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "condor-pool"
CACHE = TEST_CACHE
COLLECTOR = "127.0.0.1:9618"
SUBMIT_USER = "submitter"
EDITOR_IDENTITY = "hydrator"
"""May edit other users' jobs (QUEUE_SUPER_USERS + a schedd user record; scripts/condor-pool)."""
SLOT_SITES = {"slot1": "SITE_A", "slot2": "SITE_B", "slot3": "SITE_C", "slot4": "SITE_C"}
LOCK_TIMEOUT_S = 900.0
TEST_CONFIG_DIR = "etc/condor/hydrator-test.d"

IDLE, RUNNING, REMOVED, COMPLETED, HELD = 1, 2, 3, 4, 5
# A job that stays idle and declares datasets (format with required=<ClassAd value>, count=N).
NEVER_MATCHING = """\
executable = /bin/true
output = /dev/null
error = /dev/null
requirements = False
+RequiredDatasets = {required}
queue {count}
"""
JOB_STATES = {
    IDLE: "idle",
    RUNNING: "running",
    REMOVED: "removed",
    COMPLETED: "completed",
    HELD: "held",
}


class PoolNotReady(RuntimeError):
    """The test pool could not be built, started or used."""


def _script(*args: str, lock_fd: int, timeout_s: float = 600.0) -> str:
    env = dict(os.environ, HYDRATOR_POOL_LOCK_FD=str(lock_fd))
    proc = subprocess.run(
        [str(SCRIPT), *args],
        env=env,
        pass_fds=(lock_fd,),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    if proc.returncode != 0:
        raise PoolNotReady(f"condor-pool {' '.join(args)} failed:\n{proc.stderr[-3000:]}")
    return proc.stdout


@contextlib.contextmanager
def _pool_lock() -> Iterator[int]:
    CACHE.mkdir(parents=True, exist_ok=True)
    fd = os.open(CACHE / "condor-pool.lock", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        deadline = time.monotonic() + LOCK_TIMEOUT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise PoolNotReady("another test run holds the pool lock") from None
                time.sleep(1.0)
        yield fd
    finally:
        os.close(fd)  # releases the lock


@dataclass
class Pool:
    """A running test pool. Paths are on the host; ``config_dir`` is read by the daemons last."""

    root: Path
    token_dir: Path
    lock_fd: int
    collector_address: str = COLLECTOR

    @property
    def config_dir(self) -> Path:
        """Config fragments dropped here are read last (emptied at every start); then
        :meth:`reconfig`."""
        return self.root / TEST_CONFIG_DIR

    @property
    def collector(self) -> htcondor2.Collector:
        return htcondor2.Collector(self.collector_address)

    @property
    def schedd(self) -> htcondor2.Schedd:
        """The pool's schedd, located through the collector (never this host's local one)."""
        location = self._locate(htcondor2.DaemonType.Schedd)
        if location is None:
            raise PoolNotReady("the collector knows no schedd")
        return htcondor2.Schedd(location)

    def schedd_name(self) -> str:
        """The schedd's ``Name`` in the collector."""
        location = self._locate(htcondor2.DaemonType.Schedd)
        if location is None:
            raise PoolNotReady("the collector knows no schedd")
        return str(location["Name"])

    def _locate(self, daemon_type: htcondor2.DaemonType) -> classad2.ClassAd | None:
        try:
            return self.collector.locate(daemon_type)
        except htcondor2.HTCondorException:  # a collector (re)starting
            return None

    def wait_until_ready(self, timeout_s: float = 60.0) -> None:
        """Wait until the collector lists the schedd, the negotiator and every slot again
        (after a collector restart). A daemon that has not re-advertised after 15 s is nudged
        with a reconfig, which makes every daemon send its ad."""
        deadline = time.monotonic() + timeout_s
        nudge_at = time.monotonic() + 15
        while time.monotonic() < deadline:
            schedd = self._locate(htcondor2.DaemonType.Schedd)
            negotiator = self._locate(htcondor2.DaemonType.Negotiator)
            try:
                slots = len(self.slot_ads(constraint='SlotType != "Dynamic"'))
            except htcondor2.HTCondorException:
                slots = 0
            if schedd is not None and negotiator is not None and slots >= len(SLOT_SITES):
                return
            if time.monotonic() > nudge_at:
                self.reconfig()
                nudge_at = time.monotonic() + 15
            time.sleep(0.5)
        raise PoolNotReady(f"pool not ready after {timeout_s}s")

    # -- processes inside the chroot ----------------------------------------------------------

    def run_in_chroot(
        self,
        args: Sequence[str],
        *,
        user: str | None = None,
        input: str | None = None,
        check: bool = True,
        timeout_s: float = 60.0,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``args`` inside the chroot (as root, or as ``user`` from its home directory)."""
        env = ["/usr/bin/env", "-i", "PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8"]
        cmd = ["chroot"]
        if user is not None:
            cmd += [f"--userspec={user}:{user}"]
            env += [f"HOME=/home/{user}", f"USER={user}"]
            args = ["bash", "-c", 'cd "$HOME" && exec "$@"', "bash", *args]
        proc = subprocess.run(
            [*cmd, str(self.root), *env, *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
        if check and proc.returncode != 0:
            raise PoolNotReady(f"{' '.join(args)} exited {proc.returncode}: {proc.stderr[-2000:]}")
        return proc

    def submit(self, description: str) -> int:
        """Submit a job (submit-file text) as the ordinary user; returns the cluster id."""
        out = self.run_in_chroot(
            ["condor_submit", "-terse", "-"], user=SUBMIT_USER, input=description
        ).stdout
        first = out.strip().split(" ")[0]  # "12.0 - 12.0"
        return int(first.split(".")[0])

    def token_dir_for(self, identity: str, directory: Path) -> Path:
        """Write an IDTOKEN for ``identity@<UID_DOMAIN>`` into ``directory`` (for a process of
        its own: a process reuses its first authenticated session with a daemon)."""
        _script("token", str(directory), identity, lock_fd=self.lock_fd)
        return directory

    def remove_all_jobs(self) -> None:
        self.run_in_chroot(["condor_rm", "-all"], user=SUBMIT_USER, check=False)

    def reconfig(self) -> None:
        """Make every daemon re-read its configuration (after editing :attr:`config_dir`)."""
        self.run_in_chroot(["condor_reconfig"])  # the local master passes it on

    def write_config(self, name: str, text: str) -> Path:
        """Write a fragment into :attr:`config_dir` (does not reconfig)."""
        self.config_dir.mkdir(parents=True, exist_ok=True)
        path = self.config_dir / name
        path.write_text(text, encoding="utf-8")
        return path

    def remove_config(self, name: str) -> None:
        (self.config_dir / name).unlink(missing_ok=True)

    def advertise(self, ads: list[classad2.ClassAd], command: str) -> None:
        """``Collector.advertise`` from this process with the pool's token, tried twice: the
        first call after a collector restart fails on a stale cached security session."""
        try:
            self.collector.advertise(ads, command)
        except htcondor2.HTCondorException:
            self.collector.advertise(ads, command)

    # -- queries from the host ----------------------------------------------------------------

    def slot_ads(
        self, projection: Sequence[str] = (), constraint: str = "true"
    ) -> list[classad2.ClassAd]:
        """Slot ads as the collector has them now (``Name`` and ``GLIDEIN_Site`` always)."""
        wanted = list(dict.fromkeys(["Name", "GLIDEIN_Site", *projection]))
        ads = self.collector.query(htcondor2.AdType.Slot, constraint=constraint, projection=wanted)
        return sorted(ads, key=lambda ad: str(ad["Name"]))

    def job_ad(self, cluster: int, projection: Sequence[str] = ()) -> classad2.ClassAd | None:
        """The job ``cluster.0`` from the queue, else from the history; None if unknown."""
        wanted = list(
            dict.fromkeys(
                [
                    "ClusterId",
                    "JobStatus",
                    "RemoteHost",
                    "LastRemoteHost",
                    "HoldReason",
                    *projection,
                ]
            )
        )
        constraint = f"ClusterId == {int(cluster)} && ProcId == 0"
        ads = self.schedd.query(constraint=constraint, projection=wanted)
        if not ads:
            ads = list(self.schedd.history(constraint=constraint, projection=wanted, match=1))
        return ads[0] if ads else None

    def wait_for_job_state(
        self, cluster: int, states: Sequence[int], timeout_s: float = 60.0
    ) -> classad2.ClassAd:
        """Wait until job ``cluster.0`` is in one of ``states``; return its ad or raise."""
        wanted = [JOB_STATES.get(s, str(s)) for s in states]
        ad = wait_for(
            f"job {cluster} {wanted}",
            lambda: self.job_ad(cluster),
            done=lambda ad: ad is not None and int(ad["JobStatus"]) in states,
            timeout_s=timeout_s,
            interval_s=0.5,
        )
        assert ad is not None
        return ad

    def job_site(self, ad: classad2.ClassAd) -> str:
        """The site of the slot a job ran or runs on (from RemoteHost/LastRemoteHost)."""
        host = ad.get("RemoteHost") or ad.get("LastRemoteHost")
        if not host:
            raise AssertionError(f"job never ran: {ad}")
        slot = str(host).split("@")[0].split("_")[0]  # slot4_1@vm -> slot4
        return SLOT_SITES[slot]

    def wait_for_slots(
        self, predicate: str, count: int | None = None, timeout_s: float = 30.0
    ) -> list[classad2.ClassAd]:
        """Wait until slot ads matching the constraint ``predicate`` exist (``count`` of them,
        or all slots); return them."""
        want = len(SLOT_SITES) if count is None else count
        return wait_for(
            f"{want} slots matching {predicate!r}",
            lambda: self.slot_ads(constraint=predicate),
            done=lambda ads: len(ads) >= want,
            timeout_s=timeout_s,
            ignore=(htcondor2.HTCondorException,),  # a collector (re)starting
            interval_s=0.5,
        )

    # -- lifecycle ----------------------------------------------------------------------------

    def daemon_off(self, subsystem: str) -> None:
        """Stop one daemon (``collector``, ``negotiator``, ...); the master keeps it down."""
        self.run_in_chroot(["condor_off", "-daemon", subsystem])

    def daemon_on(self, subsystem: str) -> None:
        """Start a daemon stopped by :meth:`daemon_off`; return when the pool is whole again."""
        self.run_in_chroot(["condor_on", "-daemon", subsystem])
        self.wait_until_ready()
        if subsystem == "schedd":
            # this process's cached session with the old schedd is rejected once
            # ("SECMAN:2004:Server rejected our session id"), which drops it
            try:
                self.schedd.query(constraint="false", projection=["ClusterId"])
            except htcondor2.HTCondorException:
                self.schedd.query(constraint="false", projection=["ClusterId"])


@contextlib.contextmanager
def running_pool(token_dir: Path) -> Iterator[Pool]:
    """Build if needed, start, yield; always stop and unmount."""
    with _pool_lock() as fd:
        _script("build", lock_fd=fd, timeout_s=1200.0)
        root = Path(_script("root", lock_fd=fd).strip())
        try:
            _script("start", lock_fd=fd)
            _script("token", str(token_dir), lock_fd=fd)
            # this process's own htcondor2 calls (merges in tests) use the token too
            htcondor2.param["SEC_TOKEN_DIRECTORY"] = str(token_dir)
            yield Pool(root=root, token_dir=token_dir, lock_fd=fd)
        finally:
            _script("stop", lock_fd=fd)


@pytest.fixture(scope="session")
def condor_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    """The running test pool for the whole session (see the module docstring)."""
    with running_pool(tmp_path_factory.mktemp("condor-token")) as pool:
        yield pool


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as tmp, running_pool(Path(tmp)) as p:
        print(f"collector {p.collector_address}; token dir {p.token_dir}; Ctrl-C stops")
        with contextlib.suppress(KeyboardInterrupt):
            while True:
                time.sleep(3600)
