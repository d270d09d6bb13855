"""Run every benchmark of issue 6 and write ``benchmarks/RESULTS.md`` and ``results.json``.

    .venv/bin/python benchmarks/run.py          # 10k, 100k, 1M; wrk 10 s; Rucio 10/100/1000
    .venv/bin/python benchmarks/run.py --quick  # 10k, 100k; wrk 5 s; Rucio 10/100

Each scale runs in fresh processes (:mod:`benchmarks.core_bench`) so peak RSS is per scale.
The HTTP benchmark (:mod:`benchmarks.http_bench`) serves the 100k state (or the largest
smaller one) and needs ``wrk`` (installed with apt-get if missing). The Rucio comparison
(:mod:`benchmarks.rucio_bench`) starts a real Rucio server. Timings are printed and recorded,
never asserted. ``benchmarks/ANALYSIS.md`` (hand-written: profiles, what dominates) is copied
into RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks import report  # noqa: E402

HERE = REPO / "benchmarks"
TARGET_CYCLE_S = 10.0
TARGET_RSS_BYTES = 1 << 30
TARGET_RPS = 2000
TARGET_P99_US = 20_000


def machine() -> dict[str, Any]:
    model = "unknown"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    mem = Path("/proc/meminfo").read_text().splitlines()[0].split()[1]
    return {
        "nproc": os.cpu_count(),
        "cpu_model": model,
        "mem_total_bytes": int(mem) * 1024,
        "python": platform.python_version(),
        "kernel": platform.release(),
        "load_avg_at_start": os.getloadavg(),
        "git_commit": _git("rev-parse", "--short", "HEAD"),
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
    }


def _git(*args: str) -> str:
    out = subprocess.run(["git", *args], cwd=REPO, stdout=subprocess.PIPE, text=True, check=False)
    return out.stdout.strip()


def _step(
    step: str, replicas: int, db: Path, cycles: int, gc_freeze: bool = False
) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "benchmarks.core_bench", step, "--replicas", str(replicas)]
    cmd += ["--db", str(db), "--cycles", str(cycles)] + (["--gc-freeze"] if gc_freeze else [])
    out = subprocess.run(cmd, cwd=REPO, stdout=subprocess.PIPE, text=True, check=True)
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def run_core(replicas: int, work: Path, cycles: int, gc_freeze: bool) -> dict[str, Any]:
    """Import, then restart + steady cycles; with ``gc_freeze`` also the GC experiment."""
    db = work / f"state-{replicas}.sqlite"
    print(f"core {replicas:>9,} replicas: first import ...", flush=True)
    imported = _step("import", replicas, db, cycles)
    frozen_db = work / f"state-{replicas}-gc-freeze.sqlite"
    if gc_freeze:
        shutil.copy(db, frozen_db)
    print(f"core {replicas:>9,} replicas: restart + {cycles} steady cycles + no-change ...")
    steady = _step("steady", replicas, db, cycles)
    result = {"replicas": replicas, "import": imported, "steady": steady, "db": str(db)}
    print(report.core_line(result), flush=True)
    if gc_freeze:
        print(f"core {replicas:>9,} replicas: again with gc.freeze() after each cycle ...")
        frozen = {"replicas": replicas, "import": imported}
        frozen["steady"] = _step("steady", replicas, frozen_db, cycles, gc_freeze=True)
        print("  with gc.freeze(): " + report.core_line(frozen), flush=True)
        result["steady_gc_freeze"] = frozen["steady"]
    return result


def run_http(core: list[dict[str, Any]], work: Path, seconds: int) -> dict[str, Any]:
    from benchmarks import http_bench

    usable = [c for c in core if c["replicas"] <= 100_000] or core[:1]
    chosen = max(usable, key=lambda c: c["replicas"])
    print(f"http: serving the {chosen['replicas']:,}-replica state, wrk {seconds} s x 3 ...")
    result = http_bench.measure(
        Path(chosen["db"]), seconds=seconds, busy_replicas=chosen["replicas"]
    )
    result["replicas"] = chosen["replicas"]
    print(report.http_line(result), flush=True)
    return result


def run_rucio(counts: list[int]) -> dict[str, Any]:
    try:
        from benchmarks import rucio_bench

        print(f"rucio: real server, datasets {counts} ...", flush=True)
        result = rucio_bench.measure(counts)
    except Exception as exc:  # report what failed instead of losing the other results
        print(f"rucio: FAILED: {type(exc).__name__}: {exc}", flush=True)
        return {"error": f"{type(exc).__name__}: {exc}"}
    for row in result["rows"]:
        print(report.rucio_line(row), flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description="hydrator benchmarks (issue 6)")
    parser.add_argument("--quick", action="store_true", help="10k and 100k only, shorter runs")
    parser.add_argument("--scales", type=int, nargs="*", help="replica counts to run")
    parser.add_argument("--cycles", type=int, default=3, help="steady cycles per scale")
    parser.add_argument("--skip-http", action="store_true")
    parser.add_argument("--skip-rucio", action="store_true")
    parser.add_argument(
        "--report-only", action="store_true", help="rewrite RESULTS.md from results.json"
    )
    args = parser.parse_args()
    if args.report_only:
        write_report(json.loads((HERE / "results.json").read_text()))
        return
    scales = args.scales or ([10_000, 100_000] if args.quick else [10_000, 100_000, 1_000_000])
    results: dict[str, Any] = {"machine": machine(), "quick": args.quick}
    print(report.machine_line(results["machine"]), flush=True)
    work = Path(tempfile.mkdtemp(prefix="hydrator-bench-"))
    try:
        largest = max(scales)
        results["core"] = [run_core(n, work, args.cycles, n == largest) for n in scales]
        if not args.skip_http:
            results["http"] = run_http(results["core"], work, 5 if args.quick else 10)
        if not args.skip_rucio:
            results["rucio"] = run_rucio([10, 100] if args.quick else [10, 100, 1000])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    (HERE / "results.json").write_text(json.dumps(results, indent=1) + "\n")  # kept if below fails
    write_report(results)


def write_report(results: dict[str, Any]) -> None:
    targets = report.targets(results, TARGET_CYCLE_S, TARGET_RSS_BYTES, TARGET_RPS, TARGET_P99_US)
    results["targets"] = targets
    (HERE / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    analysis = HERE / "ANALYSIS.md"
    extra = analysis.read_text() if analysis.exists() else ""
    (HERE / "RESULTS.md").write_text(report.markdown(results, extra))
    for line in report.target_lines(targets):
        print(line)
    print(f"wrote {HERE / 'RESULTS.md'} and {HERE / 'results.json'}")


if __name__ == "__main__":
    main()
