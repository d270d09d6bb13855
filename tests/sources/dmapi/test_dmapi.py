"""The DMAPI source against a local fake of IAM, the DMAPI and the Site Capabilities API."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from hydrator.adapters.sources.dmapi.client import parse_retry_after
from hydrator.core.ports import CountsCalls, DefersChecks, FetchContext
from hydrator.domain import DatasetId, Replica, ReplicaState, Site, Snapshot
from hydrator.errors import PermanentSourceError, TransientSourceError
from hydrator.logs import setup_logging
from tests.support.dmapi import FakeClock, MakeSource
from tests.support.fake_dmapi import (
    DM_AUDIENCE,
    DM_SCOPE,
    SC_AUDIENCE,
    SC_SCOPE,
    FakeSrcnet,
    area,
    node,
    site,
    storage,
)
from tests.support.ports import free_port
from tests.support.wait import wait_for

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
CTX = FetchContext(now=NOW)
AREA_A = "2a73d212-8793-4011-a687-cad99841c269"
AREA_B = "ce04d165-4d5f-4380-a674-2a9ae4aba75e"
AREA_C = "d4e5f6a7-b8c9-0123-defa-234567890123"
AREA_UNKNOWN = "00000000-0000-4000-8000-000000000000"


def avail(site_name: str, did: str) -> Replica:
    return Replica(DatasetId.parse(did), Site(site_name), ReplicaState.AVAILABLE)


def pairs(snapshot: Snapshot) -> set[tuple[str, str]]:
    return {(r.site, str(r.dataset)) for r in snapshot.replicas}


@pytest.fixture
def srcnet(fake: FakeSrcnet) -> FakeSrcnet:
    """Two nodes, three sites; datasets spread over their RSEs."""
    fake.nodes = [
        node(
            "MARSSRC",
            [
                site("MARSSRC-OLYMPUSMONS", [storage([area(AREA_A, "MARSSRC_OLYMPUSMONS_XRD")])]),
                site("MARSSRC-VALLES", [storage([area(AREA_B, "MARSSRC_VALLES_XRD")])]),
            ],
        ),
        node("AUSSRC", [site("AUSSRC-ICRAR", [storage([area(AREA_C, "AUSSRC_ICRAR")])])]),
    ]
    fake.add_dataset("ska", "obs_1", ("MARSSRC-OLYMPUSMONS-T0", AREA_A), ("AUSSRC_T1", AREA_C))
    fake.add_dataset("ska", "obs_2", ("MARSSRC-VALLES-T1", AREA_B))
    fake.add_dataset("daac", "run/pi24_cleaned.fits", ("AUSSRC_T1", AREA_C))
    return fake


DATASETS = ["ska:obs_1", "ska:obs_2", "daac:run/pi24_cleaned.fits"]


# --------------------------------------------------------------------- locating and mapping


def test_locate_reports_each_replica_at_the_site_of_its_storage_area(
    srcnet: FakeSrcnet, make_source: MakeSource
) -> None:
    snapshot = make_source(datasets=DATASETS).fetch(CTX)

    assert snapshot.replicas == {
        avail("MARSSRC-OLYMPUSMONS", "ska:obs_1"),
        avail("AUSSRC-ICRAR", "ska:obs_1"),
        avail("MARSSRC-VALLES", "ska:obs_2"),
        avail("AUSSRC-ICRAR", "daac:run/pi24_cleaned.fits"),
    }
    # every site the Site Capabilities API knows is covered, so an emptied site stays known
    assert snapshot.sites == {"MARSSRC-OLYMPUSMONS", "MARSSRC-VALLES", "AUSSRC-ICRAR"}
    assert snapshot.source == "dmapi"
    assert (snapshot.invalid, snapshot.unmapped) == (0, frozenset())
    assert ("daac", "run/pi24_cleaned.fits") in srcnet.located  # "/" in a name survives


def test_sites_table_wins_by_rse_name_or_storage_area_id(
    srcnet: FakeSrcnet, make_source: MakeSource
) -> None:
    sites = {"AUSSRC_T1": "T2_AU_ICRAR", AREA_B: "MARS_VALLES"}
    snapshot = make_source(sites=sites, datasets=DATASETS).fetch(CTX)

    assert pairs(snapshot) == {
        ("MARSSRC-OLYMPUSMONS", "ska:obs_1"),
        ("T2_AU_ICRAR", "ska:obs_1"),
        ("MARS_VALLES", "ska:obs_2"),
        ("T2_AU_ICRAR", "daac:run/pi24_cleaned.fits"),
    }
    assert {"T2_AU_ICRAR", "MARS_VALLES"} <= snapshot.sites


def test_without_site_capabilities_only_the_sites_table_maps(
    srcnet: FakeSrcnet, make_source: MakeSource
) -> None:
    source = make_source(
        sites={"MARSSRC-VALLES-T1": "VALLES"}, datasets=DATASETS, site_capabilities_url=None
    )
    snapshot = source.fetch(CTX)

    assert pairs(snapshot) == {("VALLES", "ska:obs_2")}
    assert snapshot.unmapped == {"MARSSRC-OLYMPUSMONS-T0", "AUSSRC_T1"}
    assert srcnet.counts["nodes"] == 0


def test_unknown_dataset_is_located_nowhere_not_an_error(
    srcnet: FakeSrcnet, make_source: MakeSource
) -> None:
    snapshot = make_source(datasets=["ska:obs_2", "ska:never_ingested"]).fetch(CTX)

    assert pairs(snapshot) == {("MARSSRC-VALLES", "ska:obs_2")}
    assert snapshot.invalid == 0
    assert ("ska", "never_ingested") in srcnet.located


def test_bad_input_is_counted_skipped_and_logged_once(
    srcnet: FakeSrcnet, make_source: MakeSource, caplog: pytest.LogCaptureFixture
) -> None:
    good = {
        "identifier": "MARSSRC-VALLES-T1",
        "associated_storage_area_id": AREA_B,
        "replicas": ["davs://valles/x"],
        "is_dataset": True,
    }
    srcnet.set_raw_entries(
        "ska",
        "messy",
        [
            "not an object",
            {"identifier": 42, "associated_storage_area_id": AREA_A, "replicas": []},
            {"identifier": "NO_REPLICAS_KEY", "associated_storage_area_id": AREA_A},
            {"identifier": "RSE_X", "associated_storage_area_id": 7, "replicas": []},
            {
                "identifier": "GHOST_RSE",
                "associated_storage_area_id": AREA_UNKNOWN,
                "replicas": ["davs://ghost/x"],
            },
            good,
        ],
    )
    datasets = ["ska:messy", "ska:has space", "no-scope-separator", 'ska:quote"d']
    source = make_source(datasets=datasets)

    with caplog.at_level(logging.WARNING, logger="hydrator.adapters.sources.dmapi"):
        first = source.fetch(CTX)
        logged_first = len(caplog.records)
        second = source.fetch(CTX)

    for snapshot in (first, second):
        assert pairs(snapshot) == {("MARSSRC-VALLES", "ska:messy")}
        assert snapshot.invalid == 4 + 3  # four malformed entries, three bad names
        assert snapshot.unmapped == {"GHOST_RSE"}
    assert logged_first > 0
    assert len(caplog.records) == logged_first  # the second cycle repeats no warning
    assert not any(name.startswith("has space") for _, name in srcnet.located)


def test_invalid_site_names_from_site_capabilities_are_not_published(
    fake: FakeSrcnet, make_source: MakeSource
) -> None:
    fake.nodes = [node("BAD", [site("has space", [storage([area(AREA_A)])])])]
    fake.add_dataset("ska", "obs_1", ("SOME_RSE", AREA_A))

    snapshot = make_source(datasets=["ska:obs_1"]).fetch(CTX)

    assert snapshot.replicas == frozenset()
    assert snapshot.unmapped == {"SOME_RSE"}
    assert "has space" not in snapshot.sites


def test_datasets_queued_jobs_want_are_located_when_enabled(
    srcnet: FakeSrcnet, make_source: MakeSource
) -> None:
    context = FetchContext(now=NOW, wanted={DatasetId("ska", "obs_2"): 3})

    enabled = make_source(datasets=["ska:obs_1"], datasets_from_queue=True).fetch(context)
    assert pairs(enabled) >= {("MARSSRC-VALLES", "ska:obs_2"), ("AUSSRC-ICRAR", "ska:obs_1")}

    srcnet.located.clear()
    disabled = make_source(datasets=["ska:obs_1"]).fetch(context)
    assert ("ska", "obs_2") not in srcnet.located
    assert ("MARSSRC-VALLES", "ska:obs_2") not in pairs(disabled)


def test_known_datasets_are_relocated_within_the_budget_longest_unchecked_first(
    fake: FakeSrcnet, make_source: MakeSource
) -> None:
    fake.nodes = [node("N", [site("SITE_A", [storage([area(AREA_A)])])])]
    names = [f"ska:obs_{i:02d}" for i in range(30)]
    for did in names:
        fake.add_dataset("ska", did.partition(":")[2], ("RSE_A", AREA_A))
    source = make_source(datasets=names, max_relocates_per_cycle=10)

    per_fetch = []
    for _ in range(4):
        fake.located.clear()
        snapshot = source.fetch(CTX)
        per_fetch.append(sorted(f"{scope}:{name}" for scope, name in fake.located))
        assert len(snapshot.replicas) == 30  # nothing vanishes while it waits for its turn
    assert per_fetch[0] == names  # the first fetch locates everything
    assert [len(f) for f in per_fetch[1:]] == [10, 10, 10]
    assert sorted(d for fetch in per_fetch[1:] for d in fetch) == names  # each in turn, once
    # 10 locates and the /nodes read of every fetch
    assert source.calls_last_fetch == {"request": 11}
    assert source.deferred_last_fetch == 20  # reported as hydrator_source_deferred_checks
    # the daemon finds these numbers through the ports' optional capabilities
    assert isinstance(source, CountsCalls) and isinstance(source, DefersChecks)

    fake.add_dataset("ska", "obs_05")  # moved away: seen when its turn comes
    fake.located.clear()
    assert ("SITE_A", "ska:obs_05") not in pairs(source.fetch(CTX))
    assert ("ska", "obs_05") in fake.located


def test_a_newly_wanted_dataset_is_located_at_once_even_over_the_budget(
    fake: FakeSrcnet, make_source: MakeSource
) -> None:
    fake.nodes = [node("N", [site("SITE_A", [storage([area(AREA_A)])])])]
    for i in range(5):
        fake.add_dataset("ska", f"obs_{i}", ("RSE_A", AREA_A))
    source = make_source(
        datasets=["ska:obs_0", "ska:obs_1"], datasets_from_queue=True, max_relocates_per_cycle=1
    )
    source.fetch(CTX)
    queued = FetchContext(now=NOW, wanted={DatasetId("ska", f"obs_{i}"): 1 for i in (2, 3, 4)})
    fake.located.clear()
    snapshot = source.fetch(queued)
    assert {("ska", f"obs_{i}") for i in (2, 3, 4)} <= set(fake.located)
    assert len(fake.located) == 4  # the three new ones and one known one
    assert {d for _, d in pairs(snapshot)} == {f"ska:obs_{i}" for i in range(5)}

    fake.located.clear()
    gone = source.fetch(CTX)  # the jobs left the queue: their datasets are no longer reported
    assert {d for _, d in pairs(gone)} == {"ska:obs_0", "ska:obs_1"}
    fake.located.clear()
    source.fetch(queued)  # and when they come back, they are new again
    assert {("ska", f"obs_{i}") for i in (2, 3, 4)} <= set(fake.located)


def test_concurrency_is_bounded(fake: FakeSrcnet, make_source: MakeSource) -> None:
    fake.nodes = [node("N", [site("SITE_A", [storage([area(AREA_A)])])])]
    names = [f"ska:obs_{i}" for i in range(24)]
    for did in names:
        fake.add_dataset("ska", did.partition(":")[2], ("RSE_A", AREA_A))
    fake.locate_delay_s = 0.05

    snapshot = make_source(datasets=names, max_concurrency=3).fetch(CTX)

    assert len(snapshot.replicas) == 24
    assert fake.max_in_flight == 3  # parallel, but never more than configured


# --------------------------------------------------------------------- tokens


def test_token_is_refreshed_before_it_expires(srcnet: FakeSrcnet, make_source: MakeSource) -> None:
    clock = FakeClock()
    source = make_source(clock=clock, datasets=DATASETS, token_refresh_margin_s=60.0)
    srcnet.token_lifetime_s = 600.0  # the source's clock is ours; the fake's tokens stay valid

    source.fetch(CTX)
    assert srcnet.counts["token"] == 2  # one per audience: DMAPI and Site Capabilities

    clock.advance(500)  # 100 s left, more than the margin: keep the token
    source.fetch(CTX)
    assert srcnet.counts["token"] == 2

    clock.advance(50)  # 50 s left, inside the 60 s margin: refresh first
    source.fetch(CTX)
    assert srcnet.counts["token"] == 4  # both refreshed: /nodes is read at every fetch
    assert srcnet.counts["http_401"] == 0  # refreshed before the server had to refuse


def test_http_401_gets_one_shared_refresh_then_succeeds(
    srcnet: FakeSrcnet, make_source: MakeSource
) -> None:
    names = [f"ska:many_{i}" for i in range(12)]
    for did in names:
        srcnet.add_dataset("ska", did.partition(":")[2], ("AUSSRC_T1", AREA_C))
    source = make_source(datasets=names, max_concurrency=4)
    source.fetch(CTX)
    tokens_before = srcnet.counts["token"]

    srcnet.expire_tokens()  # the server forgets them early (revoked, clock skew, ...)
    snapshot = source.fetch(CTX)

    assert len(snapshot.replicas) == 12
    assert srcnet.counts["http_401"] >= 1
    # concurrent 401s share one refresh per audience (DMAPI, and Site Capabilities' /nodes)
    assert srcnet.counts["token"] == tokens_before + 2


def test_http_401_after_a_fresh_token_is_permanent(
    fake: FakeSrcnet, make_source: MakeSource
) -> None:
    fake.add_dataset("ska", "obs_1", ("RSE_A", AREA_A))
    fake.reject_tokens = True
    source = make_source(datasets=["ska:obs_1"], site_capabilities_url=None)

    with pytest.raises(PermanentSourceError, match="401"):
        source.fetch(CTX)
    assert (fake.counts["token"], fake.counts["locate"]) == (2, 2)  # one refresh, one retry


def test_static_token_file_is_reread_after_a_401(
    srcnet: FakeSrcnet, make_source: MakeSource, tmp_path: Path
) -> None:
    dm_file, sc_file = tmp_path / "dm.token", tmp_path / "sc.token"
    dm_file.write_text(srcnet.issue_token(DM_AUDIENCE, DM_SCOPE))
    sc_file.write_text(srcnet.issue_token(SC_AUDIENCE, SC_SCOPE))
    source = make_source(
        auth="static", token_file=dm_file, site_capabilities_token_file=sc_file, datasets=DATASETS
    )
    assert len(source.fetch(CTX).replicas) == 4

    srcnet.expire_tokens()
    dm_file.write_text(srcnet.issue_token(DM_AUDIENCE, DM_SCOPE))  # rotated by an agent
    assert len(source.fetch(CTX).replicas) == 4
    assert srcnet.counts["token"] == 0


def test_wrong_client_secret_is_permanent_and_secrets_never_logged(
    srcnet: FakeSrcnet,
    make_source: MakeSource,
    secret_files: dict[str, Path],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    source = make_source(datasets=DATASETS)
    source.fetch(CTX)
    srcnet.expire_tokens()
    source.fetch(CTX)  # a refresh: logs about tokens happen here too
    secret_files["client_secret_file"].write_text("wrong-secret")
    srcnet.expire_tokens()

    with pytest.raises(PermanentSourceError, match="invalid_client") as failure:
        source.fetch(CTX)

    issued = list(srcnet._tokens)
    assert issued
    for secret in [srcnet.client_secret, "wrong-secret", *issued]:
        assert secret not in caplog.text
        assert secret not in str(failure.value)


def test_a_token_file_with_a_line_break_is_refused_naming_the_file_and_never_sent(
    srcnet: FakeSrcnet, make_source: MakeSource, tmp_path: Path
) -> None:
    token = srcnet.issue_token(DM_AUDIENCE, DM_SCOPE)
    dm_file = tmp_path / "dm.token"
    dm_file.write_text(f"{token}\n{token}-second-line\n")
    source = make_source(
        auth="static", token_file=dm_file, datasets=DATASETS, site_capabilities_url=None
    )

    with pytest.raises(PermanentSourceError) as failure:
        source.fetch(CTX)

    assert f"token file {dm_file} holds whitespace or control characters" in str(failure.value)
    assert token not in str(failure.value)
    assert srcnet.counts["locate"] == 0


def test_an_access_token_with_cr_lf_is_refused_naming_the_endpoint(
    srcnet: FakeSrcnet, make_source: MakeSource
) -> None:
    srcnet.access_token = "first-part\r\nX-Evil: second-part"
    source = make_source(datasets=DATASETS, site_capabilities_url=None)

    with pytest.raises(PermanentSourceError) as failure:
        source.fetch(CTX)

    message = str(failure.value)
    endpoint = f"the access_token from the token endpoint {srcnet.token_url}"
    assert f"{endpoint} holds whitespace" in message
    assert "first-part" not in message and "second-part" not in message
    assert srcnet.counts["locate"] == 0


def test_storage_area_ids_with_line_breaks_cannot_forge_text_log_lines(
    srcnet: FakeSrcnet, make_source: MakeSource, capsys: pytest.CaptureFixture[str]
) -> None:
    forged = "2026-01-01 00:00:00,000 ERROR hydrator.service: forged"
    srcnet.set_raw_entries(
        "ska",
        "evil",
        [
            {
                "identifier": f"RSE\n{forged}",
                "associated_storage_area_id": f"AREA\n{forged}",
                "replicas": ["davs://evil/x"],
            }
        ],
    )
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        setup_logging("text", "INFO")
        make_source(datasets=["ska:evil"]).fetch(CTX)
    finally:
        root.handlers[:], root.level = saved
    lines = capsys.readouterr().err.splitlines()
    assert any("no site for RSE" in line for line in lines)
    assert not any(line.startswith(forged) for line in lines), lines


def test_a_token_without_the_service_scope_is_refused_permanently(
    srcnet: FakeSrcnet, make_source: MakeSource
) -> None:
    source = make_source(datasets=DATASETS, scope="openid", site_capabilities_url=None)

    with pytest.raises(PermanentSourceError, match="refused"):
        source.fetch(CTX)
    assert srcnet.counts["http_403"] == 3


# --------------------------------------------------------------------- transient failures


@pytest.mark.parametrize("status", [429, 503])
def test_retry_after_is_honoured(srcnet: FakeSrcnet, make_source: MakeSource, status: int) -> None:
    source = make_source(
        datasets=["ska:obs_2"], site_capabilities_url=None, sites={"MARSSRC-VALLES-T1": "VALLES"}
    )
    srcnet.fail_next("locate", 1, status, retry_after="1")

    started = time.monotonic()
    snapshot = source.fetch(CTX)
    elapsed = time.monotonic() - started

    assert pairs(snapshot) == {("VALLES", "ska:obs_2")}
    assert 1.0 <= elapsed < 2.5  # waited the hint (not the 0.05 s backoff), and not much more
    assert srcnet.counts["locate"] == 2
    assert source.calls_last_fetch == {"request": 3}  # token + 2 locates


def test_retry_after_beyond_the_limit_fails_at_once(
    srcnet: FakeSrcnet, make_source: MakeSource
) -> None:
    source = make_source(datasets=DATASETS, site_capabilities_url=None)
    srcnet.fail_next("locate", 1, 429, retry_after="120")

    started = time.monotonic()
    with pytest.raises(TransientSourceError) as failure:
        source.fetch(CTX)

    assert time.monotonic() - started < 1.0
    assert failure.value.retry_after_s == 120


def test_server_errors_are_retried_with_backoff(
    srcnet: FakeSrcnet, make_source: MakeSource, caplog: pytest.LogCaptureFixture
) -> None:
    source = make_source(datasets=["ska:obs_2"])
    srcnet.fail_next("locate", 2, 500)

    with caplog.at_level(logging.WARNING, logger="hydrator.adapters.sources.dmapi.client"):
        snapshot = source.fetch(CTX)

    assert pairs(snapshot) == {("MARSSRC-VALLES", "ska:obs_2")}
    assert "attempt 1/3" in caplog.text
    assert "attempt 2/3" in caplog.text


def test_persistent_server_errors_fail_the_fetch_transiently(
    srcnet: FakeSrcnet, make_source: MakeSource
) -> None:
    source = make_source(datasets=["ska:obs_2"])
    srcnet.fail_next("locate", 3, 502)

    with pytest.raises(TransientSourceError, match="attempt 3/3"):
        source.fetch(CTX)
    assert srcnet.counts["locate"] == 3


def test_one_dataset_failing_fails_the_whole_fetch(
    fake: FakeSrcnet, make_source: MakeSource
) -> None:
    """Never a partial answer: the broken dataset must not vanish from its sites."""
    fake.nodes = [node("N", [site("SITE_A", [storage([area(AREA_A)])])])]
    names = [f"ska:obs_{i}" for i in range(40)]
    for did in names:
        fake.add_dataset("ska", did.partition(":")[2], ("RSE_A", AREA_A))
    fake.broken.add(("ska", "obs_7"))

    source = make_source(datasets=names)
    with pytest.raises(TransientSourceError, match="ska:obs_7"):
        source.fetch(CTX)


def test_connection_refused_is_transient(make_source: MakeSource) -> None:
    closed_port = free_port()  # nothing listens there any more
    dead = f"http://127.0.0.1:{closed_port}/api/v1"
    source = make_source(
        datasets=DATASETS, base_url=dead, token_url=f"{dead}/token", site_capabilities_url=None
    )

    with pytest.raises(TransientSourceError, match="ConnectionError"):
        source.fetch(CTX)
    assert source.calls_last_fetch == {"request": 3}  # the token request, three attempts


def test_a_body_that_is_not_json_is_permanent(srcnet: FakeSrcnet, make_source: MakeSource) -> None:
    source = make_source(datasets=DATASETS)
    srcnet.malformed_next("locate", 1)

    with pytest.raises(PermanentSourceError, match="not JSON"):
        source.fetch(CTX)


# --------------------------------------------------------------------- site capabilities cache


def test_nodes_are_read_every_fetch_and_a_failed_read_keeps_the_old_map_for_its_ttl(
    srcnet: FakeSrcnet, make_source: MakeSource
) -> None:
    clock = FakeClock()
    source = make_source(clock=clock, datasets=DATASETS, site_capabilities_ttl_s=300.0)
    expected = pairs(source.fetch(CTX))
    source.fetch(CTX)
    assert srcnet.counts["nodes"] == 2

    clock.advance(299)
    srcnet.fail_next("nodes", 3, 503)
    assert pairs(source.fetch(CTX)) == expected  # read failed: the earlier map is used
    assert srcnet.counts["nodes"] == 5

    clock.advance(2)  # the last good answer is now older than site_capabilities_ttl_s
    srcnet.fail_next("nodes", 3, 503)
    with pytest.raises(TransientSourceError, match="/nodes"):
        source.fetch(CTX)
    assert pairs(source.fetch(CTX)) == expected  # read again: fresh


def test_nodes_unreachable_without_an_earlier_map_fails_the_fetch(
    srcnet: FakeSrcnet, make_source: MakeSource
) -> None:
    srcnet.fail_next("nodes", 3, 500)
    with pytest.raises(TransientSourceError, match="/nodes"):
        make_source(datasets=DATASETS).fetch(CTX)


# --------------------------------------------------------------------- cost


def test_requests_per_fetch_grow_with_datasets_only(
    fake: FakeSrcnet, make_source: MakeSource
) -> None:
    """1000 datasets: one locate each and one /nodes per cycle, plus two tokens on the first."""
    fake.nodes = [node("N", [site("SITE_A", [storage([area(AREA_A)])])])]
    names = [f"ska:obs_{i:04d}" for i in range(1000)]
    for did in names[::2]:
        fake.add_dataset("ska", did.partition(":")[2], ("RSE_A", AREA_A))
    source = make_source(datasets=names, max_concurrency=8)

    timings = []
    for _ in range(2):
        started = time.monotonic()
        snapshot = source.fetch(CTX)
        timings.append(time.monotonic() - started)
        assert len(snapshot.replicas) == 500
    print(
        f"\n1000 datasets: cold {timings[0]:.2f} s, warm {timings[1]:.2f} s, "
        f"calls warm {source.calls_last_fetch}"
    )

    # warm cycle: tokens reused, /nodes read again
    assert source.calls_last_fetch == {"request": 1001}
    assert fake.counts["token"] == 2 and fake.counts["nodes"] == 2
    assert timings[1] < 20


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("7", 7.0),
        (" 0 ", 0.0),
        ("Sun, 22 Nov 2026 12:00:30 GMT", 30.0),
        ("Sun, 22 Nov 2026 11:00:00 GMT", 0.0),  # in the past: retry now
        ("soon", None),
        ("-5", None),
        (None, None),
    ],
)
def test_retry_after_values(value: str | None, seconds: float | None) -> None:
    assert parse_retry_after(value, now=NOW) == seconds


# --------------------------------------------------------------------- bounds: time, size, lists


@pytest.mark.parametrize("phase", ["headers", "body"])
@pytest.mark.parametrize("endpoint", ["locate", "nodes", "token"])
def test_a_trickling_server_fails_the_fetch_at_its_deadline(
    srcnet: FakeSrcnet, make_source: MakeSource, endpoint: str, phase: str
) -> None:
    """A status line, then one header line (or body byte) a second: per-read timeouts never
    fire; the deadline does, and the connection is really closed."""
    srcnet.trickle_interval_s = 0.2
    srcnet.trickle_next(endpoint, 1, phase)
    source = make_source(datasets=DATASETS, deadline_s=2.0, timeout_s=5.0)
    t0 = time.monotonic()
    with pytest.raises(TransientSourceError, match=r"deadline_s = 2 s"):
        source.fetch(CTX)
    assert 1.9 <= time.monotonic() - t0 < 3.5
    wait_for(
        "the client ended the trickle",
        lambda: srcnet.trickles_ended_by_client,
        timeout_s=3.0,
        interval_s=0.05,
    )
    assert srcnet.trickles_ended_by_client == 1, "the trickling connection was left open"
    assert len(source.fetch(CTX).replicas) == 4  # the next fetch is not hindered


def test_an_answer_over_max_answer_bytes_fails_the_source(
    srcnet: FakeSrcnet, make_source: MakeSource
) -> None:
    srcnet.raw_locate_body = b"[" + b'"x",' * 300_000 + b'"x"]'  # 1.2 MB of valid JSON
    source = make_source(datasets=DATASETS, max_answer_bytes=1024 * 1024)
    with pytest.raises(PermanentSourceError, match="larger than max_answer_bytes = 1048576"):
        source.fetch(CTX)


CHILD = """
import json, sys
from datetime import UTC, datetime
from hydrator.core.ports import FetchContext
from hydrator.adapters.sources.dmapi import DmapiSource
from hydrator.config import DmapiSourceConfig
from hydrator.errors import SourceError
source = DmapiSource(DmapiSourceConfig.model_validate(json.loads(sys.argv[1])), {})
try:
    source.fetch(FetchContext(now=datetime.now(UTC)))
    print("no error")
except SourceError as exc:
    print(exc)
status = open("/proc/self/status").read().splitlines()
print(int(next(line for line in status if line.startswith("VmHWM")).split()[1]) // 1024)
source.close()
"""


def test_a_62_mb_answer_keeps_memory_bounded(
    srcnet: FakeSrcnet, secret_files: dict[str, Path]
) -> None:
    """A 62 MB answer took a cycle to 4 GB resident (the Kubernetes limit is 1 Gi): with
    max_answer_bytes = 8 MiB it fails the source and the process stays small.
    Measured in a process of its own (VmHWM: ru_maxrss would carry the forking parent's
    peak across exec). 2 cores shared by several engineers, 2026-11-26: 62 MiB peak with the
    cap, ~1 GiB with max_answer_bytes = 100 MB (the whole answer parsed); 54 MiB at import."""
    entry = {"identifier": "X", "associated_storage_area_id": AREA_A, "replicas": ["davs://a/b"]}
    one = json.dumps(entry).encode()
    srcnet.raw_locate_body = b"[" + b",".join([one] * (62_000_000 // len(one))) + b"]"
    config = {
        "type": "dmapi",
        "base_url": srcnet.base_url,
        "token_url": srcnet.token_url,
        **{k: str(v) for k, v in secret_files.items()},
        "datasets": ["ska:obs_1"],
        "max_answer_bytes": 8 * 1024 * 1024,
        "max_attempts": 1,
    }
    result = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(config)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    reason, peak_mib = result.stdout.splitlines()
    assert "larger than max_answer_bytes = 8388608" in reason
    assert int(peak_mib) < 120, f"peak resident {peak_mib} MiB"


def test_a_non_json_answer_fails_the_source_not_empties_it(
    srcnet: FakeSrcnet, make_source: MakeSource
) -> None:
    srcnet.content_type = "text/html"
    with pytest.raises(PermanentSourceError, match="'text/html', not JSON"):
        make_source(datasets=DATASETS).fetch(CTX)
    srcnet.content_type = "application/problem+json; charset=utf-8"  # RFC 6839 +json is JSON
    assert len(make_source(datasets=DATASETS).fetch(CTX).replicas) == 4


def test_every_dataset_404_is_a_failed_source_not_an_empty_one(
    srcnet: FakeSrcnet, make_source: MakeSource
) -> None:
    """A wrong base_url or a broken ingress answers 404 for everything."""
    with pytest.raises(PermanentSourceError, match=r"every locate \(2\) answered HTTP 404"):
        make_source(datasets=["ska:nope_1", "ska:nope_2"]).fetch(CTX)
    one_missing = make_source(datasets=["ska:obs_2", "ska:nope_1"]).fetch(CTX)
    assert pairs(one_missing) == {("MARSSRC-VALLES", "ska:obs_2")}  # a single 404: not found


def test_every_record_malformed_is_a_failed_source(
    srcnet: FakeSrcnet, make_source: MakeSource
) -> None:
    for did in DATASETS:
        scope, _, name = did.partition(":")
        srcnet.set_raw_entries(scope, name, [{"identifier": 7}, "junk", None])
    with pytest.raises(PermanentSourceError, match=r"every locate entry \(9\) is malformed"):
        make_source(datasets=DATASETS).fetch(CTX)


def test_a_short_token_lifetime_costs_a_few_grants_not_one_per_request(
    fake: FakeSrcnet, make_source: MakeSource
) -> None:
    """expires_in = 30 with the default 60 s margin made 31 grants for 30 locates."""
    fake.token_lifetime_s = 30
    names = [f"ska:short_{i}" for i in range(30)]
    for did in names:
        fake.add_dataset("ska", did.partition(":")[2], ("AUSSRC_T1", None))
    source = make_source(
        sites={"AUSSRC_T1": "AU"}, datasets=names, site_capabilities_url=None, max_concurrency=1
    )
    assert len(source.fetch(CTX).replicas) == 30
    assert fake.counts["token"] <= 2


def test_the_unmapped_list_is_bounded_counted_and_logged_in_few_lines(
    fake: FakeSrcnet, make_source: MakeSource, caplog: pytest.LogCaptureFixture
) -> None:
    """600,001 unmapped identifiers made a 19 MB once --json: the first N are
    listed (each cut to 200 characters), all are counted."""
    rses = [(f"RSE_{i:04d}" + "x" * (300 if i == 0 else 0), None) for i in range(500)]
    fake.add_dataset("ska", "spread", *rses)
    source = make_source(datasets=["ska:spread"], site_capabilities_url=None, max_listed_unmapped=5)
    with caplog.at_level(logging.WARNING):
        snapshot = source.fetch(CTX)
    assert len(snapshot.unmapped) == 5 and snapshot.unmapped_more == 495
    assert max(len(name) for name in snapshot.unmapped) == 201  # 200 and an ellipsis
    assert sorted(snapshot.unmapped)[1:] == ["RSE_0001", "RSE_0002", "RSE_0003", "RSE_0004"]
    lines = [r for r in caplog.records if "no site" in r.getMessage()]
    assert len(lines) == 6, [r.getMessage() for r in lines]  # five names and one count
    assert "500 storage elements have no site" in lines[-1].getMessage()


def test_a_fetch_longer_than_its_deadline_completes_over_a_few_cycles(
    fake: FakeSrcnet, make_source: MakeSource
) -> None:
    """The first fetch locates everything; with more datasets than one deadline allows, the
    answers in by the deadline are kept, so the next fetches go on from there instead of
    failing for ever."""
    names = [f"ska:many_{i}" for i in range(12)]
    for did in names:
        fake.add_dataset("ska", did.partition(":")[2], ("AUSSRC_T1", None))
    fake.locate_delay_s = 0.3
    source = make_source(
        sites={"AUSSRC_T1": "AU"},
        datasets=names,
        site_capabilities_url=None,
        max_concurrency=2,
        deadline_s=1.5,
        max_relocates_per_cycle=2,
    )
    with pytest.raises(TransientSourceError, match=r"deadline_s = 1\.5 s"):
        source.fetch(CTX)
    assert len(source.fetch(CTX).replicas) == 12
