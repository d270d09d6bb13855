"""The provisioning recipes of docs/provisioning.md, evaluated as their consumers do, over jobs
annotated on the real pool: the GlideinWMS ``match_expr`` (Python ``eval`` with ``job`` and
``glidein`` dicts, the value as a list and as strings), its ``start_expr`` against the pool's
slot ads, and the pyglidein server constraints run by the real ``condor_q`` through a shell."""

from __future__ import annotations

import ast
import html
import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import classad2
import pytest

from tests.pool.annotating import Annotating, jobs_of, submit_idle
from tests.support.pool import EDITOR_IDENTITY, IDLE, SLOT_SITES, Pool

pytestmark = pytest.mark.pool

DOC = Path(__file__).resolve().parents[2] / "docs" / "provisioning.md"
SITES = sorted(set(SLOT_SITES.values()))
# RequiredDatasets -> where the test inventory (tests/pool/annotating.py) holds it completely
VALUES = {
    '{"ska:obs_1", "ska:sky"}': ["SITE_A"],
    '{"ska:obs_2"}': ["SITE_B"],
    '{"ska:sky"}': ["SITE_A", "SITE_B", "SITE_C"],
    '{"ska:obs_9"}': [],
}


def doc_block(opening: str) -> str:
    """The body of the fenced block whose opening line is exactly ``opening``."""
    match = re.search(rf"^{re.escape(opening)}\n(.*?)\n```$", DOC.read_text(), re.S | re.M)
    assert match, f"no block {opening!r} in {DOC}"
    return match.group(1)


MATCH_EXPR = doc_block("```python match_expr")


@pytest.fixture(scope="module")
def annotated_jobs(
    condor_pool: Pool, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[int, list[str]]]:
    """Cluster -> the sites its jobs' data is complete at, after one annotation cycle."""
    pool = condor_pool
    pool.remove_all_jobs()
    token = pool.token_dir_for(EDITOR_IDENTITY, tmp_path_factory.mktemp("editor"))
    hydrator = Annotating(tmp_path_factory.mktemp("hydrator"), pool, token)
    hydrator.write_inventory()
    clusters = {submit_idle(pool, value): sites for value, sites in VALUES.items()}
    pool.wait_for_job_state(max(clusters), [IDLE])
    assert hydrator.once()["jobs"]["edits"] == len(VALUES)
    yield clusters
    pool.remove_all_jobs()


def frontend_job(ad: classad2.ClassAd) -> dict[str, Any]:
    """A job dict as the frontend builds it with the bindings: each attribute evaluated."""
    return {key: ad.eval(key) for key in ad}


def match(job: dict[str, Any], site: str) -> bool:
    glidein = {"attrs": {"GLIDEIN_Site": site}}
    code = compile(MATCH_EXPR, "<match_expr>", "eval")
    return bool(eval(code, {}, {"job": job, "glidein": glidein}))


def test_match_expr_requests_glideins_only_where_the_data_is(
    condor_pool: Pool, annotated_jobs: dict[int, list[str]]
) -> None:
    ads = jobs_of(condor_pool, list(annotated_jobs))
    assert len(ads) == len(VALUES)
    for ad in ads:
        want = annotated_jobs[int(ad["ClusterId"])]
        job = frontend_job(ad)
        assert isinstance(job["DataLocalitySites"], list)  # what the bindings give
        assert [s for s in SITES if match(job, s)] == want, job


def test_match_expr_accepts_the_string_forms_of_the_xml_fallback(
    condor_pool: Pool, annotated_jobs: dict[int, list[str]]
) -> None:
    for cluster, want in annotated_jobs.items():
        printed = condor_pool.run_in_chroot(
            ["condor_q", "-allusers", f"{cluster}.0", "-af", "DataLocalitySites"]
        ).stdout.strip()  # e.g. { "SITE_A","SITE_B" }
        for text in (printed, ",".join(want)):
            assert [s for s in SITES if match({"DataLocalitySites": text}, s)] == want, text
    assert not any(match({}, s) for s in SITES)  # a job not annotated yet matches nowhere


def test_the_frontend_xml_carries_the_same_match_expr() -> None:
    xml = DOC.read_text()
    found = re.search(r'<match match_expr="([^"]*)"\s+start_expr="([^"]*)"', xml)
    assert found
    in_xml = ast.parse(html.unescape(found.group(1)), mode="eval")
    assert ast.dump(in_xml) == ast.dump(ast.parse(MATCH_EXPR, mode="eval"))


def test_start_expr_runs_only_jobs_whose_data_is_at_the_glideins_site(
    condor_pool: Pool, annotated_jobs: dict[int, list[str]]
) -> None:
    found = re.search(r'start_expr="([^"]*)"', DOC.read_text())
    assert found
    start = classad2.ExprTree(html.unescape(found.group(1)))
    slots = condor_pool.slot_ads()
    for job in jobs_of(condor_pool, list(annotated_jobs)):
        want = annotated_jobs[int(job["ClusterId"])]
        for slot in slots:
            assert (start.eval(slot, job) is True) == (slot["GLIDEIN_Site"] in want)


def test_pyglidein_constraints_select_the_jobs_of_their_site(
    condor_pool: Pool, annotated_jobs: dict[int, list[str]]
) -> None:
    lines = [line for line in doc_block("```sh pyglidein").splitlines() if "--constraint" in line]
    assert len(lines) >= 2
    args = shlex.split(lines[0])
    option = args[args.index("--constraint") + 1]  # as pyglidein receives it
    assert "SITE_A" in option
    for site in SITES:
        # pyglidein's server.condor_q: the arguments joined with spaces, run by a shell
        args = ["condor_q", "-global", "-af", "ClusterId", "-constraint", '"JobStatus =?= 1"']
        command = " ".join([*args, "-constraint", option.replace("SITE_A", site), "-allusers"])
        out = condor_pool.run_in_chroot(["bash", "-c", command]).stdout
        selected = {int(line) for line in out.split() if line.isdigit()}
        assert selected == {c for c, sites in annotated_jobs.items() if site in sites}, site
