"""One connection attempt to a Rucio event broker over stomp-py, the only module that imports
stomp-py; :mod:`hydrator.adapters.events.stomp_listener` decides when to connect and what a
message means.

* **Assembly** (:func:`open_connection`): stomp-py's STOMP 1.2 connection over the brokers in
  the order given, each tried once (TCP connect within ``timeout_s``) without waiting between
  them, heart-beats both ways (``heartbeat_s``), TLS from ``use_ssl``/``ca_cert``/
  ``client_cert``/``client_key``, bodies as bytes.
* **Heart-beats.** The broker counts as lost after :data:`HEARTBEAT_RECEIVE_SCALE` intervals
  of silence (ActiveMQ sends its heart-beats up to two intervals apart; docs/platform.md).
* **Bounded frames.** :class:`BoundedTransport` counts the bytes read since the last whole
  frame; a peer that sends more than ``max_message_bytes`` plus :data:`FRAME_HEADER_BYTES`
  without ending the frame is disconnected at once (memory stays bounded while reading). A
  MESSAGE cut so is acknowledged unread first when its headers arrived whole, and its owner is
  told (a broker that does not bound frames itself would otherwise deliver it again at every
  reconnect).
* **Callbacks** (:class:`Frames`): what the connecting thread waits for (CONNECTED, the
  SUBSCRIBE receipt, an ERROR frame, the end of the connection), and each MESSAGE, loss and
  ERROR passed to the :class:`FrameOwner` from stomp-py's receiver thread.
* **Closing** (:func:`close`): DISCONNECT when connected, then the socket, whatever the broker
  said.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any, Protocol

import stomp
from stomp.exception import StompException

from hydrator.config import RucioEventsConfig
from hydrator.redact import redact

FRAME_HEADER_BYTES = 16384
"""Allowed beyond ``max_message_bytes`` in one frame for its command and headers."""
CLOSE_WAIT_S = 1.0  # for the broker's receipt of DISCONNECT before the socket is closed
# How many heart-beat intervals may pass in silence before the broker counts as lost. ActiveMQ
# sends its heart-beats up to two intervals apart; stomp-py's default of 1.5 then drops a
# healthy connection now and then, and every reconnect costs a full read (docs/platform.md).
HEARTBEAT_RECEIVE_SCALE = 2.5
BrokerError = StompException
"""What stomp-py raises when a broker fails (a failure of the network is an ``OSError``)."""


class FrameOwner(Protocol):
    """Who a connection's news goes to (the listener); called from stomp-py's receiver thread,
    so nothing it does may raise."""

    def received(self, conn: Connection, frame: Any) -> None:
        """A MESSAGE frame, to be handed over or dropped, then acknowledged on ``conn``."""

    def oversize(self, event_type: object) -> None:
        """A MESSAGE over the frame bound was acknowledged unread."""

    def lost(self, generation: int, reason: str) -> None:
        """The connection of ``generation`` is gone."""

    def broker_error(self, message: str) -> None:
        """The broker sent an ERROR frame saying ``message`` (already redacted)."""


def open_connection(
    config: RucioEventsConfig,
    hosts: list[tuple[str, int]],
    owner: FrameOwner,
    generation: int,
) -> tuple[Connection, Frames]:
    """A new connection over ``hosts`` in order: stomp-py tries each once (TCP connect within
    ``timeout_s``) without waiting between them; the waits between rounds are the owner's."""
    beat_ms = int(config.heartbeat_s * 1000)
    transport = BoundedTransport(
        list(hosts),
        config.max_message_bytes + FRAME_HEADER_BYTES,
        prefer_localhost=False,
        try_loopback_connect=False,
        reconnect_sleep_initial=0.0,
        reconnect_sleep_increase=0.0,
        reconnect_sleep_jitter=0.0,
        reconnect_sleep_max=0.0,
        reconnect_attempts_max=len(hosts),
        timeout=config.timeout_s,
        auto_decode=False,  # bodies as bytes: parse_message tells what is not UTF-8
    )
    conn = Connection(transport, (beat_ms, beat_ms))
    if config.use_ssl:
        conn.set_ssl(
            for_hosts=list(hosts),
            ca_certs=_str(config.ca_cert),
            cert_file=_str(config.client_cert),
            key_file=_str(config.client_key),
        )
    frames = Frames(owner, conn, generation)
    conn.set_listener("hydrator", frames)
    transport.oversize = owner.oversize
    return conn, frames


class BoundedTransport(stomp.transport.Transport):  # type: ignore[misc]  # stomp-py is untyped
    """stomp-py's transport that counts the bytes read since the last whole frame and drops
    the connection once they exceed ``limit_bytes`` (what is buffered stays bounded). It keeps
    the first :data:`FRAME_HEADER_BYTES` of the frame being read: when that frame is a MESSAGE
    whose headers arrived whole, it is acknowledged unread before the connection is dropped
    (else the broker would deliver it again at every reconnect) and ``oversize`` is told its
    ``event_type`` header."""

    def __init__(self, hosts: list[tuple[str, int]], limit_bytes: int, **options: Any) -> None:
        super().__init__(hosts, **options)
        self.limit_bytes = limit_bytes
        self.unframed_bytes = 0
        self.head = bytearray()  # the start of the frame being read
        self.over_bound: str | None = None
        self.oversize: Callable[[object], None] = lambda event_type: None

    def receive(self) -> bytes | None:
        chunk: bytes | None = super().receive()
        if chunk:
            self.unframed_bytes += len(chunk)
            self._keep_head(chunk)
            if self.unframed_bytes > self.limit_bytes:
                self.over_bound = (
                    f"the broker sent over {self.limit_bytes} bytes without ending a frame "
                    "(max_message_bytes and headers); disconnected"
                )
                self._acknowledge_unread()
                self.disconnect_socket()
                return b""  # stomp-py's end of stream
        return chunk

    def _keep_head(self, chunk: bytes) -> None:
        end = chunk.rfind(b"\x00")
        if end >= 0:  # a frame may start after the last NUL (a guess: a body may hold NULs)
            self.head = bytearray(chunk[end + 1 : end + 1 + FRAME_HEADER_BYTES])
        elif len(self.head) < FRAME_HEADER_BYTES:
            self.head += chunk[: FRAME_HEADER_BYTES - len(self.head)]

    def _acknowledge_unread(self) -> None:
        head = bytes(self.head)
        if not stomp.utils.PREAMBLE_END_RE.search(head):
            return  # the headers are not all there: nothing to acknowledge for sure
        frame = stomp.utils.parse_frame(head)
        if frame is None or frame.cmd != "MESSAGE" or "ack" not in frame.headers:
            return
        with contextlib.suppress(StompException, OSError):
            self.transmit(stomp.utils.Frame("ACK", {"id": frame.headers["ack"]}))
            self.oversize(frame.headers.get("event_type"))

    def process_frame(self, f: Any, frame_str: bytes) -> None:
        self.unframed_bytes = 0
        super().process_frame(f, frame_str)


class Connection(stomp.StompConnection12):  # type: ignore[misc]  # stomp-py is untyped
    """stomp-py's STOMP 1.2 connection over a :class:`BoundedTransport`, assembled as
    ``StompConnection12.__init__`` assembles its own transport and protocol."""

    def __init__(self, transport: BoundedTransport, heartbeats: tuple[int, int]) -> None:
        stomp.connect.BaseConnection.__init__(self, transport)
        stomp.protocol.Protocol12.__init__(
            self, transport, heartbeats, heart_beat_receive_scale=HEARTBEAT_RECEIVE_SCALE
        )


class Frames(stomp.ConnectionListener):  # type: ignore[misc]  # stomp-py is untyped
    """stomp-py's callbacks for one connection attempt (``generation``); ``changed`` is set
    on every news the connecting thread waits for."""

    def __init__(self, owner: FrameOwner, conn: Connection, generation: int) -> None:
        self.owner, self.conn, self.generation = owner, conn, generation
        self.connected = threading.Event()
        self.receipt = threading.Event()
        self.gone = threading.Event()
        self.changed = threading.Event()
        self.error: str | None = None
        self.host: tuple[str, int] | None = None

    def where(self) -> str:
        return "the broker" if self.host is None else f"{self.host[0]}:{self.host[1]}"

    def over_bound(self) -> str | None:
        bound: str | None = self.conn.transport.over_bound
        return bound

    def on_connecting(self, host_and_port: tuple[str, int]) -> None:
        self.host = host_and_port

    def on_connected(self, frame: Any) -> None:
        self.connected.set()
        self.changed.set()

    def on_receipt(self, frame: Any) -> None:
        self.receipt.set()
        self.changed.set()

    def on_error(self, frame: Any) -> None:
        """Kept for the one line of a failed connect; the owner decides whether to log it."""
        message = redact(str(frame.headers.get("message", "ERROR")))[:300]
        self.error = f"the broker says: {message}"
        self.changed.set()
        self.owner.broker_error(self.error)

    def on_message(self, frame: Any) -> None:
        self.owner.received(self.conn, frame)

    def on_heartbeat_timeout(self) -> None:
        self.gone.set()
        self.changed.set()
        self.owner.lost(self.generation, "no heart-beat from the broker")

    def on_disconnected(self) -> None:
        self.gone.set()
        self.changed.set()
        self.owner.lost(self.generation, self.over_bound() or self.error or "disconnected")


def close(conn: Connection, frames: Frames) -> None:
    """DISCONNECT politely when connected (the broker releases the client-id at once), wait
    :data:`CLOSE_WAIT_S` at most for its receipt, then close the socket whatever it said
    (stomp-py's receiver thread ends with it)."""
    with contextlib.suppress(StompException, OSError, AttributeError):
        if conn.is_connected():
            conn.disconnect()
            frames.gone.wait(CLOSE_WAIT_S)
    with contextlib.suppress(StompException, OSError, AttributeError):
        conn.transport.disconnect_socket()


def failure_reason(exc: BaseException, timeout_s: float) -> str:
    """One line for a failed round."""
    if isinstance(exc, stomp.exception.ConnectFailedException):
        return f"no TCP connection (refused, or no answer within timeout_s {timeout_s:g} s)"
    return redact(str(exc) or type(exc).__name__)


def _str(value: object) -> str | None:
    return None if value is None else str(value)
