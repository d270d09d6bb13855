"""A loopback Rucio for the whole-cycle benchmark: a synthetic federation served in Rucio's wire
format (issue 15).

It answers the REST calls the hydrator's Rucio source makes through ``rucio-clients``, with the
bytes a Rucio 41.5.1 server sends: ``application/x-json-stream`` (one JSON object per line)
with the fields, key order and date format recorded from the real test server in
``benchmarks/rucio_wire.json`` (``benchmarks/record_rucio.py`` re-records it;
``tests/benchmarks/test_cycle.py`` checks that these answers have the recorded shape).

The federation is :class:`benchmarks.generate.Federation` (50 sites of 4 RSEs each), mapped to
Rucio as a catalogue would hold it:

* every (dataset, site) holding is a ``collection_replicas`` row at one RSE of the site
  (``GET /replicas/rse/<rse>``); a dataset has 2..10 files;
* AVAILABLE: the row says AVAILABLE, every file there; one in 50 complete holdings is spread
  over two RSEs of its site (each row UNAVAILABLE with its share), so the source needs the
  per-file listing (``POST /replicas/list``) to see the union is complete;
* PARTIAL: the row is UNAVAILABLE with ``available_length`` < ``length``;
* REPLICATING / STUCK: a dataset rule on the RSE in state R / S with its lock counts
  (``GET /rules/?state=R``), and an UNAVAILABLE row with the OK locks as available files;
* ``GET /replicas/<scope>/<name>/datasets?deep=True`` and ``POST /replicas/list`` answer from
  the same holdings.

Answers are built once per churn (``POST /_bench/churn``, not part of what the benchmark
times) and served as stored bytes, so the server costs the client little CPU: an unchanged
federation gives byte-identical answers, as a real catalogue does.

Run: ``python -m benchmarks.replay --replicas N`` prints ``port <n>`` and serves on 127.0.0.1
until its stdin closes.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import sys
from collections import defaultdict
from typing import Any

from aiohttp import web

from benchmarks.generate import (
    AVAILABLE,
    PARTIAL,
    REPLICATING,
    SCOPES,
    STUCK,
    Federation,
    Scale,
    decode,
)

STREAM = "application/x-json-stream"
DATE = "Mon, 23 Nov 2026 11:48:48 UTC"  # Rucio's date format, as recorded
TOKEN = "root-root-hydrator-benchmark-token"
SPLIT_EVERY = 50  # one complete holding in this many is spread over two RSEs of its site

_ROW = (
    '{"scope": "%s", "name": "%s", "rse_id": "%s", "rse": "%s", "bytes": %d, "length": %d, '
    '"available_bytes": %d, "available_length": %d, "state": "%s", "created_at": "%s", '
    '"updated_at": "%s", "accessed_at": null}\n'
)
_DEEP_ROW = (
    '{"scope": "%s", "name": "%s", "rse_id": "%s", "rse": "%s", "available_bytes": %d, '
    '"available_length": %d, "created_at": "%s", "updated_at": "%s", "accessed_at": null, '
    '"length": %d, "bytes": %d, "state": "%s"}\n'
)
_RULE = (
    '{"did_type": "DATASET", "locks_ok_cnt": %d, "purge_replicas": false, '
    '"split_container": false, "state": "%s", "locks_replicating_cnt": %d, '
    '"ignore_availability": false, "meta": null, "error": null, "locks_stuck_cnt": %d, '
    '"ignore_account_limit": false, "deleted_at": null, "subscription_id": null, '
    '"rse_expression": "%s", "source_replica_expression": null, "priority": 3, '
    '"created_at": "%s", "id": "%s", "copies": 1, "activity": "User Subscriptions", '
    '"updated_at": "%s", "account": "root", "expires_at": null, "grouping": "DATASET", '
    '"comments": null, "scope": "%s", "weight": null, "notification": "NO", '
    '"child_rule_id": null, "name": "%s", "locked": false, "stuck_at": null, '
    '"eol_at": null, "bytes": null}\n'
)
FILE_BYTES = 1_000_000_000


def files_of(dataset: int) -> int:
    """Files in dataset ``dataset`` (2..10)."""
    return 2 + dataset % 9


def rse_id(rse: str) -> str:
    return hashlib.md5(rse.encode()).hexdigest()


class Catalogue:
    """The federation as Rucio rows, kept as the bytes of each answer."""

    def __init__(self, fed: Federation) -> None:
        self.fed = fed
        self.per_site = len(fed.rses) // fed.scale.sites
        self.rse_names = [rse for rse, _ in fed.rses]
        self.rse_site = dict(fed.rses)
        self.rse_ids = {rse: rse_id(rse) for rse in self.rse_names}
        self.by_rse: dict[str, bytes] = {}
        self.rules: dict[str, bytes] = {}
        self.build()

    def placements(self, dataset: int, site: int, code: int) -> list[tuple[str, int, int, str]]:
        """(RSE, files, available files, row state) of one holding: one row, or two for a
        complete holding spread over two RSEs of its site."""
        state, percent = decode(code)
        n = files_of(dataset)
        first = site * self.per_site + dataset % self.per_site
        rse = self.rse_names[first]
        if state == AVAILABLE:
            if dataset % SPLIT_EVERY == 7 and self.per_site > 1:
                other = self.rse_names[site * self.per_site + (dataset + 1) % self.per_site]
                half = n // 2
                return [
                    (rse, half, half, "UNAVAILABLE"),
                    (other, n - half, n - half, "UNAVAILABLE"),
                ]
            return [(rse, n, n, "AVAILABLE")]
        if state == PARTIAL:
            return [(rse, n, max(1, min(n - 1, n * percent // 100)), "UNAVAILABLE")]
        return [(rse, n, min(n - 1, n * percent // 100), "UNAVAILABLE")]

    def build(self) -> None:
        """Rebuild every answer from the holdings (after a churn)."""
        rows: dict[str, list[str]] = defaultdict(list)
        rules: dict[str, list[str]] = defaultdict(list)
        n_sites = self.fed.scale.sites
        for key, code in self.fed.holdings.items():
            dataset, site = divmod(key, n_sites)
            scope, name = self.fed.dataset_text(dataset)
            for rse, n, ok, state in self.placements(dataset, site, code):
                rows[rse].append(
                    _ROW
                    % (
                        scope,
                        name,
                        self.rse_ids[rse],
                        rse,
                        n * FILE_BYTES,
                        n,
                        ok * FILE_BYTES,
                        ok,
                        state,
                        DATE,
                        DATE,
                    )
                )
            kind = code & 3
            if kind in (REPLICATING, STUCK):
                rse, n, ok, _ = self.placements(dataset, site, code)[0]
                code_letter = "R" if kind == REPLICATING else "S"
                rule_id = hashlib.md5(f"{key}".encode()).hexdigest()
                stuck = (n - ok) if kind == STUCK else 0
                rules[code_letter].append(
                    _RULE
                    % (
                        ok,
                        "REPLICATING" if kind == REPLICATING else "STUCK",
                        n - ok - stuck,
                        stuck,
                        rse,
                        DATE,
                        rule_id,
                        DATE,
                        scope,
                        name,
                    )
                )
        self.by_rse = {rse: "".join(rows.get(rse, ())).encode() for rse in self.rse_names}
        self.rules = {k: "".join(rules.get(k, ())).encode() for k in ("R", "S")}

    # -- per-dataset answers ------------------------------------------------------------
    def holdings_of(self, scope: str, name: str) -> list[tuple[int, int, int]]:
        """(dataset, site, code) of every holding of one dataset."""
        try:
            dataset = int(name.removeprefix("obs_"))
        except ValueError:
            return []
        if SCOPES[dataset % len(SCOPES)] != scope:
            return []
        n_sites = self.fed.scale.sites
        found = []
        for site in range(n_sites):
            code = self.fed.holdings.get(dataset * n_sites + site)
            if code is not None:
                found.append((dataset, site, code))
        return found

    def deep(self, scope: str, name: str) -> bytes:
        """``list_dataset_replicas(deep=True)``: per RSE, files present (COPYING-only RSEs
        left out, as Rucio does)."""
        out = []
        for dataset, site, code in self.holdings_of(scope, name):
            for rse, n, ok, _ in self.placements(dataset, site, code):
                if ok == 0:
                    continue
                state = "AVAILABLE" if ok >= n else "UNAVAILABLE"
                out.append(
                    _DEEP_ROW
                    % (
                        scope,
                        name,
                        self.rse_ids[rse],
                        rse,
                        ok * FILE_BYTES,
                        ok,
                        DATE,
                        DATE,
                        n,
                        n * FILE_BYTES,
                        state,
                    )
                )
        return "".join(out).encode()

    def files(self, scope: str, name: str) -> bytes:
        """``list_replicas(all_states=True)``: each file with its state at every RSE."""
        holdings = self.holdings_of(scope, name)
        if not holdings:
            return b""
        n = files_of(holdings[0][0])
        states: list[dict[str, str]] = [{} for _ in range(n)]
        for dataset, site, code in holdings:
            placed = self.placements(dataset, site, code)
            start = 0
            for rse, rse_files, ok, _ in placed:
                # a split holding: the RSEs hold consecutive halves; else files 0..n-1
                span = range(start, start + rse_files) if len(placed) > 1 else range(n)
                for i, f in enumerate(span):
                    states[f][rse] = "AVAILABLE" if i < ok else "COPYING"
                start += rse_files
        lines = []
        for i, at in enumerate(states):
            pfns = {
                f"root://{rse.lower()}.example.org:1094//{scope}/{name}.f{i:03d}": {
                    "rse_id": self.rse_ids[rse],
                    "rse": rse,
                    "type": "DISK",
                    "volatile": False,
                    "domain": "wan",
                    "priority": 1,
                    "client_extract": False,
                }
                for rse in at
            }
            record = {
                "scope": scope,
                "name": f"{name}.f{i:03d}",
                "bytes": FILE_BYTES,
                "md5": None,
                "adler32": "0cc737eb",
                "pfns": pfns,
                "rses": {rse: [p for p, v in pfns.items() if v["rse"] == rse] for rse in at},
                "states": at,
            }
            lines.append(json.dumps(record) + "\n")
        return "".join(lines).encode()


def make_app(catalogue: Catalogue) -> web.Application:
    """The routes ``rucio-clients`` uses for the source's calls, plus ``/_bench/churn``."""

    def stream(body: bytes) -> web.Response:
        return web.Response(body=body, content_type=STREAM)

    async def auth(request: web.Request) -> web.Response:
        return web.Response(
            headers={"X-Rucio-Auth-Token": TOKEN, "X-Rucio-Auth-Token-Expires": DATE}
        )

    async def rses(request: web.Request) -> web.Response:
        expression = request.query.get("expression", "")
        names = [expression] if expression in catalogue.rse_site else catalogue.rse_names
        return stream("".join(json.dumps({"rse": r}) + "\n" for r in names).encode())

    async def attributes(request: web.Request) -> web.Response:
        rse = request.match_info["rse"]
        if rse not in catalogue.rse_site:
            raise web.HTTPNotFound()
        body = json.dumps({rse: True, "site": catalogue.rse_site[rse]}, separators=(",", ":"))
        return web.Response(text=body, content_type="application/json")

    async def per_rse(request: web.Request) -> web.Response:
        return stream(catalogue.by_rse.get(request.match_info["rse"], b""))

    async def rules(request: web.Request) -> web.Response:
        return stream(catalogue.rules.get(request.query.get("state", ""), b""))

    async def deep(request: web.Request) -> web.Response:
        return stream(catalogue.deep(request.match_info["scope"], request.match_info["name"]))

    async def listed(request: web.Request) -> web.Response:
        body: Any = await request.json()
        return stream(b"".join(catalogue.files(d["scope"], d["name"]) for d in body["dids"]))

    async def churn(request: web.Request) -> web.Response:
        done = catalogue.fed.churn()
        catalogue.build()
        return web.json_response(vars(done))

    app = web.Application(client_max_size=16 * 2**20)
    app.router.add_get("/auth/userpass", auth)
    app.router.add_get("/rses/", rses)
    app.router.add_get("/rses/{rse}/attr/", attributes)
    app.router.add_get("/replicas/rse/{rse}", per_rse)
    app.router.add_get("/rules/", rules)
    app.router.add_get("/replicas/{scope}/{name}/datasets", deep)
    app.router.add_post("/replicas/list", listed)
    app.router.add_post("/_bench/churn", churn)
    return app


async def serve(catalogue: Catalogue, port: int) -> None:
    runner = web.AppRunner(make_app(catalogue), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    bound = runner.addresses[0][1]
    print(f"port {bound}", flush=True)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.read)  # until the benchmark closes our stdin
    await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--replicas", type=int, required=True)
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    catalogue = Catalogue(Federation(Scale(args.replicas), args.seed))
    asyncio.run(serve(catalogue, args.port))


if __name__ == "__main__":
    main()
