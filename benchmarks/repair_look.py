"""What one repair look costs a real collector holding many slot ads.

Starts a ``condor_collector`` of its own (the test pool's 25.14 binaries, run outside the
chroot on a free port with its own configuration, so the shared pool is not touched), fills
it with ``--slots`` slot ads (about the size of a real static slot ad, ``GLIDEIN_Site`` one of
``--sites``, all carrying their site's current digest but ``--uncovered`` of them), then makes
``--looks`` repair looks exactly as the daemon does (the publisher's query: the slot ads of our
sites lacking their site's current digest, leaving out those merged within
``merge_min_interval_s``) and reports per look: the client's wall time, the collector's CPU
(its own and its reaped query children's, from ``/proc``), and whether the collector forked a
child for it or answered in-process (its ``ForkQueriesFromTOOL``/``InProcQueriesFromTOOL``).

    .venv/bin/python -m benchmarks repair-look --slots 20000 --looks 200 --json out.json

Needs root only to read the collector's ``/proc`` entries if it runs as another user (it runs
as the caller here).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import classad2
import htcondor2

from benchmarks.local_servers import TEST_CACHE, free_port, wait_for
from hydrator.adapters.htcondor.collector import MERGED_ATTRIBUTE
from hydrator.core.slot_coverage import Current, stale_constraint
from hydrator.domain import Site

ROOT = TEST_CACHE / "condor-chroot"  # the test pool's chroot (tests/support/pool.py builds it)
LIBS = ["usr/lib/x86_64-linux-gnu", "lib/x86_64-linux-gnu", "usr/lib/condor", "usr/lib"]
CLK_TCK = os.sysconf("SC_CLK_TCK")
DIGEST = "DataLocalityDigest"


def collector_config(directory: Path, port: int) -> Path:
    path = directory / "condor_config"
    dirs = {name: directory / name for name in ("log", "spool", "run", "lock")}
    for d in dirs.values():
        d.mkdir()
    lines = [
        f"LOCAL_DIR = {directory}",
        *(f"{name.upper()} = {d}" for name, d in dirs.items()),
        f"RELEASE_DIR = {ROOT}/usr",
        f"LIB = {ROOT}/usr/lib/condor",
        f"SBIN = {ROOT}/usr/sbin",
        f"BIN = {ROOT}/usr/bin",
        f"LIBEXEC = {ROOT}/usr/libexec/condor",
        "CONDOR_IDS = 0.0",
        "CONDOR_HOST = 127.0.0.1",
        f"COLLECTOR_HOST = 127.0.0.1:{port}",
        "NETWORK_INTERFACE = 127.0.0.1",
        "ENABLE_IPV6 = false",
        "USE_SHARED_PORT = false",
        "SEC_DEFAULT_AUTHENTICATION = OPTIONAL",
        "SEC_DEFAULT_AUTHENTICATION_METHODS = CLAIMTOBE",
        *(f"ALLOW_{level} = *" for level in ("READ", "WRITE", "DAEMON", "NEGOTIATOR")),
        "ALLOW_ADVERTISE_STARTD = *",
        "COLLECTOR_UPDATE_INTERVAL = 5",
        "CLASSAD_LIFETIME = 3600",
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


@contextmanager
def collector(directory: Path) -> Iterator[tuple[str, int]]:
    """A collector of the chroot's binaries on a free port: (address, pid)."""
    port = free_port()
    env = {**os.environ, "CONDOR_CONFIG": str(collector_config(directory, port))}
    loader = str(ROOT / "lib64/ld-linux-x86-64.so.2")
    libs = ":".join(str(ROOT / lib) for lib in LIBS)
    binary = str(ROOT / "usr/sbin/condor_collector")
    args = [loader, "--library-path", libs, binary, "-f", "-p", str(port)]
    with open(directory / "out.log", "wb") as out:
        proc = subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT)
    address = f"127.0.0.1:{port}"
    try:
        wait_for(
            "the collector answering",
            lambda: htcondor2.Collector(address).query(htcondor2.AdType.Collector),
            timeout_s=30.0,
            ignore=(htcondor2.HTCondorException, RuntimeError, OSError),
        )
        yield address, proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def slot_ad(i: int, site: str, digest: str | None, list_bytes: int) -> classad2.ClassAd:
    ad = classad2.ClassAd()
    ad["MyType"] = "Machine"
    ad["Name"] = f"slot1@glidein{i}.example"
    ad["Machine"] = f"glidein{i}.example"
    ad["MyAddress"] = f"<127.0.0.1:{10000 + i % 50000}>"
    ad["GLIDEIN_Site"] = site
    ad["LastHeardFrom"] = int(time.time())
    for k in range(180):  # about a real static slot ad's 187 attributes and 6 kB
        ad[f"Attr{k:03d}"] = f"value-{i:06d}-{k:03d}-abcdefghij"
    if digest is not None:
        ad[DIGEST] = digest
        ad[MERGED_ATTRIBUTE] = int(time.time()) - 3600
        if list_bytes:
            ad["AvailableDatasets"] = classad2.ExprTree('"' + "x" * list_bytes + '"')
    return ad


def fill(address: str, slots: int, sites: int, uncovered: int, list_bytes: int) -> None:
    coll = htcondor2.Collector(address)
    batch: list[classad2.ClassAd] = []
    for i in range(slots):
        site = f"SITE_{i % sites:02d}"
        batch.append(slot_ad(i, site, None if i < uncovered else f"d-{site}", list_bytes))
        if len(batch) == 200:
            coll.advertise(batch, "UPDATE_STARTD_AD", True)
            batch = []
    if batch:
        coll.advertise(batch, "UPDATE_STARTD_AD", True)
    wait_for(
        f"{slots} slot ads",
        lambda: len(coll.query(htcondor2.AdType.Slot, "true", ["Name"])),
        done=lambda n: n == slots,
        timeout_s=120.0,
    )


def cpu_s(pid: int) -> float:
    """utime + stime + cutime + cstime of ``pid`` (its reaped children included), seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:15]) / CLK_TCK


def query_counts(address: str) -> dict[str, int]:
    keys = ["ForkQueriesFromTOOL", "InProcQueriesFromTOOL"]
    ad = htcondor2.Collector(address).query(htcondor2.AdType.Collector, "true", keys)[0]
    return {k: int(ad.get(k, 0)) for k in ("ForkQueriesFromTOOL", "InProcQueriesFromTOOL")}


def repair_constraint(sites: int) -> str:
    """The daemon's repair query for ``sites`` sites, all current (as the publisher builds it)."""
    current = {Site(f"SITE_{s:02d}"): Current(f"d-SITE_{s:02d}", 0.0) for s in range(sites)}
    return stale_constraint(
        "GLIDEIN_Site", DIGEST, MERGED_ATTRIBUTE, current, int(time.time()) - 120
    )


def clause_per_site_constraint(sites: int) -> str:
    """The repair query as it was first written, one clause per site (for comparison)."""
    return " || ".join(
        f"(GLIDEIN_Site =?= {classad2.quote(f'SITE_{s:02d}')}"
        f" && {DIGEST} =!= {classad2.quote(f'd-SITE_{s:02d}')})"
        for s in range(sites)
    )


def looks(address: str, pid: int, constraint: str, count: int) -> dict[str, Any]:
    """``count`` slot queries with ``constraint`` and the repair look's projection."""
    projection = ["Name", "GLIDEIN_Site", DIGEST, "DataLocalityUpdated", MERGED_ATTRIBUTE]
    projection.append("LastHeardFrom")
    coll = htcondor2.Collector(address)
    before, cpu0 = query_counts(address), cpu_s(pid)
    walls, returned = [], 0
    for _ in range(count):
        t = time.perf_counter()
        returned = len(coll.query(htcondor2.AdType.Slot, constraint, projection))
        walls.append(time.perf_counter() - t)
    time.sleep(1.0)  # let the last child be reaped
    cpu = cpu_s(pid) - cpu0
    time.sleep(6.0)  # the collector's statistics refresh
    after = query_counts(address)
    return {
        "looks": count,
        "returned_per_look": returned,
        "wall_ms_p50": round(statistics.median(walls) * 1000, 2),
        "wall_ms_max": round(max(walls) * 1000, 2),
        "collector_cpu_ms_per_look": round(cpu / count * 1000, 2),
        "counters": {k: after[k] - before[k] for k in after},
        "constraint_chars": len(constraint),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--slots", type=int, default=20_000)
    parser.add_argument("--sites", type=int, default=50)
    parser.add_argument("--uncovered", type=int, default=0, help="slot ads without a digest")
    parser.add_argument("--list-bytes", type=int, default=0, help="a merged list's size")
    parser.add_argument("--looks", type=int, default=200)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="repair-look-") as tmp,
        collector(Path(tmp)) as (address, pid),
    ):
        t = time.perf_counter()
        fill(address, args.slots, args.sites, args.uncovered, args.list_bytes)
        filled_s = time.perf_counter() - t
        rss_mib = int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * 4 / 1024
        result = {
            "revision": subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
            ).stdout.strip(),
            "utc_start": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "load_average_1m_start": os.getloadavg()[0],
            "conditions": {k: v for k, v in vars(args).items() if k != "json"},
            "collector_rss_mib": round(rss_mib),
            "fill_s": round(filled_s, 1),
        }
        for name, constraint in (
            ("repair_look", repair_constraint(args.sites)),
            ("clause_per_site_form", clause_per_site_constraint(args.sites)),
            ("floor_constraint_false", "false"),
        ):
            result[name] = looks(address, pid, constraint, args.looks)
        result["utc_end"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        result["load_average_1m_end"] = os.getloadavg()[0]
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
