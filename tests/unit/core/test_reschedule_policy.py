"""When the daemon asks for a negotiation cycle (hydrator.core.reschedule_policy.due)."""

from __future__ import annotations

from hydrator.core.reschedule_policy import due

A1, A2 = {"SITE_A": "e1"}, {"SITE_A": "e2"}


def test_a_change_after_the_quiet_time_is_due() -> None:
    assert due(A1, A2, None, 100.0, 10.0)
    assert due(A1, A2, 90.0, 100.0, 10.0)


def test_nothing_is_due_without_a_change_inside_the_quiet_time_or_when_off() -> None:
    assert not due(A1, dict(A1), None, 100.0, 10.0)  # same tags
    assert not due(None, A2, None, 100.0, 10.0)  # the first cycle seen is no change
    assert not due(A1, A2, 95.0, 100.0, 10.0)  # 5 s after the last one
    assert not due(A1, A2, None, 100.0, 0.0)  # off


def test_a_site_that_comes_or_goes_is_a_change() -> None:
    assert due(A1, A1 | {"SITE_B": "e"}, None, 1.0, 10.0)
    assert due(A1 | {"SITE_B": "e"}, A1, None, 1.0, 10.0)
