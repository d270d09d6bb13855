"""Rapthor's engine for real: a CWL workflow under the real Toil (``toil-cwl-runner
--batchSystem htcondor``, 9.6.0 with the ``htcondor`` 23.10.29 bindings) on the test pool, with
``TOIL_HTCONDOR_PARAMS`` from ``hydrator expr --toil`` and the hydrator daemon publishing from the
real Rucio server into the slot ads (through the execute-node hook).

The workflow (``rapthor/`` here): calibrate over N directions (a scatter; reads the
observation), then image (reads the sky model). Every job writes the site of its slot; the
schedd's history gives each job's match-time site (``MATCH_EXP_MatchedSite``) and the datasets
it declared. Pool sites: SITE_A (slot1), SITE_B (slot2), SITE_C (slot3, slot4).
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import pytest

from tests.support.daemon import Daemon
from tests.support.pool import Pool
from tests.support.pool_hook import install_hook, remove_hook, restart_startd
from tests.support.rucio_server import RucioAdmin, RucioServer, unique
from tests.support.toil import ToilOnPool, ToilRun, toil_on_pool
from tests.support.wait import wait_for

pytestmark = [pytest.mark.pool, pytest.mark.rucio, pytest.mark.toil]

WORKFLOW = Path(__file__).parent / "rapthor"
DIRECTIONS = ["d1", "d2"]
CALIBRATE_ONLY = "calibrate-all.cwl"  # the scatter alone: one round of matching, not two
SITES = ("SITE_A", "SITE_B", "SITE_C")
MATCHED_SITE = '+MatchedSite = "$$(GLIDEIN_Site)"'  # the slot's site, recorded at match time
FALLBACK_S = 8
PLACED = {
    "obs": ("SITE_C",),
    "sky": ("SITE_A", "SITE_C"),
    "obs_b": ("SITE_B",),
    "obs_a": ("SITE_A",),
}


@dataclass
class Data:
    """RSEs (one per pool site) and datasets in the real Rucio server, isolated by ``tag``."""

    admin: RucioAdmin
    server: RucioServer
    tag: str
    rses: dict[str, str]  # site -> RSE
    scope: str
    rules: dict[str, dict[str, str]]  # DID -> site -> rule id
    dids: dict[str, str] = field(default_factory=dict)  # role (PLACED) -> DID

    def place(self, *sites: str) -> str:
        """A new two-file dataset complete at ``sites`` (a rule each); its DID. The summary
        table the source reads is filled by the next abacus run."""
        name = self.admin.dataset(self.scope, 2, at=[self.rses[s] for s in sites])
        did = f"{self.scope}:{name}"
        self.rules[did] = {s: self.admin.rule(self.scope, name, self.rses[s]) for s in sites}
        return did

    def move(self, did: str, source: str, target: str) -> None:
        """A new complete replica at ``target`` (rule, files arrived), the one at ``source``
        removed (rule, locks, replicas and summary row gone)."""
        name, rules = did.split(":", 1)[1], self.rules[did]
        rules[target] = self.admin.rule(self.scope, name, self.rses[target])
        files = self.admin.files(self.scope, name)
        self.admin.set_file_states(self.rses[target], self.scope, files, "A")
        self.admin.remove_rule_now(rules.pop(source), self.rses[source])


@pytest.fixture(scope="module")
def data(rucio_server: RucioServer, rucio_admin: RucioAdmin) -> Data:
    """Every test's datasets, placed at once (one abacus run: each costs seconds):
    ``obs`` at SITE_C, ``sky`` at SITE_A and SITE_C, ``obs_b`` at SITE_B and ``obs_a`` at
    SITE_A (one slot each)."""
    tag = unique("t").lower()
    rses = {site: rucio_admin.rse(site, attributes={"fed": tag}) for site in SITES}
    d = Data(rucio_admin, rucio_server, tag, rses, rucio_admin.scope(), {})
    for role, sites in PLACED.items():
        d.dids[role] = d.place(*sites)
    rucio_server.run_abacus()
    return d


@pytest.fixture(scope="module")
def publishing(
    condor_pool: Pool,
    rucio_server: RucioServer,
    data: Data,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Pool]:
    """``hydrator run`` on the Rucio server's RSEs of ``data``, served over HTTP to the
    execute-node hook, which puts each site's lists into its slots durably. (Collector merges
    are wiped by every startd update until the next cycle; on this pool the startd's 5 s updates
    and the negotiator's 5 s cycles fell into step and a strict job waited 55 s for a match.)"""
    daemon = Daemon(tmp_path_factory.mktemp("hydrator"))
    directory = daemon.directory
    config = directory / "hydrator.toml"
    config.write_text(
        f'[daemon]\ninterval_s = 1\njitter_s = 0\nstate_path = "{directory}/state.sqlite"\n\n'
        f'[http]\nlisten = "{daemon.target}"\nmax_age_s = 1\n\n'
        '[[sources]]\ntype = "rucio"\nname = "rucio"\n'
        f'rucio_host = "{rucio_server.url}"\nauth_host = "{rucio_server.url}"\n'
        f'account = "root"\nauth_type = "userpass"\nusername = "{rucio_server.username}"\n'
        f'password_file = "{rucio_server.password_file}"\nrse_expression = "fed={data.tag}"\n\n'
        "[classad]\nupdated_resolution_s = 1\n"
    )
    daemon.start(config, ready_timeout_s=60.0)
    try:
        install_hook(condor_pool, daemon.url, SITES)
        yield condor_pool
    finally:
        daemon.stop()
        remove_hook(condor_pool)
        restart_startd(condor_pool)  # drop the hook's attributes from the slot ads


@pytest.fixture(scope="module")
def toil(publishing: Pool) -> Iterator[ToilOnPool]:
    publishing.remove_all_jobs()  # earlier modules' jobs would take slots the runs expect
    with toil_on_pool(publishing) as t:
        yield t


def sites_holding(pool: Pool, did: str) -> set[str]:
    """Sites whose static slots now advertise ``did`` as available."""
    ads = pool.slot_ads(["AvailableDatasets"], constraint='SlotType != "Dynamic"')
    return {str(ad["GLIDEIN_Site"]) for ad in ads if did in (ad.get("AvailableDatasets") or [])}


def wait_published(pool: Pool, did: str, sites: set[str]) -> None:
    seen = wait_for(
        "sites advertising the dataset",
        lambda: sites_holding(pool, did),
        done=lambda s: s == sites,
        timeout_s=60.0,
    )
    assert seen == sites, f"{did} advertised at {seen}, expected {sites}"


def toil_params(*args: str) -> str:
    """The value ``hydrator expr --toil ARGS`` exports, plus the match-time site record."""
    line = subprocess.run(
        [sys.executable, "-m", "hydrator", "expr", "--toil", *args],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    words = shlex.split(line)  # ["export", "TOIL_HTCONDOR_PARAMS=<value>"]
    assert words[0] == "export" and words[1].startswith("TOIL_HTCONDOR_PARAMS=")
    return words[1].split("=", 1)[1] + "; " + MATCHED_SITE


def datasets(row: dict[str, object]) -> list[str]:
    """The job's RequiredDatasets (classad2 is untyped: a ClassAd list arrives as a list)."""
    return list(cast("list[str]", row["RequiredDatasets"]))


def ran_at(
    toil: ToilOnPool, run: ToilRun, jobs: int = len(DIRECTIONS) + 1
) -> list[tuple[str, str, list[str]]]:
    """(ToilJobName, match-time site, RequiredDatasets) per job, from the schedd's history of
    the run's ``jobs`` jobs; checks it agrees with what each job wrote about itself."""
    rows = toil.history(run, expected=jobs)
    assert len(rows) == jobs, rows
    by_cluster = {int(str(r["ClusterId"])): r for r in rows}
    for record in run.records:
        assert by_cluster[record.cluster]["MATCH_EXP_MatchedSite"] == record.site, record
    assert all(int(str(r["ExitCode"])) == 0 for r in rows), rows
    return [(str(r["ToilJobName"]), str(r["MATCH_EXP_MatchedSite"]), datasets(r)) for r in rows]


def test_strict_run_lands_every_job_at_its_data_then_follows_a_move_per_step(
    toil: ToilOnPool, data: Data
) -> None:
    pool = toil.pool
    obs, sky = data.dids["obs"], data.dids["sky"]
    wait_published(pool, obs, {"SITE_C"})
    wait_published(pool, sky, {"SITE_A", "SITE_C"})

    strict = toil.run(WORKFLOW, {"directions": DIRECTIONS}, toil_params(obs, sky))
    print(f"strict run: {strict.seconds:.0f} s")
    jobs = ran_at(toil, strict)
    assert all(site == "SITE_C" for _, site, _ in jobs), jobs  # the only site with both
    assert all(set(required) == {obs, sky} for _, _, required in jobs), jobs
    assert {r.label for r in strict.records} == {*DIRECTIONS, "image"}

    # the observation moves to SITE_B: no site holds both any more, so the run-wide form
    # would wait for ever; per step (deploy/toil plugin) calibrate follows the observation
    # and image goes where the sky model is
    data.move(obs, "SITE_C", "SITE_B")
    wait_published(pool, obs, {"SITE_B"})
    steps = toil.shared / "steps.json"
    by_tool = {"calibrate.cwl": obs, "image.cwl": sky}
    steps.write_text(json.dumps({t: f'+RequiredDatasets = {{"{d}"}}' for t, d in by_tool.items()}))
    per_step = toil.run(
        WORKFLOW,
        {"directions": DIRECTIONS},
        toil_params("--generic", obs, sky),
        batch_system="htcondor_steps",
        extra_env={
            "PYTHONPATH": str(toil.shared / "plugins"),
            "TOIL_HTCONDOR_STEP_PARAMS": str(steps),
        },
    )
    print(f"per-step run after the move: {per_step.seconds:.0f} s")
    jobs = ran_at(toil, per_step)
    calibrate = [(s, r) for name, s, r in jobs if name.endswith(".calibrate.cwl")]
    image = [(s, r) for name, s, r in jobs if name.endswith(".image.cwl")]
    assert calibrate == [("SITE_B", [obs])] * len(DIRECTIONS), jobs
    assert len(image) == 1 and image[0][0] in {"SITE_A", "SITE_C"} and image[0][1] == [sky]


def test_rank_only_prefers_the_data_but_spills_at_once(toil: ToilOnPool, data: Data) -> None:
    """Three jobs ranking a dataset one slot holds: one runs there, the backlog elsewhere at
    once (that alone also holds for most placements of three jobs on four slots without any
    rank). So, the check the rank alone passes: one job ranking SITE_B's dataset, then one
    ranking SITE_A's, each with all four slots free: each runs at its dataset's site. Without
    the rank the negotiator sees four equal slots; no one way of breaking that tie puts the
    two runs at two different sites."""
    obs_b, obs_a = data.dids["obs_b"], data.dids["obs_a"]  # one slot holds each
    wait_published(toil.pool, obs_b, {"SITE_B"})
    wait_published(toil.pool, obs_a, {"SITE_A"})
    directions = ["d1", "d2", "d3"]
    params = toil_params("--rank-only", obs_b)
    run = toil.run(WORKFLOW, {"directions": directions}, params, entry=CALIBRATE_ONLY)
    print(f"rank-only run: {run.seconds:.0f} s")
    sites = [site for _, site, _ in ran_at(toil, run, jobs=len(directions))]
    assert "SITE_B" in sites, sites  # preferred while free
    assert set(sites) - {"SITE_B"}, sites  # and the backlog ran elsewhere, not waiting
    for did, site in ((obs_b, "SITE_B"), (obs_a, "SITE_A")):
        one = toil.run(
            WORKFLOW, {"directions": ["d1"]}, toil_params("--rank-only", did), entry=CALIBRATE_ONLY
        )
        assert [s for _, s, _ in ran_at(toil, one, jobs=1)] == [site], (did, site)


def test_fallback_waits_for_the_data_then_runs_anywhere(toil: ToilOnPool, data: Data) -> None:
    # held nowhere (strict would wait for ever); a name with the characters CMS block names use,
    # to show they pass Toil's ';'/'=' split and the old bindings unchanged
    nowhere = f"{data.scope}:/Prim/{unique('absent')}/AOD#1a2b=c"
    params = toil_params("--fallback-after", str(FALLBACK_S), nowhere)
    run = toil.run(WORKFLOW, {"directions": DIRECTIONS}, params, entry=CALIBRATE_ONLY)
    print(f"fallback run ({FALLBACK_S} s): {run.seconds:.0f} s")
    rows = toil.history(run, expected=len(DIRECTIONS))
    assert len(rows) == len(DIRECTIONS), rows
    for row in rows:
        waited = int(str(row["JobCurrentStartDate"])) - int(str(row["QDate"]))
        assert waited >= FALLBACK_S, row  # not before the bound
        assert int(str(row["ExitCode"])) == 0, row
        assert datasets(row) == [nowhere], row


PLUGIN_CHECKS = """
import json, sys, tempfile
import toil_batch_system_hydrator as p
from toil.batchSystems.registry import get_batch_systems
assert "htcondor_steps" in get_batch_systems()
assert p.parse_pairs("a = 1; ;b = x=y;") == {"a": "1", "b": "x=y"}
with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
    json.dump({"calibrate.cwl": "+RequiredDatasets = {1}", "cwl": "rank = 2"}, f)
    f.flush()
    steps = p.load_step_params(f.name)
assert p.pairs_for("workflow.cwl.0.calibrate.cwl", steps) == {"+RequiredDatasets": "{1}"}
assert p.pairs_for("workflow.cwl.image.image.cwl", steps) == {"rank": "2"}
assert p.pairs_for("xcalibrate.cwl", steps) == {"rank": "2"}  # whole dotted parts only
assert p.classad_string('a"b\\\\c') == '"a\\\\"b\\\\\\\\c"'
try:
    p.parse_pairs("rank = 1; oops")
except ValueError as e:
    print(e)
"""


def test_plugin_keys_steps_and_names_a_bad_pair(toil: ToilOnPool) -> None:
    """The plugin in Toil's own environment: registered under Toil's plugin entry point, keys
    match whole dotted parts, and a pair without '=' is one error naming it."""
    out = subprocess.run(
        [str(toil.tree / "venv" / "bin" / "python"), "-c", PLUGIN_CHECKS],
        env={"PYTHONPATH": str(toil.shared / "plugins"), "CONDOR_CONFIG": "/dev/null"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "TOIL_HTCONDOR_STEP_PARAMS: 'oops' is not 'name = value'"
