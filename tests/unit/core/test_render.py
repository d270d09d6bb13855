"""Rendering: no dataset name a catalogue sends can inject an attribute or break an ad."""

from __future__ import annotations

import logging
import re
from dataclasses import replace
from datetime import UTC, datetime

import classad2
import htcondor2  # noqa: F401  (registers stringList* functions)
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hydrator.config import ClassAdConfig
from hydrator.core.render import CRON_UPDATE_LINE, render_cron, site_classad
from hydrator.core.storage import Drain, with_storage
from hydrator.core.views import content_digest
from hydrator.domain import DatasetId, Site, SiteView, StorageStatus
from hydrator.names import InvalidNameError

ATTRS = ClassAdConfig()
EXPECTED_ATTRS = {
    "AvailableDatasets",
    "PartialDatasets",
    "ReplicatingDatasets",
    "DataLocalitySite",
    "DataLocalityUpdated",
    "DataLocalityDigest",
}
NOW = datetime(2026, 11, 22, tzinfo=UTC)

# Everything, plus the characters that attack ClassAd and string-list syntax.
hostile = st.text(
    alphabet=st.one_of(
        st.characters(),
        st.sampled_from(list('"\\\n\r\t ,;=[]{}()\x00:/#+@-_.')),
    ),
    max_size=60,
)


def try_dataset(scope: str, name: str) -> DatasetId | None:
    try:
        return DatasetId(scope, name)
    except InvalidNameError:
        return None


def view_of(available: list[DatasetId], partial: list[DatasetId]) -> SiteView:
    site = Site("SITE_A")
    av = tuple(sorted(set(available)))
    pa = tuple((d, 0.5) for d in sorted(set(partial)))
    return SiteView(site, av, pa, (), (), NOW, content_digest(site, av, pa, ()))


def parse_old(text: str) -> classad2.ClassAd:
    ads = list(classad2.parseAds(text, classad2.ParserType.Old))
    assert len(ads) == 1
    return ads[0]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(hostile, hostile), max_size=8), st.lists(hostile, max_size=4))
def test_no_name_can_inject_or_break_the_ad(pairs: list[tuple[str, str]], names: list[str]) -> None:
    available = [d for s, n in pairs if (d := try_dataset(s, n)) is not None]
    partial = [d for n in names if (d := try_dataset("ska", n)) is not None]
    text = render_cron(view_of(available, partial), ATTRS)
    body, update, tail = text.rpartition(CRON_UPDATE_LINE + "\n")
    assert update and tail == ""
    assert len(body.splitlines()) == len(EXPECTED_ATTRS), "one line per attribute"
    ad = parse_old(body)
    assert set(ad.keys()) == EXPECTED_ATTRS
    assert list(ad["AvailableDatasets"]) == sorted({str(d) for d in available})
    assert list(ad["PartialDatasets"]) == sorted({str(d) for d in partial})


@given(hostile, hostile)
def test_accepted_names_never_hold_syntax_characters(scope: str, name: str) -> None:
    dataset = try_dataset(scope, name)
    if dataset is not None:
        assert not set(str(dataset)) & set('"\\\n\r\t ,;{}()[]\x00')
        assert str(dataset).count(":") == 1


def test_real_catalogue_names_are_accepted() -> None:
    for text in [
        "cms:/GenericTTbar/HC-CMSSW_9_2_6_91X_mcRun1_realistic_v2-v2/AODSIM#3517e1b6",
        "ska:obs_1234",
        "lofar:L654321_SB001_uv.MS",
        "user.jdoe:user.jdoe.test+v2",
    ]:
        assert str(DatasetId.parse(text)) == text


def test_new_syntax_ad_round_trips_and_matches_a_job() -> None:
    view = view_of([DatasetId("ska", "obs_1234"), DatasetId("ska", "a/b#c+d")], [])
    ad = classad2.ClassAd(str(site_classad(view, ATTRS)))
    assert ad["DataLocalityUpdated"] == int(NOW.timestamp())
    job = classad2.ClassAd(
        {
            "Requirements": classad2.ExprTree(
                'identicalMember("ska:a/b#c+d", TARGET.AvailableDatasets)'
            )
        }
    )
    assert ad.matches(job)  # evaluates the job's Requirements against the ad
    other = classad2.ClassAd(
        {
            "Requirements": classad2.ExprTree(
                'identicalMember("SKA:A/B#C+D", TARGET.AvailableDatasets)'
            )
        }
    )
    assert not ad.matches(other), "identicalMember is case-sensitive"


def test_configured_attribute_names_are_used() -> None:
    attrs = ClassAdConfig(available_attribute="DataHere", digest_attribute="DataDigest")
    ad = parse_old(render_cron(view_of([DatasetId("ska", "x")], []), attrs).split("- update")[0])
    assert list(ad["DataHere"]) == ["ska:x"] and "DataDigest" in ad
    assert "AvailableDatasets" not in ad


def test_updated_is_rounded_down_to_the_resolution() -> None:
    view = view_of([DatasetId("ska", "x")], [])
    late = SiteView(
        view.site,
        view.available,
        (),
        (),
        (),
        datetime(2026, 11, 22, 12, 4, 59, tzinfo=UTC),
        view.digest,
    )
    ad = parse_old(render_cron(late, ClassAdConfig(updated_resolution_s=300)).split("- update")[0])
    assert ad["DataLocalityUpdated"] == int(datetime(2026, 11, 22, 12, 0, tzinfo=UTC).timestamp())


def test_stuck_datasets_are_written_only_when_configured() -> None:
    stuck = DatasetId("ska", "obs_1500")
    view = replace(view_of([DatasetId("ska", "a")], []), stuck=(stuck,))
    assert "StuckDatasets" not in site_classad(view, ATTRS)
    ad = parse_old(render_cron(view, ClassAdConfig(advertise_stuck=True)))
    assert set(ad.keys()) == EXPECTED_ATTRS | {"StuckDatasets"}
    assert list(ad["StuckDatasets"]) == ["ska:obs_1500"]
    assert list(ad["AvailableDatasets"]) == ["ska:a"]


def test_the_ad_says_why_storage_cannot_serve() -> None:
    """Written when some storage cannot serve; when all can, left out of the hook's answer
    (hooks of earlier releases refuse attributes they do not know) and written as "" into
    collector merges (a merge only adds: a reason merged earlier must be overwritten).
    Hostile text from a catalogue stays one string."""
    view = view_of([DatasetId("ska", "a")], [])
    assert "DataLocalityUnavailable" not in parse_old(render_cron(view, ATTRS))
    assert site_classad(view, ATTRS, says_available=True)["DataLocalityUnavailable"] == ""
    said = replace(view, unavailable=("RSE X_DISK: availability_read false", 'RSE Y: "x"\\n'))
    ad = parse_old(render_cron(said, ClassAdConfig(unavailable_attribute="StorageDown")))
    assert ad["StorageDown"] == "RSE X_DISK: availability_read false; RSE Y: x n"
    assert list(ad["AvailableDatasets"]) == ["ska:a"]


HOOK_INT = re.compile(r"-?[0-9]{1,19}")
HOOK_STR = r'"[^"\\]*"'
HOOK_LIST = re.compile(r"\{ *(" + HOOK_STR + r" *(, *" + HOOK_STR + r" *)*)?\}")


def hook_refusal(text: str) -> str | None:
    """Why deploy/condor/hydrator-classad-hook would refuse ``text`` (its per-line value
    checks, LC_ALL=C), or None."""
    for line in text.splitlines():
        if line == CRON_UPDATE_LINE:
            continue
        if any(not " " <= c <= "~" for c in line):
            return f"a line with a control or non-ASCII character: {line!r}"
        found = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*) = (.*)", line)
        if found is None:
            return f"bad line {line!r}"
        value = found.group(2)
        if not any(p.fullmatch(value) for p in (HOOK_INT, re.compile(HOOK_STR), HOOK_LIST)):
            return f"bad value {value!r}"
        if "$" in value:
            return f"value holds $: {value!r}"
    return None


@pytest.mark.parametrize(
    "reason",
    ["move to $SCRATCH", "$(HOME) and $ENV(X)", 'say "no"\\ here', "tab\there\x7f\x00", "café ☕"],
)
def test_no_storage_reason_makes_the_hook_refuse_the_answer(reason: str) -> None:
    """A drain (or catalogue) reason with ``$`` (HTCondor expands ``$(...)``), a quote, a
    backslash, a control or non-ASCII character: the rendered answer still passes every
    value check of the execute-node hook, so the site's hooks keep accepting it."""
    site = Site("SITE_A")
    view = view_of([DatasetId("ska", "a")], [])
    drain = Drain(site, "X_DISK", reason, since=NOW)
    status = StorageStatus(site, "X_DISK", available=False, reason=drain.text)
    (shown,) = with_storage({site: view}, [status], [drain], NOW).values()
    text = render_cron(shown, ATTRS)
    assert hook_refusal(text) is None, text
    assert "drained by the operator" in parse_old(text)["DataLocalityUnavailable"]


def test_a_name_built_without_its_checks_is_left_out_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """What ``safe_names`` defends against: a DatasetId made by ``tuple.__new__`` skips its
    checks; its name never reaches the ad, and each refusal is logged."""
    forged = tuple.__new__(DatasetId, ("ska", 'x" } Evil = true { "y'))
    view = view_of([DatasetId("ska", "a"), forged], [forged])
    with caplog.at_level(logging.ERROR, logger="hydrator.core.render"):
        ad = site_classad(view, ATTRS)
        text = render_cron(view, ATTRS)
    assert list(ad["AvailableDatasets"]) == ["ska:a"] and list(ad["PartialDatasets"]) == []
    assert "Evil" not in text and hook_refusal(text) is None
    refused = [r for r in caplog.records if "refusing to render" in r.getMessage()]
    assert len(refused) == 4  # two lists, rendered twice
