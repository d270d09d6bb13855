"""Helpers for the job-annotation tests on the real pool: ``hydrator once --json`` with
``[jobs] annotate = true`` as a subprocess holding its own IDTOKEN (a process reuses its first
authenticated session with a daemon, so each identity needs a process of its own)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import classad2

from tests.support.pool import NEVER_MATCHING, Pool

SITES = {"A_DISK": "SITE_A", "B_DISK": "SITE_B", "C_DISK": "SITE_C"}
# SITE_A holds obs_1 and sky; SITE_B obs_2 and sky, part of obs_1; SITE_C sky, obs_2 incoming
INVENTORY = """\
[storage.A_DISK]
available = ["ska:obs_1", "ska:sky"]

[storage.B_DISK]
available = ["ska:obs_2", "ska:sky"]
partial = { "ska:obs_1" = 0.5 }

[storage.C_DISK]
available = ["ska:sky"]
replicating = { "ska:obs_2" = 0.1 }
"""
ATTRS = [
    "ClusterId",
    "ProcId",
    "JobStatus",
    "RequiredDatasets",
    "DataLocalitySites",
    "DataLocalityPartialSites",
    "DataLocalitySitesUpdated",
    "DESIRED_Sites",
]


@dataclass
class Annotating:
    """A hydrator configuration in ``directory`` annotating the pool's jobs as the identity
    whose token is in ``token_dir``."""

    directory: Path
    pool: Pool
    token_dir: Path
    source: str = (
        '[[sources]]\ntype = "static"\nname = "inventory"\npath = "inventory.toml"\nsettle_s = 0\n'
    )
    """The ``[[sources]]`` table (default: the static inventory)."""

    def write_inventory(self, text: str = INVENTORY) -> None:
        path = self.directory / "inventory.toml"
        path.with_suffix(".tmp").write_text(text)
        path.with_suffix(".tmp").replace(path)

    def config(self, jobs: str = "", extra: str = "") -> Path:
        sites = "".join(f'{e} = "{s}"\n' for e, s in SITES.items())
        path = self.directory / "hydrator.toml"
        path.write_text(
            '[daemon]\nstate_path = "state.sqlite"\n\n[http]\nenabled = false\n\n'
            f"{self.source}\n[sites]\n{sites}\n"
            f'[collector]\nenabled = false\npool = "{self.pool.collector_address}"\n'
            f'token_dir = "{self.token_dir}"\n\n[jobs]\nannotate = true\n{jobs}\n{extra}'
        )
        return path

    def once(self, jobs: str = "") -> dict[str, Any]:
        """One cycle; its ``once --json`` report (the process must exit 0)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("_CONDOR_")}
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "hydrator",
                "once",
                "--json",
                "--config",
                str(self.config(jobs)),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        self.last_stderr = proc.stderr
        report: dict[str, Any] = json.loads(proc.stdout)
        return report


def submit_idle(pool: Pool, required: str, count: int = 1, extra: str = "") -> int:
    """A cluster of ``count`` jobs that stay idle, declaring ``required`` (ClassAd text)."""
    description = NEVER_MATCHING.format(required=required, count=count)
    return pool.submit(extra + description)


def jobs_of(pool: Pool, clusters: Sequence[int]) -> list[classad2.ClassAd]:
    where = " || ".join(f"ClusterId == {c}" for c in clusters)
    ads = pool.schedd.query(constraint=where, projection=ATTRS)
    return sorted(ads, key=lambda ad: (int(ad["ClusterId"]), int(ad["ProcId"])))


def annotated(ad: classad2.ClassAd) -> tuple[list[str] | None, list[str] | None]:
    """A job's (DataLocalitySites, DataLocalityPartialSites) as Python lists (None: missing)."""
    sites, partial = ad.get("DataLocalitySites"), ad.get("DataLocalityPartialSites")
    return (
        None if sites is None else list(sites),
        None if partial is None else list(partial),
    )


def demand_config(pool: Pool, collector_extra: str = "") -> str:
    """A configuration with demand-driven ads, the matchmaking metrics and annotation all on
    (the static inventory in ``inventory.toml``); ``collector_extra``: more ``[collector]``
    lines."""
    sites = "".join(f'{e} = "{s}"\n' for e, s in SITES.items())
    return (
        '[daemon]\nstate_path = "state.sqlite"\n\n[http]\nenabled = false\n\n'
        '[[sources]]\ntype = "static"\nname = "inventory"\npath = "inventory.toml"\n'
        f"settle_s = 0\n\n[sites]\n{sites}\n"
        '[classad]\nadvertise = "demand"\n\n'
        f'[collector]\nenabled = true\npool = "{pool.collector_address}"\n'
        f'token_dir = "{pool.token_dir}"\nrefresh_s = 600\nlocality_metrics = true\n'
        f"{collector_extra}\n[jobs]\nannotate = true\n"
    )
