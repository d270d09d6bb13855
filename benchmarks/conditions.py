"""The machine a scenario's result was measured on, as its result file records it."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any


def machine() -> dict[str, Any]:
    """CPU model, cores, memory and swap (GiB), Python and the load averages (1, 5, 15 min)
    now: this session's machine is shared with other engineers, so a result names how busy
    it was."""
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
