"""The Rucio source against a real Rucio 41.5.1 server (tests/support/rucio_server.py)."""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest

from hydrator.adapters.sources.rucio import RucioSource
from hydrator.config import RucioSourceConfig
from hydrator.core.ports import FetchContext
from hydrator.domain import DatasetId, ReplicaState, Snapshot
from hydrator.errors import PermanentSourceError, TransientSourceError
from tests.support.rucio_server import (
    Federation,
    RucioAdmin,
    RucioServer,
    source_config,
    unique,
)

pytestmark = pytest.mark.rucio

MakeSource = Callable[..., RucioSource]


def now() -> FetchContext:
    return FetchContext(now=datetime.now(UTC))


def view(snapshot: Snapshot) -> dict[tuple[str, str], tuple[str, float]]:
    """(site, "scope:name") -> (state, fraction rounded) for comparison."""
    return {
        (r.site, str(r.dataset)): (r.state.value, round(r.fraction, 3)) for r in snapshot.replicas
    }


def of_federation(
    snapshot: Snapshot, federation: Federation
) -> dict[tuple[str, str], tuple[str, float]]:
    """The view restricted to the federation's own datasets (other tests add more)."""
    dids = {federation.did(role) for role in federation.datasets}
    return {key: value for key, value in view(snapshot).items() if key[1] in dids}


def rounded(
    expected: dict[tuple[str, str], tuple[str, float]],
) -> dict[tuple[str, str], tuple[str, float]]:
    return {k: (state, round(f, 3)) for k, (state, f) in expected.items()}


def test_federation_maps_to_sites_and_states(
    make_source: MakeSource, federation: Federation, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="hydrator.adapters.sources.rucio")
    source = make_source()
    snapshot = source.fetch(now())
    assert of_federation(snapshot, federation) == rounded(federation.expected)
    assert snapshot.sites == set(federation.sites.values())
    # the RSE with no site attribute and no [sites] entry: reported, its data ignored
    assert snapshot.unmapped == {federation.rses["nosite"]}
    assert not any(d == federation.did("at_nosite") for _, d in view(snapshot))
    # tape is not in rse_type=DISK, although its site attribute names site A
    assert not any(d == federation.did("on_tape") for _, d in view(snapshot))
    warnings = [
        r.getMessage() for r in caplog.records if federation.rses["nosite"] in r.getMessage()
    ]
    assert len(warnings) == 1
    # reported once per source, not every cycle
    again = source.fetch(now())
    assert again.unmapped == {federation.rses["nosite"]}
    assert len([r for r in caplog.records if federation.rses["nosite"] in r.getMessage()]) == 1


def test_without_sites_override_the_attributeless_rse_is_unmapped(
    make_source: MakeSource, federation: Federation
) -> None:
    snapshot = make_source(sites={}).fetch(now())
    assert snapshot.unmapped == {federation.rses["nosite"], federation.rses["mapped"]}
    assert federation.sites["C"] not in snapshot.sites
    assert {site for site, _ in view(snapshot)} == {federation.sites["A"], federation.sites["B"]}


def test_sites_override_wins_over_the_site_attribute(
    make_source: MakeSource, federation: Federation
) -> None:
    moved = dict(federation.overrides, **{federation.rses["b1"]: federation.sites["C"]})
    got = view(make_source(sites=moved).fetch(now()))
    assert got[(federation.sites["C"], federation.did("partial"))] == ("partial", 0.5)
    assert federation.sites["B"] not in {site for site, _ in got}


def test_default_expression_rse_type_disk_excludes_tape(
    make_source: MakeSource, federation: Federation
) -> None:
    snapshot = make_source(rse_expression="rse_type=DISK").fetch(now())
    datasets = {d for _, d in view(snapshot)}
    assert federation.did("complete") in datasets
    assert federation.did("on_tape") not in datasets


def own_two_sites(admin: RucioAdmin) -> tuple[str, dict[str, str], dict[str, str]]:
    """For a test that changes data: a scope, RSEs a1 and b1 and their sites A and B of its
    own (selected by ``fed=<tag>``), so that the shared federation, which other tests compare
    whole with what they publish, never gets its datasets."""
    tag = unique("o").lower()
    sites = {"A": f"SITE-A-{tag}", "B": f"SITE-B-{tag}"}
    rses = {
        role: admin.rse(sites[role[0].upper()], attributes={"fed": tag}) for role in ("a1", "b1")
    }
    return admin.scope(), rses, {**sites, "expression": f"fed={tag}"}


def test_replicating_becomes_complete(make_source: MakeSource, rucio_admin: RucioAdmin) -> None:
    scope, rses, sites = own_two_sites(rucio_admin)
    a1, b1 = rses["a1"], rses["b1"]
    name = rucio_admin.dataset(scope, 2, at=[a1])
    rucio_admin.rule(scope, name, a1)
    rucio_admin.rule(scope, name, b1)
    key = (sites["B"], f"{scope}:{name}")
    source = make_source(sites={}, rse_expression=sites["expression"])
    assert view(source.fetch(now()))[key] == ("replicating", 0.0)
    rucio_admin.set_file_states(b1, scope, rucio_admin.files(scope, name), "A")
    assert view(source.fetch(now()))[key] == ("available", 1.0)


def test_removed_replica_leaves_the_site(make_source: MakeSource, rucio_admin: RucioAdmin) -> None:
    scope, rses, sites = own_two_sites(rucio_admin)
    a1, b1 = rses["a1"], rses["b1"]
    name = rucio_admin.dataset(scope, 2, at=[a1, b1])
    rucio_admin.rule(scope, name, a1)
    rule_b = rucio_admin.rule(scope, name, b1)
    rucio_admin.server.run_abacus()
    did = f"{scope}:{name}"
    source = make_source(sites={}, rse_expression=sites["expression"])
    before = view(source.fetch(now()))
    assert before[(sites["B"], did)] == ("available", 1.0)
    rucio_admin.remove_rule_now(rule_b, b1)
    after = view(source.fetch(now()))
    assert (sites["B"], did) not in after
    assert after[(sites["A"], did)] == ("available", 1.0)


def test_server_down_is_transient_then_recovers(
    make_source: MakeSource, running_rucio: RucioServer, caplog: pytest.LogCaptureFixture
) -> None:
    source = make_source()
    good = source.fetch(now())
    running_rucio.stop()
    started = time.monotonic()
    with pytest.raises(TransientSourceError, match="cannot reach"):
        source.fetch(now())
    assert time.monotonic() - started < 5
    assert source.calls_last_fetch == {"list_rses": 3}  # bounded retries, then give up
    assert "attempt 2/3" in caplog.text
    running_rucio.start()
    assert source.fetch(now()) == good


def test_hung_server_times_out(make_source: MakeSource, running_rucio: RucioServer) -> None:
    source = make_source(timeout_s=0.5, max_attempts=2)
    source.fetch(now())
    assert running_rucio.process is not None
    os.killpg(running_rucio.process.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        with pytest.raises(TransientSourceError):
            source.fetch(now())
        assert time.monotonic() - started < 10
    finally:
        os.killpg(running_rucio.process.pid, signal.SIGCONT)
    source.fetch(now())


def test_wrong_password_is_permanent_and_clear(
    make_source: MakeSource, wrong_password_file: Path
) -> None:
    source = make_source(password_file=wrong_password_file)
    with pytest.raises(PermanentSourceError) as info:
        source.fetch(now())
    message = str(info.value)
    assert "authentication failed" in message and "account root" in message
    assert "not-the-password" not in message
    assert "\n" not in message
    assert source.calls_last_fetch["connect"] == 1  # not retried


def test_missing_password_file_is_permanent(make_source: MakeSource, tmp_path: Path) -> None:
    with pytest.raises(PermanentSourceError, match="password_file"):
        make_source(password_file=tmp_path / "absent").fetch(now())


def test_unknown_expression_is_permanent(make_source: MakeSource) -> None:
    with pytest.raises(PermanentSourceError, match="rse_expression"):
        make_source(rse_expression="fed=no-such-federation").fetch(now())


def test_bad_names_are_counted_and_skipped(
    make_source: MakeSource,
    federation: Federation,
    rucio_admin: RucioAdmin,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Rucio's generic schema allows a scope starting with "-"; a ClassAd list must not get it
    bad_scope = rucio_admin.scope("-" + unique("x"))
    a1 = federation.rses["a1"]
    name = rucio_admin.dataset(bad_scope, 1, at=[a1])
    rucio_admin.rule(bad_scope, name, a1)
    stuck_bad = rucio_admin.dataset(bad_scope, 1, at=[a1])
    rucio_admin.rule(bad_scope, stuck_bad, a1)
    rule = rucio_admin.rule(bad_scope, stuck_bad, federation.rses["b1"])
    rucio_admin.make_stuck(rule)
    caplog.set_level(logging.WARNING, logger="hydrator.adapters.sources.rucio")
    source = make_source()
    snapshot = source.fetch(now())
    # two summary rows at a1, one at b1 (the stuck rule's): three bad records
    assert snapshot.invalid == 3
    assert all(r.dataset.scope != bad_scope for r in snapshot.replicas)
    assert of_federation(snapshot, federation) == rounded(federation.expected)
    source.fetch(now())
    logged = [r for r in caplog.records if "invalid" in r.getMessage()]
    assert len(logged) == 2  # each bad name once, not every cycle


def test_names_no_api_would_accept_are_counted_and_skipped(
    rucio_admin: RucioAdmin, rucio_server: RucioServer
) -> None:
    """A catalogue record whose name would break a ClassAd (quote, space) never gets through."""
    tag = unique("q").lower()
    rse = rucio_admin.rse(f"SITE-{tag}", attributes={"fed": tag})
    scope = rucio_admin.scope()
    good, bad = rucio_admin.many_datasets(scope, 2, rse)
    rucio_server.run_abacus()
    changed = rucio_server.execute_sql(
        "UPDATE collection_replicas SET name = ? WHERE name = ?", ('x" || 1 == 1 || "', bad)
    )
    assert changed == 1
    source = RucioSource(source_config(rucio_server, rse_expression=f"fed={tag}"), {})
    try:
        snapshot = source.fetch(now())
    finally:
        source.close()
    assert snapshot.invalid == 1
    assert view(snapshot) == {(f"SITE-{tag}", f"{scope}:{good}"): ("available", 1.0)}


def test_calls_grow_with_rses_not_datasets(
    rucio_admin: RucioAdmin, rucio_server: RucioServer
) -> None:
    tag = unique("n").lower()
    rses = [rucio_admin.rse(f"SITE-{tag}-{i % 2}", attributes={"fed": tag}) for i in range(3)]
    scope = rucio_admin.scope()
    for rse in rses:
        rucio_admin.many_datasets(scope, 4, rse)
    rucio_server.run_abacus()
    source = RucioSource(source_config(rucio_server, rse_expression=f"fed={tag}"), {})
    try:
        source.fetch(now())
        assert source.calls_last_fetch["connect"] == source.calls_last_fetch["auth"] == 1
        few = source.fetch(now())  # the steady state: client and token reused
        calls_few = dict(source.calls_last_fetch)
        for rse in rses:
            rucio_admin.many_datasets(scope, 30, rse)
        rucio_server.run_abacus()
        many = source.fetch(now())
        calls_many = dict(source.calls_last_fetch)
    finally:
        source.close()
    assert len(few.replicas) == 12 and len(many.replicas) == 102
    assert calls_few == calls_many
    assert calls_many == {  # the site attributes read by the first fetch are still young
        "list_rses": 2,  # the expression, and every RSE's availability_read
        "list_datasets_per_rse": 3,
        "list_replication_rules": 2,
        "list_bad_replicas_status": 2,  # BAD and TEMPORARY_UNAVAILABLE replicas
    }
    assert source.deep_checks_last_fetch == 0


def test_deep_checks_are_bounded(rucio_admin: RucioAdmin, rucio_server: RucioServer) -> None:
    """Before abacus ran, summary rows say 0/0: exact checks settle them, up to the limit."""
    tag = unique("d").lower()
    rse = rucio_admin.rse(f"SITE-{tag}", attributes={"fed": tag})
    scope = rucio_admin.scope()
    names = rucio_admin.many_datasets(scope, 5, rse)
    wanted = DatasetId(scope, sorted(names)[-1])
    source = RucioSource(
        source_config(rucio_server, rse_expression=f"fed={tag}", deep_check_limit=2), {}
    )
    try:
        snapshot = source.fetch(FetchContext(now=datetime.now(UTC), wanted={wanted: 3}))
    finally:
        source.close()
    assert source.calls_last_fetch["list_dataset_replicas"] == 2
    assert source.deep_checks_last_fetch == 2
    assert source.deep_checks_skipped_last_fetch == source.deferred_last_fetch == 3
    # the checked ones are known complete (the wanted one among them); the rest wait for abacus
    assert len(snapshot.replicas) == 2
    assert wanted in {r.dataset for r in snapshot.replicas}
    assert {r.state for r in snapshot.replicas} == {ReplicaState.AVAILABLE}


def test_client_from_rucio_config(
    rucio_server: RucioServer, federation: Federation, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without rucio_host, everything (host, account, credentials) comes from $RUCIO_CONFIG."""
    from rucio.common.config import get_config

    monkeypatch.setenv("RUCIO_CONFIG", str(rucio_server.config_path))
    get_config.cache_clear()  # rucio-clients reads its config once per process
    source = RucioSource(
        RucioSourceConfig(type="rucio", rse_expression=federation.expression), federation.overrides
    )
    try:
        assert of_federation(source.fetch(now()), federation) == rounded(federation.expected)
    finally:
        source.close()
        monkeypatch.delenv("RUCIO_CONFIG")
        get_config.cache_clear()


def test_server_error_is_transient_and_retried(
    make_source: MakeSource, caplog: pytest.LogCaptureFixture
) -> None:
    """Rucio 41.5.1 answers HTTP 500 to a rule filter with the state's word (docs/platform.md):
    a real 5xx, classified by its status (not its text) as transient, retried, then given up."""
    source = make_source(max_attempts=2)
    client = source.wire.connected()
    with pytest.raises(TransientSourceError, match="server error 500"):
        source.wire.call(
            "list_replication_rules",
            lambda: list(client.list_replication_rules({"state": "REPLICATING"})),
        )
    assert "attempt 1/2" in caplog.text


def test_oidc_bearer_token_from_file(
    make_source: MakeSource,
    federation: Federation,
    rucio_admin: RucioAdmin,
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """auth_type = oidc sends the token in token_file (here one the server issued to root; an
    IdP-issued token travels the same way), re-reads it each cycle, and never starts rucio's
    interactive browser flow: a rejected token is a permanent error."""
    token_file = tmp_path / "token"
    token_file.write_text(rucio_admin.client.auth_token + "\n")
    source = make_source(auth_type="oidc", token_file=token_file, username=None, password_file=None)
    assert of_federation(source.fetch(now()), federation) == rounded(federation.expected)
    token_file.write_text("not-a-valid-token\n")
    with pytest.raises(PermanentSourceError, match="authentication failed"):
        source.fetch(now())
    out, _ = capfd.readouterr()
    assert "Rucio Client" not in out and "browser" not in out  # its interactive flow never ran
    token_file.write_text(rucio_admin.client.auth_token + "\n")  # renewed by an agent
    assert of_federation(source.fetch(now()), federation) == rounded(federation.expected)


def test_a_bulk_listing_renews_a_userpass_token_the_server_rejects(
    make_source: MakeSource, federation: Federation
) -> None:
    """A userpass token that expires between the calls of a fetch: the bulk listing, sent by
    the source itself from the client's public attributes, gets HTTP 401, has rucio-clients
    get a new token (through ``whoami``) and is answered on the resend."""
    source = make_source()
    client = source.wire.connected()
    client.auth_token = "expired-token"
    response = source.wire.get("rules/", {"state": "R"})
    assert response.status_code == 200 and client.auth_token != "expired-token"
    response.close()
    assert of_federation(source.fetch(now()), federation) == rounded(federation.expected)


def test_a_malformed_summary_row_is_counted_and_the_rest_of_its_rse_read(
    rucio_admin: RucioAdmin, rucio_server: RucioServer
) -> None:
    """The source reads a listing in bulk: one record of the wrong type (a file count that is
    not a number) is counted and skipped, the others of the same answer are used; an unchanged
    answer read again (reused, not re-parsed) gives the same snapshot and count, and a change
    to it is seen."""
    tag = unique("m").lower()
    rse = rucio_admin.rse(f"SITE-{tag}", attributes={"fed": tag})
    scope = rucio_admin.scope()
    good, bad = rucio_admin.many_datasets(scope, 2, rse)
    rucio_server.run_abacus()
    sql = "UPDATE collection_replicas SET length = ? WHERE name = ?"
    assert rucio_server.execute_sql(sql, ("many", bad)) == 1
    source = RucioSource(source_config(rucio_server, rse_expression=f"fed={tag}"), {})
    try:
        first = source.fetch(now())
        again = source.fetch(now())
        assert rucio_server.execute_sql(sql, (1, bad)) == 1
        repaired = source.fetch(now())
    finally:
        source.close()
    site = f"SITE-{tag}"
    assert first.invalid == again.invalid == 1
    assert view(first) == view(again) == {(site, f"{scope}:{good}"): ("available", 1.0)}
    assert repaired.invalid == 0
    assert view(repaired)[(site, f"{scope}:{bad}")] == ("available", 1.0)


def test_an_unchanged_catalogue_gives_the_same_replicas_and_a_change_only_its_own(
    rucio_admin: RucioAdmin, rucio_server: RucioServer
) -> None:
    """The source reads each answer against the last: nothing changed -> the very same
    frozenset (the core compares by identity); a dataset added -> one replica more, the
    others the same objects as before."""
    tag = unique("i").lower()
    rse = rucio_admin.rse(f"SITE-{tag}", attributes={"fed": tag})
    scope = rucio_admin.scope()
    rucio_admin.many_datasets(scope, 3, rse)
    rucio_server.run_abacus()
    source = RucioSource(source_config(rucio_server, rse_expression=f"fed={tag}"), {})
    try:
        first = source.fetch(now())
        again = source.fetch(now())
        (added,) = rucio_admin.many_datasets(scope, 1, rse)
        rucio_server.run_abacus()
        changed = source.fetch(now())
    finally:
        source.close()
    assert again.replicas is first.replicas and len(first.replicas) == 3
    assert changed.replicas - first.replicas == {
        r for r in changed.replicas if r.dataset == DatasetId(scope, added)
    }
    old = {r: r for r in first.replicas}
    assert all(old[r] is r for r in changed.replicas if r in old) and len(changed.replicas) == 4
