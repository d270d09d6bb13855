"""The whole-cycle benchmark (benchmarks/cycle.py) and its Rucio replay server keep working.

The replay server must answer in the wire format a real Rucio server sends: its answers are
compared with the answers recorded from the test suite's real Rucio 41.5.1 server
(benchmarks/rucio_wire.json, re-recorded by benchmarks/record_rucio.py): same content type,
same keys in the same order, same JSON types, the same date format.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from benchmarks.cycle import ReplayServer
from benchmarks.replay import DATE

ROOT = Path(__file__).resolve().parents[2]
RECORDED = json.loads((ROOT / "benchmarks" / "rucio_wire.json").read_text())


@pytest.fixture(scope="module")
def replay() -> Iterator[ReplayServer]:
    server = ReplayServer(replicas=2000, seed=7)
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


def test_the_benchmark_runs_a_whole_cycle_at_a_tiny_scale(tmp_path: Path) -> None:
    out = tmp_path / "cycle.json"
    subprocess.run(
        [
            *(sys.executable, "-m", "benchmarks.cycle", "--replicas", "1000", "--cycles", "1"),
            *("--slots", "100", "--json", str(out), "--profile", str(tmp_path / "prof")),
        ],
        check=True,
        cwd=ROOT,
        capture_output=True,
        timeout=300,
    )
    result = json.loads(out.read_text())
    for key in ("whole_cycle_s", "nochange_cycle_s", "startup_s", "first_cycle_s"):
        assert result[key] > 0
    assert result["peak_rss_mib"] > 0
    assert set(result["phases_s"]) >= {"fetch_parse", "snapshot", "plan", "save", "render"}
    assert result["phases_s"]["publish"] > 0
    # the source saw the generated federation through rucio-clients: most holdings arrive
    assert 800 <= result["replicas_held"] <= 1100
    assert (tmp_path / "prof" / "churn-fetch_parse.txt").exists()
