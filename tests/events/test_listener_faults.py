"""The listener against what a hostile or broken broker side does: messages it cannot use, a
peer that accepts TCP and says nothing, a frame that never ends, an outage. The real broker
wherever its behaviour matters (redelivery of unacknowledged messages to a durable
subscription, restarts); plain sockets (``tests/events/peers.py``) for peers no broker imitates.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from hydrator.adapters.events.stomp_listener import RECONNECT_GROWTH, StompListener
from hydrator.config import RucioEventsConfig
from hydrator.core.event_hints import Ignored
from hydrator.domain import DatasetId
from tests.support.activemq import Broker
from tests.support.listener import Sink, alternating, config, send_raw, transfer_done
from tests.support.peers import running_peer
from tests.support.wait import wait_for

pytestmark = pytest.mark.activemq

LOGGER = "hydrator.adapters.events.stomp_listener"


@pytest.fixture()
def started() -> Iterator[list[StompListener]]:
    """Listeners a test starts: each stopped at the end, also on failure."""
    listeners: list[StompListener] = []
    yield listeners
    for listener in listeners:
        listener.stop()


def start(started: list[StompListener], settings: Any, sink: Sink) -> StompListener:
    listener = StompListener(settings, "rucio", sink)
    started.append(listener)
    listener.start()
    return listener


def subscribed(listener: StompListener, timeout_s: float = 30.0) -> None:
    wait_for(
        "subscribed",
        lambda: listener.status().connected,
        timeout_s=timeout_s,
        ignore=(requests.RequestException,),
    )


def delivered(sink: Sink, dataset: DatasetId) -> None:
    wait_for(
        f"{dataset} handed over",
        lambda: [e for e in list(sink.events) if e.dataset == dataset],
        timeout_s=20.0,
    )


def nothing_comes_back(broker: Broker, settings: Any, started: list[StompListener]) -> Sink:
    """Stop the listeners, subscribe again with the same client-id and subscription, and read
    up to a marker published now: what was not acknowledged would come before it."""
    for listener in started:
        listener.stop()
    again = Sink()
    listener = start(started, settings, again)
    subscribed(listener)
    broker.publish_as_hermes([transfer_done("ska", "marker-f", "marker")])
    delivered(again, DatasetId("ska", "marker"))
    return again


def rule_ok(name: str, created_at: str) -> dict[str, Any]:
    return {
        "event_type": "rule_ok",
        "payload": {"scope": "ska", "name": name, "rule_id": "abc"},
        "created_at": created_at,
    }


def test_a_message_whose_time_has_no_utc_is_dropped_once_and_the_stream_goes_on(
    running_activemq: Broker, started: list[StompListener], caplog: pytest.LogCaptureFixture
) -> None:
    """Year 1 at +05:00 parses but has no UTC equivalent: it is counted once, acknowledged,
    and the message behind it is handed over on the same connection (no redelivery, no
    reconnect: each reconnect would cost a full read of Rucio)."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    settings = config(running_activemq)
    sink = Sink()
    listener = start(started, settings, sink)
    subscribed(listener)
    running_activemq.publish_as_hermes(
        [rule_ok("poison", "0001-01-01 00:00:00+05:00"), transfer_done("ska", "f5", "obs5")]
    )
    delivered(sink, DatasetId("ska", "obs5"))
    assert sink.dropped == [("rule_ok", Ignored.BAD_TIME)]
    assert sink.states == [True], "no reconnect"
    lines = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
    assert len(lines) == 1 and "bad_time" in lines[0] and "0001-01-01" in lines[0]
    again = nothing_comes_back(running_activemq, settings, started)
    assert again.dropped == [], "the poison message was acknowledged"
    assert sink.dropped == [("rule_ok", Ignored.BAD_TIME)]


def test_bad_input_is_counted_by_kind_logged_once_acknowledged_and_never_handed_over(
    running_activemq: Broker, started: list[StompListener], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    settings = config(running_activemq)
    sink = Sink()
    listener = start(started, settings, sink)
    subscribed(listener)
    bad_name = transfer_done("ska", "f6", "obs 6")  # a space breaks the name rules
    send_raw(
        running_activemq,
        [
            (b'{"event_type": "rule_ok", "payload": {}, "created_at": "\xff\xfe"}', "rule_ok"),
            ("{not json", "rule_ok"),
            ("not json either", "rule_ok"),  # the same kind again: counted, no second line
            (json.dumps(transfer_done("ska", "f7", "o" * 5000)), "transfer-done"),  # too big
            (json.dumps(bad_name), "transfer-done"),
            (json.dumps(rule_ok("obs8", "2026-11-26 10:55:12")).replace("rule_ok", "x-new"), "x"),
            (json.dumps(transfer_done("ska", "f9", "obs9")), "transfer-done"),  # a good one
        ],
    )
    delivered(sink, DatasetId("ska", "obs9"))
    assert sink.dropped == [
        ("rule_ok", Ignored.NOT_UTF8),
        ("rule_ok", Ignored.NOT_JSON),
        ("rule_ok", Ignored.NOT_JSON),
        ("transfer-done", Ignored.TOO_LARGE),
        ("transfer-done", Ignored.INVALID_NAME),
    ]
    # the unknown type goes to the sink, which counts it as irrelevant (core.event_hints.hint_of)
    assert [e.event_type for e in sink.events] == ["x-new", "transfer-done"]
    assert sink.states == [True], "no reconnect"
    lines = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
    kinds = ["not_utf8", "not_json", "too_large", "invalid_name", "irrelevant"]
    assert [k for k in kinds for line in lines if f" as {k}:" in line] == kinds
    assert len(lines) == len(kinds), lines
    assert "obs 6" in lines[3]
    again = nothing_comes_back(running_activemq, settings, started)
    assert again.dropped == [] and [e.dataset for e in again.events] == [DatasetId("ska", "marker")]


def stomp_threads() -> set[threading.Thread]:
    """stomp-py's receiver and heart-beat threads, and the listeners' own."""
    return {
        t
        for t in threading.enumerate()
        if "io_loop" in t.name or "StompHeartbeat" in t.name or t.name.startswith("events-")
    }


def test_a_silent_broker_is_a_deadline_a_line_and_a_retry_and_stop_leaves_nothing(
    running_activemq: Broker, started: list[StompListener], caplog: pytest.LogCaptureFixture
) -> None:
    """A peer that accepts TCP and never answers: each attempt ends at ``timeout_s`` (one
    line), the next follows after the reconnect wait, and stop() ends the thread and closes
    every connection; with the real broker named after it, the listener subscribes there."""
    before = stomp_threads()
    with running_peer("silent") as peer:
        settings = config(running_activemq, brokers=[peer.broker], timeout_s=1.0)
        listener = start(started, settings, Sink())
        wait_for("three attempts", lambda: peer.accepted, done=lambda n: n >= 3, timeout_s=30)
        listener.stop()
        assert not [t for t in stomp_threads() if t.name.startswith("events-")]
        wait_for(
            "stomp-py's threads gone",
            lambda: stomp_threads() - before,
            done=lambda t: not t,
            timeout_s=10,
        )
        wait_for(
            "every connection closed",
            lambda: peer.closed,
            done=lambda n: n == peer.accepted,
            timeout_s=10,
        )
        lines = [r.getMessage() for r in caplog.records if r.name == LOGGER]
        assert len(lines) == 1, lines
        assert f"no CONNECTED from {peer.broker} within timeout_s 1 s" in lines[0]

        both = config(running_activemq, timeout_s=1.0)
        both = config(running_activemq, timeout_s=1.0, brokers=[peer.broker, *both.brokers])
        listener = start(started, both, Sink())
        subscribed(listener)
        listener.stop()
        wait_for(
            "stomp-py's threads gone",
            lambda: stomp_threads() - before,
            done=lambda t: not t,
            timeout_s=10,
        )


def peak_rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


def current_rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_a_frame_that_never_ends_is_cut_at_the_bound_and_the_next_broker_used(
    running_activemq: Broker, started: list[StompListener], caplog: pytest.LogCaptureFixture
) -> None:
    """A peer answers CONNECTED, then streams 64 MiB of one MESSAGE frame without its end:
    the listener disconnects at ``max_message_bytes`` plus headers, its memory grows by less
    than three times that bound, and it subscribes at the real broker named next."""
    max_bytes = 4 * 1024 * 1024
    bound_kib = (max_bytes + 16384) // 1024
    with running_peer("endless", stream_bytes=64 * 1024 * 1024) as peer:
        settings = config(running_activemq, max_message_bytes=max_bytes, timeout_s=5.0)
        settings = config(
            running_activemq,
            max_message_bytes=max_bytes,
            timeout_s=5.0,
            brokers=[peer.broker, *settings.brokers],
        )
        Path("/proc/self/clear_refs").write_text("5")  # the peak RSS starts from now
        base = current_rss_kib()
        listener = start(started, settings, Sink())
        subscribed(listener)
        growth = peak_rss_kib() - base
        assert growth < 3 * bound_kib, f"RSS grew {growth} KiB; bound {bound_kib} KiB"
        assert peer.accepted == 1 and peer.closed == 1
        assert peer.sent < peer.stream_bytes
    lines = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert any("without ending a frame" in line for line in lines), lines


def test_a_message_over_the_frame_bound_is_acknowledged_unread_and_not_delivered_again(
    running_activemq: Broker, started: list[StompListener], caplog: pytest.LogCaptureFixture
) -> None:
    """The test broker does not bound frames: a 64 KiB message reaches a listener whose
    bound is 4 KiB plus headers. It is cut (one reconnect), acknowledged unread and counted
    once; the message behind it arrives, and nothing comes back to the subscription."""
    settings = config(running_activemq, heartbeat_s=0.0)  # no heart-beat to miss here
    sink = Sink()
    listener = start(started, settings, sink)
    subscribed(listener)
    huge = transfer_done("ska", "f10", "obs10")
    huge["payload"]["padding"] = "p" * 65536
    running_activemq.publish_as_hermes([huge, transfer_done("ska", "f11", "obs11")])
    delivered(sink, DatasetId("ska", "obs11"))
    assert sink.dropped == [("transfer-done", Ignored.TOO_LARGE)]
    assert [e.dataset for e in sink.events] == [DatasetId("ska", "obs11")]
    assert sink.states == [True, False, True], "one reconnect, not one a delivery"
    again = nothing_comes_back(running_activemq, settings, started)
    assert again.dropped == [], "the message over the bound was acknowledged"


def test_after_an_outage_the_listener_subscribes_within_10_s_of_the_broker_accepting(
    running_activemq: Broker, started: list[StompListener]
) -> None:
    """The reconnect settings' defaults: however many rounds failed while the broker was
    down, the wait before the next one is at most ``reconnect_max_s``."""
    fields = RucioEventsConfig.model_fields
    settings = config(
        running_activemq,
        reconnect_initial_s=fields["reconnect_initial_s"].default,
        reconnect_max_s=fields["reconnect_max_s"].default,
    )
    sink = Sink()
    listener = start(started, settings, sink)
    subscribed(listener)
    running_activemq.stop()
    wait_for("disconnected", lambda: not listener.status().connected, timeout_s=30)
    threading.Event().wait(10)  # the outage
    running_activemq.start()  # returns once the port accepts connections
    accepting = time.monotonic()
    subscribed(listener, timeout_s=60)
    took = time.monotonic() - accepting
    assert took <= 10, f"subscribed {took:.1f} s after the broker accepted connections"
    assert alternating(sink.states) and sink.states[-1] is True and False in sink.states


def test_a_broker_that_drops_each_subscription_is_retried_at_the_growing_wait(
    running_activemq: Broker, started: list[StompListener]
) -> None:
    """A proxy in front of the real broker cuts every connection 1 s after it opened, after the
    subscription was granted: each next attempt waits at least the jitter floor of the growing
    reconnect delay (before, each subscription reset it and the listener reconnected at once,
    each reconnect a full read at the daemon)."""
    with running_peer("cutting", upstream=running_activemq.port, cut_after_s=1.0) as peer:
        settings = config(
            running_activemq, brokers=[peer.broker], reconnect_initial_s=0.4, reconnect_max_s=2.0
        )
        sink = Sink()
        start(started, settings, sink)
        wait_for("five connections", lambda: peer.accepted, done=lambda n: n >= 5, timeout_s=60)
        opened, cut = peer.openings_and_cuts()
    assert sink.states.count(True) >= 2, sink.states  # the broker granted the subscriptions
    for k, (cut_k, next_open) in enumerate(zip(cut, opened[1:], strict=False)):
        floor = min(2.0, 0.4 * RECONNECT_GROWTH**k) / 2
        assert next_open - cut_k >= floor, (k, next_open - cut_k, floor)
