"""HTTP scenario: the current server as the daemon runs it, under wrk and bad clients.

:class:`benchmarks.cycle.BenchService` (its Rucio source reading :mod:`benchmarks.replay`) with
its HTTP endpoint started as ``hydrator run`` starts it: the aiohttp child serving the daemon's
files, on 127.0.0.1. After the first cycle: 1. wrk conditional GETs (``If-None-Match``: 304)
over every site's ClassAd, paced to about ``--rate`` a second, then saturated, while a daemon
thread runs churn cycles back to back; then saturated with none. A cycle gives every ad a new
``updated`` time, so a new ETag, which the wrk script takes from the next 200, as a hook does
(``answers``: the server's count by status). 2. ``--idle`` connections opened, held 2 s, then
one ``GET /healthz`` on each. 3. ``--slow`` clients sending a request one byte a second, while
wrk (saturated) measures the others. Memory: the server's ``VmRSS``, ``VmHWM`` (step's peak).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import select
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, suppress
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks import cycle
from benchmarks.conditions import emit, machine
from hydrator.config import ClassAdConfig, CollectorConfig, HttpConfig

LUA = """local paths, etags, index, i = {%(paths)s}, {ETAGS}, {}, 0
for j, p in ipairs(paths) do index[p:match("/v1/sites/([^/]+)/")] = j end
request = function()
  i = i %% #paths + 1
  return wrk.format("GET", paths[i], {["If-None-Match"] = etags[i]})
end
response = function(status, headers, body)
  local j = status == 200 and index[body:match('%(site)s = "([^"]+)"') or ""]
  if j then etags[j] = headers["ETag"] or headers["Etag"] end
end
done = function(s, latency)
  local e = s.errors.connect + s.errors.read + s.errors.write + s.errors.timeout + s.errors.status
  io.write(string.format('RESULT {"requests": %%d, "errors": %%d, "requests_per_s": %%.0f, ' ..
    '"p50_ms": %%.2f, "p99_ms": %%.2f, "max_ms": %%.2f}\\n', s.requests, e, s.requests * 1e6 /
    s.duration, latency:percentile(50) / 1e3, latency:percentile(99) / 1e3, latency.max / 1e3))
end
"""


def get(url: str) -> tuple[str, bytes]:
    """The ETag and body of a GET (an answer other than 2xx raises ``HTTPError``)."""
    with urllib.request.urlopen(url, timeout=30) as answer:
        return answer.headers.get("ETag", ""), answer.read()


def site_etags(base: str) -> dict[str, tuple[str, int]]:
    """Every site's ClassAd path -> (its ETag now, body bytes)."""
    out = {}
    for site in json.loads(get(base + "/v1/sites")[1])["sites"]:
        etag, body = get(base + f"/v1/sites/{site['site']}/classad")
        out[f"/v1/sites/{site['site']}/classad"] = (etag, len(body))
    return out


def wrk(args: argparse.Namespace, rate_per_s: int = 0) -> dict[str, Any]:
    """wrk's figures for ``--seconds`` of conditional GETs over every site (``rate_per_s``: each
    connection waits 90 % of connections / rate after each answer, not counted in latency)."""
    ads, before, script = site_etags(args.base), answers(args.base), Path(args.work, "wrk.lua")
    lua = LUA % {"paths": ", ".join(map(json.dumps, ads)), "site": ClassAdConfig().site_attribute}
    lua = lua.replace("ETAGS", ", ".join(json.dumps(etag) for etag, _ in ads.values()))
    delay = f"delay = function() return {900 * args.connections // max(1, rate_per_s)} end\n"
    script.write_text(lua + (delay if rate_per_s else ""))  # read by each wrk thread
    load = [f"-c{args.connections}", f"-d{args.seconds}s", "-s", str(script), args.base]
    out = subprocess.run(["wrk", "-t2", *load], capture_output=True, text=True, check=True)
    line = next(x for x in out.stdout.splitlines() if x.startswith("RESULT "))
    found: dict[str, Any] = json.loads(line.removeprefix("RESULT "))
    after = answers(args.base)
    return found | {"answers": {code: after[code] - before.get(code, 0) for code in after}}


def answers(base: str) -> dict[str, int]:
    """The server's ClassAd answers so far by status (prometheus_client sorts the labels)."""
    text = get(base + "/metrics")[1].decode()
    found = re.findall(r'requests_total\{code="(\d+)",route="classad"\} (\S+)', text)
    return {code: int(float(count)) for code, count in found}


def memory(reset: bool = False) -> dict[str, int]:
    """The HTTP server's RSS and peak in KiB (``reset``: the peak restarts, proc(5) clear_refs)."""
    pids: list[str] = []
    for task in Path("/proc/self/task").iterdir():  # the server's parent: the thread that began it
        with suppress(OSError):  # a thread that has ended since
            pids += (task / "children").read_text().split()
    pid = next(p for p in pids if b".http.server" in Path(f"/proc/{p}/cmdline").read_bytes())
    if reset:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    text = Path(f"/proc/{pid}/status").read_text()
    rss, peak = (int(text.split(f"{key}:")[1].split()[0]) for key in ("VmRSS", "VmHWM"))
    return {"rss_kib": rss, "peak_rss_kib": peak}


def step_cycling(daemon: cycle.BenchService, args: argparse.Namespace) -> dict[str, Any]:
    """Conditional GETs paced and saturated while churn cycles run back to back, then none;
    when each wrk run and each cycle ended, and each cycle began, in seconds from the start."""
    stop, cycles, errors, t0 = threading.Event(), list[list[float]](), list[str](), time.monotonic()

    def run() -> None:
        while not stop.is_set():
            try:
                cycle.churn(args.replay)
                began = time.monotonic() - t0
                cycles.append([round(began, 1), round(began + daemon.cycle()["whole"], 1)])
            except (OSError, RuntimeError) as exc:
                errors.append(str(exc))

    out: dict[str, Any] = {}
    with ThreadPoolExecutor(1, "cycles") as daemon_thread:
        cycling = daemon_thread.submit(run)
        try:
            for name, rate in (("paced", args.rate), ("saturated", 0)):
                out[name] = wrk(args, rate) | {"ended_s": round(time.monotonic() - t0, 1)}
        finally:
            stop.set()
        cycling.result()  # an error run() does not record ends the scenario, not its cycles
    out["saturated_no_cycles"] = wrk(args)
    return out | {"cycles_began_ended_s": cycles, "cycle_errors": errors}


def step_idle(args: argparse.Namespace) -> dict[str, Any]:
    """``--idle`` connections opened at once, held 2 s, then one request on each."""
    out: dict[str, Any] = {"connections": args.idle, "before": memory(reset=True)}
    socks, out["connect_errors"], out["answered_200"] = [], 0, 0
    t0 = time.monotonic()
    for _ in range(args.idle):
        try:
            socks.append(socket.create_connection(("127.0.0.1", args.port), timeout=10))
        except OSError:
            out["connect_errors"] += 1
    out["opened_s"] = round(time.monotonic() - t0, 2)
    time.sleep(2)
    out["held"] = memory()
    for sock in socks:
        with suppress(OSError):  # an error: neither answered nor counted
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            out["answered_200"] += sock.recv(4096).startswith(b"HTTP/1.1 200")
        sock.close()
    return out | {"after": memory()}


def step_slow(args: argparse.Namespace) -> dict[str, Any]:
    """``--slow`` clients each sending a request (10 KB header) one byte a second, and wrk."""
    out: dict[str, Any] = {"clients": args.slow, "before": memory(reset=True)}
    cut: list[float] = []
    until = time.monotonic() + 2 * HttpConfig().idle_timeout_s

    def drip() -> None:
        t0 = time.monotonic()
        with socket.create_connection(("127.0.0.1", args.port)) as sock, suppress(OSError):
            for byte in b"GET /v1/sites HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 10_000:
                if time.monotonic() > until:
                    return
                sock.sendall(bytes([byte]))  # raises once the server has reset the connection
                if select.select([sock], [], [], 1)[0] and not sock.recv(1, socket.MSG_PEEK):
                    break  # closed by the server
        cut.append(round(time.monotonic() - t0, 1))

    with ThreadPoolExecutor(args.slow) as clients:
        clients.map(lambda _: drip(), range(args.slow))
        out["others"] = wrk(args)
    out |= {"cut_off": len(cut), "cut_off_after_s": [min(cut, default=0), max(cut, default=0)]}
    return out | {"after": memory()}


OPTIONS = {"replicas": 1_000_000, "seconds": 10, "connections": 50, "rate": 2000, "idle": 10_000}
OPTIONS |= {"slow": 200, "seed": 2026}  # ``--seconds``: of each wrk run


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    for name, default in OPTIONS.items():  # what each is: the module's docstring
        parser.add_argument(f"--{name}", type=int, default=default)
    parser.add_argument("--json", help="write the results into this file")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("http: wrk is not installed (apt-get install --no-install-recommends wrk)")
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)  # room for --idle connections
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    version = subprocess.run(["wrk", "--version"], capture_output=True, text=True, check=False)
    result: dict[str, Any] = {"code": cycle.revision(cycle.HERE.parent), "machine": machine()}
    result |= {"options": dict(vars(args)), "wrk": version.stdout.split(" [")[0]}
    result["utc_start"] = datetime.now(UTC).isoformat(timespec="seconds")
    with tempfile.TemporaryDirectory(prefix="hydrator-http-bench-") as work, ExitStack() as stack:
        os.environ["RUCIO_HOME"] = work  # no stray rucio.cfg from elsewhere (as cycle's steps)
        replay = cycle.ReplayServer(args.replicas, args.seed)
        stack.callback(replay.stop)
        pool = cycle.PoolStub(cycle.slot_names(), CollectorConfig().slot_site_attribute)
        daemon = cycle.BenchService(cycle.config(replay.url, Path(work)), pool)
        stack.callback(daemon.close)
        daemon.service.remove_listener(daemon.endpoint.write)  # start() adds it again
        daemon.endpoint.start()  # the server child, as ``hydrator run`` starts it
        result["first_cycle_s"] = round(daemon.cycle()["whole"], 1)
        args.replay, args.port, args.work = replay.url, daemon.endpoint.port, work
        args.base = f"http://127.0.0.1:{args.port}"
        result["classad_bytes_max"] = max(size for _, size in site_etags(args.base).values())
        result |= {"cycling": step_cycling(daemon, args), "idle": step_idle(args)}
        result["slow"] = step_slow(args)
    result["utc_end"] = datetime.now(UTC).isoformat(timespec="seconds")
    result["machine_after"] = machine()
    emit(result, Path(args.json) if args.json else None)
