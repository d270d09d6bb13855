"""The old HTTP stack (hand-written asyncio server + front process) and the new one (aiohttp
child serving the daemon's files), measured in one run; results in ``benchmarks/HTTP.md``.

``python -m benchmarks.http_compare --old /tmp/old-http`` where ``/tmp/old-http`` is a checkout
of the old code (``git worktree add /tmp/old-http f139dde``). Each server runs as
``python -m benchmarks.http_bench serve`` from its own checkout (the endpoint on a state loaded
as the daemon does at startup). Steps, for old and new alike:

1. ``wrk`` conditional GETs at 50 connections on the 1M-replica state while a thread of the
   daemon process runs 1M-replica core cycles back to back (``http_bench --busy-replicas``);
2. 10,000 idle connections opened at once, then one request on each: errors, and the server
   process's RSS before and with them;
3. 200 clients sending a request one byte a second, while ``wrk`` measures everyone else:
   whether they are cut off, RSS before and during, and the others' latency;

then, new only (the old server has no squid test to compare with):

4. 500 simulated hooks polling through a real squid (``tests/support/squid.py``) every 5 s
   (random phase) with ``If-None-Match``, ``max_age_s`` 5, for 60 s: requests that reached the
   hydrator per site and per ``max_age_s``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import resource
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks import http_bench

REPO = Path(__file__).resolve().parents[1]


def child_pids(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(stat.parent.name))
    return out


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


@contextlib.contextmanager
def server(
    checkout: Path, db: Path, busy_replicas: int = 0, max_age_s: int = 60
) -> Iterator[tuple[str, int]]:
    """``http_bench serve`` from ``checkout``; yields (base URL, pid of the process holding the
    client connections: the front / the aiohttp child)."""
    extra = ("--max-age-s", str(max_age_s)) if checkout == REPO else ()
    with http_bench._server(db, busy_replicas, checkout, extra) as (base, pid):
        http_bench._get(base + "/healthz")  # the child is serving
        (child,) = child_pids(pid)
        yield base, child


def conditional_wrk(
    base: str, seconds: int, connections: int = 50, rate_per_s: int = 0
) -> dict[str, Any]:
    """wrk conditional GETs over every site; as fast as the server answers, or with
    ``rate_per_s`` about that many: each connection waits between an answer and its next
    request (wrk's ``delay``, 10 % shorter than connections/rate, as the answer takes time too;
    latency is counted from sending, so it excludes that wait)."""
    ads = http_bench._site_etags(base)
    with tempfile.TemporaryDirectory() as tmp:
        lua = http_bench._lua(Path(tmp), "conditional", ads, conditional=True)
        if rate_per_s:
            delay_ms = 900 * connections // rate_per_s
            lua.write_text(lua.read_text() + f"delay = function() return {delay_ms} end\n")
        return http_bench._wrk(http_bench.ensure_wrk(), base, lua, 2, connections, seconds)


def step_cycling(checkout: Path, db: Path, replicas: int, seconds: int) -> dict[str, Any]:
    """Conditional GETs at 50 connections while cycles run: at 2,000 req/s (the target) and
    as fast as the server answers (wrk and the cycles then compete with it for the 2 CPUs)."""
    with server(checkout, db, busy_replicas=replicas) as (base, _):
        time.sleep(5)  # the busy thread is past loading its copy of the state
        return {
            "at_2000_per_s": conditional_wrk(base, seconds, rate_per_s=2000),
            "saturated": conditional_wrk(base, seconds),
        }


def step_idle(checkout: Path, db: Path, count: int) -> dict[str, Any]:
    """``count`` idle connections, then one request on each."""
    with server(checkout, db) as (base, pid):
        port = int(base.rsplit(":", 1)[1])
        before = rss_bytes(pid)
        socks, connect_errors = [], 0
        t0 = time.monotonic()
        for _ in range(count):
            try:
                socks.append(socket.create_connection(("127.0.0.1", port), timeout=10))
            except OSError:
                connect_errors += 1
        opened_s = time.monotonic() - t0
        time.sleep(2)
        held = rss_bytes(pid)
        ok = errors = 0
        request = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
        for sock in socks:
            try:
                sock.sendall(request)
                ok += sock.recv(4096).startswith(b"HTTP/1.1 200")
            except OSError:
                errors += 1
        for sock in socks:
            sock.close()
        return {
            "connections": count,
            "opened_s": round(opened_s, 2),
            "connect_errors": connect_errors,
            "answered_200": ok,
            "request_errors": errors,
            "rss_before_bytes": before,
            "rss_held_bytes": held,
        }


def step_slow(checkout: Path, db: Path, clients: int, seconds: int) -> dict[str, Any]:
    """``clients`` sending a request a byte a second while wrk measures the others."""
    with server(checkout, db) as (base, pid):
        port = int(base.rsplit(":", 1)[1])
        before = rss_bytes(pid)
        stop = threading.Event()
        cut: list[float] = []
        peak = [before]

        def drip() -> None:
            t0 = time.monotonic()
            sock = socket.create_connection(("127.0.0.1", port), timeout=1)
            payload = b"GET /v1/sites HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 10_000
            for i in range(len(payload)):
                if stop.is_set():
                    break
                try:
                    sock.sendall(payload[i : i + 1])
                except OSError:
                    cut.append(time.monotonic() - t0)
                    break
                with contextlib.suppress(TimeoutError, OSError):
                    if sock.recv(1, socket.MSG_PEEK) == b"":
                        cut.append(time.monotonic() - t0)
                        break
            sock.close()

        def watch() -> None:
            while not stop.wait(0.5):
                peak[0] = max(peak[0], rss_bytes(pid))

        threads = [threading.Thread(target=drip) for _ in range(clients)]
        threads.append(threading.Thread(target=watch))
        for t in threads:
            t.start()
        others = conditional_wrk(base, seconds)
        time.sleep(max(0.0, 35 - seconds))  # past both timeouts (old 30 s, new 15 s)
        stop.set()
        for t in threads:
            t.join()
        return {
            "slow_clients": clients,
            "cut_off": len(cut),
            "cut_off_after_s_max": round(max(cut), 1) if cut else None,
            "rss_before_bytes": before,
            "rss_peak_bytes": peak[0],
            "others": others,
        }


async def _hook(proxy: str, url: str, period_s: float, until: float, failures: list[int]) -> None:
    import aiohttp

    etag = None
    await asyncio.sleep(random.uniform(0, period_s))
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < until:
            headers = {"If-None-Match": etag} if etag else {}
            try:
                async with session.get(url, proxy=proxy, headers=headers) as response:
                    await response.read()
                    if response.status == 200:
                        etag = response.headers.get("ETag")
                    elif response.status != 304:
                        failures.append(response.status)
            except aiohttp.ClientError:
                failures.append(0)
            await asyncio.sleep(period_s)


def classad_requests(base: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(base + "/metrics", timeout=10) as r:
        text = r.read().decode()
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "hydrator_http_requests_total" and s.labels["route"] == "classad"
    )


def step_squid(db: Path, hooks: int, seconds: int, max_age_s: int) -> dict[str, Any]:
    sys.path.insert(0, str(REPO))
    from tests.support.squid import running_squid

    with running_squid() as squid, server(REPO, db, max_age_s=max_age_s) as (base, _):
        sites = sorted(http_bench._site_etags(base))
        before = classad_requests(base)
        failures: list[int] = []
        until = time.monotonic() + seconds

        async def run() -> None:
            await asyncio.gather(
                *(
                    _hook(squid.proxy, base + sites[i % len(sites)], 5.0, until, failures)
                    for i in range(hooks)
                )
            )

        asyncio.run(run())
        reached = classad_requests(base) - before
        codes = squid.codes()
        return {
            "hooks": hooks,
            "sites": len(sites),
            "seconds": seconds,
            "max_age_s": max_age_s,
            "hook_requests": len(codes),
            "hook_failures": len(failures),
            "hydrator_requests": reached,
            "hydrator_requests_per_site_per_max_age": reached / len(sites) / (seconds / max_age_s),
            "squid_codes": {c: codes.count(c) for c in sorted(set(codes))},
        }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--old", type=Path, required=True, help="checkout of the old code")
    parser.add_argument("--replicas", type=int, default=1_000_000)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--idle", type=int, default=10_000, help="idle connections")
    parser.add_argument("--hooks", type=int, default=500, help="hooks behind squid")
    parser.add_argument("--squid-seconds", type=int, default=60)
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "http-compare")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "http_results.json")
    parser.add_argument(
        "--only-cycling", action="store_true", help="redo step 1 only, into the existing --out"
    )
    args = parser.parse_args()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    args.work.mkdir(exist_ok=True)
    big, small = args.work / f"state-{args.replicas}.sqlite", args.work / "state-10000.sqlite"
    for db, n in ((big, args.replicas), (small, 10_000)):
        if not db.exists():
            print(f"importing {n:,} replicas ...", flush=True)
            command = [sys.executable, "-m", "benchmarks.core_bench", "import"]
            subprocess.run(
                [*command, "--replicas", str(n), "--db", str(db)],
                cwd=REPO,
                check=True,
                stdout=subprocess.DEVNULL,
            )
    if args.only_cycling:
        results = json.loads(args.out.read_text())
        for name, checkout in (("old", args.old.resolve()), ("new", REPO)):
            cycling = step_cycling(checkout, big, args.replicas, args.seconds)
            results[name]["cycling"] = cycling
            results[name]["cycling"]["load"] = os.getloadavg()
        args.out.write_text(json.dumps(results, indent=1) + "\n")
        return
    results: dict[str, Any] = {"load_before": os.getloadavg(), "started": time.time()}
    for name, checkout in (("old", args.old.resolve()), ("new", REPO)):
        print(
            f"{name}: conditional GETs while {args.replicas:,}-replica cycles run ...", flush=True
        )
        r = {"cycling": step_cycling(checkout, big, args.replicas, args.seconds)}
        print(f"{name}: {args.idle:,} idle connections ...", flush=True)
        r["idle"] = step_idle(checkout, small, args.idle)
        print(f"{name}: 200 one-byte-a-second clients ...", flush=True)
        r["slow"] = step_slow(checkout, small, 200, args.seconds)
        results[name] = r
        print(json.dumps(r)[:600], flush=True)
    print(f"new: {args.hooks} hooks through squid ...", flush=True)
    results["squid"] = step_squid(small, args.hooks, args.squid_seconds, 5)
    results["load_after"] = os.getloadavg()
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps(results["squid"]))


if __name__ == "__main__":
    main()
