"""The benchmarks' one entry point: ``python -m benchmarks SCENARIO [options]``.

Each scenario is a module of this package with its own options (``python -m benchmarks
SCENARIO --help``); what each measures, and the result files the docs cite, are in
``benchmarks/README.md``. Timings are printed and written, never asserted in tests.
"""

from __future__ import annotations

import argparse
import sys
from importlib import import_module

SCENARIOS = {
    "cycle": ("cycle", "whole daemon cycles against a Rucio replay (old vs new: --code DIR)"),
    "fetch": ("fetch_only", "the Rucio source's fetch alone, old vs new (--code DIR), 1M"),
    "state-store": ("state_store", "the SQLite state file alone: save, load, migration"),
    "demand": ("demand_bench", "ad sizes and cost with and without demand-driven ads"),
    "annotation": ("annotate", "job annotation at 10,000 idle jobs on the real test pool"),
    "events": ("events", "event latency, deletions, chaos vs Rucio, idle CPU (real stack)"),
    "events-bytes": ("events_bytes", "catalogue bytes: 60 s polling vs events, counted"),
    "http": ("http_load", "the HTTP server under wrk while cycles run, idle and slow clients"),
    "locality": ("locality", "do jobs and glideins go to the data? 8 ways on the real test pool"),
    "coverage": ("coverage", "share of slot-seconds carrying the current lists, on the real pool"),
    "arrival": ("arrival", "change to the slot ad, data arrival to job start (real stack, pool)"),
    "repair-look": ("repair_look", "collector CPU of one repair look at 20,000 slot ads"),
    "replay": ("replay", "serve the generated federation in Rucio's wire format"),
    "record-rucio": ("record_rucio", "re-record rucio_wire.json from a real Rucio server"),
    "generate": ("generate", "print the generated federation's size at a scale"),
    "model-tricks": ("model_tricks", "the tricks of core/model.py against the plain code, 1M"),
    "fast-paths": ("fast_paths", "the fast paths outside core/model.py against the plain code"),
}
"""Scenario name -> (module in this package, one line of help)."""


def main(argv: list[str] | None = None) -> None:
    """Run the scenario named first in ``argv`` with the rest of ``argv`` as its options."""
    args = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description=__doc__.splitlines()[0] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join(f"  {name:13} {text}" for name, (_, text) in SCENARIOS.items()),
    )
    parser.add_argument("scenario", choices=SCENARIOS, metavar="SCENARIO")
    parser.parse_args(args[:1])
    name = args[0]
    sys.argv = [f"python -m benchmarks {name}", *args[1:]]
    sys.exit(import_module(f"benchmarks.{SCENARIOS[name][0]}").main())


if __name__ == "__main__":
    main()
