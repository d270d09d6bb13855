"""The real Toil on the test pool: ``toil-cwl-runner --batchSystem htcondor`` as a user would.

Toil's quirks on the pool: docs/platform.md ("Toil's HTCondor backend").
``scripts/toil-env install`` builds the cached Toil tree (Toil 9.6.0, ``htcondor`` 23.10.29
bindings, its own Python 3.11);
:func:`toil_on_pool` makes a shared directory owned by the pool's ordinary user, bind-mounts it
and the Toil tree into the pool's chroot at the same paths (jobs run there), writes an IDTOKEN
for that user, and undoes it all afterwards. :meth:`ToilOnPool.run` runs a CWL workflow with
the leader as that user on the host; every job records where it ran, and
:meth:`ToilOnPool.history` reads the schedd's history of the run's jobs (Toil removes them from
the queue once it has their exit code).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from tests.support.pool import CACHE, COLLECTOR, SUBMIT_USER, Pool

REPO = Path(__file__).resolve().parents[2]
TOIL_ENV = REPO / "scripts" / "toil-env"
PLUGIN = REPO / "deploy" / "toil" / "toil_batch_system_hydrator.py"
RUN_ATTRIBUTE = "HydratorToilRun"
"""Each run's jobs carry ``+HydratorToilRun = "<id>"`` (added to TOIL_HTCONDOR_PARAMS)."""
HISTORY = [
    "ClusterId",
    "ToilJobName",
    "MATCH_EXP_MatchedSite",
    "LastRemoteHost",
    "QDate",
    "JobCurrentStartDate",
    "ExitCode",
    "RequiredDatasets",
]


def toil_tree() -> Path:
    """The cached Toil tree (built on first use, ~1-2 min)."""
    out = subprocess.run([str(TOIL_ENV), "install"], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"scripts/toil-env install failed:\n{out.stderr[-3000:]}")
    return Path(out.stdout.strip())


@dataclass(frozen=True)
class Record:
    """One job's own line: the step (direction or ``image``), its slot's site, its cluster."""

    label: str
    site: str
    cluster: int


@dataclass
class ToilRun:
    run_id: str
    records: list[Record]
    seconds: float


@dataclass
class ToilOnPool:
    pool: Pool
    tree: Path
    shared: Path
    uid: int

    def environment(self, params: str, extra: Mapping[str, str]) -> dict[str, str]:
        """The leader's whole environment (jobs get it too: Toil submits with getenv)."""
        return {
            "PATH": f"{self.tree}/venv/bin:/usr/bin:/bin",
            "HOME": str(self.shared / "home"),
            "USER": SUBMIT_USER,
            "LANG": "C.UTF-8",
            "CONDOR_CONFIG": "/dev/null",  # the bindings need no config: the collector is named
            "_CONDOR_SEC_TOKEN_DIRECTORY": str(self.shared / "tokens"),
            "TOIL_HTCONDOR_COLLECTOR": COLLECTOR,
            "TOIL_HTCONDOR_SCHEDD": self.pool.schedd_name(),
            "TOIL_HTCONDOR_PARAMS": params,
            **extra,
        }

    def run(
        self,
        workflow: Path,
        inputs: Mapping[str, object],
        params: str,
        *,
        entry: str = "workflow.cwl",
        batch_system: str = "htcondor",
        extra_env: Mapping[str, str] | None = None,
        timeout_s: float = 150.0,
    ) -> ToilRun:
        """Run ``workflow`` (a directory of CWL files, ``entry`` the workflow to run) with
        ``TOIL_HTCONDOR_PARAMS = params`` plus this run's id attribute; AssertionError with the
        leader's log tail when Toil fails."""
        run_id = uuid.uuid4().hex[:12]
        work = self.shared / run_id
        shutil.copytree(workflow, work / "cwl")
        (work / "inputs.json").write_text(json.dumps(inputs))
        for sub in ("work", "out", "logs"):
            (work / sub).mkdir()
        self._own(work)
        tagged = f'{params}; +{RUN_ATTRIBUTE} = "{run_id}"'
        cmd = [
            "setpriv", f"--reuid={self.uid}", f"--regid={self.uid}", "--clear-groups",
            "toil-cwl-runner", "--batchSystem", batch_system,
            "--jobStore", str(work / "jobstore"), "--workDir", str(work / "work"),
            "--outdir", str(work / "out"), "--batchLogsDir", str(work / "logs"),
            "--defaultMemory", "200Mi", "--defaultDisk", "100Mi", "--retryCount", "0",
            "--preserve-entire-environment",  # _CONDOR_MACHINE_AD/_JOB_AD reach the tools
            "--logFile", str(work / "leader.log"),
            str(work / "cwl" / entry), str(work / "inputs.json"),
        ]  # fmt: skip
        env = self.environment(tagged, extra_env or {})
        started = time.monotonic()
        proc = subprocess.run(
            cmd, cwd=work, env=env, capture_output=True, text=True, timeout=timeout_s, check=False
        )
        took = time.monotonic() - started
        if proc.returncode != 0:
            tail = proc.stderr[-4000:]
            raise AssertionError(f"toil-cwl-runner exited {proc.returncode}:\n{tail}")
        return ToilRun(run_id, _records(work / "out"), took)

    def history(self, run: ToilRun, expected: int) -> list[dict[str, object]]:
        """The schedd's history of ``run``'s jobs (waits until all ``expected`` are there)."""
        deadline = time.monotonic() + 30
        rows: list[dict[str, object]] = []
        while time.monotonic() < deadline:
            ads = self.pool.schedd.history(
                constraint=f'{RUN_ATTRIBUTE} == "{run.run_id}"', projection=HISTORY
            )
            rows = [dict(ad) for ad in ads]
            if len(rows) >= expected:
                break
            time.sleep(0.5)
        return sorted(rows, key=lambda r: int(str(r["ClusterId"])))

    def _own(self, path: Path) -> None:
        for p in [path, *path.rglob("*")]:
            os.chown(p, self.uid, self.uid)


def _records(outdir: Path) -> list[Record]:
    records = []
    for path in sorted(outdir.glob("*.txt")):
        label, site, cluster = path.read_text().split()
        records.append(Record(label, site, int(cluster)))
    return records


def submitter_uid(pool: Pool) -> int:
    """The pool's ordinary user's uid (the chroot's passwd; the host may not know the name)."""
    for line in (pool.root / "etc" / "passwd").read_text().splitlines():
        fields = line.split(":")
        if fields[0] == SUBMIT_USER:
            return int(fields[2])
    raise RuntimeError(f"no user {SUBMIT_USER} in the pool's chroot")


@contextlib.contextmanager
def toil_on_pool(pool: Pool) -> Iterator[ToilOnPool]:
    """A shared directory mounted into the pool's chroot, a token for the submitting user, and
    the Toil tree; everything unmounted and removed afterwards, also after a failure."""
    tree = toil_tree()
    runs = CACHE / "toil-runs"
    runs.mkdir(parents=True, exist_ok=True)
    shared = Path(tempfile.mkdtemp(prefix="run-", dir=runs))
    uid = submitter_uid(pool)
    try:
        shared.chmod(0o755)
        (shared / "home").mkdir()
        pool.token_dir_for(SUBMIT_USER, shared / "tokens")
        # the plugin (deploy/toil), importable by the leader through PYTHONPATH
        (shared / "plugins").mkdir()
        shutil.copy(PLUGIN, shared / "plugins")
        toil = ToilOnPool(pool, tree, shared, uid)
        toil._own(shared)
        subprocess.run([str(TOIL_ENV), "mount", str(shared)], check=True, capture_output=True)
        yield toil
    finally:
        subprocess.run([str(TOIL_ENV), "umount", str(shared)], check=False, capture_output=True)
        shutil.rmtree(shared, ignore_errors=True)
