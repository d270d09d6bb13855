"""A loopback Rucio for the whole-cycle benchmark: a synthetic federation served in Rucio's wire
format.

It answers the REST calls the hydrator's Rucio source makes through ``rucio-clients`` with the
bytes a Rucio 41.5.1 server sends: JSON lines whose fields, key order and date format are those
recorded from the real test server in ``benchmarks/rucio_wire.json`` (``record_rucio.py``
re-records it, ``tests/benchmarks/test_cycle.py`` compares). Each (dataset, site) holding of
the federation (:mod:`benchmarks.generate`) is a ``collection_replicas`` row at one RSE of its
site: AVAILABLE, or UNAVAILABLE with the files present (REPLICATING and STUCK also have a
dataset rule in state R / S); one complete holding in :data:`SPLIT_EVERY` is spread over two
RSEs of its site, so the source needs the per-file listing to see it complete
(:meth:`Catalogue.placements`; benchmarks/RESULTS.md describes the federation).

Each answer is generated when asked and streamed in chunks, as Rucio streams its JSON lines;
encoded chunks are kept until a churn touches their rows, within ``--cache-mib``, so an
unchanged federation gives byte-identical answers, as a real catalogue does. ``POST
/_bench/churn`` churns (untimed by the benchmark); ``GET /_bench/stats`` says what the replay
cost, which ``benchmarks/cycle.py`` records with each run (``replay`` in its JSON). Its bodies
are 410 MB at 1M replicas and 4.1 GB at 10M (about 1.5 µs of CPU a row to format): the default
cache (768 MiB) holds them all at 1M, a fifth at 10M, so ``cycle.py`` sizes it for all. (The
``--sweep`` mode that measured this alone has since been removed: ``git show
7d386f0:benchmarks/replay.py``.)

Run: ``python -m benchmarks.replay --replicas N`` prints ``port <n>`` and serves on 127.0.0.1
until its stdin closes.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import resource
import sys
import time
from collections.abc import Iterator
from functools import cache
from typing import Any

from aiohttp import web

from benchmarks.generate import (
    AVAILABLE,
    PARTIAL,
    REPLICATING,
    SCOPES,
    STUCK,
    Churn,
    Federation,
    Scale,
    decode,
    encode,
)

STREAM = "application/x-json-stream"
DATE = "Mon, 23 Nov 2026 11:48:48 UTC"  # Rucio's date format, as recorded
DATE_BYTES = DATE.encode()
TOKEN = "root-root-hydrator-benchmark-token"
SPLIT_EVERY = 50  # one complete holding in this many is spread over two RSEs of its site

_ROW_HEAD = b'{"scope": "%s", "name": "obs_%07d", '  # then the RSE's part, then the tail
_SCOPE_BYTES = [scope.encode() for scope in SCOPES]
_ROW_TAIL = (
    b'"bytes": %d, "length": %d, "available_bytes": %d, "available_length": %d, "state": "%s", '
    b'"created_at": "%s", "updated_at": "%s", "accessed_at": null}\n'
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
BLOCK_DATASETS = 256  # datasets per chunk of an RSE's summary answer (~13 rows at one RSE)
RULE_KEYS = 256  # keys (dataset * sites + site) per chunk of a rules answer (~5 rules)
RULES = {"R": -1, "S": -2}  # chunk owners of the two rules answers (RSEs are 0..199)
DEFAULT_CACHE_BYTES = 768 * 2**20
WRITE_BYTES = 256 * 1024  # the streamed body is written in pieces of about this size
MAX_FILES = 10


def files_of(dataset: int) -> int:
    """Files in dataset ``dataset`` (2..``MAX_FILES``)."""
    return 2 + dataset % (MAX_FILES - 1)


@cache
def _tail(n: int, ok: int, state: str) -> bytes:
    """The end of a summary row (sizes, state, dates): few distinct ones, each made once."""
    values = (n * FILE_BYTES, n, ok * FILE_BYTES, ok, state.encode(), DATE_BYTES, DATE_BYTES)
    return _ROW_TAIL % values


class Catalogue:
    """The federation as Rucio rows, generated on request from its compact holdings.

    The two bulk answers (the per-RSE summary rows and the rules in state R / S) are cut into
    chunks by key range (:data:`BLOCK_DATASETS` datasets of one RSE; :data:`RULE_KEYS` keys of
    rules), each encoded when first asked for and kept while ``cache_bytes`` has room (first
    come, first kept: a sequential sweep larger than the cache would evict everything an LRU
    keeps); :meth:`churn` drops the chunks it touches. Rows come in key order (dataset, site).
    """

    def __init__(self, fed: Federation, cache_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        self.fed = fed
        self.holdings = fed.holdings
        self.holdings.take_touched()  # from now on churn records the keys it touches
        self.per_site = len(fed.rses) // fed.scale.sites
        self.rse_names = [rse for rse, _ in fed.rses]
        self.rse_index = {rse: i for i, rse in enumerate(self.rse_names)}
        self.rse_site = dict(fed.rses)
        self.rse_ids = {rse: hashlib.md5(rse.encode()).hexdigest() for rse in self.rse_names}
        self._rse_part = [
            b'"rse_id": "%s", "rse": "%s", ' % (self.rse_ids[r].encode(), r.encode())
            for r in self.rse_names
        ]
        self.cache: dict[tuple[int, int], bytes] = {}  # (RSE index or -1/-2 rules, block)
        self.cache_bytes = cache_bytes
        self.cached_bytes = 0
        self.served_bytes = self.generated_bytes = 0
        self.generate_s = 0.0  # building the federation (set by whoever built it)
        self.bad_replicas = 0  # BAD replicas listed (``--bad-replicas``)
        self.touched: list[tuple[str, str, str, bool]] = []  # by the last churn

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

    # -- the bulk answers, chunk by chunk ----------------------------------------------------
    def answer(self, which: int) -> Iterator[bytes]:
        """The body of one bulk answer, chunk by chunk: RSE ``which``'s summary rows, or the
        rules (``which`` = ``RULES[letter]``)."""
        per_block = RULE_KEYS if which < 0 else self.fed.scale.sites * BLOCK_DATASETS
        blocks = -(-len(self.holdings.states) // per_block)
        return (self.chunk(which, block) for block in range(blocks))

    def chunk(self, which: int, block: int) -> bytes:
        """The encoded rows of chunk ``(which, block)``: RSE ``which``'s summary rows for the
        datasets of ``block``, or (``which`` = ``RULES[letter]``) the rules of a key range."""
        body = self.cache.get((which, block))
        if body is None:
            body = self._rule_chunk(which, block) if which < 0 else self._rse_chunk(which, block)
            self.generated_bytes += len(body)
            if self.cached_bytes + len(body) <= self.cache_bytes:
                self.cache[(which, block)] = body
                self.cached_bytes += len(body)
        self.served_bytes += len(body)
        return body

    def _rse_chunk(self, rse: int, block: int) -> bytes:
        """Rows at RSE ``rse`` of the datasets in ``block``, in dataset order: its own
        (``dataset % per_site`` selects the RSE of a site) and the second half of its
        neighbour's split holdings. A complete unsplit holding (most rows) takes the short way."""
        n_sites, per_site = self.fed.scale.sites, self.per_site
        site, j = divmod(rse, per_site)
        states = self.holdings.states
        lo = block * BLOCK_DATASETS
        hi = min((block + 1) * BLOCK_DATASETS, len(states) // n_sites)
        first = lo + (j - lo) % per_site  # the first dataset of the block at this RSE
        rows: list[tuple[int, bytes]] = []
        head, part, scopes = _ROW_HEAD, self._rse_part[rse], _SCOPE_BYTES
        complete = [_tail(n, n, "AVAILABLE") for n in range(MAX_FILES + 1)]
        sliced = states[first * n_sites + site : hi * n_sites : per_site * n_sites]
        for i, st in enumerate(sliced):
            if not st:
                continue
            dataset = first + i * per_site
            if st == AVAILABLE + 1 and dataset % SPLIT_EVERY != 7:
                scope = scopes[dataset % len(scopes)]
                row = head % (scope, dataset) + part + complete[files_of(dataset)]
                rows.append((dataset, row))
            else:
                rows += self._placed(dataset, site, rse)
        if per_site > 1:  # the second halves of the split holdings whose first is at RSE j - 1
            for dataset in range(lo + (7 - lo) % SPLIT_EVERY, hi, SPLIT_EVERY):
                if (dataset + 1) % per_site == j and states[dataset * n_sites + site]:
                    rows += self._placed(dataset, site, rse)
            rows.sort()
        return b"".join(row for _, row in rows)

    def _placed(self, dataset: int, site: int, rse: int) -> list[tuple[int, bytes]]:
        """The rows that holding (``dataset``, ``site``) has at ``rse`` (the general way)."""
        key = dataset * self.fed.scale.sites + site
        code = encode(self.holdings.states[key] - 1, self.holdings.percents[key])
        name = self.rse_names[rse]
        head = _ROW_HEAD % (_SCOPE_BYTES[dataset % len(SCOPES)], dataset) + self._rse_part[rse]
        return [
            (dataset, head + _tail(n, ok, state))
            for at, n, ok, state in self.placements(dataset, site, code)
            if at == name
        ]

    def _rule_chunk(self, which: int, block: int) -> bytes:
        """The rules in state ``which`` (``RULES[letter]``) of the keys in ``block``."""
        kind = REPLICATING if which == RULES["R"] else STUCK
        state = "REPLICATING" if kind == REPLICATING else "STUCK"
        states, percents = self.holdings.states, self.holdings.percents
        n_sites = self.fed.scale.sites
        lo, hi = block * RULE_KEYS, min(len(states), (block + 1) * RULE_KEYS)
        out = []
        key = states.find(kind + 1, lo, hi)
        while key >= 0:
            dataset, site = divmod(key, n_sites)
            rse, n, ok, _ = self.placements(dataset, site, encode(kind, percents[key]))[0]
            scope, name = self.fed.dataset_text(dataset)
            stuck = (n - ok) if kind == STUCK else 0
            rule_id = hashlib.md5(f"{key}".encode()).hexdigest()
            out.append(
                _RULE % (ok, state, n - ok - stuck, stuck, rse, DATE, rule_id, DATE, scope, name)
            )
            key = states.find(kind + 1, key + 1, hi)
        return "".join(out).encode()

    def churn(self) -> Churn:
        """Churn the federation once and drop the chunks whose rows it changed; the holdings
        touched are kept in :attr:`touched` as (scope, name, RSE, still held)."""
        done = self.fed.churn()
        n_sites, per_site = self.fed.scale.sites, self.per_site
        self.touched = []
        for key, was in self.holdings.take_touched().items():
            dataset, site = divmod(key, n_sites)
            rse = self.rse_names[site * per_site + dataset % per_site]
            held = self.holdings.get(key) is not None
            self.touched.append((SCOPES[dataset % len(SCOPES)], f"obs_{dataset:07d}", rse, held))
            block = dataset // BLOCK_DATASETS
            base = site * per_site
            self._drop(base + dataset % per_site, block)
            if dataset % SPLIT_EVERY == 7:
                self._drop(base + (dataset + 1) % per_site, block)
            now = self.holdings.state_at(key)
            for kind, which in ((REPLICATING, RULES["R"]), (STUCK, RULES["S"])):
                if kind + 1 in (was, now):
                    self._drop(which, key // RULE_KEYS)
        return done

    def stats(self) -> dict[str, float]:
        """This process's peak RSS (MiB) and CPU seconds so far, and the cache's use."""
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return {
            "peak_rss_mib": usage.ru_maxrss / 1024,  # Linux: KiB
            "cpu_s": usage.ru_utime + usage.ru_stime,
            "generate_s": self.generate_s,
            "cache_mib": self.cached_bytes / 2**20,
            "served_mib": self.served_bytes / 2**20,
            "generated_mib": self.generated_bytes / 2**20,
        }

    def _drop(self, which: int, block: int) -> None:
        body = self.cache.pop((which, block), None)
        if body is not None:
            self.cached_bytes -= len(body)

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
        codes = ((site, self.holdings.get(dataset * n_sites + site)) for site in range(n_sites))
        return [(dataset, site, code) for site, code in codes if code is not None]

    def deep(self, scope: str, name: str) -> bytes:
        """``list_dataset_replicas(deep=True)``: per RSE, files present (COPYING-only RSEs
        left out, as Rucio does)."""
        out = []
        for dataset, site, code in self.holdings_of(scope, name):
            for rse, n, ok, _ in self.placements(dataset, site, code):
                if ok:
                    row = {"scope": scope, "name": name, "rse_id": self.rse_ids[rse], "rse": rse,
                           "available_bytes": ok * FILE_BYTES, "available_length": ok,
                           "created_at": DATE, "updated_at": DATE, "accessed_at": None,
                           "length": n, "bytes": n * FILE_BYTES,
                           "state": "AVAILABLE" if ok >= n else "UNAVAILABLE"}  # fmt: skip
                    out.append(json.dumps(row) + "\n")
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
            file = f"{name}.f{i:03d}"
            pfns = {rse: f"root://{rse.lower()}.example.org:1094//{scope}/{file}" for rse in at}
            record = {
                "scope": scope, "name": file, "bytes": FILE_BYTES, "md5": None,
                "adler32": "0cc737eb",
                "pfns": {pfn: {"rse_id": self.rse_ids[rse], "rse": rse, "type": "DISK",
                               "volatile": False, "domain": "wan", "priority": 1,
                               "client_extract": False} for rse, pfn in pfns.items()},
                "rses": {rse: [pfn] for rse, pfn in pfns.items()},
                "states": at,
            }  # fmt: skip
            lines.append(json.dumps(record) + "\n")
        return "".join(lines).encode()

    def bad(self, limit: int) -> bytes:
        """``GET /replicas/bad/states?state=B``: ``bad_replicas`` (at most ``limit``) BAD
        records, the first file of the first complete one-RSE holding of as many datasets, in
        key order. Minimal: the per-dataset answers still say complete (what is measured is
        the cost)."""
        out: list[str] = []
        seen: set[int] = set()
        n_sites = self.fed.scale.sites
        for key in self.holdings.ordered():
            if len(out) >= min(limit, self.bad_replicas):
                break
            dataset, site = divmod(key, n_sites)
            if dataset in seen:
                continue
            seen.add(dataset)
            code = self.holdings.get(key)
            if code is None or decode(code)[0] != AVAILABLE:
                continue
            placed = self.placements(dataset, site, code)
            if len(placed) == 1:
                rse = placed[0][0]
                scope = SCOPES[dataset % len(SCOPES)]
                record = {"scope": scope, "name": f"obs_{dataset:07d}.f000", "rse": rse,
                          "rse_id": self.rse_ids[rse], "state": "BAD",
                          "created_at": DATE, "updated_at": DATE}  # fmt: skip
                out.append(json.dumps(record) + "\n")
        return "".join(out).encode()


def make_app(catalogue: Catalogue) -> web.Application:
    """The routes ``rucio-clients`` uses for the source's calls, plus ``/_bench/churn`` and
    ``/_bench/stats``."""

    def stream(body: bytes) -> web.Response:
        return web.Response(body=body, content_type=STREAM)

    async def bulk(request: web.Request, which: int | None) -> web.StreamResponse:
        """Bulk answer ``which`` (nothing: none) written chunk by chunk as it is made (chunked
        transfer encoding, as Rucio streams), at most about :data:`WRITE_BYTES` held at once
        beyond the cache."""
        if which is None:
            return stream(b"")
        response = web.StreamResponse(headers={"Content-Type": STREAM})
        await response.prepare(request)
        pending: list[bytes] = []
        size = 0
        for body in catalogue.answer(which):
            pending.append(body)
            size += len(body)
            if size >= WRITE_BYTES:
                await response.write(b"".join(pending))
                pending, size = [], 0
        if pending:
            await response.write(b"".join(pending))
        await response.write_eof()
        return response

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

    async def per_rse(request: web.Request) -> web.StreamResponse:
        return await bulk(request, catalogue.rse_index.get(request.match_info["rse"]))

    async def rules(request: web.Request) -> web.StreamResponse:
        return await bulk(request, RULES.get(request.query.get("state", "")))

    async def deep(request: web.Request) -> web.Response:
        return stream(catalogue.deep(request.match_info["scope"], request.match_info["name"]))

    async def listed(request: web.Request) -> web.Response:
        body: Any = await request.json()
        return stream(b"".join(catalogue.files(d["scope"], d["name"]) for d in body["dids"]))

    async def bad(request: web.Request) -> web.Response:
        if request.query.get("state") != "B":
            return stream(b"")
        return stream(catalogue.bad(int(request.query.get("limit", "0"))))

    async def parents(request: web.Request) -> web.Response:
        scope, name = request.match_info["scope"], request.match_info["name"]
        record = {"scope": scope, "name": name.split(".")[0], "type": "DATASET"}
        return stream((json.dumps(record) + "\n").encode())

    async def churn(request: web.Request) -> web.Response:
        return web.json_response(vars(catalogue.churn()) | {"touched": catalogue.touched})

    async def stats(request: web.Request) -> web.Response:
        return web.json_response(catalogue.stats())

    app = web.Application(client_max_size=16 * 2**20)
    app.router.add_get("/auth/userpass", auth)
    app.router.add_get("/rses/", rses)
    app.router.add_get("/rses/{rse}/attr/", attributes)
    app.router.add_get("/replicas/rse/{rse}", per_rse)
    app.router.add_get("/rules/", rules)
    app.router.add_get("/replicas/{scope}/{name}/datasets", deep)
    app.router.add_post("/replicas/list", listed)
    app.router.add_get("/replicas/bad/states", bad)
    app.router.add_get("/dids/{scope}/{name}/parents", parents)
    app.router.add_post("/_bench/churn", churn)
    app.router.add_get("/_bench/stats", stats)
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
    parser.add_argument(
        "--cache-mib", type=int, default=DEFAULT_CACHE_BYTES // 2**20,
        help="memory for encoded answer chunks kept across requests",
    )  # fmt: skip
    parser.add_argument("--bad-replicas", type=int, default=0, help="BAD replicas listed")
    parser.add_argument("--churn-fraction", type=float, default=0.01, help="replicas a churn")
    args = parser.parse_args()
    t0 = time.perf_counter()
    fed = Federation(Scale(args.replicas, churn_fraction=args.churn_fraction), args.seed)
    catalogue = Catalogue(fed, args.cache_mib * 2**20)
    catalogue.generate_s = time.perf_counter() - t0
    catalogue.bad_replicas = args.bad_replicas
    asyncio.run(serve(catalogue, args.port))


if __name__ == "__main__":
    main()
