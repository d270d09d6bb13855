"""Slot coverage on the real pool: ``hydrator run`` with cycles 600 s apart keeps every slot
ad carrying its site's lists across its startd's own updates (each one wipes what was
merged), through the repair watch (docs/coverage.md), and says so in ``/metrics``.

The pool's startd updates every 5 s, so wipes come on their own. The collector is polled
here directly; the daemon's view is checked only for its metrics.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import classad2
import htcondor2
import pytest
import requests

from tests.support.daemon import Daemon
from tests.support.pool import RUNNING, SLOT_SITES, Pool
from tests.support.static_inventory import (
    INVENTORY,
    SITES,
    TRANSIENT,
    invalidate_site_ads,
    write_inventory,
)
from tests.support.wait import wait_for

pytestmark = [pytest.mark.pool, pytest.mark.slow]

DIGEST = "DataLocalityDigest"
SITE_ADS = 'MyType == "DataLocality"'


def start(daemon: Daemon, pool: Pool, repair_interval_s: float) -> None:
    """The daemon on the static inventory, publishing into ``pool``: one cycle at start, the
    next 600 s later; the default merge settings."""
    sites = "".join(f'{e} = "{s}"\n' for e, s in SITES.items())
    config = daemon.directory / "hydrator.toml"
    config.write_text(
        '[daemon]\ninterval_s = 600\njitter_s = 0\nstate_path = "state.sqlite"\n\n'
        f'[http]\nlisten = "{daemon.target}"\nmax_age_s = 1\n\n'
        '[[sources]]\ntype = "static"\nname = "inventory"\npath = "inventory.toml"\n'
        f"settle_s = 0\n\n[sites]\n{sites}\n"
        f'[collector]\nenabled = true\npool = "{pool.collector_address}"\n'
        f'token_dir = "{pool.token_dir}"\nrepair_interval_s = {repair_interval_s}\n'
    )
    daemon.start(config, ready_timeout_s=30.0)


@pytest.fixture
def daemon(condor_pool: Pool, tmp_path: Path) -> Iterator[Daemon]:
    d = Daemon(tmp_path)
    write_inventory(d.directory, INVENTORY)
    yield d
    d.stop()
    invalidate_site_ads(condor_pool)


def current_digests(pool: Pool) -> dict[str, str]:
    """Site -> the digest its DataLocality ad carries (what the daemon published)."""
    ads = pool.collector.query(htcondor2.AdType.Any, SITE_ADS, ["Name", DIGEST])
    return {str(ad["Name"]): str(ad[DIGEST]) for ad in ads if DIGEST in ad}


def slot1(pool: Pool) -> tuple[int, str | None]:
    """(LastHeardFrom, DataLocalityDigest) of slot1 (SITE_A) as the collector has it now."""
    ad = next(a for a in pool.slot_ads(["LastHeardFrom", DIGEST]) if a["Name"].startswith("slot1@"))
    digest = ad.get(DIGEST)
    return int(ad["LastHeardFrom"]), (str(digest) if digest is not None else None)


def test_a_slot_wiped_by_its_startd_carries_its_lists_again_before_the_next_cycle(
    condor_pool: Pool, daemon: Daemon
) -> None:
    pool = condor_pool
    assert SLOT_SITES["slot1"] == "SITE_A"
    start(daemon, pool, repair_interval_s=1)
    digests = wait_for(
        "site ads",
        lambda: current_digests(pool),
        done=lambda d: len(d) == 3,
        timeout_s=30.0,
        ignore=TRANSIENT,
    )
    want = digests["SITE_A"]
    heard, _ = wait_for(
        "slot1 carries SITE_A's lists",
        lambda: slot1(pool),
        done=lambda seen: seen[1] == want,
        timeout_s=30.0,
        ignore=TRANSIENT,
    )
    # the startd updates slot1 again (every 5 s here), which wipes the merge: slot1 must
    # carry the lists again after that update, with no cycle in between
    later, digest = wait_for(
        "slot1 updated by its startd and carrying SITE_A's lists again",
        lambda: slot1(pool),
        done=lambda seen: seen[0] > heard and seen[1] == want,
        timeout_s=30.0,
        interval_s=0.2,
        ignore=TRANSIENT,
    )
    assert later > heard and digest == want
    assert daemon.metric("hydrator_cycles_total", outcome="ok") == 1.0  # no cycle since
    found = wait_for(
        "the repair counted",
        lambda: daemon.metric("hydrator_slots_found_bare_total", site="SITE_A") or 0.0,
        done=lambda n: n >= 1,
        timeout_s=10.0,
        ignore=TRANSIENT,
    )
    assert found >= 1
    repaired = daemon.metric("hydrator_slot_bare_seconds_count", site="SITE_A") or 0.0
    assert repaired >= 1
    assert (daemon.metric("hydrator_slot_repairs_total", site="SITE_A") or 0.0) >= 1
    assert (daemon.metric("hydrator_slot_repair_queries_total", outcome="ok") or 0.0) >= 1
    ratio = daemon.metric("hydrator_slot_coverage_ratio", site="SITE_A")
    assert ratio is not None and 0.0 <= ratio <= 1.0
    slots = daemon.metric("hydrator_slot_coverage_slots", site="SITE_C", state="current")
    assert slots is not None
    sites = requests.get(f"{daemon.url}/v1/sites", timeout=5).json()["sites"]
    coverage = {s["site"]: s["coverage"] for s in sites}
    assert set(coverage) == {"SITE_A", "SITE_B", "SITE_C"}
    assert coverage["SITE_A"]["slots"] == 1


def show(daemon: Daemon) -> str:
    assert daemon.config is not None
    return subprocess.run(
        [sys.executable, "-m", "hydrator", "show", "--config", str(daemon.config)],
        cwd=daemon.directory,
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def test_show_says_how_many_slot_ads_carry_each_sites_lists(
    condor_pool: Pool, daemon: Daemon
) -> None:
    """Asked of the collector by ``hydrator show`` itself; SITE_C has slot3, slot4 and, while
    a job runs there, a dynamic slot: at least two slot ads."""
    start(daemon, condor_pool, repair_interval_s=1)
    wait_for(
        "every slot carries its site's lists",
        lambda: current_digests(condor_pool),
        done=lambda d: (
            len(d) == 3
            and all(
                a.get(DIGEST) == d[str(a["GLIDEIN_Site"])] for a in condor_pool.slot_ads([DIGEST])
            )
        ),
        timeout_s=30.0,
        ignore=TRANSIENT,
    )
    text = show(daemon)
    lines = [line for line in text.splitlines() if line.startswith("# slot coverage")]
    assert len(lines) == 3, text
    # a sample of a moving pool: slot1 may be between its startd's update and its repair
    assert re.search(r"# slot coverage: [01] of 1 slot ad\(s\) carry these lists", text), text


def test_a_new_slot_carries_its_lists_before_the_next_cycle(
    condor_pool: Pool, daemon: Daemon
) -> None:
    """A job starting in the partitionable slot4 (SITE_C) makes a dynamic slot, a slot ad the
    cycle never saw: it carries SITE_C's lists with no cycle in between."""
    pool = condor_pool
    start(daemon, pool, repair_interval_s=1)
    digests = wait_for(
        "site ads",
        lambda: current_digests(pool),
        done=lambda d: len(d) == 3,
        timeout_s=30.0,
        ignore=TRANSIENT,
    )
    cluster = pool.submit(
        "executable = /bin/sleep\narguments = 600\noutput = /dev/null\nerror = /dev/null\n"
        'requirements = TARGET.GLIDEIN_Site == "SITE_C" && TARGET.PartitionableSlot =?= true\n'
        "queue\n"
    )
    try:
        name = str(pool.wait_for_job_state(cluster, [RUNNING], timeout_s=60)["RemoteHost"])
        ads = wait_for(
            f"the new slot {name} carrying SITE_C's lists",
            lambda: pool.slot_ads([DIGEST], constraint=f"Name == {classad2.quote(name)}"),
            done=lambda ads: bool(ads) and ads[0].get(DIGEST) == digests["SITE_C"],
            timeout_s=30.0,
            interval_s=0.2,
            ignore=TRANSIENT,
        )
        assert ads[0].get(DIGEST) == digests["SITE_C"]
        assert daemon.metric("hydrator_cycles_total", outcome="ok") == 1.0  # no cycle since
    finally:
        pool.run_in_chroot(["condor_rm", str(cluster)], user="submitter", check=False)
