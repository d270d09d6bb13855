"""Formatting of benchmark results: console lines, target checks, RESULTS.md."""

# ruff: noqa: E501  (Markdown table rows are long by nature)

from __future__ import annotations

import statistics
from typing import Any

MiB = 1 << 20


def _median(rows: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in rows) if rows else 0.0


def machine_line(m: dict[str, Any]) -> str:
    return (
        f"machine: {m['nproc']} CPUs ({m['cpu_model']}),"
        f" {m['mem_total_bytes'] / (1 << 30):.0f} GiB,"
        f" Python {m['python']}, load {m['load_avg_at_start'][0]:.2f}, commit {m['git_commit']}"
    )


def core_summary(c: dict[str, Any]) -> dict[str, Any]:
    st = c["steady"]
    steady = st["steady"]
    return {
        "replicas": c["replicas"],
        "steady_core_s": _median(steady, "core_s"),
        "steady_core_max_s": max((r["core_s"] for r in steady), default=0.0),
        "steady_plan_s": _median(steady, "plan_s"),
        "steady_save_s": _median(steady, "save_s"),
        "steady_render_s": _median(steady, "render_s"),
        "steady_source_s": _median(steady, "source_s"),
        "steady_rows": _median(steady, "rows_written"),
        "steady_replica_rows": _median(steady, "replica_rows_written"),
        "steady_changes": _median(steady, "changes"),
        "steady_changed_sites": _median(steady, "changed_sites"),
        "collector_merges": _median(steady, "collector_merges"),
        "collector_site_ads": _median(steady, "collector_site_ads"),
        "collector_naive": _median(steady, "collector_updates_naive"),
        "idle": st["no_change"],
        "startup": st["startup"],
        "import_core_s": c["import"]["initial"]["core_s"],
        "import_rows": c["import"]["initial"]["rows_written"],
        "import_peak_rss": c["import"]["peak_rss_bytes"],
        "peak_rss": st["peak_rss_bytes"],
        "harness_rss": st["harness_rss_bytes"],
        "db_bytes": st["db_bytes"],
        "ad_bytes_max": steady[-1]["ad_bytes_max"] if steady else 0,
        "ad_bytes_total": steady[-1]["ad_bytes_total"] if steady else 0,
    }


def core_line(c: dict[str, Any]) -> str:
    s = core_summary(c)
    idle = s["idle"]
    return (
        f"core {s['replicas']:>9,}: steady {s['steady_core_s']:.2f} s"
        f" (plan {s['steady_plan_s']:.2f} + save {s['steady_save_s']:.2f}"
        f" + render {s['steady_render_s']:.2f}; source build {s['steady_source_s']:.2f} s"
        f" not counted), rows {s['steady_rows']:.0f};"
        f" no-change {idle['core_s']:.2f} s, rows {idle['rows_written']},"
        f" collector merges {idle['collector_merges']};"
        f" startup {s['startup']['total_s']:.2f} s; peak RSS {s['peak_rss'] / MiB:.0f} MiB;"
        f" DB {s['db_bytes'] / MiB:.1f} MiB"
    )


def http_line(h: dict[str, Any]) -> str:
    c, p = h["conditional"], h["plain"]
    return (
        f"http ({h['replicas']:,} replicas, body mean {h['body_bytes_mean'] / 1024:.0f} KiB):"
        f" conditional {c['requests_per_s']:.0f} req/s p99 {c['latency_p99_us'] / 1000:.1f} ms;"
        f" plain {p['requests_per_s']:.0f} req/s p99 {p['latency_p99_us'] / 1000:.1f} ms"
        + "".join(
            f"; while cycling {b['requests_per_s']:.0f} req/s p99 {b['latency_p99_us'] / 1000:.1f} ms"
            for b in [h["conditional_cycling"]]
            if "conditional_cycling" in h
        )
    )


def rucio_line(r: dict[str, Any]) -> str:
    return (
        f"rucio {r['datasets']:>5} datasets / {r['rses']} RSEs: source {r['source_calls']} calls"
        f" ({r['source_s']:.2f} s), naive {r['naive_calls']} calls ({r['naive_s']:.2f} s)"
    )


def targets(
    results: dict[str, Any], cycle_s: float, rss: int, rps: float, p99_us: float
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    big = [c for c in results["core"] if c["replicas"] >= 1_000_000]
    for c in big:
        s = core_summary(c)
        out.append(
            _t(
                f"steady cycle at {s['replicas']:,} <= {cycle_s:.0f} s",
                s["steady_core_max_s"],
                "s",
                s["steady_core_max_s"] <= cycle_s,
            )
        )
        out.append(
            _t(
                f"peak RSS at {s['replicas']:,} <= 1 GiB",
                s["peak_rss"] / MiB,
                "MiB",
                s["peak_rss"] <= rss,
            )
        )
    for c in results["core"]:
        idle = c["steady"]["no_change"]
        sent = idle["collector_merges"] + idle["collector_site_ads"]
        ok = idle["rows_written"] == 0 and sent == 0
        out.append(
            _t(
                f"no-change cycle at {c['replicas']:,}: 0 rows written, 0 collector updates",
                idle["rows_written"] + sent,
                "rows+updates",
                ok,
            )
        )
    http = results.get("http")
    if http:
        for mode, when in (("conditional", ""), ("conditional_cycling", " while cycles run")):
            if mode not in http:
                continue
            c = http[mode]
            out.append(
                _t(
                    f"conditional GET >= {rps:.0f} req/s{when}",
                    c["requests_per_s"],
                    "req/s",
                    c["requests_per_s"] >= rps,
                )
            )
            out.append(
                _t(
                    f"conditional GET p99 < {p99_us / 1000:.0f} ms{when}",
                    c["latency_p99_us"] / 1000,
                    "ms",
                    c["latency_p99_us"] < p99_us,
                )
            )
    return out


def _t(name: str, value: float, unit: str, ok: bool) -> dict[str, Any]:
    return {"target": name, "value": round(value, 3), "unit": unit, "met": ok}


def target_lines(ts: list[dict[str, Any]]) -> list[str]:
    return [
        f"target {'MET   ' if t['met'] else 'MISSED'} {t['target']}: {t['value']} {t['unit']}"
        for t in ts
    ]


def markdown(results: dict[str, Any], analysis: str) -> str:
    parts = [_md_head(results), _md_core(results)]
    if "http" in results:
        parts.append(_md_http(results["http"]))
    parts.append(_md_collector(results))
    parts.append(_md_rucio(results.get("rucio")))
    parts.append(analysis)
    return "\n".join(parts)


def _md_head(results: dict[str, Any]) -> str:
    m = results["machine"]
    rows = "\n".join(
        f"| {t['target']} | {t['value']} {t['unit']} | {'met' if t['met'] else '**missed**'} |"
        for t in results["targets"]
    )
    return f"""# Benchmark results (issue 6)

Generated by `.venv/bin/python benchmarks/run.py{" --quick" if results["quick"] else ""}` on {m["date_utc"]} UTC,
commit `{m["git_commit"]}`. Machine: {m["nproc"]} CPUs ({m["cpu_model"]}),
{m["mem_total_bytes"] / (1 << 30):.0f} GiB RAM, Python {m["python"]}, Linux {m["kernel"]};
load average at start {m["load_avg_at_start"][0]:.2f} (other work on the machine inflates timings).
Raw numbers: `benchmarks/results.json`. Timings are measured, never asserted in tests.

| target | measured | |
|---|---|---|
{rows}
"""


def _md_core(results: dict[str, Any]) -> str:
    lines = [
        "## Core: cycle time, memory, state",
        "",
        "Synthetic federation (`benchmarks/generate.py`, seed 2026): 50 sites, 200 RSEs, 20k slots,",
        "replicas/10 datasets; 80 % available, 10 % partial, ~9.9 % replicating, 0.1 % stuck.",
        "A steady cycle applies 1 % churn (0.4 % removed, 0.4 % added, 0.2 % state changes) and is",
        "split by phase as `Service._cycle` runs it: `plan_cycle` -> `SqliteStateStore.save` ->",
        "`render_ads` (all site ads). *core* = plan + save + render (median of the steady cycles).",
        "*source build* is the source adapter's share (building the fresh `Snapshot`), not counted.",
        "Each scale runs in fresh processes: *import* (first cycle from an empty state), then",
        "*restart* (load the DB, build views, render every ad: what `Service()` does) followed by",
        "the steady cycles and one no-change cycle. Peak RSS is `ru_maxrss` of the restart+steady",
        "process and includes the generator's own model (*harness*, RSS after generating).",
        "",
        "| replicas | steady core s | plan s | save s | render s | source build s | no-change core s | startup s (load+views+render) | import s | peak RSS MiB (harness) | import peak MiB | DB MiB |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in results["core"]:
        s = core_summary(c)
        st, idle = s["startup"], s["idle"]
        lines.append(
            f"| {s['replicas']:,} | {s['steady_core_s']:.2f} (max {s['steady_core_max_s']:.2f}) | {s['steady_plan_s']:.2f} | {s['steady_save_s']:.2f} | {s['steady_render_s']:.2f} | {s['steady_source_s']:.2f} | {idle['core_s']:.2f} | {st['total_s']:.2f} ({st['load_s']:.2f}+{st['views_s']:.2f}+{st['render_s']:.2f}) | {s['import_core_s']:.1f} | {s['peak_rss'] / MiB:.0f} ({s['harness_rss'] / MiB:.0f}) | {s['import_peak_rss'] / MiB:.0f} | {s['db_bytes'] / MiB:.1f} |"
        )
    lines += _md_gc(results)
    lines += [
        "",
        "Rows written per cycle (replica rows + first-seen rows; a changed replica is a delete and an insert):",
        "",
        "| replicas | changes per steady cycle | rows per steady cycle (replica rows) | no-change cycle rows | no-change replica rows | import rows | largest site ad KiB | all ads MiB |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in results["core"]:
        s = core_summary(c)
        idle = s["idle"]
        lines.append(
            f"| {s['replicas']:,} | {s['steady_changes']:.0f} | {s['steady_rows']:.0f} ({s['steady_replica_rows']:.0f}) | {idle['rows_written']} | {idle['replica_rows_written']} | {s['import_rows']:,} | {s['ad_bytes_max'] / 1024:.0f} | {s['ad_bytes_total'] / MiB:.1f} |"
        )
    return "\n".join(lines) + "\n"


def _md_gc(results: dict[str, Any]) -> list[str]:
    lines = [
        "",
        "Time in the cyclic garbage collector (`gc.callbacks`), included in the phases above:",
        "",
        "| replicas | GC s in core (median) | GC s in source build (median) | full collections in core |",
        "|---:|---:|---:|---:|",
    ]
    for c in results["core"]:
        steady = c["steady"]["steady"]
        lines.append(
            f"| {c['replicas']:,} | {_median(steady, 'gc_core_s'):.2f} | {_median(steady, 'gc_source_s'):.2f} | {sum(r['gc_core_full_collections'] for r in steady)} in {len(steady)} cycles |"
        )
    for c in results["core"]:
        if "steady_gc_freeze" not in c:
            continue
        frozen = core_summary({**c, "steady": c["steady_gc_freeze"]})
        plain = core_summary(c)
        before, after = c["steady"]["steady"], c["steady_gc_freeze"]["steady"]
        lines += [
            "",
            f"**GC experiment** at {c['replicas']:,} replicas: the same restart and cycles with",
            "`gc.freeze()` after startup and after each cycle (what `Service` could do; not done",
            f"by the daemon today). Steady core {plain['steady_core_s']:.2f} -> {frozen['steady_core_s']:.2f} s"
            f" (max {plain['steady_core_max_s']:.2f} -> {frozen['steady_core_max_s']:.2f}), source build"
            f" {plain['steady_source_s']:.2f} -> {frozen['steady_source_s']:.2f} s; GC in the core"
            f" {_median(before, 'gc_core_s'):.2f} -> {_median(after, 'gc_core_s'):.2f} s, in the source"
            f" build {_median(before, 'gc_source_s'):.2f} -> {_median(after, 'gc_source_s'):.2f} s;"
            f" peak RSS {plain['peak_rss'] / MiB:.0f} -> {frozen['peak_rss'] / MiB:.0f} MiB.",
        ]
    return lines


def _md_http(h: dict[str, Any]) -> str:
    w = h["wrk"]
    rows = []
    for mode in ("conditional", "plain", "conditional_c10", "conditional_cycling"):
        if mode not in h:
            continue
        r = h[mode]
        errors = sum(r[k] for k in r if k.startswith("errors_"))
        rows.append(
            f"| {mode} | {r.get('connections', w['connections'])} | {r['requests_per_s']:.0f} | {r['latency_p50_us'] / 1000:.1f} | {r['latency_p90_us'] / 1000:.1f} | {r['latency_p99_us'] / 1000:.1f} | {r['latency_p999_us'] / 1000:.1f} | {r['latency_max_us'] / 1000:.0f} | {errors} |"
        )
    return f"""## HTTP: `/v1/sites/<site>/classad` on loopback

`wrk -t{w["threads"]} -c{w["connections"]} -d{w["duration_s"]}s` against the real endpoint
(`hydrator.runtime.http.HttpEndpoint`: the daemon process and its HTTP front, `hydrator.httpd`) serving
the {h["replicas"]:,}-replica state; requests rotate over all {h["sites"]} sites. *conditional*:
`If-None-Match` with the current ETag, answered `304` (checked before the run); *plain*: `200`
with the body (mean {h["body_bytes_mean"] / 1024:.0f} KiB, largest {h["body_bytes_max"] / 1024:.0f} KiB); *conditional_c10*: 10
connections; *conditional_cycling*: while the daemon process runs core cycles (plan, save,
render, 1 % churn) back to back, the worst case for a daemon that cycles once per interval.
wrk shares the 2 CPUs with the server.

| request | connections | req/s | p50 ms | p90 ms | p99 ms | p99.9 ms | max ms | errors |
|---|---:|---:|---:|---:|---:|---:|---:|---:|
{chr(10).join(rows)}
"""


def _md_collector(results: dict[str, Any]) -> str:
    lines = [
        "## Collector updates per cycle",
        "",
        "Naive: re-advertise every slot every cycle (20k `MERGE_STARTD_AD` ads). Hydrator: what",
        "`hydrator.adapters.htcondor.collector` decides with its own pure planners (`plan_merges`,",
        "`plan_site_ads`, `refresh_s` = 900) against a pool whose 20k slots (spread over the 50",
        "sites like the data) and site ads carry what the previous cycle sent. No live pool is",
        "involved, so the startd's own updates, which wipe merged attributes every",
        "`UPDATE_INTERVAL` (FACTS.md) and make the publisher re-merge those slots, are not modelled:",
        "the numbers are the floor set by data churn.",
        "",
        "| replicas | sites changed per steady cycle | slot merges | site ads | naive slot updates | no-change cycle: merges | site ads |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in results["core"]:
        s = core_summary(c)
        idle = s["idle"]
        lines.append(
            f"| {s['replicas']:,} | {s['steady_changed_sites']:.0f} / 50 | {s['collector_merges']:.0f} | {s['collector_site_ads']:.0f} | {s['collector_naive']:.0f} | {idle['collector_merges']} | {idle['collector_site_ads']} |"
        )
    lines += [
        "",
        "With 1 % churn spread over the whole federation, most sites change every cycle, so the",
        "digest saves little while data churns that fast; a quiet cycle sends nothing.",
    ]
    return "\n".join(lines) + "\n"


def _md_rucio(r: dict[str, Any] | None) -> str:
    head = "## Rucio API calls per cycle\n\n"
    if r is None:
        return head + "**Not run** (`--skip-rucio`).\n"
    if "error" in r:
        return head + f"**Not measured:** the run failed: `{r['error']}`.\n"
    rows = "\n".join(
        f"| {x['datasets']} | {x['rses']} | {x['source_calls']} | {x['source_s']:.2f} | {x['naive_calls']} | {x['naive_s']:.2f} | {x['source_replicas']} / {x['naive_replicas']} |"
        for x in r["rows"]
    )
    by = r["rows"][-1]["source_calls_by_method"] if r["rows"] else {}
    return (
        head
        + f"""Real Rucio {r["rucio"]}. 5 RSEs at 5 sites (`site` attribute), datasets complete with a
rule each, summary table filled by abacus. *source*: one `RucioSource.fetch` after a warm-up
(calls counted by the source, client construction and token requests excluded); *naive*:
`list_dids` then `list_dataset_replicas(deep=True)` per dataset, done for real.

| datasets | RSEs | source calls | source s | naive calls | naive s | replicas found (source / naive) |
|---:|---:|---:|---:|---:|---:|---:|
{rows}

Source calls by method at the largest size: {by}. The source's calls grow with the number of
RSEs (1 + 2 per RSE + 2 rule listings), not with datasets; at the full federation (200 RSEs,
100k datasets) that is about 403 calls against about 100,001 naive ones. Paging of large
listings is done inside each call by rucio-clients (one HTTP stream per call).
"""
    )
