"""What the listener's broker tests share: a sink recording what the listener hands over, the
listener's configuration for a test broker, and a ``transfer-done`` in hermes' format."""

from __future__ import annotations

import itertools
import threading
from typing import Any

from hydrator.config import RucioEventsConfig
from hydrator.core.event_hints import Ignored, RucioEvent
from tests.support.activemq import DESTINATION, Broker
from tests.support.rucio_server import unique


class Sink:
    """Records what the listener hands over (thread-safe)."""

    def __init__(self) -> None:
        self.events: list[RucioEvent] = []
        self.dropped: list[tuple[str, Ignored]] = []
        self.states: list[bool] = []
        self.lock = threading.Lock()

    def event(self, event: RucioEvent) -> None:
        with self.lock:
            self.events.append(event)

    def ignored(self, label: str, reason: Ignored) -> None:
        with self.lock:
            self.dropped.append((label, reason))

    def connection(self, connected: bool) -> None:
        with self.lock:
            self.states.append(connected)


def alternating(states: list[bool]) -> bool:
    """Subscribed first, and each state a change from the one before."""
    return bool(states) and states[0] and all(a != b for a, b in itertools.pairwise(states))


def config(broker: Broker, **overrides: Any) -> RucioEventsConfig:
    values: dict[str, Any] = {
        "enabled": True,
        "brokers": [f"127.0.0.1:{broker.port}"],
        "destination": DESTINATION,
        "client_id": unique("hydrator-"),
        "subscription_name": "hydrator",
        "username": "hydrator",
        "password_file": broker.password_file("hydrator"),
        "heartbeat_s": 1.0,
        "reconnect_initial_s": 0.2,
        "reconnect_max_s": 1.0,
        "max_message_bytes": 4096,
    }
    values.update(overrides)
    return RucioEventsConfig(**values)


def transfer_done(scope: str, name: str, dataset: str) -> dict[str, Any]:
    """A ``transfer-done`` as Rucio 41.5.1 queues it (rucio.core.request), abridged."""
    return {
        "event_type": "transfer-done",
        "payload": {
            "scope": scope,
            "name": name,
            "dataset": dataset,
            "datasetScope": scope,
            "dst-rse": "SITE_A_DISK",
            "src-rse": "SITE_B_DISK",
            "bytes": 1000,
            "tool-id": "rucio-conveyor",
        },
        "created_at": "2026-11-26 10:55:12.123456",
    }


def send_raw(broker: Broker, messages: list[tuple[bytes | str, str]]) -> None:
    """Publish bodies as they are (hermes' headers), for bodies hermes would never send."""
    conn = broker.connect("hermes")
    try:
        for body, event_type in messages:
            conn.send(
                destination=DESTINATION,
                body=body,
                headers={"persistent": "true", "event_type": event_type},
            )
    finally:
        conn.disconnect()
