"""The coverage scenario's pure parts (benchmarks/coverage.py): which segments a run makes and
in what order, and the hook's configuration built from the deploy file."""

from __future__ import annotations

import re
from pathlib import Path

from benchmarks.coverage import (
    DEPLOY,
    Step,
    glidein_hook_settings,
    hook_config,
    plan,
    shipped_period,
)

OLD, NEW = Path("/old"), Path("/new")
SIDES = [("old", OLD), ("new", NEW)]


def test_the_collector_path_alone_is_the_previous_order() -> None:
    steps = plan([300, 30], SIDES, ["collector"], 300)
    assert steps == [
        Step("collector", 300, "old", OLD),
        Step("collector", 300, "new", NEW),
        Step("collector", 30, "new", NEW),
        Step("collector", 30, "old", OLD),
    ]


def test_the_hook_path_runs_the_new_code_after_the_collector_path_extra_periods_last() -> None:
    steps = plan([300, 30], SIDES, ["collector", "hook"], 300, [30])
    assert [(s.path, s.update_s, s.side, s.hook_period_s) for s in steps[4:]] == [
        ("hook", 300, "new", 300),
        ("hook", 30, "new", 300),
        ("hook", 300, "new", 30),
    ]
    assert all(s.code == NEW for s in steps[4:])
    assert all(s.hook_period_s is None for s in steps[:4])


def test_the_hook_path_alone_without_an_old_side() -> None:
    steps = plan([30], [("new", None)], ["hook"], 60)
    assert steps == [Step("hook", 30, "new", None, 60)]


def settings(text: str) -> dict[str, str]:
    """``NAME = value`` lines of a config text, the last of each name winning (as HTCondor)."""
    out = {}
    for line in text.splitlines():
        if " = " in line and not line.lstrip().startswith("#"):
            name, value = line.split(" = ", 1)
            out[name.strip()] = value.strip()
        elif line.rstrip().endswith(" =") and not line.startswith("#"):
            out[line.rstrip()[:-2].strip()] = ""
    return out


def test_hook_config_is_the_deploy_file_with_one_job_per_site() -> None:
    deploy = (DEPLOY / "50-hydrator.conf").read_text(encoding="utf-8")
    text = hook_config(deploy, "http://127.0.0.1:5000", 60, ["SITE_C", "SITE_A", "SITE_C"])
    assert text.startswith(deploy.rstrip("\n"))  # every deploy setting, unchanged
    got = settings(text)
    assert got["HYDRATOR_URL"] == "http://127.0.0.1:5000"
    assert got["STARTD_CRON_HYDRATOR_PERIOD"] == "60"
    assert got["STARTD_CRON_AUTOPUBLISH"] == "Never"
    assert got["STARTD_CRON_JOBLIST"] == "HYDRATOR_SITE_A HYDRATOR_SITE_C"
    for site in ("SITE_A", "SITE_C"):
        job = f"STARTD_CRON_HYDRATOR_{site}"
        assert got[f"{job}_ARGS"] == (
            f"$(STARTD_CRON_HYDRATOR_ARGS) --site {site} --slot-attribute GLIDEIN_Site"
        )
        for key in ("EXECUTABLE", "MODE", "PERIOD", "KILL", "PREFIX"):
            assert got[f"{job}_{key}"] == f"$(STARTD_CRON_HYDRATOR_{key})"


def test_a_glidein_runs_the_deploy_files_job_with_its_own_site_and_cache() -> None:
    got = glidein_hook_settings("g1", "SITE_B")
    assert got == {
        "STARTD_CRON_JOBLIST": "HYDRATOR",
        "GLIDEIN_Site": '"SITE_B"',
        "HYDRATOR_HOOK_CACHE": "$(SPOOL)/hydrator-hook-g1",
    }


def test_the_default_hook_period_is_the_one_both_deploy_files_ship() -> None:
    """The scenario measures the hook at the period operators install, and the GlideinWMS
    snippet ships the same period as the STARTD_CRON config."""
    snippet = (DEPLOY.parent / "glidein" / "hydrator-file-snippet.xml").read_text(encoding="utf-8")
    periods = re.findall(r'period="(\d+)"', snippet)
    assert periods == [str(shipped_period())]
