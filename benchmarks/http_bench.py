"""HTTP benchmark: ``/v1/sites/<site>/classad`` on loopback, driven by ``wrk``.

``python -m benchmarks.http_bench serve --db STATE`` runs the real endpoint
(:class:`~hydrator.runtime.http.HttpEndpoint` on a :class:`~hydrator.runtime.service.Service`
that loaded
``STATE`` as the daemon does at startup; its aiohttp child serves) on 127.0.0.1 and a free
port, prints the port, and serves until its stdin closes. :func:`measure` starts it in its
own process (so the load generator and the server do not share an interpreter), fetches every
site's ETag, checks that
``If-None-Match`` gets a 304, then runs ``wrk``, rotating over all sites: conditional GETs
(``If-None-Match`` with the current ETag, answered 304) and plain GETs (200 with the body) at
50 connections, and conditional GETs at 10 connections (how the tail depends on concurrency).

Then once more with ``serve --busy-replicas N``: the same endpoint while a thread of the daemon
process runs core cycles (fetch, ``plan_cycle``, save, render, 1 % churn) back to back on a copy
of the state, as :mod:`benchmarks.core_bench` times them. The daemon runs one cycle per poll
interval, so this is the worst case for the GIL: the endpoint shares the interpreter with a
thread that never waits. The published ads are not swapped, so ETags stay valid.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

LUA = """
local paths = {%(paths)s}
local etags = {%(etags)s}
local conditional = %(conditional)s
local i = 0
request = function()
  i = i %% #paths + 1
  local headers = {}
  if conditional then headers["If-None-Match"] = etags[i] end
  return wrk.format("GET", paths[i], headers)
end
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'RESULT {"requests": %%d, "duration_us": %%d, "bytes": %%d, "errors_status": %%d, ' ..
    '"errors_connect": %%d, "errors_read": %%d, "errors_write": %%d, "errors_timeout": %%d, ' ..
    '"latency_mean_us": %%.1f, "latency_p50_us": %%d, "latency_p90_us": %%d, ' ..
    '"latency_p99_us": %%d, "latency_p999_us": %%d, "latency_max_us": %%d}\\n',
    summary.requests, summary.duration, summary.bytes, e.status, e.connect, e.read, e.write,
    e.timeout, latency.mean, latency:percentile(50), latency:percentile(90),
    latency:percentile(99), latency:percentile(99.9), latency.max))
end
"""


def busy_cycles(db: Path, replicas: int, stop: threading.Event) -> None:
    """Core cycles back to back on a copy of ``db`` until ``stop`` is set (see module doc)."""
    from benchmarks.core_bench import INTERVAL, T0, cycle
    from benchmarks.generate import Federation, Scale
    from hydrator.adapters.state.sqlite import SqliteStateStore

    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "busy.sqlite"
        shutil.copy(db, copy)
        fed = Federation(Scale(replicas))
        store = SqliteStateStore(copy)
        state, now = store.load(), T0
        while not stop.is_set():
            fed.churn()
            now += INTERVAL
            plan, _ = cycle(fed, store, state, now)
            state = plan.derived
        store.close()


def serve(db: Path, busy_replicas: int = 0, max_age_s: int = 60) -> None:
    from hydrator.adapters.state.sqlite import SqliteStateStore
    from hydrator.config import Config, HttpConfig
    from hydrator.runtime.http import HttpEndpoint
    from hydrator.runtime.service import Service

    config = Config.model_validate(
        {"daemon": {"state_path": db}, "sources": [{"type": "static", "path": "unused.toml"}]}
    )
    service = Service(config, sources=[], store=SqliteStateStore(db))
    http = HttpConfig(listen="127.0.0.1:0", max_age_s=max_age_s)
    endpoint = HttpEndpoint(service, http, wedged_after_s=3600)
    endpoint.start()
    stop = threading.Event()
    busy = threading.Thread(target=busy_cycles, args=(db, busy_replicas, stop), name="cycles")
    if busy_replicas:
        busy.start()
    print(endpoint.port, flush=True)
    sys.stdin.read()  # until the parent closes our stdin
    stop.set()
    if busy_replicas:
        busy.join()
    endpoint.stop()
    service.close()


def ensure_wrk() -> str:
    """The ``wrk`` binary, installed from Debian (package ``wrk``) if missing."""
    found = shutil.which("wrk")
    if found:
        return found
    print("installing wrk (apt-get install -y wrk) ...", file=sys.stderr)
    subprocess.run(["apt-get", "install", "-y", "-q", "wrk"], check=True, stdout=subprocess.DEVNULL)
    found = shutil.which("wrk")
    if not found:
        raise RuntimeError("wrk is not installed and apt-get did not provide it")
    return found


def _get(url: str, etag: str | None = None) -> tuple[int, str, int]:
    request = urllib.request.Request(url, headers={"If-None-Match": etag} if etag else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.headers.get("ETag", ""), len(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("ETag", ""), 0


def _site_etags(base: str) -> dict[str, tuple[str, int]]:
    with urllib.request.urlopen(base + "/v1/sites", timeout=10) as response:
        doc = json.load(response)
    sites = [s["site"] for s in doc["sites"]]
    out: dict[str, tuple[str, int]] = {}
    for site in sites:
        path = f"/v1/sites/{site}/classad"
        status, etag, size = _get(base + path)
        again, _, _ = _get(base + path, etag)
        if status != 200 or again != 304:
            raise RuntimeError(f"{path}: GET {status}, conditional GET {again} (want 200, 304)")
        out[path] = (etag, size)
    return out


def _wrk(
    wrk: str, base: str, lua: Path, threads: int, connections: int, seconds: int
) -> dict[str, Any]:
    out = subprocess.run(
        [
            wrk,
            f"-t{threads}",
            f"-c{connections}",
            f"-d{seconds}s",
            "--latency",
            "-s",
            str(lua),
            base,
        ],
        check=True,
        stdout=subprocess.PIPE,
        text=True,
    )
    line = next(x for x in out.stdout.splitlines() if x.startswith("RESULT "))
    result: dict[str, Any] = json.loads(line.removeprefix("RESULT "))
    result["requests_per_s"] = result["requests"] / (result["duration_us"] / 1e6)
    return result


@contextlib.contextmanager
def _server(
    db: Path, busy_replicas: int = 0, checkout: Path = REPO, extra: tuple[str, ...] = ()
) -> Iterator[tuple[str, int]]:
    """The endpoint in its own process, from the code in ``checkout``; yields its base URL and
    pid; stops it on exit."""
    command = os.environ.get("HYDRATOR_BENCH_SERVE", "-m benchmarks.http_bench serve").split()
    busy = ["--busy-replicas", str(busy_replicas)] if busy_replicas else []
    server = subprocess.Popen(
        [sys.executable, *command, "--db", str(db), *busy, *extra],
        cwd=checkout,
        env={**os.environ, "PYTHONPATH": str(checkout)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert server.stdout is not None
        yield f"http://127.0.0.1:{int(server.stdout.readline())}", server.pid
    finally:
        if server.stdin:
            server.stdin.close()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def _lua(tmp: Path, label: str, ads: dict[str, tuple[str, int]], conditional: bool) -> Path:
    lua = tmp / f"{label}.lua"
    lua.write_text(
        LUA
        % {
            "paths": ", ".join(json.dumps(p) for p in ads),
            "etags": ", ".join(json.dumps(e) for e, _ in ads.values()),
            "conditional": "true" if conditional else "false",
        }
    )
    return lua


def measure(
    db: Path, threads: int = 2, connections: int = 50, seconds: int = 10, busy_replicas: int = 0
) -> dict[str, Any]:
    """Start the endpoint on ``db``, run wrk conditional and plain; with ``busy_replicas``
    (the scale of ``db``) also conditional GETs during back-to-back cycles; return all results."""
    wrk = ensure_wrk()
    results: dict[str, Any] = {
        "wrk": {"threads": threads, "connections": connections, "duration_s": seconds}
    }
    with tempfile.TemporaryDirectory() as tmp, _server(db) as (base, _):
        ads = _site_etags(base)
        results["sites"] = len(ads)
        results["body_bytes_mean"] = sum(size for _, size in ads.values()) / max(1, len(ads))
        results["body_bytes_max"] = max(size for _, size in ads.values())
        for label, conditional, conns in (
            ("conditional", True, connections),
            ("plain", False, connections),
            ("conditional_c10", True, 10),
        ):
            lua = _lua(Path(tmp), label, ads, conditional)
            results[label] = _wrk(wrk, base, lua, threads, conns, seconds)
            results[label]["connections"] = conns
    if busy_replicas:
        with tempfile.TemporaryDirectory() as tmp, _server(db, busy_replicas) as (base, _):
            ads = _site_etags(base)
            lua = _lua(Path(tmp), "conditional_cycling", ads, conditional=True)
            results["conditional_cycling"] = _wrk(wrk, base, lua, threads, connections, seconds)
            results["conditional_cycling"]["connections"] = connections
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["serve", "measure"])
    parser.add_argument("--db", type=Path, required=True)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--max-age-s", type=int, default=60, help="serve: Cache-Control max-age")
    parser.add_argument(
        "--busy-replicas", type=int, default=0, help="replicas in --db: also measure during cycles"
    )
    args = parser.parse_args()
    if args.mode == "serve":
        serve(args.db, args.busy_replicas, args.max_age_s)
    else:
        result = measure(args.db, seconds=args.seconds, busy_replicas=args.busy_replicas)
        print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
