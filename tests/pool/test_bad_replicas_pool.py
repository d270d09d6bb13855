"""Bad and temporarily unavailable replicas end to end: ``hydrator run`` on the
real Rucio server (two RSEs at SITE_A, one at SITE_B), publishing into the real pool's slot ads
and annotating idle jobs. A file declared bad, and one set TEMPORARY_UNAVAILABLE by
``rucio-minos`` as production runs it, make their dataset partial at that site in
``hydrator show``, ``/v1/sites/SITE_A``, SITE_A's slot ad and the jobs' ``DataLocalitySites``
within one cycle of the change; a dataset complete at the site's other RSE stays; the
necromancer and abacus change nothing the pool sees afterwards; the expired replica
(``rucio-minos-temporary-expiration``) brings the dataset back within one cycle. The delays
are printed (``-s``): benchmarks/results/bad_replicas_pool.json holds them, README quotes them."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import classad2
import pytest
import requests

from tests.pool.annotating import annotated, jobs_of, submit_idle
from tests.support.daemon import Daemon
from tests.support.pool import IDLE, SLOT_SITES, Pool
from tests.support.rucio_server import RucioAdmin, RucioServer, unique
from tests.support.static_inventory import TRANSIENT, invalidate_site_ads
from tests.support.wait import wait_for

pytestmark = [pytest.mark.pool, pytest.mark.rucio, pytest.mark.slow]

INTERVAL_S = 2


@dataclass(frozen=True)
class Seen:
    """What each of the four consumers says of SITE_A: complete and partial dataset names."""

    show: tuple[frozenset[str], frozenset[str]]
    http: tuple[frozenset[str], frozenset[str]]
    slot: tuple[frozenset[str], frozenset[str]] | None
    """None: wiped by the startd at that moment (see :func:`slot_a`)."""
    jobs: tuple[tuple[list[str] | None, list[str] | None], ...]
    """Each job's (DataLocalitySites, DataLocalityPartialSites), in submission order."""


def write_config(d: Daemon, pool: Pool, server: RucioServer, tag: str) -> Path:
    path = d.directory / "hydrator.toml"
    path.write_text(
        f'[daemon]\ninterval_s = {INTERVAL_S}\njitter_s = 0\nstate_path = "state.sqlite"\n\n'
        f'[http]\nlisten = "{d.target}"\nmax_age_s = 1\n\n'
        '[[sources]]\ntype = "rucio"\nname = "rucio"\n'
        f'rucio_host = "{server.url}"\nauth_host = "{server.url}"\naccount = "root"\n'
        f'auth_type = "userpass"\nusername = "{server.username}"\n'
        f'password_file = "{server.password_file}"\nrse_expression = "fed={tag}"\n\n'
        "[classad]\nupdated_resolution_s = 1\n\n"
        f'[collector]\nenabled = true\npool = "{pool.collector_address}"\n'
        f'token_dir = "{pool.token_dir}"\nrefresh_s = 600\nmerge_min_interval_s = 0\n\n'
        "[jobs]\nannotate = true\n"
    )
    return path


def names(value: Any) -> frozenset[str]:
    return frozenset() if value is None else frozenset(str(v) for v in value)


def shown(d: Daemon) -> tuple[frozenset[str], frozenset[str]]:
    """SITE_A's AvailableDatasets and PartialDatasets as ``hydrator show SITE_A`` prints them."""
    done = subprocess.run(
        [sys.executable, "-m", "hydrator", "show", "SITE_A", "--config", str(d.config)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    body = "".join(line + "\n" for line in done.stdout.splitlines() if not line.startswith("#"))
    ad = classad2.parseOne(body)
    return names(ad.get("AvailableDatasets")), names(ad.get("PartialDatasets"))


def served(d: Daemon) -> tuple[frozenset[str], frozenset[str]]:
    site = requests.get(f"{d.url}/v1/sites/SITE_A", timeout=5).json()
    return frozenset(site["available"]), frozenset(p["dataset"] for p in site["partial"])


def slot_a(pool: Pool) -> tuple[frozenset[str], frozenset[str]] | None:
    """SITE_A's slot's lists; None while its startd's own update has wiped the merge (every
    UPDATE_INTERVAL, 5 s on the test pool; the daemon merges again in its next cycle)."""
    (ad,) = [
        ad
        for ad in pool.slot_ads(["AvailableDatasets", "PartialDatasets"])
        if str(ad["Name"]).startswith("slot1@")
    ]
    if "AvailableDatasets" not in ad:
        return None
    return names(ad.get("AvailableDatasets")), names(ad.get("PartialDatasets"))


def total(d: Daemon, metric: str) -> float:
    """A counter's samples summed over its labels (AssertionError if it is not exported)."""
    samples = [v for (name, _), v in d.metrics().items() if name == metric]
    assert samples, f"{metric} not exported"
    return sum(samples)


def cycles(d: Daemon) -> float:
    """Cycles the daemon finished, whatever their outcome."""
    return total(d, "hydrator_cycles_total")


def agrees(got: Seen, want: Seen) -> bool:
    """``got`` says ``want``, a slot ad caught between its startd's update and the next merge
    (no lists at all) aside."""
    return got == want or (got.slot is None and got == dataclasses.replace(want, slot=None))


@dataclass
class Scene:
    d: Daemon
    pool: Pool
    server: RucioServer
    admin: RucioAdmin
    scope: str
    rse_a1: str
    rse_a2: str
    rse_b: str
    both_a: str  # complete at A1 and A2 (SITE_A): a bad file at A1 leaves it complete
    a1_and_b: str  # complete at A1 and B: a bad file at A1 makes it partial at SITE_A
    a1_only: str  # complete at A1 only: set TEMPORARY_UNAVAILABLE there
    jobs: tuple[int, ...]

    def seen(self) -> Seen:
        return Seen(
            show=shown(self.d),
            http=served(self.d),
            slot=slot_a(self.pool),
            jobs=tuple(annotated(ad) for ad in jobs_of(self.pool, self.jobs)),
        )

    def expect(self, complete: set[str], partial: set[str]) -> Seen:
        """SITE_A as every consumer must say it (jobs: one per dataset, SITE_B holding
        a1_and_b whole)."""
        a = (frozenset(self.did(n) for n in complete), frozenset(self.did(n) for n in partial))

        def job(name: str) -> tuple[list[str], list[str]]:
            sites = (["SITE_A"] if name in complete else []) + (
                ["SITE_B"] if name == self.a1_and_b else []
            )
            return sites, (["SITE_A"] if name in partial else [])

        return Seen(show=a, http=a, slot=a, jobs=tuple(job(n) for n in self.datasets))

    @property
    def datasets(self) -> tuple[str, str, str]:
        return (self.both_a, self.a1_and_b, self.a1_only)

    def did(self, name: str) -> str:
        return f"{self.scope}:{name}"

    def slot_says(self, what: str, want: Seen, started: float, timeout_s: float) -> float:
        """Seconds from ``started`` (monotonic) until SITE_A's slot ad says ``want``."""
        wait_for(
            f"{what}: SITE_A's slot ad",
            lambda: slot_a(self.pool),
            done=lambda got: got == want.slot,
            timeout_s=timeout_s,
            interval_s=0.1,
            ignore=TRANSIENT,
        )
        return time.monotonic() - started

    def within_one_cycle(self, what: str, want: Seen, started: float) -> float:
        """Seconds from ``started`` (monotonic) until SITE_A's slot ad says ``want``; then, once
        the daemon has finished the cycle after the one running at the change, every consumer
        must say ``want``."""
        first = cycles(self.d)
        delay = self.slot_says(what, want, started, timeout_s=60.0)
        wait_for(
            f"{what}: a whole cycle after the change",
            lambda: cycles(self.d),
            done=lambda n: n >= first + 2,
            timeout_s=60.0,
            ignore=TRANSIENT,
        )
        got = self.seen()
        assert agrees(got, want), (what, got)
        return delay

    def steady(self, what: str, want: Seen, cycles_n: int = 3) -> None:
        """``want`` through ``cycles_n`` more cycles, and no change planned: nothing flaps.

        The cycle running when the Rucio daemon ended, and one begun after it, are let pass
        first: a daemon's last write (the necromancer queueing a bad file's recovery) may land
        at the end of its run and be planned once then (a transfer towards the site, not in
        the lists checked here); a change planned again after that would be flapping."""
        settled = cycles(self.d) + 2
        wait_for(
            f"{what}: a cycle begun after it",
            lambda: cycles(self.d),
            done=lambda n: n >= settled,
            timeout_s=60.0,
            ignore=TRANSIENT,
        )
        first, merged = cycles(self.d), 0
        changes = total(self.d, "hydrator_changes_total")
        while cycles(self.d) < first + cycles_n:
            got = self.seen()
            assert agrees(got, want), (what, got)
            merged += got.slot is not None
            time.sleep(0.5)
        assert merged > 0, f"{what}: the slot ad never carried the lists"
        changed = total(self.d, "hydrator_changes_total") - changes
        print(f"{what}: {changed:.0f} changes planned in {cycles_n} cycles")
        assert changed == 0, f"{what}: {changed:.0f} changes planned"


@pytest.fixture
def scene(
    condor_pool: Pool, rucio_server: RucioServer, rucio_admin: RucioAdmin, tmp_path: Path
) -> Iterator[Scene]:
    pool, admin = condor_pool, rucio_admin
    assert SLOT_SITES["slot1"] == "SITE_A" and SLOT_SITES["slot2"] == "SITE_B"
    pool.remove_all_jobs()
    tag = unique("br").lower()
    fed = {"fed": tag}
    a1, a2 = admin.rse("SITE_A", attributes=fed), admin.rse("SITE_A", attributes=fed)
    b = admin.rse("SITE_B", attributes=fed)
    scope = admin.scope()
    both_a = admin.dataset(scope, 3, at=[a1, a2])
    a1_and_b = admin.dataset(scope, 3, at=[a1, b])
    a1_only = admin.dataset(scope, 3, at=[a1])
    for name, rse in ((both_a, a1), (both_a, a2), (a1_and_b, a1), (a1_and_b, b), (a1_only, a1)):
        admin.rule(scope, name, rse)
    rucio_server.run_abacus()
    jobs = tuple(submit_idle(pool, f'{{"{scope}:{n}"}}') for n in (both_a, a1_and_b, a1_only))
    for job in jobs:
        pool.wait_for_job_state(job, [IDLE])
    d = Daemon(tmp_path)
    d.start(write_config(d, pool, rucio_server, tag), ready_timeout_s=60.0)
    try:
        yield Scene(d, pool, rucio_server, admin, scope, a1, a2, b, both_a, a1_and_b, a1_only, jobs)
    finally:
        d.stop()
        invalidate_site_ads(pool)
        pool.remove_all_jobs()


def watched(s: Scene, daemon: str, want: Seen) -> tuple[float, float]:
    """Run the Rucio ``daemon`` once (in a thread) while watching SITE_A's slot ad: seconds from
    its start until the slot ad says ``want``, and seconds it ran. Then, a whole cycle after it
    ended, every consumer must say ``want``."""
    outcome: list[BaseException | float] = []

    def run() -> None:
        try:
            s.server.run_daemon(daemon)
            outcome.append(time.monotonic())
        except BaseException as exc:  # re-raised in the test's thread
            outcome.append(exc)

    started = time.monotonic()
    thread = threading.Thread(target=run, name=daemon)
    thread.start()
    try:
        seen_s = s.slot_says(daemon, want, started, timeout_s=150.0)
    finally:
        thread.join(150.0)
    (ended,) = outcome
    if isinstance(ended, BaseException):
        raise ended
    s.within_one_cycle(f"after {daemon}", want, ended)
    return seen_s, ended - started


def timed(run: Any) -> float:
    started = time.monotonic()
    run()
    return time.monotonic() - started


def pfn_of(admin: RucioAdmin, scope: str, name: str, rse: str) -> str:
    (record,) = admin.client.list_replicas([{"scope": scope, "name": name}], schemes=["file"])
    return str(record["rses"][rse][0])


def test_bad_and_unavailable_replicas_reach_the_pool_within_one_cycle(scene: Scene) -> None:
    s = scene
    every = {s.both_a, s.a1_and_b, s.a1_only}
    start = s.expect(every, set())
    wait_for(
        "the first cycles published",
        s.seen,
        done=lambda got: got == start,
        timeout_s=60.0,
        ignore=TRANSIENT,
    )
    delays: dict[str, float] = {}

    # a file of each of two datasets declared bad at A1: only the one SITE_A holds nowhere else
    # becomes partial there, at once (the summary row still says complete)
    declared = time.monotonic()
    s.admin.client.declare_bad_file_replicas(
        [
            {"scope": s.scope, "name": f"{s.both_a}.f000", "rse": s.rse_a1},
            {"scope": s.scope, "name": f"{s.a1_and_b}.f000", "rse": s.rse_a1},
        ],
        "checksum mismatch (hydrator test)",
    )
    bad = s.expect({s.both_a, s.a1_only}, {s.a1_and_b})
    delays["declared bad -> slot ad"] = s.within_one_cycle("declared bad", bad, declared)

    # the daemons as production runs them: the pool sees nothing more (no flapping)
    delays["rucio-necromancer run"] = timed(lambda: s.server.run_daemon("rucio-necromancer"))
    s.steady("after the necromancer", bad)
    delays["rucio-abacus-collection-replica run"] = timed(s.server.run_abacus)
    s.steady("after abacus", bad)

    # a replica of a1_only set TEMPORARY_UNAVAILABLE: a bad PFN, applied by rucio-minos
    expires = datetime.now(UTC).replace(tzinfo=None) + timedelta(seconds=60)
    s.admin.client.add_bad_pfns(
        [pfn_of(s.admin, s.scope, f"{s.a1_only}.f002", s.rse_a1)],
        "storage maintenance (hydrator test)",
        state="TEMPORARY_UNAVAILABLE",
        expires_at=expires.strftime("%Y-%m-%dT%H:%M:%S.%f"),
    )
    s.steady("a bad PFN waits for rucio-minos", bad, cycles_n=2)
    unavailable = s.expect({s.both_a}, {s.a1_and_b, s.a1_only})
    seen_s, ran_s = watched(s, "rucio-minos", unavailable)
    delays["rucio-minos started -> slot ad"], delays["rucio-minos run"] = seen_s, ran_s
    s.steady("temporarily unavailable, steady", unavailable)

    # expired: rucio-minos-temporary-expiration deletes the record, the dataset is whole again
    time.sleep(max(0.0, (expires - datetime.now(UTC).replace(tzinfo=None)).total_seconds()))
    seen_s, ran_s = watched(s, "rucio-minos-temporary-expiration", bad)
    delays["expiration started -> slot ad"] = seen_s
    delays["rucio-minos-temporary-expiration run"] = ran_s
    s.steady("expired, steady", bad)
    for what, seconds in delays.items():
        print(f"{what}: {seconds:.1f} s (cycle interval {INTERVAL_S} s)")
