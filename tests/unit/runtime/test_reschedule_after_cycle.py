"""The after-cycle reschedule step (hydrator.runtime.reschedule_after_cycle): one request per
changing cycle, never more than one per quiet time however many cycles change the ads, a refusal
said once; and how the daemon installs it."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest

from hydrator.config import Config, parse_config
from hydrator.errors import PoolError
from hydrator.runtime.outcome import Published
from hydrator.runtime.reschedule_after_cycle import Reschedule, install


class Fake:
    """The published tags, the clock and the schedds, as the step sees them."""

    def __init__(self) -> None:
        self.tags: dict[str, str] = {"SITE_A": "e0"}
        self.now, self.asked, self.refuse = 0.0, 0, ""

    def ask(self) -> int:
        if self.refuse:
            raise PoolError(self.refuse)
        self.asked += 1
        return 1

    def step(self, min_interval_s: float = 10.0) -> Reschedule:
        return Reschedule(lambda: dict(self.tags), self.ask, min_interval_s, lambda: self.now)


def cycle(fake: Fake, step: Reschedule, etag: str, at_s: float) -> None:
    fake.tags["SITE_A"], fake.now = etag, at_s
    step()


def test_a_flood_of_changing_cycles_asks_once_per_quiet_time() -> None:
    fake = Fake()
    step = fake.step(10.0)
    step()  # the first cycle: nothing to compare with
    for i in range(100):  # a cycle every 0.1 s, each changing the ads
        cycle(fake, step, f"e{i + 1}", 0.1 * (i + 1))
    assert fake.asked == 1  # at 0.1 s; the rest inside the quiet time
    cycle(fake, step, "later", 10.2)
    assert fake.asked == 2


def test_an_unchanged_cycle_asks_nothing() -> None:
    fake = Fake()
    step = fake.step()
    for at in (0.0, 20.0, 40.0):
        cycle(fake, step, "e0", at)
    assert fake.asked == 0


def test_a_refusal_is_said_once_and_recovery_once(caplog: pytest.LogCaptureFixture) -> None:
    fake = Fake()
    step = fake.step(1.0)
    step()
    fake.refuse = "reschedule refused: schedd@x: PERMISSION DENIED"
    with caplog.at_level(logging.INFO, logger="hydrator.runtime.reschedule_after_cycle"):
        for i in range(5):
            cycle(fake, step, f"r{i}", 10.0 * (i + 1))
        fake.refuse = ""
        cycle(fake, step, "ok", 100.0)
    said = [r.getMessage() for r in caplog.records]
    assert said == [
        "negotiation cycle not requested: reschedule refused: schedd@x: PERMISSION DENIED",
        "negotiation cycles requested again (1 schedds)",
    ]
    assert fake.asked == 1 and step.sent == 6


def test_it_is_installed_only_when_on_with_the_collector_path(tmp_path: Path) -> None:
    class Service:  # a Publishing: serves nothing yet
        def __init__(self) -> None:
            self.listeners = list[object]()
            self.published = Published()

        def add_listener(self, listener: Callable[[], None]) -> None:
            self.listeners.append(listener)

    def made(**collector: object) -> Config:
        source = {"type": "static", "path": "inv.toml"}
        return parse_config({"sources": [source], "collector": collector}, tmp_path)

    off = made(enabled=True)
    no_collector = made(reschedule_min_interval_s=5)
    on = made(enabled=True, pool="127.0.0.1:1", reschedule_min_interval_s=5)
    for config, wanted in ((off, 0), (no_collector, 0), (on, 1)):
        service = Service()
        install(service, config)
        assert len(service.listeners) == wanted
