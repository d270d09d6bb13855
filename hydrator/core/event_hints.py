"""Rucio's event stream as hints (pure): which datasets a message says to re-read, the batch of
hints an event cycle reads, what one source's event cycles read and when (:class:`Backlog`),
and when the full read (reconciliation) is due. What a cycle
between two full reads answers for each source (an event cycle's, a refresh cycle's) is
:mod:`hydrator.core.between_reads`.

Messages are hints, never facts (Rucio 41.5.1, ``rucio-hermes``; docs/platform.md): at-least-once,
unordered, no event for a replica added without a transfer. A message only names datasets to
read again through the source's exact (deep) path; what is published always comes from a
read. Mapping (:func:`hint_of`):

* ``transfer-done`` / ``transfer-failed``: the payload's rule dataset (``datasetScope``,
  ``dataset``); a file with no dataset marks the source for the next full read.
* ``deletion-done``: scope, name, rse of a *file*, no dataset: the file, whose parent datasets
  an event cycle looks up (at most ``max_parent_lookups_per_cycle``; the others wait for the
  next cycles, :class:`Batch`); without a file, or over the bound of files held
  (:data:`LOOKUP_CYCLES_HELD`), it marks the next full read.
* ``datasetlock_ok`` (the dataset complete at an RSE), ``rule_ok``, ``rule_progress``
  (the rule's DID), ``erase``, ``close``, ``open``, ``incomplete`` (the DID itself).
* Anything else (``transfer-queued``, ``create_dts``, ``register_cnt``, e-mails ...) says
  nothing about where data is: counted as ``irrelevant`` and dropped.

Nothing here does I/O, reads a clock or keeps a thread; the runtime's coordinator owns the
lock and the timers.
"""

from __future__ import annotations

import enum
import hashlib
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import NamedTuple, TypeVar

from hydrator.domain import (
    DatasetId,
)

K = TypeVar("K")
TRANSFER_TYPES = frozenset({"transfer-done", "transfer-failed"})
DATASET_TYPES = frozenset(
    {"datasetlock_ok", "rule_ok", "rule_progress", "erase", "close", "open", "incomplete"}
)
RECONCILE_TYPES = frozenset({"deletion-done"})
KNOWN_TYPES = TRANSFER_TYPES | DATASET_TYPES | RECONCILE_TYPES
"""The event types with a label of their own in metrics; any other is ``other``."""
LOOKUP_CYCLES_HELD = 10
"""Files waiting for a parent lookup are held for at most this many event cycles' worth
(``max_parent_lookups_per_cycle`` each): a burst of deletions (a rule's files, deleted
together) is looked up over a few consecutive cycles instead of stopping event cycles until
a full read; beyond that many, a full read is cheaper than the lookups (one call per file)."""


class Ignored(enum.Enum):
    """Why a message was counted and dropped."""

    MALFORMED = "malformed"  # JSON but not hermes' shape, or the listener could not handle it
    IRRELEVANT = "irrelevant"  # a type that says nothing about where data is
    DUPLICATE = "duplicate"  # the same message seen recently (at-least-once delivery)
    OUT_OF_DATE = "out_of_date"  # created before the last full read started
    OUT_OF_SCOPE = "out_of_scope"  # a scope the source does not read ([sources] scopes)
    TOO_LARGE = "too_large"  # a body over [sources.events] max_message_bytes
    NOT_UTF8 = "not_utf8"  # a body that is not UTF-8
    NOT_JSON = "not_json"  # a body that is not JSON
    BAD_TIME = "bad_time"  # a created_at that is no time in UTC
    INVALID_NAME = "invalid_name"  # a scope or name outside the name rules (hydrator.names)


@dataclass(frozen=True)
class RucioEvent:
    """One message from ``rucio-hermes``, validated at the edge (the listener adapter).

    ``dataset`` is what the payload names as the dataset (``datasetScope``/``dataset`` of a
    transfer, ``scope``/``name`` of a dataset event); ``file`` the file of a transfer or a
    deletion; ``rse`` the RSE it concerns (``dst-rse``/``rse``); ``created_at`` hermes'
    ``created_at`` (UTC; None when absent). ``key`` identifies the message's content for
    duplicate detection.
    """

    event_type: str
    created_at: datetime | None = None
    dataset: DatasetId | None = None
    file: tuple[str, str] | None = None
    rse: str | None = None
    key: str = ""

    @property
    def label(self) -> str:
        """The event type as a bounded metric label (:func:`type_label`)."""
        return type_label(self.event_type)


def type_label(event_type: str) -> str:
    """An event type as a bounded metric label: itself when one of :data:`KNOWN_TYPES`, else
    ``other`` (the one rule, for a parsed message and for a header the listener drops)."""
    return event_type if event_type in KNOWN_TYPES else "other"


def message_key(body: bytes) -> str:
    """A short digest of a message body: equal bodies, equal keys (hermes re-sends a row
    unchanged when its delete failed)."""
    return hashlib.blake2b(body, digest_size=16).hexdigest()


@dataclass(frozen=True)
class Hint:
    """What one message asks for: datasets to re-read, or (``reconcile``) a change no dataset
    can be named for, left to the next full read."""

    datasets: frozenset[DatasetId] = frozenset()
    reconcile: bool = False
    files: frozenset[tuple[str, str]] = frozenset()  # (scope, name): look up their datasets


def hint_of(event: RucioEvent) -> Hint | Ignored:
    """The hint of a validated event, or why it is dropped (see the module docstring)."""
    kind = event.event_type
    if kind in TRANSFER_TYPES:
        if event.dataset is not None:
            return Hint(frozenset({event.dataset}))
        return Hint(reconcile=True)  # a file moved; its dataset is not in the message
    if kind in DATASET_TYPES:
        if event.dataset is None:
            return Ignored.MALFORMED
        return Hint(frozenset({event.dataset}))
    if kind in RECONCILE_TYPES:
        # a deletion names a file: look up its datasets (or, without one, the full read)
        file = event.file
        return Hint(files=frozenset({file})) if file is not None else Hint(reconcile=True)
    return Ignored.IRRELEVANT


OUT_OF_DATE_MARGIN = timedelta(minutes=5)
"""A message is out of date when created this long before the last full read began: that read
saw its effect, even through the summary table's lag (abacus: minutes) and a catalogue clock
a little off the daemon's. Nearer ones are read again (a read costs one call)."""


@dataclass
class Triage:
    """Drops what an event cycle must not read: duplicates (a bounded memory of recent message
    keys), messages older than the last full read's start (less :data:`OUT_OF_DATE_MARGIN`),
    scopes the source does not read."""

    scopes: frozenset[str] = frozenset()  # empty: every scope
    remember: int = 10_000  # message keys kept for duplicate detection
    full_read_started: datetime | None = None
    _seen: OrderedDict[str, None] = field(default_factory=OrderedDict)

    def judge(self, event: RucioEvent) -> Hint | Ignored:
        """The event's hint, or why it is dropped; remembers its key."""
        if event.key:
            if event.key in self._seen:
                self._seen.move_to_end(event.key)
                return Ignored.DUPLICATE
            self._seen[event.key] = None
            if len(self._seen) > self.remember:
                self._seen.popitem(last=False)
        started = self.full_read_started
        created = event.created_at
        if started is not None and created is not None and created < started - OUT_OF_DATE_MARGIN:
            return Ignored.OUT_OF_DATE
        hint = hint_of(event)
        if isinstance(hint, Hint) and self.scopes and (hint.datasets or hint.files):
            kept = frozenset(d for d in hint.datasets if d.scope in self.scopes)
            files = frozenset(f for f in hint.files if f[0] in self.scopes)
            if not kept and not files:
                return Ignored.OUT_OF_SCOPE
            hint = replace(hint, datasets=kept, files=files)
        return hint


@dataclass
class Batch:
    """Hints gathered for the next event cycle, bounded in memory: at most ``capacity``
    datasets are held; beyond that the batch only remembers that the next full read must
    cover the rest (``reconcile``). ``first_created`` is the oldest ``created_at`` among
    the hints (for the event-to-ad lag)."""

    capacity: int
    datasets: dict[DatasetId, datetime | None] = field(default_factory=dict)
    reconcile: bool = False
    overflow: int = 0
    file_capacity: int = 0  # files held for a parent lookup at most; beyond: reconcile
    files: dict[tuple[str, str], datetime | None] = field(default_factory=dict)
    arrivals: int = 0  # hints added so far: the last one's sequence number
    _arrived: dict[object, int] = field(default_factory=dict)  # held key -> its last arrival

    def add(self, hint: Hint, created_at: datetime | None) -> None:
        self.arrivals += 1
        self.reconcile |= hint.reconcile
        self._hold(self.files, hint.files, self.file_capacity, created_at)
        self._hold(self.datasets, hint.datasets, self.capacity, created_at)

    def drop_covered(self, upto: int) -> int:
        """Drop the datasets and files whose last hint arrived at or before arrival ``upto``
        (:attr:`arrivals` when a full read began: it read them after their change); those
        named again since stay. Returns how many were dropped."""
        covered = {key for key, seq in self._arrived.items() if seq <= upto}
        self.datasets = {d: t for d, t in self.datasets.items() if d not in covered}
        self.files = {f: t for f, t in self.files.items() if f not in covered}
        self._forget(covered)
        return len(covered)

    def _hold(
        self,
        held: dict[K, datetime | None],
        keys: Iterable[K],
        capacity: int,
        created_at: datetime | None,
    ) -> None:
        """Add ``keys`` not held yet to ``held`` up to ``capacity``; beyond, reconcile."""
        for key in keys:
            if key in held:
                self._arrived[key] = self.arrivals  # named again: the later arrival counts
                continue
            if len(held) >= capacity:
                self.overflow += 1
                self.reconcile = True
                continue
            held[key] = created_at
            self._arrived[key] = self.arrivals

    def take_files(self, limit: int) -> tuple[list[tuple[str, str]], list[datetime]]:
        """Up to ``limit`` files whose datasets to look up now, the first held first, and
        their messages' ``created_at``; the others stay held for the next cycle (at most
        ``file_capacity`` are held: beyond, marked ``reconcile`` when added)."""
        files = list(self.files)[:limit]
        times = [t for f in files if (t := self.files.pop(f)) is not None]
        self._forget(files)
        return files, times

    def take(self, limit: int) -> tuple[list[DatasetId], list[datetime], bool]:
        """Up to ``limit`` datasets to read now (oldest hints first), the ``created_at`` of
        the messages behind them, and whether the next full read must cover more (overflow,
        a deletion, a file with no dataset); the batch is emptied."""
        order = sorted(self.datasets, key=lambda d: (self.datasets[d] is None, self.datasets[d]))
        now, rest = order[:limit], order[limit:]
        times = [t for d in now if (t := self.datasets[d]) is not None]
        reconcile = self.reconcile or bool(rest)
        self.datasets, self.reconcile, self.overflow = {}, False, 0
        self._forget(order)
        return now, times, reconcile

    def _forget(self, keys: Iterable[object]) -> None:
        for key in keys:
            self._arrived.pop(key, None)

    def __bool__(self) -> bool:
        return bool(self.datasets) or bool(self.files) or self.reconcile


class Taken(NamedTuple):
    """What an event cycle reads: datasets to re-read, files whose datasets to look up
    first, and the ``created_at`` of the messages behind them (for the lag)."""

    datasets: list[DatasetId]
    files: list[tuple[str, str]]
    created: list[datetime]


@dataclass
class Backlog:
    """One event-driven source's hints between cycles and what its full reads covered: the
    decisions of its event cycles (the runtime calls each under one lock). Times are the
    worker's monotonic seconds.

    ``first_hint`` arms the next event cycle (the first hint not yet read came then);
    ``marked``: a full read must cover what no event cycle will read (a deletion, overflow, a
    failed event cycle), so event cycles read nothing until it has succeeded;
    ``last_full_read`` and ``reconnect_read``: when the last successful full read, and the
    last one for a reconnect, began (:func:`full_read_due`)."""

    triage: Triage
    batch: Batch
    first_hint: float | None = None
    marked: bool = False
    last_full_read: float | None = None
    reconnect_read: float | None = None
    _covers: int = 0  # the batch's arrivals when the last full read began

    def add(self, event: RucioEvent, now: float) -> Ignored | None:
        """Judge ``event`` (:class:`Triage`) and hold its hint; why it was dropped, or None."""
        verdict = self.triage.judge(event)
        if isinstance(verdict, Ignored):
            return verdict
        self.batch.add(verdict, event.created_at)
        self.marked |= verdict.reconcile  # nothing to re-read: the next full read
        if (verdict.datasets or verdict.files) and self.first_hint is None:
            self.first_hint = now
        return None

    def take(self, max_reads: int, max_lookups: int, now: float) -> Taken | None:
        """What the event cycle due now reads, or None: nothing held, or a full read is
        marked (it covers the batch, held until it begins and dropped once it succeeded).
        Files left for the next cycle's lookups arm it at once."""
        if self.marked:
            self.first_hint = None  # the full read's success arms the next cycle
            return None
        files, file_created = self.batch.take_files(max_lookups)
        datasets, created, marked = self.batch.take(max_reads)
        self.marked |= marked
        self.first_hint = now if self.batch.files else None
        if not datasets and not files:
            return None
        return Taken(datasets, files, created + file_created)

    def full_read_begins(self, now: float, reconnected: bool) -> None:
        """A full read begins: the hints held so far are what it covers."""
        self._covers = self.batch.arrivals
        if reconnected:
            self.reconnect_read = now

    def full_read_succeeded(self, began: float, began_at: datetime, now: float) -> int:
        """The full read begun at ``began`` (``began_at``, wall clock) read this source: the
        next reconcile period starts, messages created before it are out of date, nothing is
        marked, and the hints held since before it began are dropped (how many: returned);
        those that arrived while it ran arm the next event cycle."""
        self.last_full_read = began
        self.triage.full_read_started = began_at
        self.marked = False
        covered = self.batch.drop_covered(self._covers)
        if self.batch and self.first_hint is None:
            self.first_hint = now
        return covered


@dataclass(frozen=True)
class ReconcilePolicy:
    """When the full read runs while events are on (``[sources.events]``), seconds."""

    interval_s: float  # the normal poll ([daemon] interval_s)
    reconcile_interval_s: float  # while events flow
    silence_s: float  # no message for this long: poll as if there were no events


@dataclass(frozen=True)
class ListenerStatus:
    """What the listener reports: connected now, when it last (re)connected and last got a
    message (monotonic seconds; None: never)."""

    connected: bool = False
    connected_at: float | None = None
    last_message_at: float | None = None


def full_read_due(
    now: float,
    last_full_read: float | None,
    status: ListenerStatus,
    policy: ReconcilePolicy,
    *,
    marked: bool = False,
    reconnect_read: float | None = None,
) -> bool:
    """True when the full read must run now (``now``, ``last_full_read``, ``reconnect_read``:
    monotonic seconds): never read; the listener (re)connected since the last read (what was
    missed while it was away is read), at once unless a read for a reconnect began less than
    ``interval_s`` ago (``reconnect_read``: a broker that drops each subscription, or a
    catalogue that fails the read, costs no more reads than polling); at ``interval_s`` while
    it is disconnected, silent for ``silence_s``, or ``marked`` (a hint no dataset could be
    named for, or more than one event cycle reads); else at ``reconcile_interval_s``."""
    if last_full_read is None:
        return True
    if status.connected_at is not None and status.connected_at >= last_full_read:
        return reconnect_read is None or now - reconnect_read >= policy.interval_s
    since = now - last_full_read
    heard = status.last_message_at if status.last_message_at is not None else status.connected_at
    silent = heard is None or now - heard > policy.silence_s
    if not status.connected or silent or marked:
        return since >= policy.interval_s
    return since >= policy.reconcile_interval_s


def lag_seconds(created: Iterable[datetime], published: datetime) -> list[float]:
    """Seconds from each message's ``created_at`` to the publish (negative clamped to 0: the
    catalogue's clock may run ahead of the daemon's)."""
    return [max(0.0, (published - c) / timedelta(seconds=1)) for c in created]
