"""The advertise memo and the over-size news (hydrator.core.advertise_memory)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

from hydrator.core.advertise import Advertised
from hydrator.core.advertise_memory import LastAdvertised, over_size_news, stamp_width
from hydrator.domain import DatasetId, Site, StorageStatus
from tests.unit.factories import sized_view

SITE = Site("S")


def test_stamp_width() -> None:
    assert stamp_width(sized_view(1)) == 0
    assert stamp_width(sized_view(1, updated=datetime(2026, 11, 26, tzinfo=UTC))) == 10
    assert stamp_width(sized_view(1, updated=datetime(1970, 1, 1, 0, 1, 40, tzinfo=UTC))) == 3


def test_the_memo_holds_while_its_inputs_are_the_same() -> None:
    contents = sized_view(6)
    stamped = replace(contents, updated=datetime(2026, 11, 26, tzinfo=UTC))
    wanted = {DatasetId("ska", "00000000"): 2}
    answer = Advertised(replace(stamped, available=stamped.available[:1]), over_size=5)
    memo = LastAdvertised(contents, stamped, dict(wanted), answer)
    assert memo.fits(contents, stamped, wanted)
    later = replace(stamped, updated=datetime(2026, 11, 27, tzinfo=UTC))  # same width
    assert memo.fits(contents, later, wanted)
    assert memo.stamped(later) == replace(answer, view=replace(answer.view, updated=later.updated))
    assert memo.fits(sized_view(6), stamped, wanted)  # an equal view built again: the same answer
    assert not memo.fits(sized_view(5), stamped, wanted)  # other contents
    assert not memo.fits(contents, stamped, {})  # another demand
    assert not memo.fits(contents, replace(stamped, updated=None), wanted)  # another width
    storages = (StorageStatus(SITE, "SE", "RSE", available=False, reason="down"),)
    assert not memo.fits(contents, replace(stamped, storages=storages), wanted)
    assert not memo.fits(contents, replace(stamped, unavailable=("SE: down",)), wanted)


def test_over_size_news_names_each_change_once() -> None:
    a, b, c = Site("A"), Site("B"), Site("C")
    cut, whole = Advertised(sized_view(1), over_size=3), Advertised(sized_view(1))
    first = over_size_news(frozenset(), {a: cut, b: whole})
    assert (first.over, first.started, first.ended) == (frozenset({a}), ((a, 3),), ())
    again = over_size_news(first.over, {a: cut, b: cut, c: whole})
    assert (again.over, again.started, again.ended) == (frozenset({a, b}), ((b, 3),), ())
    fits = over_size_news(again.over, {b: whole})  # a gone, b fits again
    assert (fits.over, fits.started, fits.ended) == (frozenset(), (), (a, b))
