"""Rucio API calls per cycle: the hydrator's Rucio source against naive per-dataset querying.

On a real Rucio 41.5.1 server (:mod:`tests.support.rucio_server`, started here on 127.0.0.1
and a free port, removed afterwards): 5 RSEs at 5 sites, then 10, 100 and 1000 datasets
(spread over the RSEs, each complete with a rule, summary table filled by abacus). At each
size, one :meth:`RucioSource.fetch` (its own call counter, ``calls_last_fetch``) and the naive
way, done for real with the same client library: list the scope's datasets, then
``list_dataset_replicas(scope, name, deep=True)`` per dataset.

``python -m benchmarks.rucio_bench`` prints the JSON.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from hydrator.adapters.sources.rucio import RucioSource
from hydrator.config import RucioSourceConfig
from hydrator.core.ports import FetchContext
from tests.support.rucio_server import RucioAdmin, RucioServer, make_server, unique


def _config(server: RucioServer, expression: str) -> RucioSourceConfig:
    return RucioSourceConfig(
        type="rucio",
        rucio_host=server.url,
        auth_host=server.url,
        account="root",
        auth_type="userpass",
        username=server.username,
        password_file=server.password_file,
        rse_expression=expression,
        timeout_s=30.0,
    )


def _naive(admin: RucioAdmin, scope: str) -> tuple[int, int, float]:
    """(API calls, replicas found, seconds): list the datasets, then one call per dataset."""
    t0 = time.perf_counter()
    names = [d for d in admin.client.list_dids(scope, {"type": "dataset"}, did_type="dataset")]
    calls, found = 1, 0
    for name in names:
        found += sum(1 for _ in admin.client.list_dataset_replicas(scope, name, deep=True))
        calls += 1
    return calls, found, time.perf_counter() - t0


def _source(server: RucioServer, expression: str) -> tuple[dict[str, int], int, float]:
    source = RucioSource(_config(server, expression), {})
    try:
        source.fetch(FetchContext(now=datetime.now(UTC)))  # warm: client and token
        t0 = time.perf_counter()
        snapshot = source.fetch(FetchContext(now=datetime.now(UTC)))
        return dict(source.calls_last_fetch), len(snapshot.replicas), time.perf_counter() - t0
    finally:
        source.close()


def measure(counts: Sequence[int] = (10, 100, 1000), n_rses: int = 5) -> dict[str, Any]:
    server = make_server()
    try:
        admin = RucioAdmin(server)
        tag = unique("bench").lower()
        rses = [admin.rse(f"BENCH-{tag}-S{i}", attributes={"bench": tag}) for i in range(n_rses)]
        expression = f"bench={tag}"
        scope = admin.scope()
        placed, rows = 0, []
        for target in counts:
            for i, rse in enumerate(rses):
                share = (target - placed) // n_rses + (i < (target - placed) % n_rses)
                if share:
                    admin.many_datasets(scope, share, rse)
            placed = target
            server.run_abacus()
            calls, replicas, source_s = _source(server, expression)
            naive_calls, naive_found, naive_s = _naive(admin, scope)
            rows.append(
                {
                    "datasets": target,
                    "rses": n_rses,
                    "source_calls": sum(
                        v for k, v in calls.items() if k not in ("connect", "auth")
                    ),
                    "source_calls_by_method": calls,
                    "source_replicas": replicas,
                    "source_s": source_s,
                    "naive_calls": naive_calls,
                    "naive_replicas": naive_found,
                    "naive_s": naive_s,
                }
            )
        return {"rucio": "41.5.1 (real server, sqlite, 127.0.0.1)", "rows": rows}
    finally:
        server.stop()
        shutil.rmtree(server.dir, ignore_errors=True)


if __name__ == "__main__":
    print(json.dumps(measure(), indent=1))
