"""The Rucio event listener: a durable STOMP subscription (stomp-py) to the topic ``rucio-hermes``
sends to, for one Rucio source: when to connect, and what each message is. One connection
attempt (stomp-py, its transport and callbacks) is :mod:`hydrator.adapters.events.stomp_connection`.

* **Connection.** Each attempt is one round over ``[sources.events] brokers`` in order, and
  every network step of it has a deadline of ``timeout_s``: the TCP connect (stomp-py's
  ``timeout``), the CONNECT/CONNECTED exchange and the SUBSCRIBE receipt (awaited here). A
  broker that accepted TCP and then failed (no answer, an ERROR frame) goes to the end of the
  order, so a silent peer in front cannot hide the others. After a failed round the supervisor
  thread waits a jittered exponential delay (:func:`reconnect_delay`: from
  ``reconnect_initial_s``, growing by half per failed round, at most ``reconnect_max_s``) and
  tries again; a subscription that then lasts :data:`STABLE_S` resets it, so the next outage
  starts short again, while a broker that drops each subscription soon after granting it
  (a proxy or load balancer cutting connections) is retried at the growing delay, not in a
  loop (each reconnect also makes a full read due: docs/events.md). Heart-beats
  both ways (``heartbeat_s``) turn a dead broker into a disconnect. Credentials come from
  ``password_file`` (read at each connect), TLS from ``use_ssl``/``ca_cert``/``client_cert``/
  ``client_key``. Each state change is logged once: subscribed, lost, cannot subscribe at any
  broker (until it changes). :meth:`StompListener.stop` interrupts every wait.
* **Durable.** CONNECT carries ``client-id``, SUBSCRIBE ``activemq.subscriptionName``: the
  broker keeps what is sent while the daemon is away and delivers it on return. Frames are
  acknowledged one by one (``client-individual``): every MESSAGE exactly once, after it was
  handed over or dropped, whatever happened while handling it (a message left unacknowledged
  would come back at once, forever). A message handed over and lost with the process is
  covered by the full read at start-up.
* **Bounded frames.** A peer that sends more than ``max_message_bytes`` plus
  :data:`~hydrator.adapters.events.stomp_connection.FRAME_HEADER_BYTES` without ending the
  frame is disconnected at once
  (:class:`~hydrator.adapters.events.stomp_connection.BoundedTransport`: memory stays bounded
  while reading), and the next attempt waits as after a failed round. A MESSAGE cut so is
  acknowledged unread first when its headers arrived whole, and counted as ``too_large``: a
  broker that does not bound frames itself would otherwise deliver it again at every
  reconnect.
* **Hostile input.** :func:`~hydrator.adapters.events.hermes_messages.parse_message`
  says why a body cannot be used: over ``max_message_bytes`` (``too_large``), not UTF-8, not
  JSON, not hermes' envelope (``event_type``, ``payload``, ``created_at``; nothing else:
  ``malformed``), a ``created_at`` that is no UTC time (``bad_time``), a scope or name
  outside the name rules (``invalid_name``). A type the hydrator does not use is
  ``irrelevant``. The sink gets a :class:`~hydrator.core.event_hints.RucioEvent` or the reason
  it was dropped, counted by the sink; each reason is logged at most once per
  :data:`DROP_LOG_INTERVAL_S`, with the number dropped since.
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any

from hydrator.adapters.events.hermes_messages import Dropped, parse_message
from hydrator.adapters.events.stomp_connection import (
    FRAME_HEADER_BYTES,
    BrokerError,
    Connection,
    Frames,
    close,
    failure_reason,
    open_connection,
)
from hydrator.config import RucioEventsConfig
from hydrator.core.event_hints import (
    KNOWN_TYPES,
    Ignored,
    ListenerStatus,
    type_label,
)
from hydrator.core.ports import EventSink
from hydrator.errors import SourceError
from hydrator.redact import read_secret, redact

log = logging.getLogger(__name__)

STOP_MARGIN_S = 5.0  # stop() waits the listener's thread this much beyond timeout_s
DROP_LOG_INTERVAL_S = 60.0
RECONNECT_GROWTH = 1.5
STABLE_S = 30.0  # a subscription lost sooner than this counts as a failed round


def reconnect_delay(failures: int, initial_s: float, max_s: float, draw: float) -> float:
    """Seconds to wait after ``failures`` (>= 1) failed rounds in a row: ``initial_s`` growing
    by half per round, at most ``max_s``, times ``0.5 + draw / 2`` (``draw`` in [0, 1): the
    jitter that keeps many daemons from reconnecting in step)."""
    base = min(max_s, initial_s * RECONNECT_GROWTH ** min(failures - 1, 64))
    return base * (0.5 + draw / 2)


def build(config: RucioEventsConfig, source: str, sink: EventSink) -> StompListener:
    """The factory the runtime uses for a Rucio source's ``[sources.events]``."""
    return StompListener(config, source, sink)


class _Refused(Exception):
    """One connection attempt failed; the message says why (one line, redacted)."""


class _Stopped(Exception):
    """stop() came while connecting."""


class StompListener:
    """Keeps one durable subscription alive from a thread of its own (see the module
    docstring); ``clock`` gives monotonic seconds for :meth:`status`, ``draw`` the jitter of
    the reconnect delay (a number in [0, 1))."""

    def __init__(
        self,
        config: RucioEventsConfig,
        source: str,
        sink: EventSink,
        *,
        clock: Callable[[], float] = time.monotonic,
        draw: Callable[[], float] = random.random,
    ) -> None:
        self.config = config
        self.source = source
        self._sink = sink
        self._clock = clock
        self._draw = draw
        self._order = config.addresses  # tried in this order
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._status = ListenerStatus()
        self._conn: tuple[Connection, Frames] | None = None  # subscribed, or being closed
        self._frames: Frames | None = None  # of the attempt in progress (stop() wakes it)
        self._generation = 0
        self._current = 0  # the generation of the subscribed connection; 0: none
        self._failing = False
        self._failures = 0  # failed rounds in a row: the reconnect delay
        self._streak = 0  # failed rounds before the last subscription
        self._subscribed_at = 0.0  # when it was granted (the listener's clock)
        self._drops: dict[Ignored, tuple[float, int]] = {}  # last line at, dropped since
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._run, name=f"events-listener-{self.source}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Unsubscribe nothing (the durable subscription stays), end the thread, which
        disconnects as it ends (also a connection it was making meanwhile). Returns once the
        thread ended: within ``timeout_s`` per broker it is connecting to at the time."""
        self._stop.set()
        self._wake.set()
        frames = self._frames
        if frames is not None:
            frames.changed.set()
        if self._thread is not None:
            self._thread.join(self.config.timeout_s * len(self._order) + STOP_MARGIN_S)

    def status(self) -> ListenerStatus:
        with self._lock:
            return self._status

    def alive(self) -> bool:
        """The listener's thread runs, or was never started or was stopped on purpose
        (:class:`~hydrator.core.ports.RunsThread`: the daemon restarts a dead one)."""
        thread = self._thread
        return thread is None or thread.is_alive() or self._stop.is_set()

    # -- the supervisor thread ------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                if self.status().connected:
                    self._wake.wait()
                    self._wake.clear()
                    continue
                self._close_current()
                if self._failures and self._stop.wait(self._delay()):
                    break
                if self._connect():
                    self._streak, self._failures = self._failures, 0
                else:
                    self._failures += 1
        finally:
            # Only this thread disconnects: also a connection it made while stop() ran, which
            # would otherwise stay and keep the client-id (the broker refuses the next listener).
            self._close_current()

    def _delay(self) -> float:
        cfg = self.config
        return reconnect_delay(
            self._failures, cfg.reconnect_initial_s, cfg.reconnect_max_s, self._draw()
        )

    def _close_current(self) -> None:
        """Close what is left of the last connection; one that ended on a frame over the bound
        (the broker may send that frame again at once) or within :data:`STABLE_S` of its
        subscription counts as a failed round."""
        held, self._conn, self._current = self._conn, None, 0
        if held is None:
            return
        conn, frames = held
        brief = self._clock() - self._subscribed_at < STABLE_S
        if frames.over_bound() is not None or brief:
            self._failures = self._streak + 1
        close(conn, frames)

    def _connect(self) -> bool:
        """One round over the brokers; True once subscribed."""
        self._generation += 1
        generation = self._generation
        # stomp-py tries each broker once, in order, without waiting; the waits are _run's
        conn, frames = open_connection(self.config, self._order, self, generation)
        self._frames = frames
        try:
            if self._stop.is_set():
                raise _Stopped
            conn.connect(
                self.config.username,
                self._password(),
                wait=False,
                headers={"client-id": self.config.client_id},
            )
            self._await(frames, frames.connected, "CONNECTED")
            self._subscribe(conn, frames, generation)
        except _Stopped:
            close(conn, frames)
            return False
        except (_Refused, BrokerError, OSError, SourceError) as exc:
            close(conn, frames)
            self._demote(frames.host)
            self._not_connected(failure_reason(exc, self.config.timeout_s))
            return False
        self._subscribed(conn, frames, generation)
        return True

    def _await(self, frames: Frames, done: threading.Event, what: str) -> None:
        """Wait for ``done`` at most ``timeout_s``; raise :class:`_Refused` on the deadline, an
        ERROR frame or a closed connection, :class:`_Stopped` on stop()."""
        deadline = time.monotonic() + self.config.timeout_s
        while not done.is_set():
            if self._stop.is_set():
                raise _Stopped
            if frames.error is not None:
                raise _Refused(frames.error)
            if frames.gone.is_set():
                raise _Refused(frames.over_bound() or f"{frames.where()} closed the connection")
            left = deadline - time.monotonic()
            if left <= 0:
                raise _Refused(
                    f"no {what} from {frames.where()} within timeout_s {self.config.timeout_s:g} s"
                )
            frames.changed.wait(left)
            frames.changed.clear()

    def _demote(self, host: tuple[str, int] | None) -> None:
        """A broker that accepted TCP and then failed is tried last in the next round."""
        if host in self._order and len(self._order) > 1:
            self._order.remove(host)
            self._order.append(host)

    def _subscribed(self, conn: Connection, frames: Frames, generation: int) -> None:
        self._conn, self._current = (conn, frames), generation
        now = self._clock()
        self._subscribed_at = now
        with self._lock:
            self._status = ListenerStatus(True, now, self._status.last_message_at)
        self._failing = False
        log.info(
            "events %s: subscribed to %s at %s (durable subscription %s, client-id %s)",
            self.source,
            self.config.destination,
            frames.where(),
            self.config.subscription_name,
            self.config.client_id,
        )
        self._sink.connection(True)
        if frames.gone.is_set():  # lost between the receipt and now: its news was not ours yet
            self.lost(generation, frames.over_bound() or "disconnected")

    def _not_connected(self, reason: str) -> None:
        """One warning until the state changes (a round that failed again says nothing)."""
        if not self._failing:
            log.warning(
                "events %s: cannot subscribe at any broker of %s: %s; retrying after %g s "
                "growing to %g s at most, polling at [daemon] interval_s meanwhile",
                self.source,
                ",".join(self.config.brokers),
                reason,
                self.config.reconnect_initial_s,
                self.config.reconnect_max_s,
            )
            self._failing = True

    def _password(self) -> str | None:
        path = self.config.password_file
        return None if path is None else read_secret(path, "broker password")

    def _subscribe(self, conn: Connection, frames: Frames, generation: int) -> None:
        conn.subscribe(
            self.config.destination,
            id="1",
            ack="client-individual",
            headers={
                "activemq.subscriptionName": self.config.subscription_name,
                "receipt": f"subscribe-{generation}",
            },
        )
        self._await(frames, frames.receipt, "receipt for SUBSCRIBE")

    # -- callbacks from stomp-py's receiver thread -----------------------------------------

    def received(self, conn: Connection, frame: Any) -> None:
        """Hand one MESSAGE frame over or drop it, then acknowledge it, whatever happened
        (nothing raised here reaches stomp-py, which would drop the connection and have the
        broker deliver the same message again)."""
        label = _header_label(frame.headers.get("event_type"))
        try:
            self._hand_over(label, frame.body)
        except Exception as exc:  # the message is dropped, the stream goes on
            detail = f"could not be handled: {type(exc).__name__}: {redact(str(exc))[:200]}"
            with contextlib.suppress(Exception):
                self._drop(label, Dropped(Ignored.MALFORMED, detail))
        finally:
            ack = frame.headers.get("ack")
            if ack is not None:
                try:
                    conn.ack(ack)
                except Exception as exc:  # gone: the broker delivers it again
                    log.debug("events %s: ack failed: %s", self.source, exc)

    def oversize(self, event_type: object) -> None:
        """A MESSAGE over the frame bound was acknowledged unread (from stomp-py's receiver)."""
        detail = (
            f"a frame over max_message_bytes {self.config.max_message_bytes} and "
            f"{FRAME_HEADER_BYTES} bytes of headers, acknowledged unread; reconnecting"
        )
        with contextlib.suppress(Exception):  # nothing may reach stomp-py's receiver
            self._drop(_header_label(event_type), Dropped(Ignored.TOO_LARGE, detail))

    def broker_error(self, message: str) -> None:
        """An ERROR frame (from stomp-py's receiver): kept by the attempt for the one line of a
        failed connect; logged at once only while subscribed (a refused connect repeats every
        round)."""
        if self.status().connected:
            log.warning("events %s: %s", self.source, message)

    def _hand_over(self, label: str, body: str | bytes) -> None:
        with self._lock:
            old = self._status
            self._status = ListenerStatus(old.connected, old.connected_at, self._clock())
        found = parse_message(body, self.config.max_message_bytes)
        if isinstance(found, Dropped):
            self._drop(label, found)
            return
        if found.event_type not in KNOWN_TYPES:  # counted as irrelevant by the sink
            self._note(Ignored.IRRELEVANT, label, f"type {found.event_type[:64]!r} is not used")
        self._sink.event(found)

    def _drop(self, label: str, dropped: Dropped) -> None:
        self._sink.ignored(label, dropped.reason)
        self._note(dropped.reason, label, dropped.detail)

    def _note(self, reason: Ignored, label: str, detail: str) -> None:
        """One line per reason at most every :data:`DROP_LOG_INTERVAL_S` (a flood of bad
        messages is one line a minute), saying how many were dropped since the last line."""
        now = time.monotonic()
        with self._lock:
            last, since = self._drops.get(reason, (None, 0))
            if last is not None and now - last < DROP_LOG_INTERVAL_S:
                self._drops[reason] = (last, since + 1)
                return
            self._drops[reason] = (now, 0)
        more = f" ({since} more dropped as {reason.value} since the last line)" if since else ""
        log.log(
            logging.INFO if reason is Ignored.IRRELEVANT else logging.WARNING,
            "events %s: dropped a message (type %s) as %s: %s%s",
            self.source,
            label,
            reason.value,
            redact(detail),
            more,
        )

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


def _header_label(event_type: object) -> str:
    """A dropped message's type as a bounded label, from hermes' ``event_type`` header
    (lower-cased as the message's own is; no header, no type), by the core's rule
    (:func:`~hydrator.core.event_hints.type_label`)."""
    return type_label(event_type.lower() if isinstance(event_type, str) else "")
