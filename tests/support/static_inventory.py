"""``hydrator run`` on a static inventory (:class:`tests.support.daemon.Daemon`), as the pool
tests and the locality benchmark run it: three storage endpoints mapped to the pool's three
sites, one-second cycles, the inventory file rewritten while the daemon runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import classad2
import htcondor2
import requests

from tests.support.daemon import Daemon
from tests.support.pool import Pool

CYCLE_S = 1
INVENTORY = {
    "A_DISK": ["ska:obs_1"],
    "B_DISK": ["ska:obs_2", "ska:skymodel_v3"],
    "C_DISK": ["ska:obs_3", "ska:skymodel_v3"],
}
SITES = {"A_DISK": "SITE_A", "B_DISK": "SITE_B", "C_DISK": "SITE_C"}


def write_inventory(directory: Path, inventory: dict[str, list[str]]) -> None:
    """``directory/inventory.toml`` holding ``inventory`` (endpoint -> dataset names), renamed
    into place so the daemon never reads half a file."""
    text = "".join(f"[storage.{e}]\navailable = {names!r}\n\n" for e, names in inventory.items())
    path = directory / "inventory.toml"
    path.with_suffix(".tmp").write_text(text.replace("'", '"'))
    path.with_suffix(".tmp").replace(path)


def write_config(daemon: Daemon, extra: str = "") -> Path:
    """``hydrator.toml`` in the daemon's directory: the static source on ``inventory.toml``,
    :data:`SITES`, cycles of :data:`CYCLE_S` seconds; ``extra`` is appended."""
    sites = "".join(f'{e} = "{s}"\n' for e, s in SITES.items())
    config = daemon.directory / "hydrator.toml"
    config.write_text(
        f'[daemon]\ninterval_s = {CYCLE_S}\njitter_s = 0\nstate_path = "state.sqlite"\n\n'
        f'[http]\nlisten = "{daemon.target}"\nmax_age_s = 1\n\n'
        '[[sources]]\ntype = "static"\nname = "inventory"\npath = "inventory.toml"\n'
        "settle_s = 0\n\n"  # write_inventory renames a complete file into place
        f"[sites]\n{sites}\n[classad]\nupdated_resolution_s = 1\n\n{extra}"
    )
    return config


def start_static(daemon: Daemon, extra_config: str = "") -> None:
    """Write the config (:func:`write_config`) and start the daemon on it (ready within 30 s)."""
    daemon.start(write_config(daemon, extra_config), ready_timeout_s=30.0)


def start_publishing(daemon: Daemon, pool: Pool, merge_min_interval_s: int = 0) -> None:
    """Start with the collector publisher on ``pool`` (refresh slow enough for tests; changed
    slots re-merged every cycle unless ``merge_min_interval_s`` is given)."""
    start_static(
        daemon,
        f'[collector]\nenabled = true\npool = "{pool.collector_address}"\n'
        f'token_dir = "{pool.token_dir}"\nrefresh_s = 600\n'
        f"merge_min_interval_s = {merge_min_interval_s}\n",
    )


def invalidate_site_ads(pool: Pool) -> None:
    """Remove every site ad (``MyType == "DataLocality"``) from the pool's collector, as a
    test's cleanup after a publishing daemon."""
    invalidate = classad2.ClassAd({"MyType": "Query", "TargetType": "DataLocality"})
    invalidate["Requirements"] = classad2.ExprTree('MyType == "DataLocality"')
    pool.advertise([invalidate], "INVALIDATE_ADS_GENERIC")


def expressions(*datasets: str, generic: bool = False) -> str:
    """The submit lines ``hydrator expr`` prints (RequiredDatasets, requirements, rank)."""
    return subprocess.run(
        [sys.executable, "-m", "hydrator", "expr", *datasets, *(["--generic"] if generic else [])],
        capture_output=True,
        text=True,
        check=True,
    ).stdout


TRANSIENT = (requests.RequestException, htcondor2.HTCondorException)
"""What a probe of the daemon or the pool may raise while either is (re)starting: a
:func:`tests.support.wait.wait_for` ``ignore``."""
