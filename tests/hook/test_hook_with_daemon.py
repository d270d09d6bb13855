"""The hook against the real daemon's answers (static source, real HTTP endpoint).

Renamed attributes (``[classad] site_attribute = "MySite"`` and the others) reach the hook the
way the daemon's config names them: ``--site-attribute``, ``HYDRATOR_SITE_ATTRIBUTE``, or the
glidein attribute of that name. And a dataset or site name holding ``$`` (HTCondor expands
``$(...)`` and ``$ENV(...)`` in configuration, which the glidein mode writes) is an invalid
record for the daemon: counted, skipped, never in an ad.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from tests.support.hook import HOOK, Glidein, run_hook, served_hydrator

INVENTORY = """\
[storage.A]
site = "SITE_A"
available = ["ska:a1"]
partial = { "ska:p1" = 0.5 }
replicating = { "ska:r1" = 0.25 }
stuck = ["ska:s1"]
"""
RENAMED = {
    "available_attribute": "HasData",
    "partial_attribute": "SomeData",
    "replicating_attribute": "IncomingData",
    "stuck_attribute": "StuckData",
    "site_attribute": "MySite",
    "updated_attribute": "MyUpdated",
    "digest_attribute": "MyDigest",
    "unavailable_attribute": "MyUnavailable",
    "near_attribute": "MyNearSites",
}
# An operator's distance table, so that the daemon's answer carries the near sites too.
DISTANCES = {"enabled": True, "sites": {"SITE_A": {"SITE_B": 1}}}
OPTIONS = [
    arg
    for key, name in RENAMED.items()
    for arg in (f"--{key.removesuffix('_attribute')}-attribute", name)
]
ENVIRONMENT = {f"HYDRATOR_{key.upper()}": name for key, name in RENAMED.items()}


def _names(lines: str) -> list[str]:
    return [line.split(" = ")[0] for line in lines.splitlines() if " = " in line]


@pytest.mark.parametrize("how", ["options", "environment"])
def test_the_hook_accepts_the_renamed_attributes_it_is_told(tmp_path: Path, how: str) -> None:
    classad = {**RENAMED, "advertise_stuck": True}
    with served_hydrator(tmp_path, INVENTORY, classad, DISTANCES) as hydrator:
        args, env = (OPTIONS, {}) if how == "options" else ([], ENVIRONMENT)
        out = run_hook(hydrator.url, tmp_path / "cache", *args, env=env)

    assert out.returncode == 0
    assert sorted(_names(out.stdout)) == sorted(RENAMED.values())
    assert 'MySite = "SITE_A"' in out.stdout and 'HasData = { "ska:a1" }' in out.stdout
    assert 'MyNearSites = { "SITE_B" }' in out.stdout
    assert out.stdout.endswith("- update:true\n")


def test_without_the_names_the_hook_refuses_a_renamed_answer_and_says_which(
    tmp_path: Path,
) -> None:
    with served_hydrator(tmp_path, INVENTORY, RENAMED) as hydrator:
        out = run_hook(hydrator.url, tmp_path / "cache")
    assert (out.returncode, out.stdout) == (0, "")
    assert "unexpected attribute" in out.stderr


def test_only_the_site_attribute_renamed(tmp_path: Path) -> None:
    """One attribute renamed alone: the other names keep their defaults."""
    with served_hydrator(tmp_path, INVENTORY, {"site_attribute": "MySite"}) as hydrator:
        out = run_hook(hydrator.url, tmp_path / "cache", "--site-attribute", "MySite")
        refused = run_hook(hydrator.url, tmp_path / "other", "--site-attribute", "OtherSite")
    assert 'MySite = "SITE_A"' in out.stdout and "AvailableDatasets" in out.stdout
    assert refused.stdout == ""


def test_the_stuck_attribute_is_accepted_by_default(tmp_path: Path) -> None:
    with served_hydrator(tmp_path, INVENTORY, {"advertise_stuck": True}) as hydrator:
        out = run_hook(hydrator.url, tmp_path / "cache")
    assert 'StuckDatasets = { "ska:s1" }' in out.stdout


def test_a_glidein_learns_the_renamed_attributes_from_glidein_config(tmp_path: Path) -> None:
    with served_hydrator(tmp_path, INVENTORY, RENAMED) as hydrator:
        extra = "".join(f"HYDRATOR_{key.upper()} {name}\n" for key, name in RENAMED.items())
        glidein = Glidein.make(tmp_path, hydrator.url, extra)
        out = glidein.run()
    assert out.returncode == 0
    assert 'MySite = "SITE_A"' in out.stdout
    assert 'MySite "SITE_A"' in glidein.config.read_text()  # seeded into the startd config


def test_an_invalid_renamed_attribute_is_refused(tmp_path: Path) -> None:
    with served_hydrator(tmp_path, INVENTORY, RENAMED) as hydrator:
        out = run_hook(hydrator.url, tmp_path / "cache", "--site-attribute", "$(SITE)")
    assert (out.returncode, out.stdout) == (0, "")
    assert "invalid --site-attribute" in out.stderr


# --- `$` in names: invalid records for the daemon ------------------------------------------------

DOLLAR_INVENTORY = """\
[storage.A]
site = "SITE_A"
available = ["ska:a1", "ska:obs_$1", "ska$:a2", "ska:$ENV(HOME)"]
partial = { "ska:p_$(FULL_HOSTNAME)" = 0.5 }
[storage.B]
site = "SITE_$B"
available = ["ska:b1"]
"""


def test_names_with_a_dollar_are_invalid_records_never_in_an_ad(tmp_path: Path) -> None:
    with served_hydrator(tmp_path, DOLLAR_INVENTORY) as hydrator:
        report = hydrator.service.run_cycle()
        sites = requests.get(f"{hydrator.url}/v1/sites", timeout=5).text
        out = run_hook(hydrator.url, tmp_path / "cache")

    assert report.plan is not None
    (status,) = report.plan.sources
    assert status.invalid == 4  # the four dataset names, counted and skipped
    assert status.unmapped == frozenset({"B"})  # a storage element whose site name is invalid
    assert set(report.plan.sites) == {"SITE_A"}
    assert "$" not in sites
    assert 'AvailableDatasets = { "ska:a1" }' in out.stdout and "$" not in out.stdout


def _condor_param(config: Path, name: str) -> str:
    """``name`` as HTCondor's own configuration reader expands it from ``config`` (the
    htcondor2 bindings, in a child process: they read $CONDOR_CONFIG once, at import)."""
    out = subprocess.run(
        [sys.executable, "-c", f"import htcondor2; print(htcondor2.param[{name!r}])"],
        env={**os.environ, "CONDOR_CONFIG": str(config)},
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    return out.stdout.strip()


@pytest.mark.parametrize("renamed", [False, True])
def test_the_shipped_startd_cron_config_runs_the_hook_with_the_daemons_names(
    tmp_path: Path, renamed: bool
) -> None:
    """deploy/condor/50-hydrator.conf as HTCondor reads it: its STARTD_CRON_HYDRATOR_ARGS,
    with the renaming line the file documents, make the hook accept the daemon's answer."""
    config = tmp_path / "condor_config"
    config.write_text(
        f"SPOOL = {tmp_path}/spool\n"
        f"include : {HOOK.parent / '50-hydrator.conf'}\n"
        + ("HYDRATOR_HOOK_ATTRIBUTES = --site-attribute MySite\n" if renamed else "")
    )
    args = _condor_param(config, "STARTD_CRON_HYDRATOR_ARGS").split()
    classad = {"site_attribute": "MySite"} if renamed else {}
    with served_hydrator(tmp_path, INVENTORY, classad) as hydrator:
        args[args.index("--url") + 1] = hydrator.url
        out = subprocess.run(
            [str(HOOK), "--site", "SITE_A", *args],
            capture_output=True,
            text=True,
            env={"PATH": os.environ["PATH"]},
            timeout=20,
            check=False,
        )
    site_line = 'MySite = "SITE_A"' if renamed else 'DataLocalitySite = "SITE_A"'
    assert site_line in out.stdout, out.stderr
    assert (tmp_path / "spool" / "hydrator-hook" / "SITE_A.classad").is_file()
