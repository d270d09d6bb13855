"""The whole-cycle benchmark (benchmarks/cycle.py) and its Rucio replay server keep working.

The replay server must answer in the wire format a real Rucio server sends: its answers are
compared with the answers recorded from the test suite's real Rucio 41.5.1 server
(benchmarks/rucio_wire.json, re-recorded by benchmarks/record_rucio.py): same content type,
same keys in the same order, same JSON types, the same date format.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from benchmarks.cycle import (
    N_SITES,
    PoolStub,
    ReplayServer,
    config,
    distance_table,
    median_interval,
)
from benchmarks.generate import Federation, Scale
from benchmarks.replay import DATE, RULES, Catalogue
from hydrator.core.near import NearTable, operator_distances, refresh
from hydrator.core.slot_coverage import Current, stale_constraint
from hydrator.domain import Site

ROOT = Path(__file__).resolve().parents[2]
RECORDED = json.loads((ROOT / "benchmarks" / "rucio_wire.json").read_text())


@pytest.fixture(scope="module")
def replay() -> Iterator[ReplayServer]:
    server = ReplayServer(replicas=2000, seed=7, cache_mib=0)
    try:
        yield server
    finally:
        server.stop()


def _shape(value: Any) -> Any:
    """Keys (in order) and JSON types, with dates told apart from other strings."""
    if isinstance(value, dict):
        return [(k, _shape(v)) for k, v in value.items()]
    if isinstance(value, str) and value.endswith(" UTC"):
        return "date"
    return type(value).__name__


def _rows(body: str, content_type: str) -> list[Any]:
    if content_type == "application/json":
        return [json.loads(body)]
    return [json.loads(line) for line in body.splitlines() if line]


def _get(url: str, data: bytes | None = None) -> tuple[str, str]:
    request = urllib.request.Request(url, data=data, method="POST" if data else "GET")
    with urllib.request.urlopen(request, timeout=30) as answer:
        return answer.headers["Content-Type"].split(";")[0], answer.read().decode()


def _recorded(path_start: str, query: str = "") -> dict[str, Any]:
    for call in RECORDED["calls"]:
        if call["path"].startswith(path_start) and query in call["query"]:
            found: dict[str, Any] = call
            return found
    raise AssertionError(f"nothing recorded for {path_start}")


def _same_shape(recorded: dict[str, Any], content_type: str, body: str) -> None:
    """Every answered row has the recorded row's keys, order, types and date format.

    Keys that are data (an RSE's attribute names, a file's PFNs) are compared by the shape of
    their values."""
    assert content_type == recorded["content_type"]
    want = _rows(recorded["body"], recorded["content_type"])[0]
    got = _rows(body, content_type)
    assert got, "the replay server answered nothing"
    for row in got:
        if recorded["path"].endswith("/attr/"):
            assert row["site"].startswith("SRCNET_") and all(
                row[k] is True for k in row if k != "site"
            )
        elif "pfns" in want:
            assert list(row) == list(want)
            assert {json.dumps(_shape(v)) for v in row["pfns"].values()} == {
                json.dumps(_shape(v)) for v in want["pfns"].values()
            }
        else:
            assert _shape(row) == _shape(want)


def test_replay_answers_have_the_recorded_wire_format(replay: ReplayServer) -> None:
    url = replay.url
    _same_shape(
        _recorded("/rses/", "expression=rec"), *_get(f"{url}/rses/?expression=rse_type%3DDISK")
    )
    rse = "SRCNET_S00_DISK0"
    _same_shape(_recorded("/rses/DISK"), *_get(f"{url}/rses/{rse}/attr/"))
    _same_shape(_recorded("/replicas/rse/"), *_get(f"{url}/replicas/rse/{rse}"))
    for state in ("R", "S"):
        _same_shape(_recorded("/rules/", f"state={state}"), *_get(f"{url}/rules/?state={state}"))
    _, body = _get(f"{url}/replicas/rse/{rse}")
    first = json.loads(body.splitlines()[0])
    deep = _get(f"{url}/replicas/{first['scope']}/{first['name']}/datasets?deep=True")
    _same_shape(_recorded("/replicas/s"), *deep)
    dids = json.dumps({"dids": [{"scope": first["scope"], "name": first["name"]}]}).encode()
    listed = _get(f"{url}/replicas/list", dids)
    _same_shape(_recorded("/replicas/list"), *listed)
    assert DATE.endswith(" UTC") and first["created_at"] == DATE


def _benchmark(tmp_path: Path, *options: str) -> dict[str, Any]:
    """The JSON of ``benchmarks/cycle.py`` at 1000 replicas, one cycle each, 100 slots."""
    out = tmp_path / "cycle.json"
    subprocess.run(
        [
            *(sys.executable, "-m", "benchmarks.cycle", "--replicas", "1000", "--cycles", "1"),
            *("--slots", "100", "--json", str(out), *options),
        ],
        check=True,
        cwd=ROOT,
        capture_output=True,
        timeout=300,
    )
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def test_the_benchmark_runs_a_whole_cycle_at_a_tiny_scale(tmp_path: Path) -> None:
    result = _benchmark(tmp_path, "--profile", str(tmp_path / "prof"))
    for key in ("whole_cycle_s", "nochange_cycle_s", "startup_s", "first_cycle_s"):
        assert result[key] > 0
    assert result["peak_rss_mib"] > 0
    # the phases are the service's own report's, and they add up to the whole cycle
    assert set(result["phases_s"]) >= {"fetch", "plan", "save", "render", "publish", "after"}
    assert result["phases_s"]["publish"] > 0
    first = result["raw"]["daemon"]["first"]
    assert sum(first["phases"].values()) == pytest.approx(first["whole"])
    # the daemon's own CPU in the fetch is reported apart from its wall time (which includes
    # waiting for the replay server) and cannot exceed it by more than the other threads' share
    cpu = result["fetch_cpu_s"]
    assert min(cpu["first"], cpu["churn"], cpu["nochange"]) > 0
    assert cpu["first"] <= 2 * result["first_phases_s"]["fetch"]
    # the source saw the generated federation through rucio-clients: most holdings arrive
    assert 800 <= result["replicas_held"] <= 1100
    assert (tmp_path / "prof" / "churn.txt").exists()
    assert result["failed"] == {} and result["replay_peak_rss_mib"] > 0
    assert result["machine"]["cores"] >= 1 and result["machine"]["ram_gib"] > 0
    # the collector's traffic by kind of cycle: the first merges into every slot, a cycle
    # with nothing changed and no slot wiped sends no merge
    sent = result["collector_sent"]
    assert sent["first"]["merges"] > 0 and sent["first"]["bytes"] > 0
    assert sent["nochange"]["merges"] == 0
    # as the daemon with its repair watch: the cycles hand the slot merges to the looks, and
    # the look after each cycle sends them (timed apart)
    for kind in ("first", "churn", "nochange"):
        assert sent[kind]["look_merges"] == sent[kind]["merges"], kind
        assert result["delivery_s"][kind] > 0
    assert sent["first"]["look_bytes"] > 0
    assert result["distances"] == 0 and result["near_ads"] == 0  # [distances] off by default


def test_without_looks_the_cycles_send_their_slot_merges_themselves(tmp_path: Path) -> None:
    result = _benchmark(tmp_path, "--no-looks")
    sent = result["collector_sent"]
    assert result["looks"] is False and "delivery_s" not in result
    assert sent["first"]["merges"] > 0 and "look_merges" not in sent["first"]


def test_the_stub_answers_a_look_as_the_collector_evaluates_its_constraint() -> None:
    """Only the slots of a site with a site ad whose digest is not the ad's, less those the
    per-slot window holds (merged at or after its bound, carrying a digest)."""
    pool = PoolStub({f"s{i}": "A" for i in range(5)} | {"x": "X"}, "GLIDEIN_Site")
    pool.site_ads["A"] = {"Name": "A", "DataLocalityDigest": "new"}
    carried = {"s1": ("new", 10), "s2": ("old", 10), "s3": ("old", 50), "s4": (None, 50)}
    for name, (digest, merged) in carried.items():
        pool.slots[name] |= {"DataLocalityDigest": digest, "DataLocalityMerged": merged}
    current = {Site("A"): Current("new", 0.0)}
    args = ("GLIDEIN_Site", "DataLocalityDigest", "DataLocalityMerged", current)
    names = [[ad["Name"] for ad in pool.query(None, stale_constraint(*args, after), [])]
             for after in (None, 40)]  # fmt: skip
    assert names == [["s0", "s2", "s3", "s4"], ["s0", "s2", "s4"]]
    assert len(pool.query(None, "true", [])) == 6 and pool.filter_s > 0


def test_the_distance_table_puts_each_site_near_the_other_sites_of_its_region() -> None:
    table = distance_table(N_SITES)
    assert len(table) == N_SITES and all(len(row) == N_SITES - 1 for row in table.values())
    assert all(table[b][a] == d for a, row in table.items() for b, d in row.items())
    published = [Site(f"SRCNET_S{i:02d}") for i in range(N_SITES)]
    near, problems = refresh(operator_distances(table), NearTable(), 1, published)
    assert problems == []
    assert near.near[Site("SRCNET_S07")] == ("SRCNET_S05", "SRCNET_S06", "SRCNET_S08", "SRCNET_S09")
    assert all(len(others) == 4 for others in near.near.values())
    for wrong in (0, N_SITES + 1):
        with pytest.raises(ValueError, match="sites"):
            distance_table(wrong)


def test_the_config_turns_distances_on_only_when_asked(tmp_path: Path) -> None:
    assert not config("http://x", tmp_path).distances.enabled
    on = config("http://x", tmp_path, distances=10).distances
    assert (
        on.enabled
        and on.source is None
        and sorted(on.sites) == [f"SRCNET_S{i:02d}" for i in range(10)]
    )


def test_the_benchmark_compares_the_near_sites_on_with_them_off(tmp_path: Path) -> None:
    result = _benchmark(tmp_path, "--distances", "10", "--against-no-distances")
    old, new = result["old"], result["new"]
    assert old["failed"] == {} and new["failed"] == {}
    assert (old["distances"], old["near_ads"]) == (0, 0)
    assert new["distances"] == 10 and new["near_ads"] > 0 and new["whole_cycle_s"] > 0
    assert old["hydrator"] == new["hydrator"] == str(ROOT)
    assert set(result["new_vs_old_median"]) >= {"whole_cycle_s", "nochange_cycle_s"}
    wrong = {
        ("--distances", str(N_SITES + 1)): "--distances must be 0 to",
        ("--against-no-distances",): "needs --distances",
        ("--distances", "5", "--against-no-distances", "--code", "x"): "no --code",
    }
    for options, said in wrong.items():
        command = [sys.executable, "-m", "benchmarks.cycle", *options]
        refused = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
        assert refused.returncode == 2 and said in refused.stderr, options


def test_old_and_new_code_are_measured_in_one_run(tmp_path: Path) -> None:
    """``--code DIR`` runs DIR's hydrator, then this checkout's, each on a fresh replay of the
    same federation (here DIR is a copy of this checkout), alternating pairs, and compares them."""
    old = tmp_path / "old"
    shutil.copytree(ROOT / "hydrator", old / "hydrator", ignore=shutil.ignore_patterns("*.pyc"))
    profiles = tmp_path / "prof"
    result = _benchmark(tmp_path, "--code", str(old), "--rounds", "2", "--profile", str(profiles))
    assert result["old"]["hydrator"] == str(old.resolve())
    # each side's profiles apart, so that the two can be compared
    assert (profiles / "old" / "churn.txt").exists() and (profiles / "new" / "churn.txt").exists()
    # the fetch runs in a thread of its own: profiled apart, the source's own calls in it
    assert "rucio_source.py" in (profiles / "new" / "churn-fetch.txt").read_text()
    assert result["new"]["hydrator"] == str(ROOT)
    assert result["old"]["replicas_held"] == result["new"]["replicas_held"]
    assert set(result["new_vs_old"]) >= {"whole_cycle_s", "startup_s", "peak_rss_mib"}
    assert all(-1 < change < 20 for change in result["new_vs_old"].values())
    assert len(result["rounds"]) == 2 and result["rounds"][1]["old"]["whole_cycle_s"] > 0
    assert set(result["new_vs_old_median"]) == set(result["new_vs_old"])
    # every pair keeps both sides' churn phases and CPU, not the first pair's alone
    second = result["rounds"][1]
    for side in ("old", "new"):
        assert "fetch" in second[side]["phases_s"] and second[side]["cycle_cpu_s"]["churn"] > 0
        assert second[side]["cycle_minor_faults"]["first"] > 0  # a first cycle grows the heap
    # two pairs are too few for a 90 % interval of the median
    assert set(result["new_vs_old_interval"].values()) == {None}


def test_the_interval_of_the_median_widens_with_fewer_pairs_and_holds_it() -> None:
    """Eight pairs: the 2nd and 7th of the ordered changes (93 % coverage); fourteen: the 4th
    and 11th; four pairs reach no 90 % interval."""
    eight = [3.8, -9.8, -4.8, -0.5, 7.7, -1.1, 4.4, 8.4]
    assert median_interval(eight) == {"low": -4.8, "high": 7.7, "coverage": 0.9297}
    fourteen = [float(i) for i in range(14)]
    assert median_interval(fourteen) == {"low": 3.0, "high": 10.0, "coverage": 0.9426}
    assert median_interval([1.0, 2.0, 3.0, 4.0]) is None


def _catalogue(scale: Scale, seed: int, cache_bytes: int) -> Catalogue:
    return Catalogue(Federation(scale, seed), cache_bytes)


def _expected(catalogue: Catalogue, fed: Federation) -> tuple[set[tuple[Any, ...]], set[str]]:
    """The summary rows (RSE, scope, name, files, available, state) and the rule names that the
    holdings of ``fed`` (churned apart from the catalogue) imply by :meth:`Catalogue.placements`."""
    rows, rules = set(), set()
    for key, code in fed.holdings.items():
        dataset, site = divmod(key, fed.scale.sites)
        scope, name = fed.dataset_text(dataset)
        placed = catalogue.placements(dataset, site, code)
        rows |= {(rse, scope, name, n, ok, state) for rse, n, ok, state in placed}
        if code & 3 >= 2:  # REPLICATING or STUCK: a rule at the first RSE
            rules.add(f"{'RS'[(code & 3) - 2]} {scope}:{name}@{placed[0][0]}")
    return rows, rules


def _served(catalogue: Catalogue) -> tuple[list[tuple[Any, ...]], list[str]]:
    rows, rules = [], []
    for i, rse in enumerate(catalogue.rse_names):
        for line in b"".join(catalogue.answer(i)).splitlines():
            row = json.loads(line)
            assert row["rse"] == rse and row["created_at"] == DATE
            fields = ("rse", "scope", "name", "length", "available_length", "state")
            rows.append(tuple(row[k] for k in fields))
    for letter, which in RULES.items():
        for line in b"".join(catalogue.answer(which)).splitlines():
            rule = json.loads(line)
            assert rule["state"][0] == letter
            rules.append(f"{letter} {rule['scope']}:{rule['name']}@{rule['rse_expression']}")
    return rows, rules


def test_answers_made_on_the_fly_hold_the_federation_through_churn() -> None:
    """The catalogue's federation equals one of the same seed churned apart, the answers
    generated from it chunk by chunk hold exactly its holdings (no row twice), and a cache too
    small for everything serves the same bytes as none while churn drops what it touched."""
    scale = Scale(3000, churn_fraction=0.1)  # churn enough to touch split holdings and rules
    reference = Federation(scale, 11)
    # all cached, cached as room allows (the summary rows come first), never cached
    cached, some, uncached = (_catalogue(scale, 11, size) for size in (2**30, 600_000, 0))
    for cycle in range(4):
        if cycle:
            churns = {json.dumps(vars(c.churn())) for c in (cached, some, uncached)}
            assert churns == {json.dumps(vars(reference.churn()))}
        assert list(cached.fed.holdings.items()) == list(reference.holdings.items())
        rows, rules = _served(cached)
        assert len(rows) == len(set(rows)) and len(rules) == len(set(rules))
        assert (set(rows), set(rules)) == _expected(cached, reference)
        for which in [*range(len(cached.rse_names)), *RULES.values()]:
            body = b"".join(uncached.answer(which))
            assert b"".join(cached.answer(which)) == body == b"".join(some.answer(which))
        assert 0 < some.cached_bytes <= 600_000 and uncached.cached_bytes == 0


def test_the_replay_streams_the_generated_answers_and_churns_them(replay: ReplayServer) -> None:
    """Over HTTP the bulk answers are the generated bytes, before and after a churn."""
    local = _catalogue(Scale(2000), 7, 0)
    rse = "SRCNET_S00_DISK1"
    for _ in range(2):
        _, body = _get(f"{replay.url}/replicas/rse/{rse}")
        assert body.encode() == b"".join(local.answer(local.rse_index[rse]))
        _, body = _get(f"{replay.url}/rules/?state=R")
        assert body.encode() == b"".join(local.answer(RULES["R"]))
        _get(f"{replay.url}/_bench/churn", b"{}")
        local.churn()
    stats = replay.stats()
    assert stats["peak_rss_mib"] > 0 and stats["cache_mib"] == 0


def test_a_step_stopped_for_memory_is_recorded_not_a_crash(tmp_path: Path) -> None:
    """The watchdog stops a step when the machine runs short of memory (here: always); the
    run still writes its JSON, naming the step and why, with no figures for it."""
    result = _benchmark(tmp_path, "--min-available-mib", str(10**9))
    assert "watchdog" in result["failed"]["daemon"] and "not run" in result["failed"]["restart"]
    assert result["whole_cycle_s"] is None and result["peak_rss_mib"] is None
    assert result["replay_peak_rss_mib"] > 0
