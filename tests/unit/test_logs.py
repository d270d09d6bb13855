"""ProblemLog: a problem said once per key, its recovery once, bounded and thread-safe."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor

import pytest

from hydrator.logs import ProblemLog

log = logging.getLogger("test.logs.problems")


def said(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    return [(r.levelname, r.getMessage()) for r in caplog.records]


def test_a_problem_is_said_once_until_it_recovers_and_then_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    problems: ProblemLog[str] = ProblemLog(log)
    with caplog.at_level(logging.INFO, logger=log.name):
        assert problems.problem("s1", "s1 fails: %s", "refused")
        assert not problems.problem("s1", "s1 fails: %s", "refused again")
        assert problems.recovered("s1", "s1 works again")
        assert not problems.recovered("s1", "s1 works again")  # said once
        assert not problems.recovered("s2", "s2 works again")  # never failed: nothing to say
        assert problems.problem("s1", "s1 fails: %s", "timeout")
    assert said(caplog) == [
        ("WARNING", "s1 fails: refused"),
        ("INFO", "s1 works again"),
        ("WARNING", "s1 fails: timeout"),
    ]


def test_a_problem_is_said_again_when_its_cause_changes(caplog: pytest.LogCaptureFixture) -> None:
    problems: ProblemLog[str] = ProblemLog(log)
    with caplog.at_level(logging.INFO, logger=log.name):
        problems.problem("s1", "read fails", cause="read")
        problems.problem("s1", "read fails", cause="read")
        problems.problem("s1", "edit fails", cause="edit")
        assert not problems.recovered("s1", "works", cause="read")  # the edit still fails
        assert problems.recovered("s1", "works", cause="edit")
    assert said(caplog) == [("WARNING", "read fails"), ("WARNING", "edit fails"), ("INFO", "works")]


def test_forget_re_arms_without_a_line(caplog: pytest.LogCaptureFixture) -> None:
    problems: ProblemLog[str] = ProblemLog(log)
    with caplog.at_level(logging.INFO, logger=log.name):
        for key in ("a", "b", "c"):
            problems.problem(key, "problem %s", key)
        problems.forget("a")
        problems.forget_all_but({"a", "b"})
        assert problems.failing() == {"b"}
        for key in ("a", "b", "c"):
            problems.problem(key, "problem %s", key)
    assert [m for _, m in said(caplog)] == [
        "problem a",
        "problem b",
        "problem c",
        "problem a",
        "problem c",
    ]


def test_once_per_process_never_re_arms(caplog: pytest.LogCaptureFixture) -> None:
    problems: ProblemLog[str] = ProblemLog(log, once_per_process=True)
    with caplog.at_level(logging.INFO, logger=log.name):
        problems.problem("bad name", "invalid: %s", "bad name")
        assert not problems.recovered("bad name", "fine again")
        problems.forget("bad name")
        problems.forget_all_but(())
        problems.problem("bad name", "invalid: %s", "bad name", cause="another")
    assert said(caplog) == [("WARNING", "invalid: bad name")]


def test_past_its_limit_new_keys_are_not_said_until_others_recover(
    caplog: pytest.LogCaptureFixture,
) -> None:
    problems: ProblemLog[str] = ProblemLog(log, limit=2)
    with caplog.at_level(logging.INFO, logger=log.name):
        for key in ("a", "b", "c", "a"):
            problems.problem(key, "problem %s", key)
        problems.recovered("a", "a recovered")
        problems.problem("c", "problem %s", "c")
    assert [m for _, m in said(caplog)] == ["problem a", "problem b", "a recovered", "problem c"]
    assert problems.failing() == {"b", "c"}


def test_each_key_is_said_once_from_many_threads(caplog: pytest.LogCaptureFixture) -> None:
    problems: ProblemLog[str] = ProblemLog(log)
    with caplog.at_level(logging.WARNING, logger=log.name), ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda i: problems.problem(f"k{i % 2}", "problem %d", i % 2), range(100)))
    assert sorted(m for _, m in said(caplog)) == ["problem 0", "problem 1"]
