"""The advertise memo and the over-size news (hydrator.core.advertise_memory)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

from hydrator.core.advertise import Advertised
from hydrator.core.advertise_memory import LastAdvertised, over_size_news, stamp_width
from hydrator.core.views import content_digest
from hydrator.domain import DatasetId, Site, SiteView, StorageStatus

SITE = Site("S")


def view(count: int, name_length: int = 8, updated: datetime | None = None) -> SiteView:
    """A site with ``count`` names of ``name_length`` characters, a third in each list."""
    names = [DatasetId("ska", f"{i:0{name_length}d}") for i in range(count)]
    available = tuple(names[0::3])
    partial = tuple((d, 0.5) for d in names[1::3])
    replicating = tuple((d, 0.25) for d in names[2::3])
    digest = content_digest(SITE, available, partial, replicating)
    return SiteView(SITE, available, partial, replicating, (), updated, digest)


def test_stamp_width() -> None:
    assert stamp_width(view(1)) == 0
    assert stamp_width(view(1, updated=datetime(2026, 11, 26, tzinfo=UTC))) == 10
    assert stamp_width(view(1, updated=datetime(1970, 1, 1, 0, 1, 40, tzinfo=UTC))) == 3


def test_the_memo_holds_while_its_inputs_are_the_same() -> None:
    contents = view(6)
    stamped = replace(contents, updated=datetime(2026, 11, 26, tzinfo=UTC))
    wanted = {DatasetId("ska", "00000000"): 2}
    answer = Advertised(replace(stamped, available=stamped.available[:1]), over_size=5)
    memo = LastAdvertised(contents, stamped, dict(wanted), answer)
    assert memo.fits(contents, stamped, wanted)
    later = replace(stamped, updated=datetime(2026, 11, 27, tzinfo=UTC))  # same width
    assert memo.fits(contents, later, wanted)
    assert memo.stamped(later) == replace(answer, view=replace(answer.view, updated=later.updated))
    assert memo.fits(view(6), stamped, wanted)  # an equal view built again: the same answer
    assert not memo.fits(view(5), stamped, wanted)  # other contents
    assert not memo.fits(contents, stamped, {})  # another demand
    assert not memo.fits(contents, replace(stamped, updated=None), wanted)  # another width
    storages = (StorageStatus(SITE, "SE", "RSE", available=False, reason="down"),)
    assert not memo.fits(contents, replace(stamped, storages=storages), wanted)
    assert not memo.fits(contents, replace(stamped, unavailable=("SE: down",)), wanted)


def test_over_size_news_names_each_change_once() -> None:
    a, b, c = Site("A"), Site("B"), Site("C")
    cut, whole = Advertised(view(1), over_size=3), Advertised(view(1))
    first = over_size_news(frozenset(), {a: cut, b: whole})
    assert (first.over, first.started, first.ended) == (frozenset({a}), ((a, 3),), ())
    again = over_size_news(first.over, {a: cut, b: cut, c: whole})
    assert (again.over, again.started, again.ended) == (frozenset({a, b}), ((b, 3),), ())
    fits = over_size_news(again.over, {b: whole})  # a gone, b fits again
    assert (fits.over, fits.started, fits.ended) == (frozenset(), (), (a, b))
