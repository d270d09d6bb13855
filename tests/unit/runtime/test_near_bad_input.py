"""Every kind of bad distance input, through the daemon's near-site refresh
(:class:`hydrator.runtime.near_sites.NearSites`): counted once, logged in one line, and the near
lists that were last good kept, also at the next refresh with the same bad input.

The reader stands in for a catalogue's (the real Rucio server's answers, a refusal among them,
are in tests/sources/rucio/test_rucio_distances.py); a budget of 0 is refused when the
configuration is read (tests/unit/test_config.py, and a reload below)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from hydrator.config import DistancesConfig, load_config
from hydrator.core.near import ElementDistances
from hydrator.core.ports import DistanceReader
from hydrator.domain import Site
from hydrator.errors import SourceError
from hydrator.runtime.metrics import Metrics
from hydrator.runtime.near_sites import NearSites
from hydrator.runtime.scheduler import Daemon
from hydrator.runtime.wiring import build_assembly
from tests.support.near import INVENTORY

A, B, C = (Site(f"SITE_{x}") for x in "ABC")
ELEMENTS = {"A_DISK": A, "B_DISK": B, "C_DISK": C}
GOOD = [("A_DISK", "B_DISK", 1), ("B_DISK", "A_DISK", 1), ("A_DISK", "C_DISK", 1)]
GOOD += [("C_DISK", "A_DISK", 1), ("B_DISK", "C_DISK", 5), ("C_DISK", "B_DISK", 5)]
LISTS = {A: (B, C), B: (A,), C: (A,)}  # max_distance 1


class Reader(DistanceReader):
    """Answers ``answer`` (an exception: raised) at every read."""

    def __init__(self) -> None:
        self.answer: ElementDistances | Exception = ElementDistances(ELEMENTS, GOOD)

    def read_distances(self) -> ElementDistances:
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer

    def close(self) -> None:
        pass


def bad(
    entries: Sequence[tuple[str, str, object]], elements: dict[str, Site] = ELEMENTS
) -> ElementDistances:
    """The good read with ``entries`` replacing the rows of their pairs, both directions."""
    pairs = {frozenset((s, d)) for s, d, _ in entries}
    kept = [e for e in GOOD if frozenset(e[:2]) not in pairs and {e[0], e[1]} <= set(elements)]
    return ElementDistances(elements, [*kept, *entries])


CASES: dict[str, ElementDistances | Exception] = {
    "negative": bad([("A_DISK", "B_DISK", -1)]),
    "not_a_number": bad([("A_DISK", "B_DISK", "1")]),
    "unknown_element": bad([("A_DISK", "X_DISK", 0)]),
    "asymmetric": bad([("A_DISK", "B_DISK", 1), ("B_DISK", "A_DISK", 7)]),
    "unmapped_site": bad([], {"A_DISK": A, "B_DISK": B}),  # SITE_C's element gone
    "refused": SourceError("rucio: 401 CannotAuthenticate"),
}


@pytest.mark.parametrize("kind", list(CASES))
def test_bad_input_is_counted_once_logged_once_and_keeps_the_last_good_lists(
    kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    config = DistancesConfig(enabled=True, source="rucio", max_distance=1, refresh_s=60)
    metrics, reader, clock = Metrics(CollectorRegistry()), Reader(), [0.0]
    near = NearSites(config, metrics, reader, lambda: clock[0])
    assert near.current([A, B, C]) == LISTS
    reader.answer = CASES[kind]
    with caplog.at_level(logging.WARNING, logger="hydrator.runtime.near_sites"):
        for refresh in (1, 2):  # the same bad input twice: one count, one line
            clock[0] = 60.0 * refresh
            assert near.current([A, B, C]) == LISTS
    count = metrics.registry.get_sample_value("hydrator_near_problems_total", {"kind": kind})
    assert count == 1
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and lines[0].startswith("near sites: "), lines
    assert "X_DISK" in lines[0] if kind == "unknown_element" else True
    assert "SITE_C" in lines[0] if kind == "unmapped_site" else True


def test_a_reload_with_a_budget_of_0_is_refused_and_keeps_the_running_budget(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "inv.toml").write_text(INVENTORY)
    path = tmp_path / "hydrator.toml"
    text = '[daemon]\nstate_path = "s.sqlite"\n\n[http]\nenabled = false\n\n'
    text += '[[sources]]\ntype = "static"\npath = "inv.toml"\n\n[distances]\nenabled = true\n'
    path.write_text(text + "remote_budget = 3\n")
    config = load_config(path)
    built = build_assembly(config)
    service = built.service
    daemon = Daemon(config, built, lambda: load_config(path), build_assembly)
    path.write_text(text + "remote_budget = 0\n")
    with caplog.at_level(logging.INFO, logger="hydrator.runtime.scheduler"):
        daemon.reload()
    service.close()
    assert daemon.config is config and daemon.service is service
    assert daemon.config.distances.remote_budget == 3
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(errors) == 1 and "distances.remote_budget" in errors[0], errors
