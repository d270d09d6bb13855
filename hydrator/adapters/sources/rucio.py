"""The Rucio source: which datasets each site holds, from a Rucio server via rucio-clients.

The only module that imports ``rucio``. One :meth:`RucioSource.fetch` makes these calls:

1. ``list_rses(rse_expression)``: the RSEs that count (default ``rse_type=DISK``: data only on
   tape is not available to a job);
2. ``list_rse_attributes(rse)`` for each RSE not named in ``[sites]`` whose ``site``
   attribute was last read ``rse_attributes_max_age_s`` ago or more (or never: a new RSE is
   read at once), so a site attribute changed on the server is seen within that time.
   An RSE with neither is logged once, listed in ``Snapshot.unmapped`` and ignored;
3. ``list_datasets_per_rse(rse)`` for each mapped RSE: the dataset summary table
   (``collection_replicas``: state, length, available_length per dataset and RSE); the next
   RSE's table is read by a worker thread while this one is parsed (one request at a time,
   the wait for the server's bytes overlapping the parse: :func:`_ahead`);
4. ``list_replication_rules({"state": "R"})`` and ``{"state": "S"}``: the REPLICATING and STUCK
   rules, with exact lock counts (``locks_ok_cnt`` ...) kept by the rule engine;
5. ``list_rses(expr)`` once per distinct expression of those rules that concern a dataset
   listed in step 3 and are not simply the name of a mapped RSE;
6. for at most ``deep_check_limit`` datasets, one exact listing each:
   ``list_dataset_replicas(scope, name, deep=True)`` (per RSE), or ``list_replicas`` (per file)
   when the dataset has summary rows at two or more RSEs of one site; none for a dataset whose
   last check still stands (see "Deep checks reused" below).

The two bulk listings (steps 3 and 4) and the per-RSE deep checks (step 6) are sent as
rucio-clients sends them (its URL, session, token and headers) but their bodies are read here,
with one pydantic-core call per batch of lines into plain dicts (record by record only when a
batch holds a malformed one), instead of rucio-clients' ``json.loads`` per line with a
date-parsing hook, which was most of a fetch at a million rows.

Incremental design (issue 15): a fetch costs what changed, not what exists. The source keeps a
:class:`_Book` between fetches and reads each answer against it:

* **Lines, not answers.** Each listing is kept as the hash of each distinct line and what it
  gave (:class:`_Lines`: 16 bytes a line). An RSE answer byte-identical to the last (SHA-256)
  costs its transfer and a hash; otherwise only its new lines are parsed (:func:`_diff`), and
  its rows are updated by the lines added and gone (:func:`_apply_rows`). The rules listings
  are diffed the same way as they stream in. A malformed line is kept as a mark, counted every
  fetch, never used. An RSE answer naming a dataset twice keeps the first row (the others are
  counted invalid) and is read whole at its next change.
* **Rows are small.** Per dataset, one flat tuple of its rows at mapped RSEs
  (``_Dataset.at``: ``(rse, row, ...)``); a row that says complete is just the
  :class:`_Dataset` (one object per dataset, hashed by identity), others a :class:`_Partial`
  tuple of counts. No parsed record outlives its batch.
* **Dirty pairs only.** A (site, dataset) is settled again (:meth:`RucioSource._settle`) only
  when one of its inputs changed: a row at one of the site's RSEs, the rules' transfer towards
  the site (:func:`_coverage` per dataset whose rules changed or that gained or lost all its
  rows; all of them when the RSE -> site map or an expression's RSEs changed), the RSE -> site
  map, or a deep check (done this fetch or last). Pairs left to the fallback beyond
  ``deep_check_limit`` keep their replica while their inputs stand.
* **Deep checks reused.** The datasets chosen for a deep check are the same as without reuse
  (up to ``deep_check_limit``, most wanted first), but a chosen dataset checked before is
  answered from that check, with no call, while everything the check read stands: no summary
  row, pending site or rule transfer of the dataset changed (no dirty pair at any site), none
  of its rule lines changed (lock counts follow its files), the RSE -> site map is the same,
  and the check is younger than ``deep_check_max_age_s`` (by ``FetchContext.now``; 0: never
  reused). Otherwise it is listed again at once. :attr:`RucioSource.deep_checks_reused_last_fetch`
  counts the reused ones, ``deep_checks_last_fetch`` the listings made.
* **Identity.** A pair whose new replica equals the last keeps the last object; the answer is
  one set, built from the last one by delta (:func:`_record`: a copy, never changed once
  handed over with ``Snapshot.of(..., unique=True)``), so an unchanged fetch returns the very
  same set and the core compares by identity. A replica that says only "complete" (most of
  them) is kept in that set alone and found there by value; the others also per site and
  dataset. A fetch with no answer of its own behind it (the first, after a restart or a
  failed fetch) takes the objects of the daemon's last good answer (``FetchContext.previous``,
  after a restart those loaded from the state) for every replica equal to one of them, found
  site by site (:class:`_Reuse`).
* **All or nothing.** A fetch that fails half way replaces the book by an empty one: the next
  fetch reads everything, as the first does, and nothing partial is ever returned.

Line identity is Python's 64-bit ``hash`` of the line's bytes (random per process): two
different lines of one listing colliding (odds about 3 in 10^10 per million new lines read
against listings of 5,000 lines) would
make the source miss one change until that line changes again.

So the number of calls grows with the number of RSEs (and distinct rule expressions, and the
bounded deep checks), not with the number of datasets; :attr:`RucioSource.calls_last_fetch`
counts them by method (``connect`` counts client constructions, ``auth`` token requests).

Two facts per (site, dataset), each from its own listing:

* **Presence** (complete / partial with shares of files and bytes / absent) from the replica
  listings, as a union over every RSE of the site (a file at either RSE counts once): a
  summary row saying AVAILABLE with ``available_length >= length > 0`` at any of the site's
  RSEs -> complete, trusted as is; a dataset that one active or stuck rule places at RSEs of
  this site only, with no summary row at the site's other RSEs -> the rule's OK locks, which
  count exactly the files AVAILABLE there (no call; the bytes share is taken to be the files
  share); anything else is checked exactly (step 6), most wanted datasets first. Beyond the
  limit the best summary row is used, or the share of files a rule's OK locks prove present
  when its RSEs are all at the site and that shows more.
* **Transfer** (none / replicating with progress / stuck) from the rules whose expression
  covers an RSE of the site: any STUCK lock -> stuck, else any REPLICATING lock ->
  replicating, progress = OK locks / all locks; a stuck rule wins over an active one.

Presence decides the list (:class:`~hydrator.domain.ReplicaState`): files present are
advertised whatever the rules do; a stuck rule is reported beside them.

The trade-off (FACTS.md): the summary table is filled by the ``rucio-abacus-collection-replica``
daemon and lags. A new rule's row reads ``UNAVAILABLE 0/0`` until abacus ran, which costs a
deep check (bounded) until then; a file lost or deleted from a dataset whose row says AVAILABLE
is noticed only when abacus updates the row (usually minutes); when the last file goes abacus
deletes the row and the dataset leaves the site. Checking every dataset deeply every cycle would
be exact but one call per dataset. A reused deep check misses what changes neither the
dataset's rows nor its rules' locks (a file lost, or arriving with no lock, before abacus
rewrites the row; a container rule's locks, which are not read) for at most
``deep_check_max_age_s`` (default 600 s, the order of abacus' own lag that complete rows are
trusted across); a row abacus rewrites or a lock of a dataset rule that moves re-checks the
dataset in the next cycle. Only datasets placed by a dataset (or container) rule have
summary rows; files registered without any rule are not seen. ``deep=True`` leaves out RSEs
where every file is still COPYING: such a site holds nothing of the dataset yet.

Errors (all translated here, never classified by message text)::

    requests ConnectionError, Timeout, broken stream, OSError,
    Rucio errors from an HTTP 5xx/429 answer, ServerConnectionException  -> TransientSourceError
    CannotAuthenticate, NoAuthInformation, AccessDenied, HTTP 401/403,
    TLS (SSLError), a bad client configuration, other Rucio errors        -> PermanentSourceError

Transient errors are retried ``max_attempts`` times per call with exponential backoff from
``backoff_s``, or after the server's ``Retry-After`` up to ``max_retry_after_s`` (by
:mod:`hydrator.adapters.retry`; logged ``attempt n/N``); rucio-clients' own retries are
reduced (it still resends once at once after a connection error) so that a dead server fails
a fetch within about ``max_attempts x (timeout + backoff)``. Only rucio-clients' public
interface is used (see :meth:`RucioSource._make_client` and docs/dependencies.md).

Known limits: a dataset left over ``deep_check_limit`` that is spread over several RSEs of one
site is judged by its best RSE (a lower bound). rucio-clients reads a ``rucio.cfg`` once per
process (``$RUCIO_CONFIG``, else ``$RUCIO_HOME/etc``, ``$VIRTUAL_ENV/etc``, ``/opt/rucio/etc``):
all Rucio sources of one daemon share it, and even with ``rucio_host`` set it takes options such as
``auth_token_file_path`` from it when one exists. For OIDC the token in ``token_file`` is the
one sent, also when ``BEARER_TOKEN`` is set in the environment.
"""

from __future__ import annotations

import enum
import hashlib
import json
import logging
import os
import shutil
import sys
import tempfile
import threading
import time
from array import array
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from concurrent.futures import Executor, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property, partial
from itertools import filterfalse, islice, repeat
from operator import attrgetter, itemgetter
from pathlib import Path
from typing import Any, Generic, NamedTuple, NotRequired, Protocol, TypeGuard, TypeVar, cast
from urllib.parse import quote, quote_plus

import requests
from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError
from rucio.client import Client
from rucio.common import exception as rucio_exc
from rucio.common.utils import build_url
from typing_extensions import TypedDict  # pydantic needs this one on Python < 3.12

from hydrator.adapters.retry import RetryPolicy, call_with_retries, parse_retry_after
from hydrator.adapters.sources import FetchContext, OnceLog, site_or_none
from hydrator.config import RucioSourceConfig
from hydrator.domain import (
    DatasetId,
    InvalidNameError,
    Replica,
    ReplicaState,
    Site,
    Snapshot,
    Transfer,
    check_site,
    holding,
)
from hydrator.errors import PermanentSourceError, SourceError, TransientSourceError
from hydrator.logs import adopt_library_loggers
from hydrator.redact import read_secret, redact

log = logging.getLogger(__name__)
adopt_library_loggers()  # rucio's own stderr handler would bypass the redacting formatter

T = TypeVar("T")
K = TypeVar("K")

_AUTH_ERRORS: tuple[type[Exception], ...] = (
    rucio_exc.CannotAuthenticate,
    rucio_exc.NoAuthInformation,
    rucio_exc.AccessDenied,
)
_CLIENT_CONFIG_ERRORS: tuple[type[Exception], ...] = (
    rucio_exc.MissingClientParameter,
    rucio_exc.ConfigNotFound,
    rucio_exc.ClientProtocolNotSupported,
    rucio_exc.ClientProtocolNotFound,
)


class _TokenRejected(Exception):
    """Raised by the response hook when the server refuses the OIDC bearer token (HTTP 401)."""


_CALL_ERRORS: tuple[type[Exception], ...] = (
    rucio_exc.RucioException,
    requests.RequestException,
    OSError,
    json.JSONDecodeError,
    _TokenRejected,
)
_MAX_LOGGED_NAMES = 1000  # bad names logged once each, up to this many per source
_REPLICAS, _RULES = "replicas", "rules"  # rucio-clients' REPLICAS_BASEURL and RULE_BASEURL
_READ_BYTES = 1 << 20  # read size of a streamed listing


class _Payload(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class _DatasetRow(TypedDict):
    """One row of ``list_datasets_per_rse`` (the ``collection_replicas`` summary)."""

    scope: str
    name: str
    state: str
    length: NotRequired[int | None]
    available_length: NotRequired[int | None]
    bytes: NotRequired[int | None]
    available_bytes: NotRequired[int | None]


class _RuleRow(TypedDict):
    """The fields of a replication rule this source uses."""

    scope: str
    name: str
    did_type: str
    rse_expression: str
    state: str
    locks_ok_cnt: int
    locks_replicating_cnt: int
    locks_stuck_cnt: int


class _DeepLine(TypedDict):
    """One row of ``list_dataset_replicas(deep=True)``: exact file counts at one RSE."""

    rse: str
    length: NotRequired[int | None]
    available_length: NotRequired[int | None]
    bytes: NotRequired[int | None]
    available_bytes: NotRequired[int | None]


R = TypeVar("R", _DatasetRow, _RuleRow, _DeepLine)


@dataclass(frozen=True)
class _LineSchema(Generic[R]):
    """How the lines of a bulk listing are validated: pydantic's validators of one record and
    of a JSON array of them, building plain dicts (the TypedDict ``R``; unknown keys dropped)
    instead of a model object per line: 2-3x less time for a million lines. Validation is
    lax as a pydantic model's (``"3"`` is 3); a ``NotRequired[int | None]`` field may be
    absent or null (as in the summary table before abacus fills it)."""

    one: TypeAdapter[R]
    many: TypeAdapter[list[R]]


_BATCH = ConfigDict(cache_strings="keys")  # values are mostly distinct: ~10 % less time a line
_SUMMARY_LINES = _LineSchema(
    TypeAdapter(_DatasetRow), TypeAdapter(list[_DatasetRow], config=_BATCH)
)
_RULE_LINES = _LineSchema(TypeAdapter(_RuleRow), TypeAdapter(list[_RuleRow], config=_BATCH))
_DEEP_LINES = _LineSchema(TypeAdapter(_DeepLine), TypeAdapter(list[_DeepLine]))


class _FileRow(_Payload):
    """One file of ``list_replicas(all_states=True)``: its size and its state per RSE."""

    bytes: int | None = None
    states: dict[str, str] = {}


P = TypeVar("P", bound=_Payload)


@dataclass(frozen=True, slots=True)
class _Counts:
    """Files and bytes of a dataset, and how many of them are present (at an RSE or site)."""

    length: int
    available: int
    bytes: int
    available_bytes: int

    @property
    def files_share(self) -> float:
        return _files_share(self.available, self.length)

    @property
    def bytes_share(self) -> float:
        return _bytes_share(self.available, self.length, self.available_bytes, self.bytes)


def _files_share(available: int, length: int) -> float:
    """The share of ``length`` files that ``available`` are (0 without files)."""
    return available / length if length > 0 else 0.0


def _bytes_share(available: int, length: int, present: int, size: int) -> float:
    """The share of ``size`` bytes that ``present`` are; without bytes, the files share."""
    return present / size if size > 0 else _files_share(available, length)


class _Dataset:
    """One dataset known to the source: one object per dataset while it has summary rows, so
    the source's tables key on it by identity (a C-level hash, unlike :class:`DatasetId`'s).

    ``at`` holds its summary rows at mapped RSEs, flat: ``(rse, row, rse, row, ...)`` (the
    dataset is "listed" while it is not empty). One tuple per dataset instead of an entry
    per row in a table per RSE: about 16 bytes a row instead of about 38. The RSE names are
    the interned ones of :meth:`RucioSource._map_rses`, and a row is never equal to a name,
    so the C-level ``in`` and ``index`` find an RSE at its even position."""

    __slots__ = ("at", "id", "key")

    def __init__(self, dataset: DatasetId, key: tuple[str, str]) -> None:
        self.id = dataset
        self.key = key  # (scope, name) (the id itself), shared by the tables keyed by text
        self.at: tuple[str | _RowValue, ...] = ()

    def row(self, rse: str) -> _RowValue | None:
        """Its summary row at ``rse``, if any."""
        at = self.at
        if rse not in at:
            return None
        return cast(_RowValue, at[at.index(rse) + 1])

    def put(self, rse: str, value: _RowValue) -> bool:
        """Set its row at ``rse``; True when it had none there."""
        at = self.at
        if rse not in at:
            self.at = at + (rse, value)  # noqa: RUF005  (faster than unpacking)
            return True
        i = at.index(rse) + 1
        self.at = (*at[:i], value, *at[i + 1 :])
        return False

    def drop(self, rse: str) -> None:
        """Remove its row at ``rse`` (which it has)."""
        at = self.at
        i = at.index(rse)
        self.at = at[:i] + at[i + 2 :]


class _Partial(NamedTuple):
    """A summary row that does not say complete: its files, files present, and share of
    bytes present. A row that says complete is kept as its :class:`_Dataset` alone: its
    counts are never needed (8 bytes a row)."""

    dataset: _Dataset
    length: int
    available: int
    bytes_share: float  # available_bytes / bytes; without bytes, the files share

    @classmethod
    def of(
        cls, dataset: _Dataset, length: int, available: int, size: int, present: int
    ) -> _Partial:
        """The row of ``available`` of ``length`` files and ``present`` of ``size`` bytes
        (without building a :class:`_Counts`: one row in five)."""
        return cls(dataset, length, available, _bytes_share(available, length, present, size))

    @property
    def files_share(self) -> float:
        return _files_share(self.available, self.length)


_RowValue = _Dataset | _Partial  # one dataset's summary row at one RSE


class _Rule(NamedTuple):
    """An active or stuck dataset rule, as this source uses it."""

    key: tuple[str, str]  # (scope, name) of its dataset
    expression: str
    transfer: Transfer  # REPLICATING or STUCK
    progress: float  # OK locks / all locks


class _Mark(enum.Enum):
    """What a line of a listing gave besides a value (kept, so the line is not read again)."""

    INVALID = "invalid"  # malformed or an invalid name: counted every fetch, never used
    SKIPPED = "skipped"  # out of the configured scopes, a container rule, a finished rule


class _New(enum.Enum):
    LINE = "new"  # placeholder for a line not in the last answer, until it is parsed


V = TypeVar("V")


@dataclass
class _Lines(Generic[V]):
    """A listing's last answer as this source keeps it: per distinct line (identical lines
    count once) its hash and what it gave, in answer order. The next answer is compared line
    by line (Python's 64-bit ``hash`` of the bytes, per process), so only new lines are parsed.
    ``unique`` is False when two different lines named one dataset (only the first counts):
    the next change to that answer is then read whole."""

    hashes: array[int] = field(default_factory=lambda: array("q"))
    values: list[V] = field(default_factory=list)
    digest: bytes = b""
    unique: bool = True

    @cached_property
    def invalid(self) -> int:
        """Lines marked invalid (counted once: ``values`` is complete when this is read)."""
        return self.values.count(_Mark.INVALID)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class _SiteTransfer:
    """The rules' transfer towards one site (``site``) for one dataset.

    ``floor`` is the share of files the rules' OK locks prove present at the site (a lock is
    OK when its file replica is AVAILABLE), counted only for rules whose RSEs all belong to
    this site. ``only`` names that rule's RSEs when it is the one rule towards the site: then
    its locks count exactly the files present at them.
    """

    site: Site
    transfer: Transfer
    progress: float
    floor: float = 0.0
    only: frozenset[str] | None = None


_Coverage = tuple[_SiteTransfer, ...]  # a dataset's rules: the transfer towards each site


def _towards(covered: _Coverage | None, site: Site) -> _SiteTransfer | None:
    """The transfer towards ``site`` in a dataset's coverage (a few sites: a scan; a tuple
    is a quarter of the memory of a small dict)."""
    if covered:
        for moving in covered:
            if moving.site == site:
                return moving
    return None


class _Counter(Protocol):
    invalid: int  # malformed or invalid records skipped


@dataclass
class _Book:
    """Everything the source keeps between fetches, so that a fetch costs what changed.

    The lines of each RSE's summary table and the rows they gave (``listings``; the rows
    are also kept per dataset, :attr:`_Dataset.at`); the rules per dataset (``rules_of``,
    from the lines in ``rule_lines``);
    the rules' transfer per dataset and site (``moving``) and the RSEs each expression covered
    (``resolved``); the pairs waiting for a deep check (``pending``), the datasets checked
    last time (``checked``) and the answers of those checks while their inputs stand
    (``checks``); the site attribute read per RSE and when (``attributes``); and the answer
    itself: all replicas as one set (never changed once handed out), and per site, dataset ->
    replica for those that say more than "complete" (:func:`_record`). Replaced by an empty
    book when a fetch fails half way.
    """

    rse_site: dict[str, Site] = field(default_factory=dict)
    listings: dict[str, _Lines[_RowValue | _Mark]] = field(default_factory=dict)
    datasets: dict[tuple[str, str], _Dataset] = field(default_factory=dict)
    rule_lines: dict[str, _Lines[_Rule | _Mark]] = field(default_factory=dict)
    rules_of: dict[tuple[str, str], list[_Rule]] = field(default_factory=dict)
    resolved: dict[str, frozenset[str]] = field(default_factory=dict)
    moving: dict[_Dataset, _Coverage] = field(default_factory=dict)
    pending: dict[_Dataset, tuple[Site, ...]] = field(default_factory=dict)
    checked: set[_Dataset] = field(default_factory=set)
    checks: dict[_Dataset, _Check] = field(default_factory=dict)
    attributes: dict[str, tuple[datetime, Site | None]] = field(default_factory=dict)
    answer: dict[Site, dict[_Dataset, Replica]] = field(default_factory=dict)
    replicas: AbstractSet[Replica] = frozenset()
    order: list[_Dataset] | None = None  # ``pending`` by :func:`_order_key`, while it stands


class _Check(NamedTuple):
    """A deep check's answer, reused while its inputs stand and it is young enough."""

    at: datetime  # the cycle (``FetchContext.now``) whose fetch made the call
    outcomes: tuple[_Outcome, ...]  # a replica (or None) for each pending site of the dataset


@dataclass
class _Dirty:
    """What changed in one fetch: the (site, dataset) pairs to settle again, and the datasets
    whose rules must be re-applied (their rules changed, or they gained or lost every row)."""

    pairs: dict[Site, set[_Dataset]] = field(default_factory=dict)
    # RSE tables read whole the first time: every dataset in them is dirty at the site (kept
    # as the listings' values until the site is settled: a first fetch would copy every pair)
    filled: dict[Site, list[list[_RowValue | _Mark]]] = field(default_factory=dict)
    datasets: set[_Dataset] = field(default_factory=set)
    rule_keys: set[tuple[str, str]] = field(default_factory=set)
    remapped: bool = False  # the RSE -> site map changed

    def add(self, site: Site, dataset: _Dataset) -> None:
        found = self.pairs.get(site)
        if found is None:
            found = self.pairs[site] = set()
        found.add(dataset)

    def pop(self) -> tuple[Site, set[_Dataset]]:
        """A site with dirty pairs and its dirty datasets, no longer held here."""
        site = next(iter(self.filled)) if self.filled else next(iter(self.pairs))
        datasets = self.pairs.pop(site, set())
        for values in self.filled.pop(site, ()):
            datasets.update(filter(_IS_DATASET, values))  # (as _listed, without its frames)
            datasets.update(map(_PARTIAL_DATASET, filter(_IS_PARTIAL, values)))
        return site, datasets

    def each(self) -> Iterator[_Dataset]:
        """Every dataset with a dirty pair (once per site it is dirty at)."""
        for datasets in self.pairs.values():
            yield from datasets
        for tables in self.filled.values():
            for values in tables:
                yield from _listed(values)


def _line_blocks(response: requests.Response, size: int = _READ_BYTES) -> Iterator[list[bytes]]:
    """The non-empty lines of a streamed answer, a block of about ``size`` bytes at a time
    (split in C, not a generator step per line)."""
    rest = b""
    for block in response.iter_content(chunk_size=size):
        data = rest + block
        lines = data.splitlines()
        rest = b"" if data.endswith((b"\n", b"\r")) or not lines else lines.pop()
        yield list(filter(None, lines))
    if rest:
        yield [rest]


@dataclass
class _Cycle:
    """What one fetch has learned so far (mutable scratch space, not shared)."""

    sites: dict[str, Site]  # mapped RSE -> site
    unmapped: set[str]
    invalid: int = 0

    def site_rses(self) -> dict[Site, tuple[str, ...]]:
        """Site -> its mapped RSEs, sorted."""
        out: dict[Site, list[str]] = {}
        for rse in sorted(self.sites):
            out.setdefault(self.sites[rse], []).append(rse)
        return {site: tuple(rses) for site, rses in out.items()}


def build(config: RucioSourceConfig, sites: Mapping[str, str]) -> RucioSource:
    """The factory the service uses for ``type = "rucio"``; ``sites`` is ``Config.sites``."""
    return RucioSource(config, sites)


class RucioSource:
    """A :class:`~hydrator.adapters.sources.Source` reading one Rucio server.

    ``sleep`` is the backoff clock (seconds). After each fetch,
    ``calls_last_fetch`` maps client method -> API calls made (retries included) and
    ``deep_checks_last_fetch`` / ``deep_checks_reused_last_fetch`` /
    ``deep_checks_skipped_last_fetch`` count exact checks made (one call each), answered by an
    earlier check whose inputs stand (no call), and left out because of ``deep_check_limit``.
    """

    def __init__(
        self,
        config: RucioSourceConfig,
        sites: Mapping[str, str],
        *,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.config = config
        self.site_overrides = {rse: check_site(site) for rse, site in sites.items()}
        self._sleep = sleep
        self._client: Any = None
        self._token_dir: Path | None = None
        self._calls: Counter[str] = Counter()
        self._last_status: int | None = None
        self._retry_after_s: float | None = None
        self._token_seen: str | None = None
        self._bad_names = OnceLog(log, _MAX_LOGGED_NAMES)
        self._unmapped_rses = OnceLog(log)
        self._book = _Book()  # what the last fetch learned (the incremental design)
        self._held_ids: dict[tuple[str, str], DatasetId] = {}  # during a fetch: _held_ids
        self.calls_last_fetch: dict[str, int] = {}
        self.deep_checks_last_fetch = 0
        self.deep_checks_reused_last_fetch = 0
        self.deep_checks_skipped_last_fetch = 0

    @property
    def deferred_last_fetch(self) -> int:
        """Deep checks left to later cycles (the lagging summary was used instead)."""
        return self.deep_checks_skipped_last_fetch

    @property
    def reused_last_fetch(self) -> int:
        """Deep checks answered by an earlier one whose inputs stand (no call made)."""
        return self.deep_checks_reused_last_fetch

    @property
    def name(self) -> str:
        return self.config.name

    def close(self) -> None:
        """Drop the client and remove the private token directory."""
        self._client = None
        if self._token_dir is not None:
            shutil.rmtree(self._token_dir, ignore_errors=True)
            self._token_dir = None

    # -- the cycle -----------------------------------------------------------------------

    def fetch(self, context: FetchContext) -> Snapshot:
        """This cycle's snapshot, or raise Transient/PermanentSourceError (nothing partial).

        Incremental (see the module docstring): only lines new since the last fetch are parsed
        and only the pairs they touch are settled again. A fetch that fails half way forgets
        what the source kept, so the next one reads everything as a first fetch does.
        """
        self._calls = Counter()
        self.deep_checks_last_fetch = self.deep_checks_skipped_last_fetch = 0
        self.deep_checks_reused_last_fetch = 0
        book = self._book
        self._held_ids = _held_ids(book, context.previous.get(self.name))
        try:
            client = self._connected_client()
            cycle = self._map_rses(client, book, context.now)
            dirty = _Dirty()
            _remap(book, cycle, dirty)
            self._read_summaries(client, book, cycle, dirty)
            self._read_rules(client, book, cycle, dirty)
            self._apply_rules(client, book, cycle, dirty)
            settled = self._settle(client, book, cycle, dirty, context)
            _record(book, settled, _Reuse.of(book, context.previous.get(self.name)))
            _forget_unlisted(book, dirty)
        except PermanentSourceError:
            self._client = None  # rebuilt (password file re-read) next cycle
            self._book = _Book()
            raise
        except BaseException:
            self._book = _Book()
            raise
        finally:
            self.calls_last_fetch = dict(self._calls)
            self._held_ids = {}
        return Snapshot.of(
            self.name,
            book.replicas,
            sites=cycle.sites.values(),
            invalid=cycle.invalid,
            unmapped=cycle.unmapped,
            unique=True,  # one replica per (site, dataset): the book is keyed by pair
            sites_named=True,  # every pair's site is one an RSE maps to (_remap drops others)
        )

    def _map_rses(self, client: Any, book: _Book, now: datetime) -> _Cycle:
        """RSEs of the expression -> site: ``[sites]`` first, else the site attribute
        (:meth:`_site_of`)."""
        expression = self.config.rse_expression
        try:
            found = self._call("list_rses", partial(_as_list, client.list_rses, expression))
        except PermanentSourceError as exc:
            if isinstance(exc.__cause__, rucio_exc.InvalidRSEExpression):
                raise PermanentSourceError(
                    f"rucio: rse_expression {expression!r} is invalid or matches no RSE"
                ) from exc.__cause__
            raise
        cycle = _Cycle(sites={}, unmapped=set())
        read, book.attributes = book.attributes, {}
        for record in found:
            rse = record.get("rse") if isinstance(record, dict) else None
            if not isinstance(rse, str):
                cycle.invalid += 1
                continue
            site = self.site_overrides.get(rse) or self._site_of(client, rse, book, read, now)
            if site is None:
                cycle.unmapped.add(rse)
                self._log_unmapped(rse)
            else:
                cycle.sites[sys.intern(rse)] = site  # one object per name: see _Dataset.at
        return cycle

    def _site_of(
        self,
        client: Any,
        rse: str,
        book: _Book,
        read: Mapping[str, tuple[datetime, Site | None]],
        now: datetime,
    ) -> Site | None:
        """The RSE's site attribute as read less than ``rse_attributes_max_age_s`` ago (in
        ``read``), else read now; kept in ``book.attributes`` (only listed RSEs are kept)."""
        last = read.get(rse)
        if last is not None and _younger(last[0], now, self.config.rse_attributes_max_age_s):
            book.attributes[rse] = last
            return last[1]
        site = self._site_attribute(client, rse)
        book.attributes[rse] = (now, site)
        return site

    def _site_attribute(self, client: Any, rse: str) -> Site | None:
        attrs = self._call("list_rse_attributes", partial(client.list_rse_attributes, rse))
        value = attrs.get(self.config.site_attribute) if isinstance(attrs, dict) else None
        if value is None:
            return None
        site = site_or_none(str(value))
        if site is None:
            log.warning(
                "rucio: RSE %s has an invalid %s attribute %r; ignoring the RSE",
                rse,
                self.config.site_attribute,
                value,
            )
        return site

    def _log_unmapped(self, rse: str) -> None:
        self._unmapped_rses.warn(
            rse,
            "rucio: RSE %s has no %r attribute and no [sites] entry; its datasets are ignored",
            rse,
            self.config.site_attribute,
        )

    def _read_summaries(self, client: Any, book: _Book, cycle: _Cycle, dirty: _Dirty) -> None:
        """Every mapped RSE's summary table, compared with its last answer: an identical
        answer (same SHA-256) costs its transfer and a hash; otherwise only its new lines are
        parsed, and each row added, changed or gone marks its (site, dataset) dirty.

        The next RSE's answer is read in a thread while this one is parsed (:func:`_ahead`):
        one request at a time as before, none left running when this returns or raises."""

        def read(rse: str) -> bytes:
            path = f"{_REPLICAS}/rse/{quote(rse, safe='')}"
            return self._call("list_datasets_per_rse", partial(self._body, client, path))

        rses = sorted(cycle.sites)
        with ThreadPoolExecutor(1, thread_name_prefix="rucio-read") as reader:
            for rse, body in zip(rses, _ahead(reader, read, rses), strict=True):
                self._summary(body, book, cycle, dirty, rse)

    def _summary(self, body: bytes, book: _Book, cycle: _Cycle, dirty: _Dirty, rse: str) -> None:
        """One RSE's answer (:meth:`_read_summaries`)."""
        digest = hashlib.sha256(body).digest()
        listing = book.listings.get(rse)
        if listing is None or listing.digest != digest:
            listing = self._summary_listing(
                body, listing, book, rse=rse, site=cycle.sites[rse], dirty=dirty
            )
            listing.digest = digest
            book.listings[rse] = listing
        cycle.invalid += listing.invalid

    def _body(self, client: Any, path: str, params: dict[str, str] | None = None) -> bytes:
        """A listing's whole answer, read in blocks of ``_READ_BYTES`` (``Response.content``
        reads 10 kB at a time: about 1.5x the CPU for the 340 MB of a million rows)."""
        with self._get(client, path, params, stream=True) as response:
            return b"".join(response.iter_content(_READ_BYTES))

    def _lines(self, client: Any, path: str, params: dict[str, str]) -> list[_DeepLine | _Mark]:
        """A small listing's records, validated here (:meth:`_parse_lines`) instead of by
        rucio-clients, which parses every date of every record."""
        lines = list(filter(None, self._body(client, path, params).splitlines()))
        return self._parse_lines(_DEEP_LINES, lines)

    def _summary_listing(
        self,
        body: bytes,
        old: _Lines[_RowValue | _Mark] | None,
        book: _Book,
        *,
        rse: str,
        site: Site,
        dirty: _Dirty,
    ) -> _Lines[_RowValue | _Mark]:
        """One RSE's new answer applied to its rows: line by line against ``old`` when that is
        exact, else read whole (the first time, or when the RSE named a dataset twice)."""
        lines = list(dict.fromkeys(filter(None, body.splitlines())))  # identical lines once
        hashes = array("q", map(hash, lines))
        diff = _diff(old, hashes)
        if diff is not None:
            values, gone = diff
            fresh = _new_positions(values)
            added = self._row_values([lines[i] for i in fresh], book, dirty)
            for i, value in zip(fresh, added, strict=True):
                values[i] = value
            if not _repeats(added, gone, rse):
                _apply_rows(rse, added, gone, site, dirty)
                return _Lines(hashes, cast(list[_RowValue | _Mark], values))  # no _New left
        values_all = self._row_values(lines, book, dirty)
        if old is None:  # a first read (no row there yet): one pass instead of the two below
            return _Lines(hashes, values_all, unique=_fill_rows(rse, values_all, site, dirty))
        unique = _first_only(values_all)
        _apply_rows(rse, values_all, old.values, site, dirty)
        return _Lines(hashes, values_all, unique=unique)

    def _row_values(
        self, lines: list[bytes], book: _Book, dirty: _Dirty
    ) -> list[_RowValue | _Mark]:
        """What each summary line gives: its dataset alone when the row says complete, its
        counts otherwise, or a mark (malformed or invalid: counted; out of scope: skipped)."""
        out: list[_RowValue | _Mark] = []
        known = book.datasets
        for row in self._parse_lines(_SUMMARY_LINES, lines):
            if isinstance(row, _Mark):
                out.append(row)
                continue
            dataset = known.get((row["scope"], row["name"])) or self._known(
                row["scope"], row["name"], book, dirty
            )
            if isinstance(dataset, _Mark):
                out.append(dataset)
                continue
            length, available = row.get("length") or 0, row.get("available_length") or 0
            if row["state"] == "AVAILABLE" and available >= length > 0:
                out.append(dataset)
            else:
                size, present = row.get("bytes") or 0, row.get("available_bytes") or 0
                out.append(_Partial.of(dataset, length, available, size, present))
        return out

    def _known(self, scope: str, name: str, book: _Book, dirty: _Dirty) -> _Dataset | _Mark:
        """The one :class:`_Dataset` for ``scope:name``, made on first sight (its id the held
        replicas' one, if any: :func:`_held_ids`); a mark when out of scope (skipped) or
        invalid (counted, logged once per name)."""
        key = (scope, name)
        found = book.datasets.get(key)
        if found is not None:
            return found
        if self.config.scopes and scope not in self.config.scopes:
            return _Mark.SKIPPED
        try:
            dataset = self._held_ids.get(key) or DatasetId(scope, name)
        except InvalidNameError as exc:
            self._bad_names.warn(
                f"{scope}:{name}", "rucio: skipping a dataset with an invalid name: %s", exc
            )
            return _Mark.INVALID
        found = book.datasets[dataset] = _Dataset(dataset, dataset)  # equal to key, no copy
        dirty.datasets.add(found)  # forgotten again at the end if no row keeps it
        return found

    def _read_rules(self, client: Any, book: _Book, cycle: _Cycle, dirty: _Dirty) -> None:
        """The REPLICATING and STUCK rules (state filter by one-letter code), line by line
        against the last answer: the rules of new lines join their dataset's, those of lines
        gone leave it, and those datasets' rules are applied again (:meth:`_apply_rules`)."""
        for code in ("R", "S"):
            old = book.rule_lines.get(code)
            lines, added, gone = self._call(
                "list_replication_rules",
                partial(self._rule_lines, client, code, old, book.datasets),
            )
            book.rule_lines[code] = lines
            cycle.invalid += lines.invalid
            for rule in added:
                if isinstance(rule, _Rule):
                    book.rules_of.setdefault(rule.key, []).append(rule)
                    dirty.rule_keys.add(rule.key)
            for rule in gone:
                if isinstance(rule, _Rule):
                    rules = book.rules_of[rule.key]
                    rules.remove(rule)
                    if not rules:
                        del book.rules_of[rule.key]
                    dirty.rule_keys.add(rule.key)

    def _rule_lines(
        self,
        client: Any,
        code: str,
        old: _Lines[_Rule | _Mark] | None,
        known: Mapping[tuple[str, str], _Dataset],
    ) -> tuple[_Lines[_Rule | _Mark], list[_Rule | _Mark], list[_Rule | _Mark]]:
        """The rules in state ``code`` as lines, with what the new lines give and what the
        lines gone gave; read a block at a time as the answer streams in (a million rules are
        about a gigabyte of JSON), parsing only lines not in ``old``."""
        response = self._get(client, f"{_RULES}/", {"state": code}, stream=True)
        index = dict(zip(old.hashes, old.values, strict=True)) if old is not None else {}
        lines: _Lines[_Rule | _Mark] = _Lines()
        seen: set[int] = set()
        added: list[_Rule | _Mark] = []
        for block in _line_blocks(response):
            distinct = dict(zip(map(hash, block), block, strict=True))  # identical lines once
            if not seen.isdisjoint(distinct):
                distinct = {h: line for h, line in distinct.items() if h not in seen}
            seen.update(distinct)
            hashes = list(distinct)
            values: list[_Rule | _Mark | _New] = list(map(index.get, hashes, repeat(_New.LINE)))
            fresh = _new_positions(values)
            parsed = self._parse_lines(_RULE_LINES, [distinct[hashes[i]] for i in fresh])
            for i, row in zip(fresh, parsed, strict=True):
                values[i] = _rule_value(row, code, known)
                added.append(values[i])  # type: ignore[arg-type]  # parsed: no _New
            lines.hashes.extend(hashes)
            lines.values += cast(list[_Rule | _Mark], values)
        gone = [index[h] for h in index.keys() - seen]
        return lines, added, gone

    def _apply_rules(self, client: Any, book: _Book, cycle: _Cycle, dirty: _Dirty) -> None:
        """Each rule's transfer towards the sites its expression covers, re-applied for the
        datasets whose rules changed, that gained or lost every summary row, or (after a
        change of the RSE -> site map or of an expression's RSEs) that have rules at all.

        Only rules on datasets with a summary row at a mapped RSE count. An expression that
        is just an RSE name needs no call; the others are resolved once each per fetch.
        """
        relevant = {
            rule.expression
            for key, rules in book.rules_of.items()
            if (found := book.datasets.get(key)) is not None and found.at
            for rule in rules
        }
        resolved = {e: self._resolve(client, e, cycle) for e in sorted(relevant)}
        moved = {e for e, rses in resolved.items() if book.resolved.get(e, rses) != rses}
        book.resolved = resolved
        keys = dirty.rule_keys
        if dirty.remapped or moved:
            keys = keys | {
                key
                for key, rules in book.rules_of.items()
                if dirty.remapped or any(rule.expression in moved for rule in rules)
            }
        datasets = dirty.datasets | {found for k in keys if (found := book.datasets.get(k))}
        for dataset in datasets:
            rules = book.rules_of.get(dataset.key, []) if dataset.at else []
            _move(book, dataset, _coverage(rules, resolved, cycle.sites), dirty)

    def _resolve(self, client: Any, expression: str, cycle: _Cycle) -> frozenset[str]:
        if expression in cycle.sites or expression in cycle.unmapped:
            return frozenset({expression} & cycle.sites.keys())
        try:
            found = self._call("list_rses", partial(_as_list, client.list_rses, expression))
        except PermanentSourceError as exc:
            if isinstance(exc.__cause__, rucio_exc.InvalidRSEExpression):
                return frozenset()  # the rule targets RSEs that no longer exist
            raise
        names = {r.get("rse") for r in found if isinstance(r, dict)}
        return frozenset(rse for rse in names if isinstance(rse, str) and rse in cycle.sites)

    def _settle(
        self, client: Any, book: _Book, cycle: _Cycle, dirty: _Dirty, context: FetchContext
    ) -> Iterator[_Outcome | _Plain]:
        """The new replica of each dirty pair the summary or one rule's locks settle
        (:func:`_settled`); the others join ``book.pending`` and are answered by
        :meth:`_deep_checks`, with the pending pairs whose deep check starts or stops.
        Yielded as settled, and the dirty pairs let go site by site (a first fetch settles
        every pair: no list of a million outcomes); where most of a site's pairs are dirty,
        those that are plainly complete are told apart at C level and yielded as one
        :class:`_Plain` batch (:func:`_plainly_complete`)."""
        site_rses = cycle.site_rses()
        waiting: dict[_Dataset, set[Site]] = {}
        _drop_stale_checks(book, dirty)
        if dirty.pairs or dirty.filled:
            book.order = None
        covering, waits = book.moving.get, book.pending.get  # (the loop runs once a pair)
        exempt: dict[Site, set[_Dataset]] | None = None  # (for _plainly_complete)
        while dirty.pairs or dirty.filled:
            site, datasets = dirty.pop()
            rses = site_rses.get(site, ())
            tables = [book.listings[rse].values for rse in rses]
            if len(datasets) * _BULK_SHARE >= sum(map(len, tables)):
                exempt = _moving_or_pending(book) if exempt is None else exempt
                plain = _plainly_complete(tables, datasets, exempt.get(site, set()))
                yield _Plain(site, plain)
                datasets.difference_update(plain)
            for dataset in datasets:
                moving = _towards(covering(dataset), site)
                pending = waits(dataset, ())
                if moving is None and site not in pending and _complete_at(dataset, rses):
                    yield (site, dataset, _available(dataset.id, site))
                    continue  # the common case, as _settled has it, without its lists
                found = _settled(dataset, site, _rows_at(book, rses, dataset), moving)
                if found is _Wait.PENDING:
                    if site not in pending:
                        book.pending[dataset] = (*pending, site)  # a tuple: most have one
                    waiting.setdefault(dataset, set()).add(site)
                    continue
                if site in pending:
                    rest = tuple(s for s in pending if s != site)
                    if rest:
                        book.pending[dataset] = rest
                    else:
                        del book.pending[dataset]
                yield (site, dataset, found)
        # by site, as the loop above: a restarted fetch's _Reuse then builds a site's table
        # once more at most, not once per outcome
        yield from sorted(self._deep_checks(client, book, cycle, waiting, context), key=_SITE_OF)

    def _deep_checks(
        self,
        client: Any,
        book: _Book,
        cycle: _Cycle,
        waiting: dict[_Dataset, set[Site]],
        context: FetchContext,
    ) -> list[_Outcome]:
        """Exact presence for the pending pairs: most wanted datasets first, then those no
        rule's locks vouch for, up to ``deep_check_limit``; a chosen dataset whose last check
        still stands (:meth:`_check_or_reuse`) costs no call. The others use the lagging
        summary (or the locks, where they prove more), recomputed only for the ``waiting``
        pairs and those checked last time (the rest kept their inputs, so their replicas
        stand)."""
        limit = self.config.deep_check_limit
        chosen = _deep_order(book, context.wanted, limit)
        checked = set(chosen)
        self.deep_checks_skipped_last_fetch = max(0, len(book.pending) - limit)
        if self.deep_checks_skipped_last_fetch:
            log.warning(
                "rucio: %d datasets over deep_check_limit=%d used the lagging summary",
                self.deep_checks_skipped_last_fetch,
                limit,
            )
        for dataset in book.checked - checked:
            if dataset in book.pending:
                waiting.setdefault(dataset, set()).update(book.pending[dataset])
        site_rses = cycle.site_rses()
        out: list[_Outcome] = []
        for dataset, sites in waiting.items():
            if dataset not in checked:
                for site in sites:
                    rows = _rows_at(book, site_rses.get(site, ()), dataset)
                    found = _fallback(dataset.id, site, rows, _moving(book, dataset, site))
                    out.append((site, dataset, found))
        checks = {
            d: self._check_or_reuse(
                book.checks.get(d),
                context.now,
                partial(self._checked, client, d, book, cycle, site_rses),
            )
            for d in chosen
        }
        for check in checks.values():
            out += check.outcomes
        book.checked, book.checks = checked, checks
        self.deep_checks_last_fetch = len(chosen) - self.deep_checks_reused_last_fetch
        return out

    def _check_or_reuse(
        self, last: _Check | None, now: datetime, check: Callable[[], list[_Outcome]]
    ) -> _Check:
        """``last``, a dataset's deep check that still stands (nothing it read changed:
        :func:`_drop_stale_checks`), when younger than ``deep_check_max_age_s`` (counted in
        ``deep_checks_reused_last_fetch``); else a new one (``check``: :meth:`_checked`)."""
        if last is not None and _younger(last.at, now, self.config.deep_check_max_age_s):
            self.deep_checks_reused_last_fetch += 1
            return last
        return _Check(now, tuple(check()))

    def _checked(
        self,
        client: Any,
        dataset: _Dataset,
        book: _Book,
        cycle: _Cycle,
        site_rses: Mapping[Site, tuple[str, ...]],
    ) -> list[_Outcome]:
        """One exact listing for ``dataset``: per file when some pending site has summary rows
        at two or more of its RSEs (the union needs to know which files they share), else per
        RSE; a replica for each of its pending sites."""
        sites = book.pending[dataset]
        if any(len(_rows_at(book, site_rses.get(s, ()), dataset)) > 1 for s in sites):
            exact = self._file_union(client, dataset.id, cycle)
        else:
            exact = self._deep_counts(client, dataset.id, cycle)
        out: list[_Outcome] = []
        for site in sites:
            counts = exact.get(site, _NOTHING)
            moving = _moving(book, dataset, site)
            found = _replica(dataset.id, site, counts.files_share, counts.bytes_share, moving)
            out.append((site, dataset, found))
        return out

    def _deep_counts(self, client: Any, dataset: DatasetId, cycle: _Cycle) -> dict[Site, _Counts]:
        """Site -> files and bytes of one dataset present there, from the file replicas
        (``list_dataset_replicas(deep=True)``, per RSE; several RSEs of a site: the best, a
        lower bound, as this listing cannot tell which files they share)."""
        path = f"{_REPLICAS}/{quote_plus(dataset.scope)}/{quote_plus(dataset.name)}/datasets"
        rows = self._call(
            "list_dataset_replicas", partial(self._lines, client, path, {"deep": "True"})
        )
        counts: dict[Site, _Counts] = {}
        for row in rows:
            if isinstance(row, _Mark):
                cycle.invalid += 1  # malformed (no blank line is left to skip)
                continue
            site = cycle.sites.get(row["rse"])
            if site is None:
                continue
            found = _Counts(
                row.get("length") or 0,
                row.get("available_length") or 0,
                row.get("bytes") or 0,
                row.get("available_bytes") or 0,
            )
            old = counts.get(site)
            if old is None or (found.available, found.available_bytes) > (
                old.available,
                old.available_bytes,
            ):
                counts[site] = found
        return counts

    def _file_union(self, client: Any, dataset: DatasetId, cycle: _Cycle) -> dict[Site, _Counts]:
        """Site -> files and bytes of one dataset present there, a file counting once when
        any RSE of the site holds it AVAILABLE (``list_replicas(all_states=True)``: one call,
        one record per file with its state at each RSE)."""
        did = {"scope": dataset.scope, "name": dataset.name}
        records = self._call(
            "list_replicas", partial(_as_list, client.list_replicas, [did], all_states=True)
        )
        length = size = 0
        files: Counter[Site] = Counter()
        sizes: Counter[Site] = Counter()
        for record in records:
            row = self._parse(_FileRow, record, cycle)
            if row is None:
                continue
            length += 1
            size += row.bytes or 0
            for site in {
                found
                for rse, state in row.states.items()
                if state == "AVAILABLE" and (found := cycle.sites.get(rse)) is not None
            }:
                files[site] += 1
                sizes[site] += row.bytes or 0
        return {site: _Counts(length, files[site], size, sizes[site]) for site in files}

    # -- parsing -------------------------------------------------------------------------

    def _get(
        self, client: Any, path: str, params: dict[str, str] | None = None, stream: bool = False
    ) -> requests.Response:
        """One listing GET exactly as rucio-clients sends it (its URL, session, token and
        headers), whose body is then read here instead of by rucio-clients' per-line
        ``json.loads`` with a date-parsing hook, which was most of a fetch at a million rows
        (issue 15). A 401 gets the client a new token (through ``whoami``) and one resend;
        another error status raises a ``RucioException`` classified by :meth:`_translate`."""
        url = build_url(client.host, path=path, params=params)
        for attempt in (1, 2):
            headers = {
                "X-Rucio-Auth-Token": client.auth_token,
                "X-Rucio-VO": client.vo,
                "X-Rucio-Account": client.account,
                "User-Agent": client.user_agent,
                "X-Rucio-Script": client.script_id,
            }
            response: requests.Response = client.session.get(
                url,
                headers={k: v for k, v in headers.items() if v is not None},
                timeout=client.timeout,
                verify=client.ca_cert or False,
                stream=stream,
            )
            self._last_status = response.status_code
            if response.status_code != 401 or attempt == 2:
                break
            response.close()
            client.whoami()  # rucio-clients renews the token on the 401 this gets
        if response.status_code != 200:
            response.close()
            raise rucio_exc.RucioException(f"HTTP {response.status_code} from {path}")
        return response

    def _parse_lines(self, schema: _LineSchema[R], lines: list[bytes]) -> list[R | _Mark]:
        """Validate JSON lines at once (one pydantic call, which reads the JSON itself); if
        any record is malformed, record by record, marking the bad ones ``_Mark.INVALID``
        (counted) and blank lines ``_Mark.SKIPPED``. A line that is not JSON raises
        ``JSONDecodeError`` (a broken answer: transient, as when rucio-clients read it)."""
        if not lines:
            return []
        stripped = list(map(bytes.strip, lines))
        if all(stripped):  # no blank line (the usual answer): the records as pydantic gives them
            try:
                return cast(
                    list[R | _Mark], schema.many.validate_json(b"[" + b",".join(lines) + b"]")
                )
            except ValidationError:
                pass  # record by record, below
        blank = [not line for line in stripped]
        text = [line for line, empty in zip(lines, blank, strict=True) if not empty]
        try:
            parsed: Iterable[R | None] = schema.many.validate_json(b"[" + b",".join(text) + b"]")
        except ValidationError:
            parsed = [_validated(schema, json.loads(line)) for line in text]
        found = iter(parsed)
        return [
            _Mark.SKIPPED if empty else (_Mark.INVALID if (p := next(found)) is None else p)
            for empty in blank
        ]

    def _parse(self, model: type[P], record: Any, tally: _Counter) -> P | None:
        """Validate one untrusted record; a malformed one is counted and skipped."""
        try:
            return model.model_validate(record)
        except ValidationError as exc:
            tally.invalid += 1
            log.debug("rucio: skipping a malformed %s record: %s", model.__name__, exc)
            return None

    # -- calls, retries, errors ----------------------------------------------------------

    def _call(self, method: str, fn: Callable[[], T]) -> T:
        """Run one API call with bounded retries on transient errors; translate all errors."""

        def attempt(n: int) -> T:
            self._calls[method] += 1
            self._last_status = self._retry_after_s = None
            self._watch(self._client)
            try:
                return fn()
            except _CALL_ERRORS as exc:
                raise self._translate(method, exc) from exc
            finally:
                self._note_token(self._client)

        cfg = self.config
        policy = RetryPolicy(
            cfg.max_attempts, cfg.backoff_s, max_retry_after_s=cfg.max_retry_after_s
        )
        return call_with_retries(attempt, policy, logger=log, sleep=self._sleep)

    def _translate(self, method: str, exc: Exception) -> SourceError:
        """The hydrator's error for a library exception, by its class and HTTP status."""
        where = redact(self.config.rucio_host or "the server in $RUCIO_CONFIG")  # user:pw@
        kind = type(exc).__name__
        status = self._last_status
        if isinstance(exc, (*_AUTH_ERRORS, _TokenRejected)) or status in (401, 403):
            return PermanentSourceError(
                f"rucio: authentication failed at {where} for account "
                f"{self.config.account or '(from rucio.cfg)'} ({kind}); check the credentials"
            )
        if isinstance(exc, _CLIENT_CONFIG_ERRORS):
            return PermanentSourceError(f"rucio: bad client configuration ({kind}): {_line(exc)}")
        if isinstance(exc, requests.exceptions.SSLError):
            return PermanentSourceError(f"rucio: TLS failure talking to {where}; check ca_cert")
        if isinstance(exc, requests.RequestException | OSError | json.JSONDecodeError):
            return TransientSourceError(f"rucio: {method}: cannot reach {where} ({kind})")
        if isinstance(exc, rucio_exc.ServerConnectionException) or (
            status is not None and (status >= 500 or status == 429)
        ):
            return TransientSourceError(
                f"rucio: {method}: server error {status} ({kind})", self._retry_after_s
            )
        return PermanentSourceError(f"rucio: {method} failed ({kind}, HTTP {status}): {_line(exc)}")

    # -- the client ----------------------------------------------------------------------

    def _connected_client(self) -> Any:
        """The client, built (and authenticated) on first use or after a permanent error.

        With ``auth_type = "oidc"`` the bearer token is re-read from ``token_file`` every cycle,
        so a token renewed by an external agent is picked up without a restart.
        """
        if self._client is None:
            client = self._call("connect", self._make_client)
            client.request_retries = 0  # one immediate resend inside rucio-clients; ours follow
            self._client = client
        elif self.config.auth_type == "oidc":
            self._client.auth_token = _read_secret(self.config.token_file, "token_file")
        self._note_token(self._client)
        return self._client

    def _make_client(self) -> Any:
        """A rucio ``Client`` from the config, or from ``$RUCIO_CONFIG`` without rucio_host.

        Only rucio-clients' public interface is used: constructor arguments, the
        ``TOKEN_PATH_PREFIX`` class constant (a private token directory, not the shared
        ``/tmp/.rucio_<user>``), WLCG token discovery (``BEARER_TOKEN_FILE``) for OIDC, and the
        ``session`` attribute, whose ``requests`` response hook (:meth:`_on_response`) records
        each answer's status and stops at a rejected bearer token.
        """
        cfg = self.config
        kwargs: dict[str, Any] = {"timeout": cfg.timeout_s}
        for key in ("rucio_host", "auth_host", "account", "vo", "auth_type"):
            if getattr(cfg, key) is not None:
                kwargs[key] = getattr(cfg, key)
        if cfg.ca_cert is not None:
            kwargs["ca_cert"] = str(cfg.ca_cert)
        if cfg.auth_type is not None:
            kwargs["creds"] = self._creds()
        if self._token_dir is None:
            self._token_dir = Path(tempfile.mkdtemp(prefix="hydrator-rucio-"))
        client_class = type(
            "HydratorRucioClient", (Client,), {"TOKEN_PATH_PREFIX": f"{self._token_dir}/.rucio_"}
        )
        if cfg.auth_type != "oidc":
            return client_class(**kwargs)
        token = _read_secret(cfg.token_file, "token_file")
        with _bearer_token_file(self._token_dir, token):
            client = client_class(**kwargs)
        client.auth_token = token  # token_file wins over a BEARER_TOKEN in the environment
        return client

    def _watch(self, client: Any) -> None:
        """Hook :meth:`_on_response` into the client's session (rucio-clients replaces its
        session after an HTTP 401, so this runs before every call)."""
        if client is not None and self._on_response not in client.session.hooks["response"]:
            client.session.hooks["response"].append(self._on_response)

    def _on_response(self, resp: requests.Response, *args: Any, **kwargs: Any) -> None:
        """Record the status and ``Retry-After`` of each answer; with OIDC, end at a 401.

        rucio-clients answers a 401 by fetching a new token, which for OIDC is its interactive
        browser flow: a daemon must stop there instead (the token comes from ``token_file``).
        """
        self._last_status = resp.status_code
        self._retry_after_s = None
        if resp.status_code in (429, 503):
            self._retry_after_s = parse_retry_after(resp.headers.get("Retry-After"))
        if resp.status_code == 401 and self.config.auth_type == "oidc":
            resp.close()
            raise _TokenRejected

    def _note_token(self, client: Any) -> None:
        """Count a token obtained since the last look (``calls_last_fetch["auth"]``)."""
        token = getattr(client, "auth_token", None) if client is not None else None
        if token and token != self._token_seen:
            self._calls["auth"] += 1
            self._token_seen = token

    def _creds(self) -> dict[str, Any]:
        cfg = self.config
        if cfg.auth_type == "userpass":
            return {
                "username": cfg.username,
                "password": _read_secret(cfg.password_file, "password_file"),
            }
        if cfg.auth_type == "x509":
            return {"client_cert": _path(cfg.client_cert), "client_key": _path(cfg.client_key)}
        if cfg.auth_type == "x509_proxy":
            return {"client_proxy": _path(cfg.client_proxy)}
        return {}


_Outcome = tuple[Site, _Dataset, Replica | None]  # a pair's replica this fetch (None: none)
_SITE_OF: Callable[[_Outcome], Site] = itemgetter(0)
_BULK_SHARE = 4  # a site whose dirty pairs are a quarter of its rows or more: see _Plain
_REPLICA = partial(tuple.__new__, Replica)  # Replica._make at C level: fields already checked


def _ahead(reader: Executor, read: Callable[[K], T], keys: Sequence[K]) -> Iterator[T]:
    """``read(key)`` for each of ``keys`` in order, the next one running in ``reader`` (one
    worker) while the caller works on this one: its wait for the server's bytes overlaps the
    caller's parsing. Only one ``read`` runs at a time, and the caller makes no call while it
    runs. A failed ``read`` raises here, in its turn; the one already started after it ends
    with ``reader`` (shut down by the caller's ``with``), and its answer is dropped."""
    if not keys:
        return
    ahead = reader.submit(read, keys[0])
    for key in keys[1:]:
        done, ahead = ahead, reader.submit(read, key)
        yield done.result()
    yield ahead.result()


def _available(dataset: DatasetId, site: Site) -> Replica:
    """``Replica(dataset, site, ReplicaState.AVAILABLE)`` without re-checking its fields."""
    return _REPLICA((dataset, site, ReplicaState.AVAILABLE, 1.0, None))


class _Plain(NamedTuple):
    """A batch of outcomes: the replica of each of ``datasets`` at ``site`` says only
    "complete" (:func:`_plainly_complete`)."""

    site: Site
    datasets: list[_Dataset]

    def replicas(self) -> list[Replica]:
        """Their replicas, built at C level (:func:`_available` for each)."""
        ids = map(_DATASET_ID, self.datasets)
        fields = zip(
            ids, repeat(self.site), repeat(ReplicaState.AVAILABLE), repeat(1.0), repeat(None)
        )
        return list(map(_REPLICA, fields))


_DATASET_ID: Callable[[_Dataset], DatasetId] = attrgetter("id")
_NOTHING = _Counts(0, 0, 0, 0)


class _Wait(enum.Enum):
    PENDING = "pending"  # the summary cannot settle the pair: a deep check or the fallback


def _dataset_of(value: _RowValue) -> _Dataset:
    return value if isinstance(value, _Dataset) else value.dataset


_RSE_OF: Callable[[Any], str] = itemgetter(0)
_IS_DATASET = cast(Callable[[Any], TypeGuard[_Dataset]], _Dataset.__instancecheck__)  # C level
_IS_PARTIAL = cast(Callable[[Any], TypeGuard[_Partial]], _Partial.__instancecheck__)
_PARTIAL_DATASET: Callable[[_Partial], _Dataset] = attrgetter("dataset")


def _listed(values: list[_RowValue | _Mark]) -> Iterator[_Dataset]:
    """The dataset of each row among a listing's ``values`` (C-level passes, marks left out)."""
    yield from filter(_IS_DATASET, values)
    yield from map(_PARTIAL_DATASET, filter(_IS_PARTIAL, values))


# -- line diffs ----------------------------------------------------------------------------


def _diff(old: _Lines[V] | None, hashes: array[int]) -> tuple[list[V | _New], list[V]] | None:
    """Against ``old``, the value of each line of a new answer (``_New.LINE`` where the line
    is new) and the values of ``old``'s lines that are gone; None when ``old`` cannot be
    compared line by line (none yet, or it named a dataset twice)."""
    if old is None or not old.unique:
        return None
    index = dict(zip(old.hashes, old.values, strict=True))
    values: list[V | _New] = list(map(index.get, hashes, repeat(_New.LINE)))
    gone = [index[h] for h in index.keys() - set(hashes)]
    return values, gone


def _new_positions(values: list[Any]) -> list[int]:
    """Indices of the ``_New.LINE`` placeholders (C-level scans: most lines are not new)."""
    out: list[int] = []
    start = 0
    while True:
        try:
            start = values.index(_New.LINE, start)
        except ValueError:
            return out
        out.append(start)
        start += 1


def _repeats(added: list[_RowValue | _Mark], gone: list[_RowValue | _Mark], rse: str) -> bool:
    """True when the new lines name a dataset twice, or one that a kept line (at ``rse``)
    names."""
    new = [_dataset_of(v) for v in added if not isinstance(v, _Mark)]
    leaving = {_dataset_of(v) for v in gone if not isinstance(v, _Mark)}
    return len(set(new)) != len(new) or any(rse in d.at and d not in leaving for d in new)


def _first_only(values: list[_RowValue | _Mark]) -> bool:
    """Keep the first row of each dataset of one answer, marking later ones invalid (Rucio
    keeps one row per dataset and RSE); return whether every dataset came once."""
    seen: set[_Dataset] = set()
    unique = True
    for i, value in enumerate(values):
        if isinstance(value, _Mark):
            continue
        dataset = _dataset_of(value)
        if dataset in seen:
            values[i] = _Mark.INVALID
            unique = False
        seen.add(dataset)
    return unique


def _fill_rows(rse: str, values: list[_RowValue | _Mark], site: Site, dirty: _Dirty) -> bool:
    """:func:`_first_only` and :func:`_apply_rows` in one pass, for an RSE read the first
    time (no row at ``rse`` yet, nothing gone): what they would do, at half the cost a row,
    with the values themselves noted as dirty at ``site`` (:attr:`_Dirty.filled`). A row
    put here is its dataset's last, so a second line of a dataset finds ``rse`` last."""
    unique = True
    for i, value in enumerate(values):
        if isinstance(value, _Mark):
            continue
        dataset = value if isinstance(value, _Dataset) else value.dataset
        at = dataset.at
        if at and at[-2] is rse:
            values[i] = _Mark.INVALID
            unique = False
            continue
        dataset.at = at + (rse, value)  # noqa: RUF005  (faster than unpacking)
        if not at:
            dirty.datasets.add(dataset)
    if values:
        dirty.filled.setdefault(site, []).append(values)
    return unique


def _apply_rows(
    rse: str,
    added: Iterable[_RowValue | _Mark],
    gone: Iterable[_RowValue | _Mark],
    site: Site,
    dirty: _Dirty,
) -> None:
    """The rows at ``rse`` with ``gone`` taken out where still current, then ``added`` put in
    (a row that says complete is its dataset object, so a changed line goes before its
    successor comes). Each dataset touched is dirty at ``site``; one that gained its first
    or lost its last row anywhere has its rules applied again."""
    emptied: set[_Dataset] = set()
    for value in gone:
        if isinstance(value, _Mark):
            continue
        dataset = _dataset_of(value)
        if dataset.row(rse) is value:
            dataset.drop(rse)
            if not dataset.at:
                emptied.add(dataset)
            dirty.add(site, dataset)
    for value in added:
        if isinstance(value, _Mark):
            continue
        dataset = _dataset_of(value)
        if dataset.put(rse, value):
            if len(dataset.at) == 2 and dataset not in emptied:
                dirty.datasets.add(dataset)
            emptied.discard(dataset)
        dirty.add(site, dataset)
    dirty.datasets |= emptied


def _remap(book: _Book, cycle: _Cycle, dirty: _Dirty) -> None:
    """Apply the changes of the RSE -> site map: an RSE no longer mapped takes its rows away;
    one mapped to another site makes each of its datasets dirty at both sites."""
    for rse, old in book.rse_site.items():
        new = cycle.sites.get(rse)
        if new == old:
            continue
        dirty.remapped = True
        listing = book.listings.get(rse)
        values = listing.values if listing is not None else []
        if new is None:
            _apply_rows(rse, (), values, old, dirty)
            book.listings.pop(rse, None)
            continue
        for dataset in _listed(values):
            dirty.add(old, dataset)
            dirty.add(new, dataset)
    if cycle.sites.keys() - book.rse_site.keys():
        dirty.remapped = True
    book.rse_site = dict(cycle.sites)


# -- rules ---------------------------------------------------------------------------------


def _rule_value(
    row: _RuleRow | _Mark, code: str, known: Mapping[tuple[str, str], _Dataset]
) -> _Rule | _Mark:
    """What a rule line gives: an active or stuck dataset rule, or a mark (malformed:
    counted; a container rule, whose datasets get a deep check, or a finished one: skipped).
    The transfer follows the lock counts, which the rule engine keeps current, before the
    rule's state, which waits for the judge."""
    if isinstance(row, _Mark):
        return row
    if row["did_type"] != "DATASET":
        return _Mark.SKIPPED
    transfer = _transfer(row, code)
    if transfer is Transfer.NONE:
        return _Mark.SKIPPED
    ok = row["locks_ok_cnt"]
    total = ok + row["locks_replicating_cnt"] + row["locks_stuck_cnt"]
    progress = min(1.0, max(0.0, ok / total)) if total > 0 else 0.0
    key = (row["scope"], row["name"])
    found = known.get(key)
    key = key if found is None else found.key  # the dataset's own strings: less memory
    return _Rule(key, sys.intern(row["rse_expression"]), transfer, progress)


def _transfer(rule: _RuleRow, code: str) -> Transfer:
    """A rule's transfer from its lock counts; its listed state only when it has no locks."""
    if rule["locks_stuck_cnt"] > 0:
        return Transfer.STUCK
    if rule["locks_replicating_cnt"] > 0:
        return Transfer.REPLICATING
    if rule["locks_ok_cnt"] > 0:
        return Transfer.NONE  # every lock OK: done, though the judge has not re-evaluated yet
    return Transfer.STUCK if code == "S" else Transfer.REPLICATING


def _merge_transfers(a: _SiteTransfer, b: _SiteTransfer) -> _SiteTransfer:
    """Two rules towards one site: a stuck one wins (it needs an operator), then progress."""
    rank = {Transfer.NONE: 0, Transfer.REPLICATING: 1, Transfer.STUCK: 2}
    first = a if (rank[a.transfer], a.progress) >= (rank[b.transfer], b.progress) else b
    floor = max(a.floor, b.floor)
    return _SiteTransfer(first.site, first.transfer, first.progress, floor)  # not "only"


def _coverage(
    rules: Iterable[_Rule], resolved: Mapping[str, frozenset[str]], sites: Mapping[str, Site]
) -> _Coverage:
    """One dataset's rules as the transfer towards each site, for the mapped RSEs each
    rule's expression covers (several rules: :func:`_merge_transfers`, order-free)."""
    covered: dict[Site, _SiteTransfer] = {}
    for rule in rules:
        rses = resolved[rule.expression]
        at = {sites[rse] for rse in rses}
        single = len(at) == 1  # the rule's locks are all at one site
        for site in at:
            new = _SiteTransfer(
                site,
                rule.transfer,
                rule.progress,
                rule.progress if single else 0.0,
                rses if single else None,
            )
            old = covered.get(site)
            covered[site] = new if old is None else _merge_transfers(old, new)
    return tuple(covered.values())


def _move(book: _Book, dataset: _Dataset, covered: _Coverage, dirty: _Dirty) -> None:
    """Put a dataset's new rule coverage in the book; each site whose transfer changed is
    dirty."""
    old = {moving.site: moving for moving in book.moving.get(dataset, ())}
    new = {moving.site: moving for moving in covered}
    for site in old.keys() | new.keys():
        if old.get(site) != new.get(site):
            dirty.add(site, dataset)
    if covered:
        book.moving[dataset] = covered
    else:
        book.moving.pop(dataset, None)


def _moving(book: _Book, dataset: _Dataset, site: Site) -> _SiteTransfer | None:
    return _towards(book.moving.get(dataset), site)


# -- settling pairs ------------------------------------------------------------------------


def _rows_at(book: _Book, rses: tuple[str, ...], dataset: _Dataset) -> list[tuple[str, _RowValue]]:
    """(RSE, row) of ``dataset`` at each of ``rses`` (sorted) that has one, in that order."""
    at = dataset.at  # (the fastest scan measured for ~10 rows: names only, by index)
    found: list[tuple[str, _RowValue]] = []
    for i in range(0, len(at), 2):
        if at[i] in rses:
            found.append((at[i], at[i + 1]))  # type: ignore[arg-type]  # (names at even i)
    if len(found) > 1:
        found.sort(key=_RSE_OF)  # in the order of ``rses`` (sorted)
    return found


def _settled(
    dataset: _Dataset,
    site: Site,
    rows: list[tuple[str, _RowValue]],
    moving: _SiteTransfer | None,
) -> Replica | _Wait | None:
    """A pair's replica when its summary says complete at one of the site's RSEs (presence
    wins over any transfer), or when one rule's locks count it exactly (the rule's RSEs are
    all at the site and hold every summary row of the site; the bytes share is taken to be
    the files share); None when nothing is there or moving; else ``_Wait.PENDING``
    (``list_datasets_per_rse`` rows per RSE are not a union over a site's RSEs)."""
    for _, value in rows:
        if isinstance(value, _Dataset):
            return _replica(dataset.id, site, 1.0, 1.0, moving)
    if moving is not None and moving.only is not None and all(r in moving.only for r, _ in rows):
        return _replica(dataset.id, site, moving.floor, moving.floor, moving)
    if not rows and moving is None:
        return None
    return _Wait.PENDING


def _moving_or_pending(book: _Book) -> dict[Site, set[_Dataset]]:
    """Site -> the datasets some rule moves towards it or pending there: the pairs whose
    replica is not told by their summary rows alone. (Settling one pair changes the pending
    sites of its dataset at its own site only: a site's set stands until it is settled.)"""
    out: dict[Site, set[_Dataset]] = {}
    for dataset, covered in book.moving.items():
        for moving in covered:
            out.setdefault(moving.site, set()).add(dataset)
    for dataset, sites in book.pending.items():
        for site in sites:
            out.setdefault(site, set()).add(dataset)
    return out


def _plainly_complete(
    tables: Iterable[list[_RowValue | _Mark]], datasets: set[_Dataset], exempt: set[_Dataset]
) -> list[_Dataset]:
    """Those of ``datasets`` that a row at one of a site's RSEs (``tables``: their listings'
    values) says complete, but not ``exempt`` ones (:func:`_moving_or_pending` at the site):
    their replica there says only "complete", as :meth:`RucioSource._settle` would find pair
    by pair (the others are left to it). C-level passes over the site's rows: for a site
    most of whose pairs are dirty."""
    complete: set[_Dataset] = set()
    for values in tables:
        complete.update(filter(_IS_DATASET, values))  # a row that says complete: its dataset
    complete.intersection_update(datasets)
    complete.difference_update(exempt)
    return list(complete)


def _complete_at(dataset: _Dataset, rses: tuple[str, ...]) -> bool:
    """True when a row of ``dataset`` at one of ``rses`` says complete (is the dataset)."""
    at = dataset.at
    if dataset not in at:  # (C level: most datasets with a partial row have no complete one)
        return False
    for i in range(1, len(at), 2):  # noqa: SIM110  (any() over a generator: slower)
        if at[i] is dataset and at[i - 1] in rses:
            return True
    return False


def _deep_order(book: _Book, wanted: Mapping[DatasetId, int], limit: int) -> list[_Dataset]:
    """The first ``limit`` pending datasets: most wanted first, then those no rule's locks
    vouch for at a pending site, then by scope and name. The order without demand is kept
    in the book until a pair is settled again (only that can change ``pending`` or a pending
    pair's rules), so a fetch in which nothing changed sorts only the wanted datasets."""
    if book.order is None:
        book.order = sorted(book.pending, key=partial(_order_key, book))
    demand: dict[_Dataset, int] = {}
    for did, count in wanted.items():
        found = book.datasets.get((did.scope, did.name))
        if count > 0 and found is not None and found in book.pending:
            demand[found] = count
    head = sorted(demand, key=lambda d: (-demand[d], *_order_key(book, d)))
    rest = (d for d in book.order if d not in demand)
    return head[:limit] + list(islice(rest, max(0, limit - len(head))))


def _order_key(book: _Book, dataset: _Dataset) -> tuple[bool, str, str]:
    """Unvouched first (no rule's OK locks show files at a pending site), then scope, name."""
    covered = book.moving.get(dataset)
    vouched = covered is not None and any(
        (m := _towards(covered, site)) is not None and m.floor > 0 for site in book.pending[dataset]
    )
    return (vouched, dataset.id.scope, dataset.id.name)


def _drop_stale_checks(book: _Book, dirty: _Dirty) -> None:
    """Forget the deep checks whose inputs changed this fetch: every check after a change
    of the RSE -> site map; else those of a dataset with a dirty pair at any site (a summary
    row, its pending sites or its transfer towards a site changed) or whose rule lines
    changed (lock counts follow the files, even where the transfer reads the same)."""
    if not book.checks:
        return
    if dirty.remapped:
        book.checks.clear()
        return
    for dataset in dirty.each():
        book.checks.pop(dataset, None)
    for dataset in dirty.datasets:
        book.checks.pop(dataset, None)
    for key in dirty.rule_keys:
        found = book.datasets.get(key)
        if found is not None:
            book.checks.pop(found, None)


def _replica(
    dataset: DatasetId, site: Site, files: float, bytes_: float, moving: _SiteTransfer | None
) -> Replica | None:
    if moving is None:
        return holding(dataset, site, files, bytes_)
    return holding(dataset, site, files, bytes_, transfer=moving.transfer, progress=moving.progress)


def _fallback(
    dataset: DatasetId,
    site: Site,
    rows: list[tuple[str, _RowValue]],
    moving: _SiteTransfer | None,
) -> Replica | None:
    """Without a deep check: the best summary row of the site's RSEs (a lower bound that lags),
    or the share of files the rules' OK locks prove present, whichever shows more."""
    partial = [v for _, v in rows if isinstance(v, _Partial)]
    best = max(partial, key=lambda p: p.available, default=None)
    files, bytes_ = (0.0, 0.0) if best is None else (best.files_share, best.bytes_share)
    if moving is not None and moving.floor > files:
        files = bytes_ = moving.floor  # locks count files, not bytes: the file share stands in
    return _replica(dataset, site, files, bytes_, moving)


def _held_ids(
    book: _Book, previous: AbstractSet[Replica] | None
) -> dict[tuple[str, str], DatasetId]:
    """The datasets of the daemon's held replicas (``FetchContext.previous``), each mapped to
    itself, when the book knows no dataset yet (the first fetch, after a restart or a failed
    fetch); else empty. The source names a dataset it reads with the object those replicas
    already use (checked when they were made): after a restart, one object per dataset
    instead of a loaded and a read one. C-level passes; lives for one fetch."""
    if book.datasets or not previous:
        return {}
    ids = map(_REPLICA_DATASET, previous)
    return dict(zip(ids, map(_REPLICA_DATASET, previous), strict=True))


_REPLICA_DATASET: Callable[[Replica], DatasetId] = attrgetter("dataset")


class _Reuse:
    """The daemon's replicas of this source's last good answer (``FetchContext.previous``),
    to answer with where a new replica equals one of them, when the book holds no answer to
    reuse objects from (the first fetch, after a restart or a failed fetch).

    Grouped by site (a list of references, for one fetch), and a lookup table (replica ->
    itself) for one site at a time: outcomes come site by site (:meth:`RucioSource._settle`),
    so a fetch builds each site's table once or twice instead of one table of every replica
    (about 40 bytes a replica: 40 MiB at a million, beside the new answer)."""

    def __init__(self, previous: AbstractSet[Replica]) -> None:
        groups: dict[Site, list[Replica]] = {}
        for replica in previous:
            site = replica.site
            group = groups.get(site)
            if group is None:
                groups[site] = [replica]
            else:
                group.append(replica)
        self._groups = groups
        self._site: Site | None = None
        self._table: dict[Replica, Replica] = {}

    @classmethod
    def of(cls, book: _Book, previous: AbstractSet[Replica] | None) -> _Reuse | None:
        """One for a book without an answer and a non-empty ``previous``, else None."""
        if book.replicas or not previous:
            return None
        return cls(previous)

    def at(self, site: Site) -> dict[Replica, Replica]:
        """The table of ``site``'s replicas (the last site's is let go)."""
        if site != self._site:
            self._table = {}  # first let the last one go
            group = self._groups.get(site, ())
            self._site, self._table = site, dict(zip(group, group, strict=True))
        return self._table


def _record(book: _Book, outcomes: Iterable[_Outcome | _Plain], reuse: _Reuse | None) -> None:
    """Put each pair's replica in the book. A pair whose replica equals the last one keeps
    that object, and the answer set is the last one moved by the delta: one C-level copy
    reusing the stored hashes (the last set is the daemon's until its next state, so the
    two are both alive for a moment; ``difference().union()`` made a third), so the core
    compares unchanged pairs by identity. A replica equal to one in ``reuse`` is that
    object instead.

    Most replicas say just "complete" (:func:`_plain`): those are kept in the set alone,
    found there by value; ``book.answer`` holds the others by pair (a pair has at most one
    replica, so a plain one in the set is the pair's)."""
    removed: list[Replica] = []
    added: list[Replica] = []
    for outcome in outcomes:
        if isinstance(outcome, _Plain):
            _record_plain(book, outcome, reuse, removed, added)
        else:
            _record_pair(book, outcome, reuse, removed, added)
    if removed or added:
        answer = set(book.replicas)
        answer.difference_update(removed)
        answer.update(added)
        book.replicas = answer  # handed out with the snapshot: never changed after this


def _record_pair(
    book: _Book,
    outcome: _Outcome,
    reuse: _Reuse | None,
    removed: list[Replica],
    added: list[Replica],
) -> None:
    """:func:`_record` for one pair: its last replica (if any, and not the same) to
    ``removed``, its new one (if any, and not the same) to ``added``."""
    site, dataset, new = outcome
    if reuse is not None and new is not None:
        new = reuse.at(site).get(new, new)
    answer = book.answer.get(site)
    old = None if answer is None else answer.get(dataset)
    replicas = book.replicas
    if old is None:
        if new is not None and _plain(new):
            if new not in replicas:  # else unchanged
                added.append(new)  # no replica or a plain one before (the same: in the set)
            return
        if replicas:
            plain = _available(dataset.id, site)
            old = plain if plain in replicas else None
    elif old == new:
        return
    else:
        del answer[dataset]  # type: ignore[union-attr]  # old came from it
    if old is not None:
        removed.append(old)
    if new is not None:
        added.append(new)
        if not _plain(new):
            book.answer.setdefault(site, {})[dataset] = new


def _record_plain(
    book: _Book,
    batch: _Plain,
    reuse: _Reuse | None,
    removed: list[Replica],
    added: list[Replica],
) -> None:
    """:func:`_record` for a batch of plain replicas, at C level: a pair that had a replica
    saying more loses it; one whose plain replica is in the answer already keeps it."""
    answer = book.answer.get(batch.site)
    if answer:
        removed += map(answer.pop, answer.keys() & batch.datasets)
    new = batch.replicas()
    found = new if reuse is None else map(reuse.at(batch.site).get, new, new)
    added.extend(filterfalse(book.replicas.__contains__, found))


def _plain(replica: Replica) -> bool:
    """True for a replica that says only "complete" (the form :func:`holding` gives it)."""
    return (
        replica.detail is None
        and replica.state is ReplicaState.AVAILABLE
        and replica.fraction == 1.0
    )


def _forget_unlisted(book: _Book, dirty: _Dirty) -> None:
    """Drop the datasets left without a summary row (nothing else refers to them now)."""
    for dataset in dirty.datasets:
        if not dataset.at and book.datasets.get(dataset.key) is dataset:
            del book.datasets[dataset.key]


def _read_secret(path: Path | None, key: str) -> str:
    """The stripped content of a secret file, checked (no whitespace or control characters
    inside) and remembered for redaction; the error names the key and file, never the content."""
    if path is None:
        raise PermanentSourceError(f"rucio: {key} is required for this auth_type")
    return read_secret(path, f"rucio {key.removesuffix('_file')}")


_ENV_LOCK = threading.Lock()


@contextmanager
def _bearer_token_file(directory: Path, token: str) -> Iterator[None]:
    """``$BEARER_TOKEN_FILE`` naming a private copy of ``token`` while a client is built.

    rucio-clients' public way to take a bearer token at construction is WLCG token discovery
    (``BEARER_TOKEN``, ``BEARER_TOKEN_FILE``); without one it would start its interactive flow.
    The copy is checked content (no race with an agent rewriting ``token_file``), mode 0600,
    and removed again at once; the lock keeps two sources from racing on the variable.
    """
    path = directory / "bearer-token"
    with _ENV_LOCK:
        old = os.environ.get("BEARER_TOKEN_FILE")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(token)
        os.environ["BEARER_TOKEN_FILE"] = str(path)
        try:
            yield
        finally:
            if old is None:
                os.environ.pop("BEARER_TOKEN_FILE", None)
            else:
                os.environ["BEARER_TOKEN_FILE"] = old
            path.unlink(missing_ok=True)


def _path(path: Path | None) -> str | None:
    return None if path is None else str(path)


def _as_list(fn: Callable[..., Iterable[Any]], *args: Any, **kwargs: Any) -> list[Any]:
    """Call a listing method and read its whole (streamed) answer inside the retry loop."""
    return list(fn(*args, **kwargs))


def _younger(at: datetime, now: datetime, max_age_s: float) -> bool:
    """True if what was read ``at`` is less than ``max_age_s`` old at ``now`` (a time in the
    future, the clock having gone back, is not trusted: False)."""
    return 0 <= (now - at).total_seconds() < max_age_s


def _validated(schema: _LineSchema[R], record: Any) -> R | None:
    """One untrusted record as ``schema`` reads it; None (logged) when malformed."""
    try:
        return schema.one.validate_python(record)
    except ValidationError as exc:
        log.debug("rucio: skipping a malformed record: %s", exc)
        return None


def _line(exc: Exception) -> str:
    """The first line of a library error, redacted (it may quote a header or a URL)."""
    text = str(exc).strip().splitlines()
    return redact(text[0])[:200] if text else type(exc).__name__
