"""The machine a scenario's result was measured on, and how a scenario gives its result: printed,
and written in full to its ``--json`` file."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any


def emit(result: Any, path: Path | None, shown: Any = None) -> None:
    """Print ``shown`` (default: ``result``) as indented JSON, and write ``result`` in full to
    ``path`` (a scenario's ``--json``; None: print only)."""
    print(json.dumps(result if shown is None else shown, indent=1))
    if path is not None:
        path.write_text(json.dumps(result, indent=1) + "\n")


def machine() -> dict[str, Any]:
    """CPU model, cores, memory and swap (GiB), Python and the load averages (1, 5, 15 min)
    now: the machine may be shared, so a result names how busy it was."""
    info = Path("/proc/cpuinfo").read_text().splitlines()
    cpu = next((line.split(":", 1)[1].strip() for line in info if "model name" in line), "?")
    memory = kib("meminfo")
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "ram_gib": round(memory["MemTotal"] / 2**20, 1),
        "available_gib": round(memory["MemAvailable"] / 2**20, 1),
        "swap_gib": round(memory["SwapTotal"] / 2**20, 1),
        "swap_used_gib": round((memory["SwapTotal"] - memory["SwapFree"]) / 2**20, 1),
        "load_average": os.getloadavg(),
        "python": platform.python_version(),
    }


def kib(name: str) -> dict[str, int]:
    """The figures in KiB of ``/proc/<name>`` (``meminfo``, ``self/status``), by name."""
    rows = (line.split() for line in Path("/proc", name).read_text().splitlines())
    return {row[0].rstrip(":"): int(row[1]) for row in rows if row[-1] == "kB"}
