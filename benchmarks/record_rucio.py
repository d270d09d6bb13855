"""Record a real Rucio server's answers to the calls the Rucio source makes.

Starts the test suite's Rucio 41.5.1 server (:mod:`tests.support.rucio_server`, 127.0.0.1, a
free port, removed afterwards), places a few datasets (complete, partial, replicating, stuck,
spread over two RSEs of one site), runs abacus, then makes each call with ``rucio-clients`` and
records method, path, query, status, content type and body (two rows at most per answer) via a
``requests`` response hook. ``benchmarks/rucio_wire.json`` is its output; the benchmark's
replay server (:mod:`benchmarks.replay`) is checked against it by tests/benchmarks/test_cycle.py.

``python -m benchmarks.record_rucio [OUT]`` (default ``benchmarks/rucio_wire.json``).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from tests.support.rucio_server import RucioAdmin, make_server, unique

MAX_ROWS = 2


def _populate(admin: RucioAdmin, tag: str) -> tuple[list[str], str, dict[str, str]]:
    a1 = admin.rse("SITE_A", attributes={"rec": tag})
    a2 = admin.rse("SITE_A", attributes={"rec": tag})
    b1 = admin.rse("SITE_B", attributes={"rec": tag})
    scope = admin.scope()
    complete = admin.many_datasets(scope, 1, a1, files=3)[0]
    partial = admin.dataset(scope, 4, at=[a2], available=2)
    admin.rule(scope, partial, a2)
    replicating = admin.dataset(scope, 3, at=[a1])
    admin.rule(scope, replicating, b1)
    stuck = admin.dataset(scope, 2, at=[a1])
    admin.make_stuck(admin.rule(scope, stuck, b1))
    spread = admin.dataset(scope, 3, at=[a2], available=3)
    admin.rule(scope, spread, a2)
    names = {"complete": complete, "partial": partial, "replicating": replicating}
    return [a1, a2, b1], scope, names | {"stuck": stuck, "spread": spread}


def _recorder(out: list[dict[str, Any]]) -> Any:
    def hook(response: Any, *args: Any, **kwargs: Any) -> Any:
        url = urlsplit(response.url)
        body = response.content.decode()
        if response.headers.get("Content-Type") == "application/x-json-stream":
            body = "".join(line + "\n" for line in body.splitlines()[:MAX_ROWS])
        sent = response.request.body
        out.append(
            {
                "method": response.request.method,
                "path": url.path,
                "query": url.query,
                "status": response.status_code,
                "content_type": response.headers.get("Content-Type"),
                "request_body": sent.decode() if isinstance(sent, bytes) else sent,
                "body": body,
            }
        )
        return response

    return hook


def record() -> dict[str, Any]:
    server = make_server()
    calls: list[dict[str, Any]] = []
    try:
        admin = RucioAdmin(server)
        tag = unique("rec").lower()
        rses, scope, names = _populate(admin, tag)
        server.run_abacus()
        client = admin.client
        client.session.hooks["response"].append(_recorder(calls))
        list(client.list_rses(f"rec={tag}"))
        client.list_rse_attributes(rses[0])
        for rse in rses:
            list(client.list_datasets_per_rse(rse))
        list(client.list_replication_rules({"state": "R"}))
        list(client.list_replication_rules({"state": "S"}))
        list(client.list_rses(rses[2]))
        list(client.list_dataset_replicas(scope, names["partial"], deep=True))
        spread = [{"scope": scope, "name": names["spread"]}]
        list(client.list_replicas(spread, all_states=True))
        return {
            "recorded_with": "Rucio 41.5.1 test server, rucio-clients, benchmarks/record_rucio.py",
            "rses": rses,
            "scope": scope,
            "datasets": names,
            "calls": calls,
        }
    finally:
        server.stop()
        shutil.rmtree(server.dir, ignore_errors=True)


def main() -> None:
    """Record into ``sys.argv[1]`` (default ``benchmarks/rucio_wire.json``)."""
    target = Path(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/rucio_wire.json")
    target.write_text(json.dumps(record(), indent=1) + "\n")


if __name__ == "__main__":
    main()
