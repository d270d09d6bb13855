"""The execute-node hook on the test pool: ``deploy/condor/hydrator-classad-hook`` as STARTD_CRON
jobs reading a running daemon's HTTP endpoint, so slot ads carry the site lists durably (the
startd merges the hook's output into every update; collector merges are wiped by each one).

The pool's one startd stands in for three sites, so the hook runs once per site with
``--slot-attribute GLIDEIN_Site`` (each ad merged only into that site's slots); a real execute
node runs one hook (deploy/condor/50-hydrator.conf).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterable
from pathlib import Path

from tests.support.pool import SLOT_SITES, Pool
from tests.support.wait import wait_for

REPO = Path(__file__).resolve().parents[2]
HOOK = REPO / "deploy" / "condor" / "hydrator-classad-hook"
HOOK_PERIOD_S = 2
HOOK_FRAGMENT = "60-hydrator-hook"


def hook_config(url: str, sites: Iterable[str] = ()) -> str:
    """One STARTD_CRON job per site (default: the test pool's), each merged only into that
    site's slots."""
    lines = [f"HYDRATOR_HOOK = {HOOK_IN_CHROOT}"]
    for site in sorted(set(sites) or set(SLOT_SITES.values())):
        job = f"HYDRATOR_{site}"
        lines += [
            f"STARTD_CRON_JOBLIST = $(STARTD_CRON_JOBLIST) {job}",
            f"STARTD_CRON_{job}_EXECUTABLE = $(HYDRATOR_HOOK)",
            f"STARTD_CRON_{job}_ARGS = --url {url} --site {site} --slot-attribute GLIDEIN_Site"
            " --cache-dir $(SPOOL)/hydrator-hook --timeout 2",
            f"STARTD_CRON_{job}_MODE = Periodic",
            f"STARTD_CRON_{job}_PERIOD = {HOOK_PERIOD_S}",
            f"STARTD_CRON_{job}_KILL = True",
        ]
    return "\n".join(lines) + "\n"


HOOK_IN_CHROOT = "/opt/hydrator/hydrator-classad-hook"


def copy_hook(pool: Pool) -> None:
    """The deploy directory's hook into the chroot, at :data:`HOOK_IN_CHROOT`, executable."""
    target = pool.root / HOOK_IN_CHROOT.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(HOOK, target)
    target.chmod(0o755)


def install_hook(pool: Pool, url: str, sites: Iterable[str] = ()) -> None:
    """Copy the hook into the chroot and run it as STARTD_CRON jobs against ``url``."""
    copy_hook(pool)
    pool.write_config(HOOK_FRAGMENT, hook_config(url, sites))
    pool.reconfig()


def remove_hook(pool: Pool) -> None:
    """Undo :func:`install_hook` (the hook's attributes stay in slot ads until the startd
    restarts: :func:`restart_startd`)."""
    pool.remove_config(HOOK_FRAGMENT)
    pool.reconfig()
    spool = pool.run_in_chroot(["condor_config_val", "SPOOL"]).stdout.strip()
    shutil.rmtree(pool.root / spool.lstrip("/") / "hydrator-hook", True)


def restart_startd(pool: Pool) -> None:
    """A new startd: slot ads rebuilt from scratch (only what the hook prints comes back)."""
    pool.run_in_chroot(["condor_restart", "-daemon", "startd"])
    time.sleep(2)
    static = 'SlotType != "Dynamic"'
    ads = wait_for(
        "the startd's four static slots",
        lambda: pool.slot_ads(constraint=static),
        done=lambda a: len(a) == 4,
        timeout_s=30.0,
    )
    assert len(ads) == 4, f"startd back with {len(ads)} slots"
