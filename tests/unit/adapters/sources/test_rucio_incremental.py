"""The Rucio source's incremental fetch: after random churn it answers exactly what a fresh
source reading the same answers answers, and keeps the object of every unchanged replica.

The catalogue here is a scripted world answered in Rucio's wire format (JSON lines, fields as
the real server sends them) through a stand-in for the rucio-clients ``Client`` at its public
attributes: the behaviour under test is the source's own bookkeeping, which does not depend
on the server (the server-facing behaviour is tested against a real Rucio in tests/sources).
"""

from __future__ import annotations

import copy
import io
import json
import random
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import parse_qs, unquote, unquote_plus, urlparse

import pytest
import requests

from hydrator.adapters.sources.rucio import RucioSource
from hydrator.adapters.sources.rucio.listing import line_blocks
from hydrator.adapters.sources.rucio.settling import BULK_SHARE
from hydrator.config import RucioSourceConfig
from hydrator.core.index import merged_snapshot
from hydrator.core.ports import (
    Abandonable,
    CountsCalls,
    CountsReadCalls,
    DefersChecks,
    FetchContext,
    ParentLookups,
    ReusesAnswers,
    TargetedReads,
)
from hydrator.domain import DatasetId, Snapshot
from hydrator.errors import TransientSourceError
from tests.support.rucio_client import ClientAttributes

RSES = [f"RSE_{i}" for i in range(7)]
SITES = ["SITE_A", "SITE_B", "SITE_C"]
DATASETS = [("ska", f"obs_{i:03d}") for i in range(40)] + [("-bad", "obs_x")]
SIZE = 1_000


@dataclass
class Row:
    """One summary row: files in the dataset and files available at the RSE."""

    length: int
    available: int
    complete: bool  # the row says AVAILABLE
    malformed: bool = False


@dataclass
class World:
    """A catalogue: RSE -> site attribute, summary rows, rules, exact file counts."""

    site_of: dict[str, str | None]
    rows: dict[str, dict[tuple[str, str], Row]]
    rules: list[tuple[str, tuple[str, str], str, int, int, int]]  # code, did, expr, locks
    fail: set[str] = field(default_factory=set)  # paths that answer with a broken connection
    doubled: dict[str, dict[tuple[str, str], Row]] = field(default_factory=dict)  # 2nd rows

    def summary(self, rse: str) -> bytes:
        out = []
        rows = [*self.rows.get(rse, {}).items(), *self.doubled.get(rse, {}).items()]
        for (scope, name), row in rows:
            record: dict[str, Any] = {
                "scope": scope,
                "name": name,
                "rse": rse,
                "bytes": row.length * SIZE,
                "length": "many" if row.malformed else row.length,
                "available_bytes": row.available * SIZE,
                "available_length": row.available,
                "state": "AVAILABLE" if row.complete else "UNAVAILABLE",
                "updated_at": "Mon, 23 Nov 2026 11:48:48 UTC",
            }
            out.append(json.dumps(record) + "\n")
        return "".join(out).encode()

    def rule_listing(self, code: str) -> bytes:
        out = []
        for i, (state, (scope, name), expr, ok, repl, stuck) in enumerate(self.rules):
            if state != code:
                continue
            record = {
                "id": f"rule{i}",
                "scope": scope,
                "name": name,
                "did_type": "CONTAINER" if name.endswith("7") else "DATASET",
                "rse_expression": expr,
                "state": "REPLICATING" if code == "R" else "STUCK",
                "locks_ok_cnt": ok,
                "locks_replicating_cnt": repl,
                "locks_stuck_cnt": stuck,
            }
            out.append(json.dumps(record) + "\n")
        if code == "R":
            out.append('{"scope": "ska", "name": "broken", "did_type": "DATASET"}\n')
        return "".join(out).encode()

    def expression(self, expr: str) -> list[dict[str, str]]:
        return [{"rse": rse} for rse in expr.split("|") if rse in self.site_of]

    def deep(self, scope: str, name: str) -> list[dict[str, Any]]:
        return [
            {"rse": rse, "length": row.length, "available_length": row.available + 1,
             "bytes": row.length * SIZE, "available_bytes": (row.available + 1) * SIZE}
            for rse, rows in self.rows.items()
            if (row := rows.get((scope, name))) is not None and row.available + 1 <= row.length
        ]  # fmt: skip

    def files(self, scope: str, name: str) -> list[dict[str, Any]]:
        at = {rse: row for rse, rows in self.rows.items() if (row := rows.get((scope, name)))}
        length = max((row.length for row in at.values()), default=0)
        return [
            {
                "bytes": SIZE,
                "states": {rse: "AVAILABLE" for rse, r in at.items() if i < r.available},
            }
            for i in range(length)
        ]


class Session:
    """The ``requests`` session of the stand-in client: answers the two bulk listings."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.hooks: dict[str, list[Any]] = {"response": []}

    def get(self, url: str, **kwargs: Any) -> requests.Response:
        parsed = urlparse(url)
        if parsed.path in self.world.fail:
            raise requests.ConnectionError("scripted outage")
        if parsed.path.startswith("/replicas/rse/"):
            body = self.world.summary(unquote(parsed.path.removeprefix("/replicas/rse/")))
        elif parsed.path.endswith("/datasets"):  # list_dataset_replicas(scope, name, deep=True)
            assert parse_qs(parsed.query) == {"deep": ["True"]}
            _, _, scope, name, _ = map(unquote_plus, parsed.path.split("/"))
            body = "".join(json.dumps(r) + "\n" for r in self.world.deep(scope, name)).encode()
        elif parsed.path == "/replicas/bad/states":  # no bad or unavailable replica
            body = b""
        else:
            body = self.world.rule_listing(parse_qs(parsed.query)["state"][0])
        response = requests.Response()
        response.status_code = 200
        response.raw = io.BytesIO(body)
        return response


class Client(ClientAttributes):
    """The rucio-clients ``Client`` attributes and calls the source uses, answered by ``world``."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.session = Session(world)

    def list_rses(self, expression: str | None) -> list[dict[str, Any]]:
        if expression is None:  # rucio-clients: every RSE's record, availability included
            return [{"rse": rse, "availability_read": True} for rse in self.world.site_of]
        if expression == "all":
            return [{"rse": rse} for rse in self.world.site_of]
        return self.world.expression(expression)

    def list_rse_attributes(self, rse: str) -> dict[str, str]:
        site = self.world.site_of[rse]
        return {} if site is None else {"site": site}

    def list_replicas(self, dids: list[dict[str, str]], all_states: bool) -> list[Any]:
        return self.world.files(dids[0]["scope"], dids[0]["name"])


def make_source(
    world: World, attributes_max_age_s: float = 0, bulk_share: int = BULK_SHARE
) -> RucioSource:
    """A source on ``world`` (through the stand-in client); by default reading every site
    attribute every fetch, so that a remap in :func:`churn` is seen at once, as by a fresh
    source."""
    config = RucioSourceConfig(
        type="rucio",
        rse_expression="all",
        deep_check_limit=3,
        max_attempts=1,
        rse_attributes_max_age_s=attributes_max_age_s,
    )
    return RucioSource(
        config,
        {},
        sleep=lambda _: None,
        client_factory=lambda: Client(world),
        bulk_share=bulk_share,
    )


def random_row(rng: random.Random) -> Row:
    length = rng.randint(1, 6)
    roll = rng.random()
    if roll < 0.6:
        return Row(length, length, complete=True)
    if roll < 0.65:
        return Row(length, length, complete=False)  # a split holding's share
    return Row(length, rng.randint(0, length - 1), complete=False, malformed=roll > 0.97)


def random_rule(
    rng: random.Random, rses: list[str]
) -> tuple[str, tuple[str, str], str, int, int, int]:
    expr = rng.choice(rses) if rng.random() < 0.8 else "|".join(rng.sample(rses, 2))
    return (
        rng.choice("RS"),
        rng.choice(DATASETS[:-1]),
        expr,
        rng.randint(0, 3),
        rng.randint(0, 2),
        rng.randint(0, 1),
    )


def new_world(rng: random.Random) -> World:
    site_of: dict[str, str | None] = {rse: SITES[i % 3] for i, rse in enumerate(RSES)}
    site_of[RSES[-1]] = None  # no site attribute: unmapped
    rows = {rse: {did: random_row(rng) for did in rng.sample(DATASETS, 15)} for rse in RSES}
    rules = [random_rule(rng, RSES) for _ in range(15)]
    return World(site_of, rows, rules)


def churn(world: World, rng: random.Random) -> None:
    """Rows added, removed and changed, rules added and removed, sometimes an RSE remapped."""
    for _ in range(rng.randint(0, 6)):
        rows = world.rows[rng.choice(RSES)]
        did = rng.choice(DATASETS)
        if did in rows and rng.random() < 0.5:
            del rows[did]
        else:
            rows[did] = random_row(rng)
    for _ in range(rng.randint(0, 3)):
        if world.rules and rng.random() < 0.5:
            world.rules.pop(rng.randrange(len(world.rules)))
        else:
            world.rules.append(random_rule(rng, RSES))
    if rng.random() < 0.15:
        world.site_of[rng.choice(RSES)] = rng.choice([*SITES, None])


def context(rng: random.Random) -> FetchContext:
    wanted = {DatasetId(*did): rng.randint(1, 5) for did in rng.sample(DATASETS[:-1], 3)}
    return FetchContext(now=datetime.now(UTC), wanted=wanted)


def assert_same(incremental: Snapshot, fresh: Snapshot) -> None:
    assert incremental.replicas == fresh.replicas
    # the source vouches for its sites (Snapshot.of(sites_named=True)): they name every site
    assert {r.site for r in incremental.replicas} <= incremental.sites
    assert (incremental.sites, incremental.invalid, incremental.unmapped) == (
        fresh.sites,
        fresh.invalid,
        fresh.unmapped,
    )
    assert incremental.elements == fresh.elements  # per RSE: its site, its listed datasets


def assert_kept(before: Snapshot, after: Snapshot) -> None:
    """Every replica equal to one of the last fetch is that same object."""
    old = {r: r for r in before.replicas}
    assert all(old[r] is r for r in after.replicas if r in old)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("bulk", ["usual", "always", "never"])
def test_incremental_fetch_after_random_churn_equals_a_fresh_full_fetch(
    seed: int, bulk: str
) -> None:
    """``bulk``: a site's plainly complete pairs settled in one batch where most of its pairs
    are dirty (as the source does), for every dirty site, or never: the same answers."""
    share = {"usual": BULK_SHARE, "always": 1 << 62, "never": 0}[bulk]
    rng = random.Random(seed)
    world = new_world(rng)
    source = make_source(world, bulk_share=share)
    ctx = context(rng)
    last = source.fetch(ctx)
    assert_same(last, make_source(world).fetch(ctx))
    reused = 0
    for _ in range(25):
        churn(world, rng)
        ctx = context(rng)
        snapshot = source.fetch(ctx)
        assert_same(snapshot, make_source(world).fetch(ctx))
        assert_kept(last, snapshot)
        last = snapshot
        reused += source.deep_checks_reused_last_fetch
    assert last.invalid > 0  # malformed rows and the broken rule are counted every fetch
    assert reused > 0  # deep checks whose inputs stood were reused, and gave the same


def test_a_changed_site_map_makes_every_deep_check_again() -> None:
    rng = random.Random(3)
    world = new_world(rng)
    source = make_source(world)
    source.fetch(FetchContext(now=datetime.now(UTC)))
    source.fetch(FetchContext(now=datetime.now(UTC)))
    assert (source.deep_checks_last_fetch, source.deep_checks_reused_last_fetch) == (0, 3)
    world.site_of[RSES[-1]] = SITES[0]  # the unmapped RSE gets a site: its files count there
    ctx = FetchContext(now=datetime.now(UTC))
    assert_same(source.fetch(ctx), make_source(world).fetch(ctx))
    assert source.deep_checks_reused_last_fetch == 0


def test_site_attributes_are_read_again_only_when_older_than_their_max_age() -> None:
    rng = random.Random(5)
    world = new_world(rng)
    source = make_source(world, attributes_max_age_s=600)
    t0 = datetime.now(UTC)

    def fetch(after_s: float) -> Snapshot:
        return source.fetch(FetchContext(now=t0 + timedelta(seconds=after_s)))

    fetch(0)
    assert source.calls_last_fetch["list_rse_attributes"] == len(RSES)
    world.site_of["RSE_new"] = SITES[1]  # a new RSE
    world.rows["RSE_new"] = {DATASETS[0]: Row(2, 2, complete=True)}
    before = copy.deepcopy(world)
    world.site_of[RSES[0]] = SITES[2]  # moved on the server
    ctx = FetchContext(now=t0 + timedelta(seconds=300))
    snapshot = fetch(300)
    assert source.calls_last_fetch["list_rse_attributes"] == 1  # the new RSE alone
    assert_same(snapshot, make_source(before).fetch(ctx))  # the move not seen yet
    assert snapshot.replicas != make_source(world).fetch(ctx).replicas
    later = fetch(600)  # the max age passed: every attribute read again, the move seen
    assert source.calls_last_fetch["list_rse_attributes"] == len(RSES)  # RSE_new: 300 s old
    ctx = FetchContext(now=t0 + timedelta(seconds=600))
    assert_same(later, make_source(world).fetch(ctx))


def test_an_unchanged_catalogue_gives_the_same_frozenset() -> None:
    rng = random.Random(7)
    world = new_world(rng)
    source = make_source(world)
    ctx = FetchContext(now=datetime.now(UTC))
    first = source.fetch(ctx)
    source.config = source.config.model_copy(update={"deep_check_limit": 0})
    second = source.fetch(ctx)  # deep checks stop: their pairs use the summary
    third = source.fetch(ctx)
    assert second.replicas is third.replicas
    assert first.replicas != second.replicas or not source.deep_checks_skipped_last_fetch


def test_an_answer_naming_a_dataset_twice_is_read_whole_at_its_next_change() -> None:
    """Rucio keeps one row per dataset and RSE; an answer with two keeps the first (the other
    counted invalid) and, once it changes, is read whole again: the second row counts then."""
    rng = random.Random(13)
    world = new_world(rng)
    did = next(iter(world.rows[RSES[0]]))
    world.rows[RSES[0]][did] = Row(4, 4, complete=True)
    world.doubled[RSES[0]] = {did: Row(4, 1, complete=False)}
    source = make_source(world)
    ctx = FetchContext(now=datetime.now(UTC))
    assert_same(source.fetch(ctx), make_source(world).fetch(ctx))
    del world.rows[RSES[0]][did]  # the first row goes; the second one stays
    ctx = FetchContext(now=datetime.now(UTC))
    assert_same(source.fetch(ctx), make_source(world).fetch(ctx))


def test_a_first_read_naming_a_dataset_twice_keeps_the_first_row() -> None:
    """An RSE read the first time whose answer names a dataset twice: the first row counts,
    the second is counted invalid (as when it is read whole later)."""
    rng = random.Random(17)
    world = new_world(rng)
    did = next(iter(world.rows[RSES[0]]))
    world.rows[RSES[0]][did] = Row(4, 4, complete=True)
    ctx = FetchContext(now=datetime.now(UTC))
    single = make_source(world).fetch(ctx)
    world.doubled[RSES[0]] = {did: Row(4, 1, complete=False)}
    doubled = make_source(world).fetch(ctx)
    assert doubled.replicas == single.replicas
    assert doubled.invalid == single.invalid + 1


def test_a_fetch_failing_half_way_leaves_the_next_one_exact() -> None:
    rng = random.Random(11)
    world = new_world(rng)
    source = make_source(world)
    source.fetch(FetchContext(now=datetime.now(UTC)))
    churn(world, rng)
    world.fail = {f"/replicas/rse/{RSES[3]}"}  # after three RSEs were read and applied
    with pytest.raises(TransientSourceError):
        source.fetch(FetchContext(now=datetime.now(UTC)))
    world.fail = set()
    ctx = FetchContext(now=datetime.now(UTC))
    assert_same(source.fetch(ctx), make_source(world).fetch(ctx))


@pytest.mark.parametrize("size", [1, 2, 3, 7, 64, 1 << 20])
def test_a_streamed_listing_splits_into_the_same_lines_whatever_the_block_size(size: int) -> None:
    body = b'{"a": 1}\n\n{"b": 22}\r\n{"c": 333}\n  \n{"d": 4444}'
    response = requests.Response()
    response.raw = io.BytesIO(body)
    got = [line for block in line_blocks(response.iter_content(size)) for line in block]
    assert got == [line for line in body.splitlines() if line]


@pytest.mark.parametrize("seed", range(4))
def test_a_restarted_source_answers_with_the_objects_the_daemon_holds(seed: int) -> None:
    """A new source (a restart, or the fetch after a failed one) given the daemon's replicas
    as ``FetchContext.previous`` answers exactly what a fresh source answers, with the held
    object for every replica that did not change; the changed ones are new objects."""
    rng = random.Random(100 + seed)
    world = new_world(rng)
    held = make_source(world).fetch(context(rng)).replicas
    churn(world, rng)
    churn(world, rng)
    ctx = context(rng)
    restarted = make_source(world)
    snapshot = restarted.fetch(FetchContext(ctx.now, ctx.wanted, previous={"rucio": held}))
    assert_same(snapshot, make_source(world).fetch(ctx))
    old = {r: r for r in held}
    kept = [r for r in snapshot.replicas if r in old]
    assert kept and all(old[r] is r for r in kept)
    assert all(r is not o for r in snapshot.replicas - held for o in held)
    assert any(r.detail is not None for r in kept)  # the per-pair table reuses them too
    ids = {r.dataset: r.dataset for r in held}  # new replicas name a held dataset by its object
    new = [r for r in snapshot.replicas - held if r.dataset in ids]
    assert new and all(ids[r.dataset] is r.dataset for r in new)
    again = restarted.fetch(ctx)  # and the source keeps them as its own answer
    assert again.replicas is snapshot.replicas


def test_a_failed_fetch_is_followed_by_one_reusing_the_held_objects() -> None:
    rng = random.Random(17)
    world = new_world(rng)
    source = make_source(world)
    held = source.fetch(FetchContext(now=datetime.now(UTC))).replicas
    world.fail = {f"/replicas/rse/{RSES[2]}"}
    with pytest.raises(TransientSourceError):
        source.fetch(FetchContext(now=datetime.now(UTC), previous={"rucio": held}))
    world.fail = set()
    after = source.fetch(FetchContext(now=datetime.now(UTC), previous={"rucio": held}))
    assert after.replicas == held
    assert_kept(merged_snapshot("rucio", held), after)
    assert after.replicas is not held  # one new set of the same objects


def test_the_source_has_the_capabilities_the_daemon_finds_it_by() -> None:
    """Metrics, shutdown and event cycles find these through the ports' protocols
    (hydrator.core.ports), not by attribute name: a rename here would drop them silently."""
    source = make_source(World({}, {}, []))
    for capability in (CountsCalls, CountsReadCalls, DefersChecks, ReusesAnswers, Abandonable):
        assert isinstance(source, capability), capability.__name__
    assert isinstance(source, TargetedReads) and isinstance(source, ParentLookups)
