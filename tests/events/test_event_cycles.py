"""Event cycles on the real stack: the test Rucio server, its own ``rucio-hermes``, Debian's
ActiveMQ, and the daemon's service with its listener (hydrator.runtime.event_worker).

Where the server can emit the event itself it does (a rule with ``notify="Y"`` whose replicas
are made AVAILABLE through the public API emits ``datasetlock_ok`` and ``rule_ok``, which hermes
sends). ``transfer-done`` needs FTS and ``deletion-done`` the reaper on real storage: those are
published by the test to the same broker in hermes' exact format, and say so.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

import pytest
import requests

from hydrator.domain import Site
from hydrator.runtime.json_views import site_json, sites_json
from hydrator.runtime.wiring import build_assembly, event_listener, start_events
from tests.support.activemq import Broker
from tests.support.event_service import CALLS, EventService, daemon_config
from tests.support.hermes import Hermes, transfer_done
from tests.support.rucio_server import RucioAdmin, RucioServer, unique
from tests.support.wait import wait_for

pytestmark = [pytest.mark.rucio, pytest.mark.activemq]


@pytest.fixture()
def daemon(
    rucio_server: RucioServer,
    rucio_admin: RucioAdmin,
    running_activemq: Broker,
    tmp_path: Path,
) -> Iterator[EventService]:
    tag = unique("ev").lower()
    site, attrs = f"SITE-EV-{tag}", {"fed": tag}
    dst = rucio_admin.rse(site, attributes=attrs)
    src = rucio_admin.rse(f"SITE-SRC-{tag}", attributes=attrs)
    # These tests count full reads. Here the listener saw heart-beat timeouts (nothing heard
    # for 1.5 beats, with 2 s and with 10 s beats) after deliveries on the loaded machine, and
    # the reconnect's full read (right then) would hide what they check. Without heart-beats
    # a broker stopping still closes the connection, which the listener sees at once.
    config = daemon_config(rucio_server, running_activemq, tmp_path, tag, heartbeat_s=0.0)
    built = build_assembly(config)
    service, metrics = built.service, built.instruments.metrics
    gate = start_events(config, built, event_listener)
    assert gate is not None
    try:
        made = EventService(service, metrics, gate, site, dst, src, rucio_admin.scope())
        wait_for(
            "subscribed",
            lambda: gate.cycles[0].status().connected,
            timeout_s=30.0,
            ignore=(requests.RequestException,),
        )
        gate()  # the start-up full read (the scheduler's first run)
        assert made.full_reads() == 1
        yield made
    finally:
        gate.stop()
        service.close()


def test_a_lock_ok_emitted_by_the_server_reaches_the_ad_in_an_event_cycle(
    daemon: EventService, rucio_admin: RucioAdmin, hermes: Hermes
) -> None:
    name = rucio_admin.dataset(daemon.scope, 2, at=[daemon.src])
    rule = rucio_admin.rule(daemon.scope, name, daemon.dst, notify="Y")
    did = f"{daemon.scope}:{name}"
    daemon.gate()  # not due: events flow (subscribed, read at start-up)
    assert daemon.full_reads() == 1
    assert daemon.sample("hydrator_full_reads_skipped_total") == 1
    # the conveyor's part, through the public API: the files arrive, the lock goes OK
    rucio_admin.set_file_states(
        daemon.dst, daemon.scope, rucio_admin.files(daemon.scope, name), "A"
    )
    assert rucio_admin.rule_info(rule)["state"] == "OK"
    reads = daemon.sample(CALLS, source="rucio", method="list_dataset_replicas")
    # in this order: nothing received and nothing published until hermes sends the messages
    lock_oks = partial(
        daemon.sample, "hydrator_events_received_total", source="rucio", type="datasetlock_ok"
    )
    assert lock_oks() == 0
    assert did not in daemon.lists()[0]
    assert daemon.sample("hydrator_event_reads_total", source="rucio") == 0
    hermes.run_once()  # the server's datasetlock_ok and rule_ok go to the broker
    wait_for(
        "the dataset in the site's ad",
        lambda: did in daemon.lists()[0],
        timeout_s=30.0,
        ignore=(requests.RequestException,),
    )
    assert daemon.full_reads() == 1  # no full read: an event cycle read that dataset alone
    assert daemon.origin() == "event"
    assert lock_oks() >= 1
    assert daemon.sample("hydrator_event_reads_total", source="rucio") >= 1
    assert daemon.sample("hydrator_event_lag_seconds_count", source="rucio") >= 1
    # the event cycle's exact read is counted as a full read's calls are
    assert daemon.sample(CALLS, source="rucio", method="list_dataset_replicas") > reads


def test_a_transfer_done_in_hermes_format_is_confirmed_by_a_read_before_publishing(
    daemon: EventService, rucio_admin: RucioAdmin, running_activemq: Broker
) -> None:
    """Messages published by the test in hermes' exact format (``transfer-done`` needs FTS).
    One names a dataset that is really complete at the site: it is published. One names a
    dataset that is not there at all (a forged or stale message), one a dataset the catalogue
    does not know: nothing is published from the message alone, and reading the three in one
    event cycle does not fail."""
    there = rucio_admin.dataset(daemon.scope, 1, at=[daemon.dst])
    rucio_admin.rule(daemon.scope, there, daemon.dst)  # placed without a transfer message
    absent = rucio_admin.dataset(daemon.scope, 1, at=[daemon.src])
    unknown = unique("never-made")  # no such DID: its rules' listing answers HTTP 404
    assert f"{daemon.scope}:{there}" not in daemon.lists()[0]
    names = (there, absent, unknown)
    messages = [transfer_done(daemon.scope, name, daemon.dst) for name in names]
    running_activemq.publish_as_hermes(messages)
    wait_for(
        "the complete dataset published",
        lambda: f"{daemon.scope}:{there}" in daemon.lists()[0],
        timeout_s=30.0,
        ignore=(requests.RequestException,),
    )
    available, replicating = daemon.lists()
    assert f"{daemon.scope}:{absent}" not in available + replicating
    assert f"{daemon.scope}:{unknown}" not in available + replicating
    assert daemon.full_reads() == 1


def test_a_deletion_whose_file_has_no_dataset_marks_a_full_read_at_the_normal_interval(
    daemon: EventService, running_activemq: Broker
) -> None:
    """``deletion-done`` (published by the test in hermes' format: the reaper of the test
    server deletes no real file) names a file, no dataset; this file is unknown to the
    catalogue (its parent lookup fails): nothing is re-read, and the next scheduled run reads
    everything once ``interval_s`` has passed."""
    running_activemq.publish_as_hermes(
        [
            {
                "event_type": "deletion-done",
                "payload": {"scope": daemon.scope, "name": "f1", "rse": daemon.dst},
                "created_at": datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S.%f"),
            }
        ]
    )
    labels = {"source": "rucio", "type": "deletion-done"}
    wait_for(
        "the deletion counted",
        lambda: daemon.sample("hydrator_events_applied_total", **labels),
        timeout_s=30.0,
        ignore=(requests.RequestException,),
    )
    cycles = daemon.gate.cycles[0]
    wait_for(
        "the event cycle of its parent lookup",
        lambda: sum(
            daemon.sample("hydrator_event_cycles_total", source="rucio", outcome=outcome)
            for outcome in ("ok", "degraded", "failed")
        ),
        timeout_s=30.0,
        ignore=(requests.RequestException,),
    )
    assert not cycles.full_read_due()  # within interval_s of the start-up read
    cycles.policy = type(cycles.policy)(0.0, 1800.0, 600.0)  # as if interval_s had passed
    assert cycles.full_read_due()
    daemon.gate()
    assert daemon.full_reads() == 2
    assert not cycles.full_read_due()  # the mark is cleared by the read


def test_a_reconnect_reads_everything_once(
    daemon: EventService, rucio_admin: RucioAdmin, running_activemq: Broker
) -> None:
    """While the broker is away, a change happens that no message will tell (its messages
    were lost with the broker, or it had none: a replica added without a transfer). After the
    listener subscribes again, one full read publishes it; the stream is followed again."""
    cycles = daemon.gate.cycles[0]
    running_activemq.stop()
    wait_for(
        "disconnected",
        lambda: not cycles.status().connected,
        timeout_s=30.0,
        ignore=(requests.RequestException,),
    )
    assert daemon.sample("hydrator_events_listener_connected", source="rucio") == 0
    daemon.gate()  # disconnected, but within interval_s of the last read: not due yet
    assert daemon.full_reads() == 1
    silent = rucio_admin.dataset(daemon.scope, 1, at=[daemon.dst])
    rucio_admin.rule(daemon.scope, silent, daemon.dst)
    running_activemq.start()
    did = f"{daemon.scope}:{silent}"
    wait_for(
        "the silent change, by the reconnect's full read",
        lambda: did in daemon.lists()[0],
        timeout_s=60.0,
        ignore=(requests.RequestException,),
    )
    assert daemon.full_reads() == 2
    assert daemon.origin() == "full_read"
    assert daemon.sample("hydrator_events_listener_connected", source="rucio") == 1
    assert not cycles.full_read_due()


def test_a_deletion_done_re_reads_the_dataset_of_its_file_in_an_event_cycle(
    daemon: EventService, rucio_admin: RucioAdmin, running_activemq: Broker
) -> None:
    """A dataset's replicas at the site are deleted for real (its rule removed: judge-cleaner,
    reaper, abacus; its files stay at another RSE). The ``deletion-done`` of one of its files
    is published by the test in hermes' format (the reaper here deletes from no real storage
    and its messages are not sent): it names the file and the RSE, no dataset. The event
    cycle looks up the file's dataset (``list_parent_dids``) and re-reads it: the site's ad
    drops it without a full read, and nothing is left marked for one."""
    # files at the source RSE too: Rucio detaches a file from its dataset with its last replica
    name = rucio_admin.dataset(daemon.scope, 2, at=[daemon.dst, daemon.src])
    rule = rucio_admin.rule(daemon.scope, name, daemon.dst)
    did = f"{daemon.scope}:{name}"
    first, _second = rucio_admin.files(daemon.scope, name)
    cycles = daemon.gate.cycles[0]
    cycles.full_read()  # the dataset published by a full read
    assert did in daemon.lists()[0]
    rucio_admin.remove_rule_now(rule, daemon.dst)  # the replicas at the site go
    assert did in daemon.lists()[0]  # no message yet, no read: still published
    assert daemon.sample(CALLS, source="rucio", method="list_parent_dids") == 0
    running_activemq.publish_as_hermes(
        [
            {
                "event_type": "deletion-done",
                "payload": {"scope": daemon.scope, "name": first, "rse": daemon.dst},
                "created_at": datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S.%f"),
            }
        ]
    )

    def gone() -> bool:
        available, replicating = daemon.lists()
        return did not in available + replicating

    wait_for(
        "the dataset re-read and dropped from the site",
        gone,
        timeout_s=30.0,
        ignore=(requests.RequestException,),
    )
    assert daemon.full_reads() == 2  # the fixture's and the one above: no other
    assert daemon.origin() == "event"
    assert daemon.sample("hydrator_event_reads_total", source="rucio") >= 1
    assert daemon.sample(CALLS, source="rucio", method="list_parent_dids") >= 1  # counted
    assert not cycles.full_read_due()  # the deletion was settled, not marked


def _lists_holding(daemon: EventService, did: str) -> list[str]:
    """The lists of the daemon's site in ``/v1/sites/<site>`` that name ``did``; checks that
    ``/v1/sites`` counts as many incoming as that document lists."""
    site = site_json(daemon.service.published.view(Site(daemon.site)))
    counts = {s["site"]: s for s in sites_json(daemon.service.published)["sites"]}
    assert counts[daemon.site]["incoming"] == len(site["incoming"])
    names = {
        "available": site["available"],
        "partial": [p["dataset"] for p in site["partial"]],
        "replicating": [p["dataset"] for p in site["replicating"]],
        "stuck": site["stuck"],
        "incoming": [p["dataset"] for p in site["incoming"]],
    }
    return [kind for kind, datasets in names.items() if did in datasets]


def test_a_dataset_completed_then_deleted_through_events_leaves_every_list(
    daemon: EventService,
    rucio_server: RucioServer,
    rucio_admin: RucioAdmin,
    hermes: Hermes,
    running_activemq: Broker,
) -> None:
    """A full read sees a dataset's rule REPLICATING towards the site (progress 0). Its files
    arrive (the server's ``datasetlock_ok`` and ``rule_ok``, sent by its hermes): an event
    cycle publishes it complete, with no transfer left (the rule is OK: nothing incoming).
    Its rule and replicas at the site are then deleted for real (judge-cleaner, reaper,
    abacus) and a ``deletion-done`` of one of its files is published in hermes' format (the
    reaper here deletes from no real storage and sends none): the event cycle reads the
    dataset's rules with its replicas, so the dataset leaves every list of the site
    (available, partial, replicating, stuck, incoming), with no full read."""
    # files at the source RSE too: Rucio detaches a file from its dataset with its last replica
    name = rucio_admin.dataset(daemon.scope, 2, at=[daemon.src])
    rule = rucio_admin.rule(daemon.scope, name, daemon.dst, notify="Y")
    did = f"{daemon.scope}:{name}"
    rucio_server.run_abacus()  # the summary row at the source, which the full read needs
    cycles = daemon.gate.cycles[0]
    cycles.full_read()
    assert _lists_holding(daemon, did) == ["replicating", "incoming"]
    first, second = rucio_admin.files(daemon.scope, name)
    rucio_admin.set_file_states(daemon.dst, daemon.scope, [first, second], "A")
    assert rucio_admin.rule_info(rule)["state"] == "OK"
    hermes.run_once()
    wait_for(
        "the completed dataset in the site's ad",
        lambda: did in daemon.lists()[0],
        timeout_s=30.0,
        ignore=(requests.RequestException,),
    )
    assert _lists_holding(daemon, did) == ["available"]  # the rule is done: not incoming
    assert daemon.origin() == "event"
    rucio_admin.remove_rule_now(rule, daemon.dst)
    assert _lists_holding(daemon, did) == ["available"]  # no message yet: still published
    reads = daemon.sample(CALLS, source="rucio", method="list_did_rules")
    running_activemq.publish_as_hermes(
        [
            {
                "event_type": "deletion-done",
                "payload": {"scope": daemon.scope, "name": first, "rse": daemon.dst},
                "created_at": datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S.%f"),
            }
        ]
    )
    wait_for(
        "the deleted dataset out of the site's available list",
        lambda: did not in daemon.lists()[0],
        timeout_s=30.0,
        ignore=(requests.RequestException,),
    )
    assert _lists_holding(daemon, did) == []  # not left behind as a transfer
    assert daemon.full_reads() == 2  # the fixture's and the one above: no other
    assert daemon.origin() == "event"
    # the dataset's rules were read with it, counted as the source's requests are
    assert daemon.sample(CALLS, source="rucio", method="list_did_rules") > reads
