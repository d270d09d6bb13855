"""The events scenario's chaos check can fail: a tiny run on the real stack (Rucio server, its
hermes, ActiveMQ, ``hydrator run``) in which the scenario itself counts one forged dataset as
Rucio's must exit 1 naming exactly that target, every other target of the run met."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import events

pytestmark = [pytest.mark.rucio, pytest.mark.activemq, pytest.mark.slow]


def test_the_chaos_check_fails_when_a_forged_dataset_is_expected_to_publish(
    tmp_path: Path,
) -> None:
    out = tmp_path / "chaos.json"
    argv = ["--changes", "0", "--chaos", "5", "--no-restart", "--idle-s", "0", "--no-pool"]
    code = events.main([*argv, "--expect-forged", "--json", str(out)])
    results = json.loads(out.read_text())
    faults = results["chaos"]["faults"]
    assert code == 1
    assert results["missed"] == ["faults: 1 divergent datasets against Rucio"]
    assert len(faults["divergent"]) == 1 and faults["forged_published"] == []
    counted = faults["daemon_counters"]
    assert counted["received"] == faults["messages"] and counted["full_reads"] == 0
    assert counted["duplicates"] == faults["duplicated"]
