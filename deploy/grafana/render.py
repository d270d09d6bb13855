#!/usr/bin/env python3
"""Draw the Grafana dashboard from a Prometheus server's data, without Grafana.

Grafana is not installable where this project is built (no Debian package, nothing on PyPI or
npm that ships the server), so this script stands in for it to make a picture for the docs:
it reads ``hydrator.json``, sends each panel's PromQL to Prometheus' HTTP API (``query_range``
for time series, ``query`` for bar gauges and the stat's value), and draws the panels in the
dashboard's grid with matplotlib. Only what the dashboard uses is supported: ``timeseries``
(lines or bars, stacked or not), ``stat`` and ``bargauge`` panels, units ``s``, ``bytes``,
``percentunit`` and ``short``, and the variables ``$instance`` (as "All") and
``$__rate_interval`` (Grafana's rule: max(4 x scrape interval, step + scrape interval)).

    python deploy/grafana/render.py --prometheus http://127.0.0.1:9090 --minutes 10 \
        --out docs/dashboard.png

Needs ``requests`` and ``matplotlib`` (the project's ``test`` extra).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.dates as mdates
import matplotlib.pyplot as plt
import requests
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, MaxNLocator

HERE = Path(__file__).resolve().parent
GRID_COLUMNS = 24
COLUMN_IN = 0.78  # inches per grid column
ROW_IN = 0.34  # inches per grid row (Grafana: 30 px high, columns ~ 2.6 x wider)
BACKGROUND, PANEL, TEXT, GRID = "#111217", "#181b1f", "#ccccdc", "#2c3235"
PALETTE = [
    "#73bf69",
    "#f2cc0c",
    "#5794f2",
    "#ff9830",
    "#f2495c",
    "#b877d9",
    "#8ab8ff",
    "#ffcb7d",
    "#96d98d",
    "#ff7383",
    "#ca95e5",
    "#fade2a",
]
NAMED = {
    "green": "#73bf69",
    "orange": "#ff9830",
    "red": "#f2495c",
    "yellow": "#fade2a",
    "blue": "#5794f2",
    "purple": "#b877d9",
}


@dataclass(frozen=True)
class Series:
    legend: str
    times: list[float]  # unix seconds
    values: list[float]


class Prometheus:
    """The two read endpoints of Prometheus' HTTP API."""

    def __init__(self, url: str, scrape_interval_s: float) -> None:
        self.url = url.rstrip("/")
        self.scrape_interval_s = scrape_interval_s

    def _get(self, path: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        r = requests.get(f"{self.url}{path}", params=params, timeout=30)
        body = r.json()
        if body.get("status") != "success":
            raise RuntimeError(f"{params.get('query')}: {body.get('error', body)}")
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        params = {"query": expr, "start": start, "end": end, "step": step}
        return self._get("/api/v1/query_range", params)

    def instant(self, expr: str, at: float) -> list[dict[str, Any]]:
        return self._get("/api/v1/query", {"query": expr, "time": at})


def concrete(expr: str, step_s: float, scrape_s: float) -> str:
    """Replace the dashboard variables the way Grafana would for 'All' instances."""
    rate_interval = max(4 * scrape_s, step_s + scrape_s)
    expr = expr.replace("$__rate_interval", f"{math.ceil(rate_interval)}s")
    return expr.replace("$instance", ".*")


def legend(template: str, labels: dict[str, str]) -> str:
    text = re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), template)
    return text.strip() or "{" + ",".join(f"{k}={v}" for k, v in labels.items()) + "}"


def fetch(
    prom: Prometheus, panel: dict[str, Any], start: float, end: float, step: float
) -> list[Series]:
    out: list[Series] = []
    for target in panel.get("targets", []):
        expr = concrete(target["expr"], step, prom.scrape_interval_s)
        if target.get("instant"):
            rows = [{**r, "values": [r["value"]]} for r in prom.instant(expr, end)]
        else:
            rows = prom.range(expr, start, end, step)
        for row in rows:
            name = legend(target.get("legendFormat", ""), row["metric"])
            times = [float(t) for t, _ in row["values"]]
            out.append(Series(name, times, [float(v) for _, v in row["values"]]))
    return sorted(out, key=lambda s: s.legend)


# -- formatting ----------------------------------------------------------------------------------


def fmt(value: float, unit: str, decimals: int | None = None) -> str:
    """A value as Grafana shows it for the units the dashboard uses."""
    if math.isnan(value):
        return "NaN"
    formatter = {"percentunit": _percent, "bytes": _bytes, "s": _seconds}.get(unit)
    if formatter is not None:
        return formatter(value)
    if decimals is not None:
        return f"{value:.{decimals}f}"
    return f"{value:.2f}".rstrip("0").rstrip(".") if value % 1 else f"{value:.0f}"


def _percent(value: float) -> str:
    return f"{value * 100:.0f}%"


def _bytes(value: float) -> str:
    for suffix, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(value) >= size:
            return f"{value / size:.1f} {suffix}"
    return f"{value:.0f} B"


def _seconds(value: float) -> str:
    magnitude = abs(value)
    if magnitude == 0:
        return "0 s"
    if magnitude < 1:
        return f"{value * 1000:.0f} ms"
    if magnitude < 120:
        return f"{value:.1f} s" if magnitude < 10 else f"{value:.0f} s"
    return f"{value / 60:.1f} min" if magnitude < 7200 else f"{value / 3600:.1f} h"


def day(unix_s: float) -> float:
    """Matplotlib's date number (days since 1970) for unix seconds."""
    return unix_s / 86400.0


def style(ax: Axes) -> None:
    ax.set_facecolor(PANEL)
    for spine in ax.spines.values():
        spine.set_visible(False)
    ax.tick_params(colors=TEXT, labelsize=7, length=0)
    ax.grid(True, color=GRID, linewidth=0.6)


# -- panels --------------------------------------------------------------------------------------


def series_color(panel: dict[str, Any], name: str, index: int) -> str:
    """The colour of series ``name``: the panel's first matching ``byName``/``byRegexp``
    override with a fixed colour, else the palette's ``index``-th."""
    for override in panel["fieldConfig"].get("overrides", []):
        matcher = override["matcher"]
        pattern = matcher.get("options", "")
        if matcher["id"] == "byName":
            hit = name == pattern
        else:
            hit = matcher["id"] == "byRegexp" and re.fullmatch(pattern, name) is not None
        for prop in override["properties"] if hit else []:
            if prop["id"] == "color" and "fixedColor" in prop["value"]:
                color: str = prop["value"]["fixedColor"]
                return NAMED.get(color, color)
    return PALETTE[index % len(PALETTE)]


def draw_timeseries(ax: Axes, panel: dict[str, Any], series: list[Series]) -> None:
    defaults = panel["fieldConfig"]["defaults"]
    custom = defaults.get("custom", {})
    unit, decimals = defaults.get("unit", "short"), defaults.get("decimals")
    stacked = custom.get("stacking", {}).get("mode") == "normal"
    bars = custom.get("drawStyle") == "bars"
    times = sorted({t for s in series for t in s.times})
    step = min((b - a for a, b in itertools.pairwise(times)), default=60.0)
    layers = (
        stack(series, times)
        if stacked
        else [(s.times, [0.0] * len(s.values), s.values) for s in series]
    )
    for i, (s, (ts, low, ys)) in enumerate(zip(series, layers, strict=True)):
        color = series_color(panel, s.legend, i)
        xs = [day(t) for t in ts]
        if bars:
            heights = [y - lo for y, lo in zip(ys, low, strict=True)]
            width = step / 86400.0 * 0.8
            ax.bar(xs, heights, bottom=low, width=width, color=color, label=s.legend)
            continue
        line = ys
        if stacked:  # a layer that is zero here would draw over the one below: hide it
            line = [y if shown else math.nan for y, shown in zip(ys, visible(ys, low), strict=True)]
            ax.fill_between(xs, low, ys, color=color, alpha=0.25, linewidth=0)
        ax.plot(xs, line, color=color, linewidth=1.6, label=s.legend)
    ax.set_ylim(bottom=defaults.get("min", None), top=defaults.get("max", None))
    low_y, high_y = ax.get_ylim()
    if decimals == 0 and high_y - low_y < 1:  # flat zero: one integer step, as Grafana draws it
        ax.set_ylim(low_y, low_y + 1)
    if decimals == 0:
        ax.yaxis.set_major_locator(MaxNLocator(nbins=4, integer=True))
    else:
        ax.yaxis.set_major_locator(MaxNLocator(nbins=4))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: fmt(v, unit, decimals)))
    ax.xaxis.set_major_locator(MaxNLocator(nbins=5))
    if series:
        ax.legend(
            loc="upper left",
            bbox_to_anchor=(0, -0.12),
            ncol=min(len(series), 3),
            fontsize=7,
            frameon=False,
            labelcolor=TEXT,
            handlelength=1.2,
            columnspacing=1.0,
        )


def stack(
    series: list[Series], times: list[float]
) -> list[tuple[list[float], list[float], list[float]]]:
    """(times, bottom, top) per series, stacked in order; missing and NaN values count as 0."""
    base = dict.fromkeys(times, 0.0)
    out = []
    for s in series:
        by_time = dict(zip(s.times, s.values, strict=True))
        low = [base[t] for t in times]
        values = [by_time.get(t, 0.0) for t in times]
        top = [lo + (v if math.isfinite(v) else 0.0) for lo, v in zip(low, values, strict=True)]
        base.update(zip(times, top, strict=True))
        out.append((times, low, top))
    return out


def visible(top: list[float], low: list[float]) -> list[bool]:
    """Points of a stacked layer worth a line: non-zero here or at a neighbour."""
    nonzero = [t != lo for t, lo in zip(top, low, strict=True)]
    padded = [False, *nonzero, False]
    return [any(padded[j : j + 3]) for j in range(len(nonzero))]


def draw_stat(ax: Axes, panel: dict[str, Any], series: list[Series]) -> None:
    defaults = panel["fieldConfig"]["defaults"]
    values = [v for v in (series[0].values if series else []) if math.isfinite(v)]
    ax.set_xticks([])
    ax.set_yticks([])
    ax.grid(False)
    if not values:
        return
    value = values[-1]
    color = NAMED["green"]
    for threshold in defaults.get("thresholds", {}).get("steps", []):
        if threshold["value"] is None or value >= threshold["value"]:
            color = NAMED.get(threshold["color"], threshold["color"])
    ax.set_facecolor(color)
    ax.plot(range(len(values)), values, color="white", alpha=0.35, linewidth=1.5)
    ax.set_ylim(0, max(values) * 2.2 or 1)
    ax.text(
        0.5,
        0.55,
        fmt(value, defaults.get("unit", "short")),
        transform=ax.transAxes,
        ha="center",
        va="center",
        fontsize=26,
        color="white",
        weight="bold",
    )


def draw_bargauge(ax: Axes, panel: dict[str, Any], series: list[Series]) -> None:
    unit = panel["fieldConfig"]["defaults"].get("unit", "short")
    ax.grid(False)
    rows = [(s.legend, s.values[-1]) for s in series if s.values]
    if not rows:
        return
    top = max(v for _, v in rows) or 1
    for i, (name, value) in enumerate(reversed(rows)):
        color = series_color(panel, name, len(rows) - 1 - i)
        ax.barh(i, top, color=GRID, height=0.7)
        ax.barh(i, value, color=color, height=0.7)
        ax.text(top * 1.02, i, fmt(value, unit), va="center", fontsize=8, color=TEXT)
    ax.set_yticks(range(len(rows)), [name for name, _ in reversed(rows)], fontsize=7.5)
    ax.set_xticks([])
    ax.set_xlim(0, top * 1.12)


# -- layout --------------------------------------------------------------------------------------


def axes_for(fig: Figure, grid: dict[str, int], height: int, panel_type: str) -> tuple[Axes, Any]:
    """Axes inside the panel's grid cell (figure fractions), leaving room for title and legend."""
    fig_w, fig_h = GRID_COLUMNS * COLUMN_IN, height * ROW_IN
    x0 = grid["x"] * COLUMN_IN / fig_w
    w = grid["w"] * COLUMN_IN / fig_w
    top = 1 - grid["y"] * ROW_IN / fig_h
    h = grid["h"] * ROW_IN / fig_h
    pad_x, pad_y = 0.16 / fig_w, 0.16 / fig_h  # gap between panels, inches
    frame = fig.add_axes((x0 + pad_x / 2, top - h + pad_y / 2, w - pad_x, h - pad_y))
    frame.set_facecolor(PANEL)
    frame.set_xticks([])
    frame.set_yticks([])
    for spine in frame.spines.values():
        spine.set_color(GRID)
    title_in, legend_in = 0.4, (0.62 if panel_type == "timeseries" else 0.12)
    left = {"timeseries": 0.55, "bargauge": 1.55, "stat": 0.12}[panel_type]
    inner = (
        x0 + pad_x / 2 + left / fig_w,
        top - h + pad_y / 2 + legend_in / fig_h,
        w - pad_x - (left + 0.15) / fig_w,
        h - pad_y - (title_in + legend_in) / fig_h,
    )
    return fig.add_axes(inner), frame


def render(
    dashboard: dict[str, Any], prom: Prometheus, start: float, end: float, out: Path
) -> None:
    """Query every panel's targets over [start, end] (unix seconds) and write a PNG."""
    header = 3  # grid rows above the first panel, for the title line
    panels = [
        {**p, "gridPos": {**p["gridPos"], "y": p["gridPos"]["y"] + header}}
        for p in dashboard["panels"]
    ]
    height = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels) + 1  # + bottom margin
    step = max(prom.scrape_interval_s, (end - start) / 240)
    fig = plt.figure(figsize=(GRID_COLUMNS * COLUMN_IN, height * ROW_IN), facecolor=BACKGROUND)
    draw_header(fig, dashboard["title"], start, end, height)
    for panel in panels:
        if panel["type"] == "row":
            y = 1 - (panel["gridPos"]["y"] + 0.75) / height
            fig.text(0.01, y, panel["title"], color=TEXT, fontsize=12, weight="bold")
        else:
            draw_panel(fig, panel, fetch(prom, panel, start, end, step), height, (start, end))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110, facecolor=BACKGROUND)
    plt.close(fig)


def draw_header(fig: Figure, title: str, start: float, end: float, height: int) -> None:
    first, last = datetime.fromtimestamp(start, UTC), datetime.fromtimestamp(end, UTC)
    y = 1 - 0.5 / (height * ROW_IN)
    fig.text(0.01, y, title, color=TEXT, fontsize=16, weight="bold")
    note = f"{first:%Y-%m-%d %H:%M} to {last:%H:%M} UTC · data from a real Prometheus"
    fig.text(0.99, y, note + " · drawn by render.py", color="#8e8e9a", fontsize=9, ha="right")


def draw_panel(
    fig: Figure,
    panel: dict[str, Any],
    series: list[Series],
    height: int,
    span: tuple[float, float],
) -> None:
    grid = panel["gridPos"]
    ax, frame = axes_for(fig, grid, height, panel["type"])
    style(ax)
    frame.text(
        0.012,
        1 - 0.2 / (grid["h"] * ROW_IN),
        panel["title"],
        transform=frame.transAxes,
        color=TEXT,
        fontsize=9.5,
        weight="bold",
        va="top",
    )
    if panel["type"] == "timeseries":
        draw_timeseries(ax, panel, series)
        ax.set_xlim(day(span[0]), day(span[1]))
        clock = "%H:%M" if span[1] - span[0] > 1200 else "%H:%M:%S"
        ax.xaxis.set_major_formatter(mdates.DateFormatter(clock, tz=UTC))  # type: ignore[no-untyped-call]
    elif panel["type"] == "stat":
        draw_stat(ax, panel, series)
    else:
        draw_bargauge(ax, panel, series)
    if not series:
        ax.text(
            0.5,
            0.5,
            "No data",
            transform=ax.transAxes,
            ha="center",
            va="center",
            color="#8e8e9a",
            fontsize=10,
        )


def load_dashboard(path: Path = HERE / "hydrator.json") -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(path.read_text())
    return doc


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prometheus", required=True, help="base URL, e.g. http://127.0.0.1:9090")
    parser.add_argument("--dashboard", type=Path, default=HERE / "hydrator.json")
    parser.add_argument("--minutes", type=float, default=15.0, help="time range ending at --end")
    parser.add_argument("--end", type=float, default=None, help="unix time (default: now)")
    parser.add_argument("--scrape-interval", type=float, default=15.0, help="seconds")
    parser.add_argument("--out", type=Path, default=Path("dashboard.png"))
    args = parser.parse_args(argv)
    end = args.end if args.end is not None else time.time()
    prom = Prometheus(args.prometheus, args.scrape_interval)
    render(load_dashboard(args.dashboard), prom, end - args.minutes * 60, end, args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
