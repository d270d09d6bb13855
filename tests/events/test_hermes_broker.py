"""The real parts the listener is built on: Rucio's own ``rucio-hermes`` sends the events the
server queued to Debian's ActiveMQ, and a durable STOMP subscriber (stomp-py) gets them, also
those sent while it was away."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
import requests
import stomp

from tests.support.activemq import DESTINATION, Broker
from tests.support.hermes import Hermes
from tests.support.rucio_server import RucioAdmin, unique
from tests.support.wait import wait_for

pytestmark = [pytest.mark.rucio, pytest.mark.activemq]


class Inbox(stomp.ConnectionListener):  # type: ignore[misc]  # stomp-py is untyped
    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.lock = threading.Lock()

    def on_message(self, frame: Any) -> None:
        with self.lock:
            self.bodies.append(json.loads(frame.body))
            self.headers.append(dict(frame.headers))

    def of(self, event_type: str, name: str) -> list[dict[str, Any]]:
        with self.lock:
            return [
                b
                for b in self.bodies
                if b["event_type"] == event_type and b["payload"].get("name") == name
            ]


def durable(broker: Broker, client_id: str, inbox: Inbox) -> stomp.Connection12:
    conn = stomp.Connection12([("127.0.0.1", broker.port)], heartbeats=(0, 0))
    conn.set_listener("inbox", inbox)
    conn.connect(
        "hydrator", broker.passwords["hydrator"], wait=True, headers={"client-id": client_id}
    )
    receipt = threading.Event()

    class Receipt(stomp.ConnectionListener):  # type: ignore[misc]  # stomp-py is untyped
        def on_receipt(self, frame: Any) -> None:
            receipt.set()

    conn.set_listener("receipt", Receipt())
    conn.subscribe(
        DESTINATION,
        id="1",
        ack="auto",
        headers={"activemq.subscriptionName": client_id, "receipt": "sub-1"},
    )
    assert receipt.wait(10), "the broker did not confirm the subscription"
    return conn


def test_hermes_delivers_the_servers_rule_events_to_a_durable_subscriber(
    rucio_admin: RucioAdmin, hermes: Hermes, activemq_broker: Broker
) -> None:
    """A rule with ``notify="Y"`` whose last lock goes OK (replicas made AVAILABLE through
    the public API, as the conveyor would) makes the server queue ``datasetlock_ok`` (scope,
    name, rse) and ``rule_ok``; hermes sends both; a subscriber that was disconnected while
    hermes sent them gets them when it comes back (durable subscription)."""
    site, attrs = f"SITE-E-{unique('e').lower()}", {"fed": unique("e").lower()}
    src, dst = (
        rucio_admin.rse(site + "-src", attributes=attrs),
        rucio_admin.rse(site, attributes=attrs),
    )
    scope = rucio_admin.scope()
    name = rucio_admin.dataset(scope, 2, at=[src])
    client_id = unique("hydrator-test-")
    inbox = Inbox()
    durable(activemq_broker, client_id, inbox).disconnect()  # subscribed, then away
    rule_id = rucio_admin.rule(scope, name, dst, notify="Y")
    assert rucio_admin.rule_info(rule_id)["state"] == "REPLICATING"
    rucio_admin.set_file_states(dst, scope, rucio_admin.files(scope, name), "A")
    assert rucio_admin.rule_info(rule_id)["state"] == "OK"

    hermes.run_once()
    conn = durable(activemq_broker, client_id, inbox)
    try:
        (lock_ok,) = wait_for(
            "datasetlock_ok",
            lambda: inbox.of("datasetlock_ok", name),
            timeout_s=15.0,
            ignore=(requests.RequestException,),
        )
        (rule_ok,) = wait_for(
            "rule_ok",
            lambda: inbox.of("rule_ok", name),
            timeout_s=15.0,
            ignore=(requests.RequestException,),
        )
    finally:
        conn.disconnect()
    assert lock_ok["payload"]["scope"] == scope
    assert lock_ok["payload"]["rse"] == dst
    assert lock_ok["payload"]["rule_id"] == rule_id
    assert rule_ok["payload"] == {"scope": scope, "name": name, "rule_id": rule_id}
    assert isinstance(lock_ok["created_at"], str)
    # hermes' STOMP headers: persistent, and the event type for broker-side selectors
    types = {h["event_type"] for h in inbox.headers}
    assert {"datasetlock_ok", "rule_ok"} <= types
    assert all(h["persistent"] == "true" for h in inbox.headers)


def test_the_subscriber_may_not_write_the_topic(activemq_broker: Broker) -> None:
    """The ACL docs/events.md recommends: the hydrator's user only reads."""
    errors: list[str] = []

    class Errors(stomp.ConnectionListener):  # type: ignore[misc]  # stomp-py is untyped
        def on_error(self, frame: Any) -> None:
            errors.append(frame.headers.get("message", ""))

    conn = activemq_broker.connect("hydrator")
    conn.set_listener("errors", Errors())
    try:
        conn.send(destination=DESTINATION, body="{}", headers={"receipt": "w"})
        wait_for(
            "the broker's refusal",
            lambda: errors,
            timeout_s=10.0,
            ignore=(requests.RequestException,),
        )
    finally:
        if conn.is_connected():
            conn.disconnect()
    assert "not authorized to write" in errors[0]
