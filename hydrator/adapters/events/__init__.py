"""Event streams: a listener hands each validated message (or why it was dropped) to a
:class:`EventSink` from its own thread, and reports its connection state.

``stomp_listener`` is the one module that imports stomp-py (Rucio's ``rucio-hermes`` sends
over STOMP to ActiveMQ). What a message means is decided in :mod:`hydrator.core.events`.
"""

from __future__ import annotations

from typing import Protocol

from hydrator.core.events import Ignored, ListenerStatus, RucioEvent


class EventSink(Protocol):
    """Where a listener delivers; called from the listener's threads, so thread-safe."""

    def event(self, event: RucioEvent) -> None:
        """A message that passed validation."""
        ...

    def ignored(self, label: str, reason: Ignored) -> None:
        """A message dropped at the edge (``label``: its event type as a metric label)."""
        ...

    def connection(self, connected: bool) -> None:
        """The listener's state changed (subscribed, or the connection is gone)."""
        ...


class EventListener(Protocol):
    """A started listener keeps itself connected until :meth:`stop`."""

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def status(self) -> ListenerStatus: ...
