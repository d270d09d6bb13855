"""What the sources share: reading a site name from a record, logging a bad record once,
counting a fetch's requests by name."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor

import pytest

from hydrator.adapters.sources import site_or_none
from hydrator.adapters.sources.call_counts import CallCounts
from hydrator.logs import ProblemLog

log = logging.getLogger("test.sources.shared")


@pytest.mark.parametrize(
    ("name", "expected"),
    [("SRCNET_CH", "SRCNET_CH"), ("bad site", None), ("", None), (7, None), (None, None)],
)
def test_site_or_none_accepts_only_valid_site_names(name: object, expected: str | None) -> None:
    assert site_or_none(name) == expected


def test_a_bad_record_is_logged_once_per_key(caplog: pytest.LogCaptureFixture) -> None:
    once: ProblemLog[str] = ProblemLog(log, once_per_process=True)  # as the sources log them
    with caplog.at_level(logging.WARNING, logger=log.name), ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda i: once.problem(f"k{i % 2}", "problem %d", i % 2), range(100)))
    assert sorted(r.getMessage() for r in caplog.records) == ["problem 0", "problem 1"]


def test_bad_records_past_the_limit_are_not_logged(caplog: pytest.LogCaptureFixture) -> None:
    once: ProblemLog[str] = ProblemLog(log, limit=2, once_per_process=True)
    with caplog.at_level(logging.WARNING, logger=log.name):
        for key in ("a", "b", "c", "a"):
            once.problem(key, "problem %s", key)
    assert [r.getMessage() for r in caplog.records] == ["problem a", "problem b"]


def test_call_counts_count_by_name_from_several_threads() -> None:
    calls = CallCounts(["request"])
    assert calls.counts() == {"request": 0}  # a name given is there before its first call
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda i: calls.count("list_rses" if i % 4 else "auth"), range(1000)))
    assert calls.counts() == {"request": 0, "auth": 250, "list_rses": 750}
