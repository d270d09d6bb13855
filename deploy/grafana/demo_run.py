#!/usr/bin/env python3
"""Reproduce ``docs/dashboard.png``: a real run, scraped by a real Prometheus, drawn by render.py.

    .venv/bin/python deploy/grafana/demo_run.py [--minutes 6] [--no-pool] [--out docs/dashboard.png]

What runs (all on 127.0.0.1, free ports, in a temporary directory; everything is stopped at the
end, also on Ctrl-C):

* ``hydrator run`` on a copy of ``config/demo.toml`` (cycle every 5 s, at most 3 dataset names
  per site ad, so one of SRCNET_CH's is left out) whose inventory also has the test pool's
  sites, with ``[collector]`` enabled so the site lists are merged into the pool's slot ads and
  the matchmaking-quality metrics are read every cycle;
* the real HTCondor test pool (``scripts/condor-pool``, via ``tests/support/pool.py``; unless
  ``--no-pool``, when the matchmaking panels stay empty), with
  data-bound jobs from ``hydrator expr``: two that run where their data is, one pinned to a site
  without its data (remote), one whose data is nowhere, one whose data sits at a site with a free
  slot it is not allowed to use (missed locality);
* Prometheus (Debian package) scraping every 5 s with the shipped alert rules;
* a loop that fetches site ClassAds as glidein hooks do (each site every second, with
  ``If-None-Match``), plus a hook at a site the hydrator does not know (answered 404).

A script changes the world during the run: at 30 % the demo inventory changes (datasets added
and removed), at 50 % it is broken (invalid TOML: the source fails and goes stale), at 65 % it is
restored with one invalid dataset name (skipped and counted). At the end the dashboard is drawn
over the whole run. Needs root for the pool (chroot, mounts) and the ``test`` extra.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from deploy.grafana.render import Prometheus, load_dashboard, render  # noqa: E402
from tests.support.pool import SUBMIT_USER, Pool, running_pool  # noqa: E402
from tests.support.prometheus import (  # noqa: E402
    RULES,
    demo_inventory,
    running_demo_daemon,
    running_prometheus,
)

SCRAPE_S = 5
POOL_INVENTORY = """
[storage.A_DISK]
site = "SITE_A"
available = ["ska:obs_1"]

[storage.B_DISK]
site = "SITE_B"
available = ["ska:obs_2", "ska:skymodel_v3"]

[storage.C_DISK]
site = "SITE_C"
available = ["ska:obs_3", "ska:skymodel_v3"]
"""
SLEEP = "executable = /bin/sleep\narguments = 3600\noutput = /dev/null\nerror = /dev/null\n"


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


@contextlib.contextmanager
def maybe_pool(wanted: bool, tmp: Path) -> Iterator[Pool | None]:
    """The test pool (waiting up to 15 min if another user holds its lock), or None."""
    if not wanted:
        yield None
        return
    log("starting the HTCondor test pool (waits while another user holds its lock)")
    with running_pool(tmp / "token") as pool:
        yield pool


def expressions(*datasets: str) -> str:
    return subprocess.run(
        [sys.executable, "-m", "hydrator", "expr", *datasets],
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def submit(pool: Pool, jobs: list[int], what: str, description: str) -> None:
    jobs.append(pool.submit(SLEEP + description + "queue\n"))
    log(f"submitted job {jobs[-1]}: {what}")


def pinned(dataset: str, site: str) -> str:
    return f'My.RequiredDatasets = {{"{dataset}"}}\nrequirements = GLIDEIN_Site == "{site}"\n'


def edit(inventory: Path, old: str, new: str) -> None:
    text = inventory.read_text()
    if old not in text:
        raise RuntimeError(f"{inventory}: {old!r} not found")
    inventory.write_text(text.replace(old, new))


@contextlib.contextmanager
def hooks_fetching(base: str) -> Iterator[None]:
    """A thread fetching every site's ClassAd each second as hooks do, until the block ends."""
    stop = threading.Event()

    def loop() -> None:
        etags: dict[str, str] = {}
        with requests.Session() as http:
            while not stop.wait(1.0):
                try:
                    sites = [
                        s["site"] for s in http.get(f"{base}/v1/sites", timeout=5).json()["sites"]
                    ]
                    for site in [*sites, "SITE_NOT_MAPPED"]:
                        headers = {"If-None-Match": etags[site]} if site in etags else {}
                        r = http.get(f"{base}/v1/sites/{site}/classad", headers=headers, timeout=5)
                        if r.status_code == 200:
                            etags[site] = r.headers["ETag"]
                except requests.RequestException as exc:
                    log(f"hook fetch failed: {exc}")

    thread = threading.Thread(target=loop, name="hooks", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=10)


def scenario(inventory: Path, pool: Pool | None, jobs: list[int], seconds: float) -> None:
    """Drive the run: jobs, a data change, a broken source, an invalid name."""
    t0 = time.monotonic()

    def at(fraction: float) -> None:
        time.sleep(max(0.0, t0 + fraction * seconds - time.monotonic()))

    if pool is not None:
        submit(pool, jobs, "ska:obs_1 (at SITE_A)", expressions("ska:obs_1"))
        submit(pool, jobs, "ska:obs_3 (at SITE_C)", expressions("ska:obs_3"))
        submit(pool, jobs, "ska:obs_404 (nowhere)", expressions("ska:obs_404"))
    at(0.3)
    log("inventory: two datasets added at SRCNET_ES, one removed at SRCNET_UK")
    edit(
        inventory,
        'available = ["ska:skymodel_v3"]',
        'available = ["ska:skymodel_v3", "ska:obs_2001", "ska:obs_2002"]',
    )
    edit(inventory, 'available = ["ska:obs_1234", "ska:obs_1300"]', 'available = ["ska:obs_1234"]')
    if pool is not None:
        submit(pool, jobs, "ska:obs_2 pinned to SITE_C (remote)", pinned("ska:obs_2", "SITE_C"))
        submit(pool, jobs, "ska:obs_2 pinned to SITE_D (missed)", pinned("ska:obs_2", "SITE_D"))
    at(0.5)
    good = inventory.read_text()
    log("inventory: broken (invalid TOML), the source fails and goes stale")
    inventory.write_text(good + "\n[storage.BROKEN\n")
    at(0.65)
    log("inventory: restored, with one invalid dataset name")
    inventory.write_text(
        good.replace('available = ["ska:obs_1234"]', 'available = ["ska:obs_1234", "ska:bad name"]')
    )
    at(1.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=6.0)
    parser.add_argument("--no-pool", action="store_true", help="do not use the HTCondor pool")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "dashboard.png")
    args = parser.parse_args()
    # SIGTERM unwinds like Ctrl-C, so every process started here is stopped and the pool too
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with tempfile.TemporaryDirectory(prefix="hydrator-dashboard-") as name:
        tmp = Path(name)
        with maybe_pool(not args.no_pool, tmp) as pool:
            # appended to demo.toml, whose last table is [classad]: a budget SRCNET_CH exceeds
            extra = "max_datasets_per_site = 3\n"
            if pool is not None:
                extra += (
                    f'\n[collector]\nenabled = true\npool = "{pool.collector_address}"\n'
                    f'token_dir = "{pool.token_dir}"\n'
                )
            jobs: list[int] = []
            with (
                running_demo_daemon(
                    tmp / "hydrator",
                    interval_s=SCRAPE_S,
                    extra_config=extra,
                    extra_inventory=POOL_INVENTORY if pool is not None else "",
                ) as daemon,
                running_prometheus(
                    tmp / "prometheus",
                    [daemon.target],
                    scrape_interval_s=SCRAPE_S,
                    rule_files=[RULES],
                ) as prom,
            ):
                log(f"hydrator {daemon.target}, prometheus {prom.url}; {args.minutes} minutes")
                start = time.time()
                try:
                    with hooks_fetching(f"http://{daemon.target}"):
                        scenario(demo_inventory(daemon), pool, jobs, args.minutes * 60)
                    end = time.time()
                    prometheus = Prometheus(prom.url, SCRAPE_S)
                    render(load_dashboard(), prometheus, start, end, args.out)
                    log(f"wrote {args.out}")
                finally:
                    if pool is not None and jobs:
                        pool.run_in_chroot(
                            ["condor_rm", *map(str, jobs)], user=SUBMIT_USER, check=False
                        )


if __name__ == "__main__":
    main()
