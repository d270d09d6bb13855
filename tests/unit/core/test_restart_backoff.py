"""When a supervised thread is restarted (hydrator.core.restart_backoff.step): after the first wait
of the backoff, one step further per restart in a row, the last wait repeating, afresh once it
has run steadily."""

from __future__ import annotations

from hydrator.core.restart_backoff import Verdict, Watch, step

BACKOFF = (1.0, 5.0, 30.0)


def run(looks: list[tuple[float, bool]]) -> list[tuple[float, Verdict]]:
    watch, seen = Watch(up_since=0.0), []
    for now, alive in looks:
        watch, verdict = step(watch, alive, now, BACKOFF)
        seen.append((now, verdict))
    return seen


def test_a_dead_thread_is_restarted_after_each_wait_of_the_sequence_the_last_repeating() -> None:
    looks = [(10, False), (10.5, False), (11, False), (12, False), (16, False), (45, False)]
    looks += [(46, False), (75, False)]
    assert run(looks) == [
        (10, Verdict.DIED),
        (10.5, Verdict.WAITING),
        (11, Verdict.RESTART),  # 1 s after it was found dead
        (12, Verdict.WAITING),  # that restart did not hold: 5 s now
        (16, Verdict.RESTART),
        (45, Verdict.WAITING),  # then 30 s, and 30 s again (bounded)
        (46, Verdict.RESTART),
        (75, Verdict.WAITING),
    ]


def test_a_thread_back_is_running_and_starts_the_sequence_afresh_once_steady() -> None:
    looks = [(10, False), (11, False), (11.5, True), (12, True), (13, False), (18, False)]
    looks += [(19, True), (50, True), (60, False), (61, False)]
    assert run(looks) == [
        (10, Verdict.DIED),
        (11, Verdict.RESTART),
        (11.5, Verdict.BACK),
        (12, Verdict.RUNNING),
        (13, Verdict.DIED),  # died again soon: the next wait is 5 s
        (18, Verdict.RESTART),
        (19, Verdict.BACK),
        (50, Verdict.RUNNING),  # ran for the longest wait: afresh
        (60, Verdict.DIED),
        (61, Verdict.RESTART),  # 1 s again
    ]
