"""The Rucio event listener: a durable STOMP subscription (stomp-py) to the topic ``rucio-hermes``
sends to, for one Rucio source. The only module that imports stomp-py.

* **Connection.** ``[sources.events] brokers`` are tried in order (stomp-py's own reconnect
  loop: ``reconnect_initial_s`` growing by half per try up to ``reconnect_max_s``, with
  jitter); after a round that reached none, the supervisor thread waits ``reconnect_max_s``
  and starts another. Heart-beats both ways (``heartbeat_s``) turn a dead broker into a
  disconnect. Credentials come from ``password_file`` (read at each connect), TLS from
  ``use_ssl``/``ca_cert``/``client_cert``/``client_key``. Each state change is logged once:
  subscribed, lost, cannot reach any broker (until it changes).
* **Durable.** CONNECT carries ``client-id``, SUBSCRIBE ``activemq.subscriptionName``: the
  broker keeps what is sent while the daemon is away and delivers it on return. Frames are
  acknowledged one by one (``client-individual``) after they are handed over; a message
  handed over and lost with the process is covered by the full read at start-up.
* **Hostile input.** A body over ``max_message_bytes``, not JSON, or not hermes' envelope
  (``event_type``, ``payload``, ``created_at``; nothing else) is dropped as malformed; names
  are checked by :class:`~hydrator.domain.DatasetId`. The sink gets a
  :class:`~hydrator.core.events.RucioEvent` or the reason it was dropped.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Annotated, Any

import stomp
from pydantic import BaseModel, ConfigDict, StringConstraints, ValidationError
from stomp.exception import StompException

from hydrator.config import RucioEventsConfig
from hydrator.core.events import (
    KNOWN_TYPES,
    TRANSFER_TYPES,
    Ignored,
    ListenerStatus,
    RucioEvent,
    dataset_or_none,
    message_key,
)
from hydrator.core.ports import EventSink
from hydrator.errors import SourceError
from hydrator.redact import read_secret, redact

log = logging.getLogger(__name__)

RECEIPT_TIMEOUT_S = 10.0  # the broker's answer to SUBSCRIBE
STOP_TIMEOUT_S = 10.0


class _Envelope(BaseModel):
    """hermes' message body (``deliver_to_activemq``, Rucio 41.5.1)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    event_type: Annotated[str, StringConstraints(min_length=1, max_length=64)]
    payload: dict[str, Any]
    created_at: Annotated[str, StringConstraints(max_length=64)] | None = None


def parse_message(body: str | bytes, max_bytes: int) -> RucioEvent | Ignored:
    """One message body as an event, or :attr:`Ignored.MALFORMED`."""
    raw = body.encode("utf-8", "replace") if isinstance(body, str) else body
    if len(raw) > max_bytes:
        return Ignored.MALFORMED
    try:
        envelope = _Envelope.model_validate_json(raw)
    except ValidationError:
        return Ignored.MALFORMED
    created = _created_at(envelope.created_at)
    if envelope.created_at is not None and created is None:
        return Ignored.MALFORMED
    kind = envelope.event_type.lower()
    payload = envelope.payload
    if kind in TRANSFER_TYPES:
        dataset = dataset_or_none(payload.get("datasetScope"), payload.get("dataset"))
        rse = payload.get("dst-rse")
    else:
        dataset = dataset_or_none(payload.get("scope"), payload.get("name"))
        rse = payload.get("rse")
    scope, name = payload.get("scope"), payload.get("name")
    file = (scope, name) if isinstance(scope, str) and isinstance(name, str) else None
    return RucioEvent(
        event_type=kind,
        created_at=created,
        dataset=dataset,
        file=file,
        rse=rse if isinstance(rse, str) else None,
        key=message_key(raw),
    )


def _created_at(text: str | None) -> datetime | None:
    """hermes' ``str(datetime)`` (UTC, naive: ``2026-11-26 10:55:12.123456``) as aware UTC."""
    if text is None:
        return None
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        return None
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)


def build(config: RucioEventsConfig, source: str, sink: EventSink) -> StompListener:
    """The factory the runtime uses for a Rucio source's ``[sources.events]``."""
    return StompListener(config, source, sink)


class StompListener:
    """Keeps one durable subscription alive from a thread of its own (see the module
    docstring); ``clock`` gives monotonic seconds for :meth:`status`."""

    def __init__(
        self,
        config: RucioEventsConfig,
        source: str,
        sink: EventSink,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.source = source
        self._sink = sink
        self._clock = clock
        self._hosts = [_host_port(b) for b in config.brokers]
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._status = ListenerStatus()
        self._conn: stomp.Connection12 | None = None
        self._generation = itertools.count(1)
        self._current = 0
        self._failing = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"events-{self.source}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Unsubscribe nothing (the durable subscription stays), end the thread, which
        disconnects as it ends (also a connection it was making meanwhile)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(STOP_TIMEOUT_S)

    def status(self) -> ListenerStatus:
        with self._lock:
            return self._status

    # -- the supervisor thread ------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self.status().connected and not self._connect():
                self._stop.wait(self.config.reconnect_max_s)
                continue
            self._wake.wait()
            self._wake.clear()
        # Only this thread disconnects: also a connection it made while stop() ran, which
        # would otherwise stay and keep the client-id (the broker refuses the next listener).
        conn = self._conn
        if conn is not None:
            # AttributeError: stomp-py's send when the broker closed the socket meanwhile
            with contextlib.suppress(StompException, OSError, AttributeError):
                conn.disconnect()

    def _connect(self) -> bool:
        """One round over the brokers (stomp-py's backoff); True once subscribed."""
        generation = next(self._generation)
        conn = self._connection(generation)
        try:
            password = self._password()
            conn.connect(
                self.config.username,
                password,
                wait=True,
                headers={"client-id": self.config.client_id},
            )
            self._subscribe(conn, generation)
        except (StompException, OSError, SourceError, TimeoutError) as exc:
            with contextlib.suppress(StompException, OSError):
                conn.disconnect()
            frames = conn.get_listener("hydrator")
            said = frames.error if isinstance(frames, _Frames) else None
            self._not_connected(said or redact(str(exc) or type(exc).__name__))
            return False
        self._conn, self._current = conn, generation
        now = self._clock()
        with self._lock:
            self._status = ListenerStatus(True, now, self._status.last_message_at)
        self._failing = False
        log.info(
            "events %s: subscribed to %s at %s (durable subscription %s, client-id %s)",
            self.source,
            self.config.destination,
            ",".join(self.config.brokers),
            self.config.subscription_name,
            self.config.client_id,
        )
        self._sink.connection(True)
        return True

    def _not_connected(self, reason: str) -> None:
        """One warning until the state changes (a round that failed again says nothing)."""
        if not self._failing:
            log.warning(
                "events %s: cannot subscribe at any broker of %s: %s; retrying every %g s "
                "at most, polling at [daemon] interval_s meanwhile",
                self.source,
                ",".join(self.config.brokers),
                reason,
                self.config.reconnect_max_s,
            )
            self._failing = True

    def _connection(self, generation: int) -> stomp.Connection12:
        beat_ms = int(self.config.heartbeat_s * 1000)
        conn = stomp.Connection12(
            self._hosts,
            prefer_localhost=False,
            try_loopback_connect=False,
            reconnect_sleep_initial=self.config.reconnect_initial_s,
            reconnect_sleep_increase=0.5,
            reconnect_sleep_max=self.config.reconnect_max_s,
            reconnect_attempts_max=max(3, len(self._hosts)),
            heartbeats=(beat_ms, beat_ms),
            timeout=10.0,
        )
        if self.config.use_ssl:
            conn.set_ssl(
                for_hosts=self._hosts,
                ca_certs=_str(self.config.ca_cert),
                cert_file=_str(self.config.client_cert),
                key_file=_str(self.config.client_key),
            )
        conn.set_listener("hydrator", _Frames(self, conn, generation))
        return conn

    def _password(self) -> str | None:
        path = self.config.password_file
        return None if path is None else read_secret(path, "broker password")

    def _subscribe(self, conn: stomp.Connection12, generation: int) -> None:
        receipt = f"subscribe-{generation}"
        frames = conn.get_listener("hydrator")
        assert isinstance(frames, _Frames)
        conn.subscribe(
            self.config.destination,
            id="1",
            ack="client-individual",
            headers={
                "activemq.subscriptionName": self.config.subscription_name,
                "receipt": receipt,
            },
        )
        if not frames.receipt.wait(RECEIPT_TIMEOUT_S):
            reason = frames.error or f"no receipt for SUBSCRIBE in {RECEIPT_TIMEOUT_S:g} s"
            raise TimeoutError(reason)

    # -- callbacks from stomp-py's receiver thread -----------------------------------------

    def received(self, conn: stomp.Connection12, frame: Any) -> None:
        """Hand one MESSAGE frame over, then acknowledge it."""
        with self._lock:
            old = self._status
            self._status = ListenerStatus(old.connected, old.connected_at, self._clock())
        found = parse_message(frame.body, self.config.max_message_bytes)
        try:
            if isinstance(found, Ignored):
                self._sink.ignored(_label(frame.headers.get("event_type")), found)
            else:
                self._sink.event(found)
        finally:
            ack = frame.headers.get("ack")
            if ack is not None:
                with contextlib.suppress(StompException, OSError):
                    conn.ack(ack)

    def lost(self, generation: int, reason: str) -> None:
        """The connection of ``generation`` is gone (a stale one's news is ignored)."""
        if generation != self._current or self._stop.is_set():
            return
        with self._lock:
            old = self._status
            self._status = ListenerStatus(False, old.connected_at, old.last_message_at)
        self._current = 0
        log.warning(
            "events %s: lost the broker connection (%s); reconnecting, polling at [daemon] "
            "interval_s meanwhile",
            self.source,
            reason,
        )
        self._sink.connection(False)
        self._wake.set()


class _Frames(stomp.ConnectionListener):  # type: ignore[misc]  # stomp-py is untyped
    """stomp-py's callbacks for one connection attempt (``generation``)."""

    def __init__(self, owner: StompListener, conn: stomp.Connection12, generation: int) -> None:
        self.owner, self.conn, self.generation = owner, conn, generation
        self.receipt = threading.Event()
        self.error: str | None = None

    def on_receipt(self, frame: Any) -> None:
        self.receipt.set()

    def on_error(self, frame: Any) -> None:
        """Kept for the one line of a failed connect; logged at once only while subscribed
        (a refused connect repeats every round)."""
        self.error = "the broker says: " + redact(str(frame.headers.get("message", "ERROR")))[:300]
        if self.owner.status().connected:
            log.warning("events %s: %s", self.owner.source, self.error)

    def on_message(self, frame: Any) -> None:
        self.owner.received(self.conn, frame)

    def on_heartbeat_timeout(self) -> None:
        self.owner.lost(self.generation, "no heart-beat from the broker")

    def on_disconnected(self) -> None:
        self.owner.lost(self.generation, self.error or "disconnected")


def _host_port(broker: str) -> tuple[str, int]:
    host, _, port = broker.rpartition(":")
    return host.strip("[]"), int(port)


def _str(value: object) -> str | None:
    return None if value is None else str(value)


def _label(event_type: object) -> str:
    """A dropped message's type as a bounded label (from hermes' ``event_type`` header)."""
    kind = event_type.lower() if isinstance(event_type, str) else ""
    return kind if kind in KNOWN_TYPES else "other"
