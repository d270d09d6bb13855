"""The listener (hydrator.adapters.events.stomp_listener) on the real broker.

Messages here are published by the test as the broker's ``hermes`` user in hermes' exact
format (:meth:`Broker.publish_as_hermes`): ``transfer-done`` needs FTS, which the test server
does not have. ``tests/events/test_hermes_broker.py`` shows the server's own hermes sending.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from hydrator.adapters.events.stomp_listener import StompListener
from hydrator.core.event_hints import Ignored
from hydrator.domain import DatasetId
from tests.support.activemq import Broker
from tests.support.listener import Sink, alternating, config, send_raw, transfer_done
from tests.support.wait import wait_for

pytestmark = pytest.mark.activemq


@pytest.fixture()
def listening(running_activemq: Broker) -> Iterator[tuple[StompListener, Sink]]:
    sink = Sink()
    listener = StompListener(config(running_activemq), "rucio", sink)
    listener.start()
    try:
        wait_for(
            "subscribed",
            lambda: listener.status().connected,
            timeout_s=30.0,
            ignore=(requests.RequestException,),
        )
        yield listener, sink
    finally:
        listener.stop()


def test_valid_messages_are_handed_over_and_hostile_ones_dropped(
    listening: tuple[StompListener, Sink], running_activemq: Broker
) -> None:
    listener, sink = listening
    running_activemq.publish_as_hermes([transfer_done("ska", "f1", "obs1")])
    (event,) = wait_for(
        "the transfer-done",
        lambda: list(sink.events),
        timeout_s=15.0,
        ignore=(requests.RequestException,),
    )
    assert event.event_type == "transfer-done"
    assert event.dataset == DatasetId("ska", "obs1")
    assert event.file == ("ska", "f1")
    assert event.rse == "SITE_A_DISK"
    assert event.created_at is not None and event.created_at.isoformat().startswith(
        "2026-11-26T10:55:12.123456+00:00"
    )
    assert listener.status().last_message_at is not None

    send_raw(
        running_activemq,
        [
            ("not json", "transfer-done"),
            (json.dumps({"event_type": "x", "payload": {}, "extra": 1}), "x"),
            (json.dumps(transfer_done("ska", "f2", "o" * 5000)), "transfer-done"),  # too big
        ],
    )
    dropped = wait_for(
        "three dropped",
        lambda: list(sink.dropped),
        done=lambda got: len(got) == 3,
        timeout_s=15.0,
        ignore=(requests.RequestException,),
    )
    assert dropped == [
        ("transfer-done", Ignored.NOT_JSON),
        ("other", Ignored.MALFORMED),
        ("transfer-done", Ignored.TOO_LARGE),
    ]


def test_messages_sent_while_away_arrive_on_return(running_activemq: Broker) -> None:
    """The durable subscription: the broker keeps what hermes sends while the daemon is
    stopped, and delivers it when the same client-id and subscription come back."""
    settings = config(running_activemq)
    first = Sink()
    listener = StompListener(settings, "rucio", first)
    listener.start()
    wait_for(
        "subscribed",
        lambda: listener.status().connected,
        timeout_s=30.0,
        ignore=(requests.RequestException,),
    )
    listener.stop()
    running_activemq.publish_as_hermes([transfer_done("ska", "f3", "obs3")])
    again = Sink()
    listener = StompListener(settings, "rucio", again)
    listener.start()
    try:
        (event,) = wait_for(
            "the queued message",
            lambda: list(again.events),
            timeout_s=30.0,
            ignore=(requests.RequestException,),
        )
    finally:
        listener.stop()
    assert event.dataset == DatasetId("ska", "obs3")
    assert first.events == []


def test_a_broker_restart_is_one_lost_and_one_subscribed_line(
    listening: tuple[StompListener, Sink],
    running_activemq: Broker,
    caplog: pytest.LogCaptureFixture,
) -> None:
    listener, sink = listening
    caplog.set_level(logging.INFO, logger="hydrator.adapters.events.stomp_listener")
    running_activemq.stop()
    wait_for(
        "disconnected",
        lambda: not listener.status().connected,
        timeout_s=30.0,
        ignore=(requests.RequestException,),
    )
    threading.Event().wait(3)  # a few reconnect rounds against a closed port
    running_activemq.start()
    wait_for(
        "subscribed again",
        lambda: listener.status().connected,
        timeout_s=60.0,
        ignore=(requests.RequestException,),
    )
    running_activemq.publish_as_hermes([transfer_done("ska", "f4", "obs4")])
    wait_for(
        "a message after the restart",
        lambda: list(sink.events),
        timeout_s=15.0,
        ignore=(requests.RequestException,),
    )
    # Connected, lost, connected again: in this order, each a change. A heart-beat missed on
    # a loaded machine (1 s here) may add a loss and a reconnect; each is one line too.
    states = list(sink.states)
    assert alternating(states) and states[-1] and False in states, states
    outages = states.count(False)
    lines = [r.getMessage() for r in caplog.records]
    lost = [i for i, m in enumerate(lines) if "lost the broker connection" in m]
    failing = [i for i, m in enumerate(lines) if "cannot subscribe at any broker" in m]
    back = [i for i, m in enumerate(lines) if "subscribed to" in m]
    assert len(lost) == len(back) == outages, lines
    assert 1 <= len(failing) <= outages, lines  # the closed port: one line, not one a round
    assert lost[0] < failing[0] < back[-1], lines


def test_a_wrong_password_is_one_line_naming_the_broker(
    running_activemq: Broker, tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    wrong = tmp_path / "password"
    wrong.write_text("not-the-password\n")
    sink = Sink()
    listener = StompListener(config(running_activemq, password_file=wrong), "rucio", sink)
    listener.start()
    try:
        wait_for(
            "the warning",
            lambda: any("cannot subscribe" in r.getMessage() for r in caplog.records),
            timeout_s=30.0,
            ignore=(requests.RequestException,),
        )
        threading.Event().wait(3)  # more rounds, refused again: nothing more is logged
        assert not listener.status().connected
    finally:
        listener.stop()
    lines = [r.getMessage() for r in caplog.records if "cannot subscribe" in r.getMessage()]
    assert len(lines) == 1
    # the broker's refusal is in that line, not in others of the hydrator's (stomp-py's own
    # warnings, e.g. a socket its two threads closed at once, are quieted by the daemon's setup)
    assert len([r for r in caplog.records if r.name.startswith("hydrator")]) == 1
    assert "the broker says" in lines[0]
    assert f"127.0.0.1:{running_activemq.port}" in lines[0]
    assert "not-the-password" not in caplog.text
    assert sink.states == []


class StoppedWhileConnecting(StompListener):
    """A listener whose ``stop()`` comes while it subscribes: the stop finds no connection
    yet (``_conn`` still None), as when the daemon reloads during a connect."""

    def _subscribe(self, conn: Any, frames: Any, generation: int) -> None:
        super()._subscribe(conn, frames, generation)
        self._stop.set()  # what stop() does before it reads _conn, which is still None
        self._wake.set()


def test_a_stop_while_connecting_leaves_no_connection(running_activemq: Broker) -> None:
    """The connection made under a stop is closed by the listener's thread itself: the same
    client-id can subscribe again (the broker refuses a client-id still connected)."""
    settings = config(running_activemq)
    first = StoppedWhileConnecting(settings, "rucio", Sink())
    first.start()
    assert first._thread is not None
    first._thread.join(30)
    assert not first._thread.is_alive()
    again = StompListener(settings, "rucio", Sink())
    again.start()
    try:
        wait_for(
            "subscribed with the same client-id",
            lambda: again.status().connected,
            timeout_s=20.0,
            ignore=(requests.RequestException,),
        )
    finally:
        again.stop()
        first.stop()
