"""The Rucio source: which datasets each site holds, from a Rucio server via rucio-clients.

The only module that imports ``rucio``. One :meth:`RucioSource.fetch` makes these calls:

1. ``list_rses(rse_expression)``: the RSEs that count (default ``rse_type=DISK``: data only on
   tape is not available to a job);
2. ``list_rse_attributes(rse)`` for each RSE not named in ``[sites]``: its ``site`` attribute.
   An RSE with neither is logged once, listed in ``Snapshot.unmapped`` and ignored;
3. ``list_datasets_per_rse(rse)`` for each mapped RSE: the dataset summary table
   (``collection_replicas``: state, length, available_length per dataset and RSE);
4. ``list_replication_rules({"state": "R"})`` and ``{"state": "S"}``: the REPLICATING and STUCK
   rules, with exact lock counts (``locks_ok_cnt`` ...) kept by the rule engine;
5. ``list_rses(expr)`` once per distinct expression of those rules that concern a dataset
   listed in step 3 and are not simply the name of a mapped RSE;
6. for at most ``deep_check_limit`` datasets, one exact listing each:
   ``list_dataset_replicas(scope, name, deep=True)`` (per RSE), or ``list_replicas`` (per file)
   when the dataset has summary rows at two or more RSEs of one site.

The two bulk listings (steps 3 and 4) are sent as rucio-clients sends them (its URL, session,
token and headers) but their bodies are read here: validated a chunk of lines at a time with
one pydantic call (record by record only when a chunk holds a malformed one), instead of
rucio-clients' ``json.loads`` per line with a date-parsing hook, which was most of a fetch at a
million rows. An RSE whose summary answer is byte-identical to the last fetch's (SHA-256)
reuses the rows parsed then, and each dataset id is one object per dataset across fetches.

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
be exact but one call per dataset. Only datasets placed by a dataset (or container) rule have
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

import hashlib
import json
import logging
import os
import shutil
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache, partial
from pathlib import Path
from typing import Any, Protocol, TypeVar
from urllib.parse import quote

import requests
from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError
from rucio.client import Client
from rucio.common import exception as rucio_exc
from rucio.common.utils import build_url

from hydrator.adapters.retry import RetryPolicy, call_with_retries, parse_retry_after
from hydrator.adapters.sources import FetchContext
from hydrator.config import RucioSourceConfig
from hydrator.domain import (
    DatasetId,
    InvalidNameError,
    Replica,
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


class _CountsRow(_Payload):
    """A dataset's files and bytes, all and available, as Rucio's dataset listings give them."""

    length: int | None = None
    available_length: int | None = None
    bytes: int | None = None
    available_bytes: int | None = None


class _DatasetRow(_CountsRow):
    """One row of ``list_datasets_per_rse`` (the ``collection_replicas`` summary)."""

    scope: str
    name: str
    state: str


class _RuleRow(_Payload):
    """The fields of a replication rule this source uses."""

    scope: str
    name: str
    did_type: str
    rse_expression: str
    state: str
    locks_ok_cnt: int
    locks_replicating_cnt: int
    locks_stuck_cnt: int


class _DeepRow(_CountsRow):
    """One row of ``list_dataset_replicas(deep=True)``: exact file counts at one RSE."""

    rse: str


class _FileRow(_Payload):
    """One file of ``list_replicas(all_states=True)``: its size and its state per RSE."""

    bytes: int | None = None
    states: dict[str, str] = {}


P = TypeVar("P", bound=_Payload)


@dataclass(frozen=True, slots=True)  # a million of them live between fetches
class _Counts:
    """Files and bytes of a dataset, and how many of them are present (at an RSE or site)."""

    length: int
    available: int
    bytes: int
    available_bytes: int

    @property
    def files_share(self) -> float:
        return self.available / self.length if self.length > 0 else 0.0

    @property
    def bytes_share(self) -> float:
        return self.available_bytes / self.bytes if self.bytes > 0 else self.files_share


@dataclass(frozen=True, slots=True)  # a million of them live between fetches
class _Row:
    dataset: DatasetId
    rse: str
    available_summary: bool  # the summary row says complete
    counts: _Counts


@dataclass(frozen=True, slots=True)
class _Rule:
    dataset: DatasetId
    expression: str
    transfer: Transfer  # REPLICATING or STUCK
    progress: float  # OK locks / all locks


@dataclass(frozen=True)
class _SiteTransfer:
    """The rules' transfer towards one site for one dataset.

    ``floor`` is the share of files the rules' OK locks prove present at the site (a lock is
    OK when its file replica is AVAILABLE), counted only for rules whose RSEs all belong to
    this site. ``only`` names that rule's RSEs when it is the one rule towards the site: then
    its locks count exactly the files present at them.
    """

    transfer: Transfer
    progress: float
    floor: float = 0.0
    only: frozenset[str] | None = None


class _Counter(Protocol):
    invalid: int  # malformed or invalid records skipped


@dataclass
class _Tally:
    invalid: int = 0


@dataclass
class _Listing:
    """One RSE's summary rows as parsed, and the SHA-256 of the answer they came from."""

    digest: bytes
    rows: list[_Row] = field(default_factory=list)
    invalid: int = 0


def _chunks(lines: Iterable[bytes], size: int = 10_000) -> Iterator[list[bytes]]:
    """``lines`` in lists of ``size`` (bounded memory for a bulk parse)."""
    chunk: list[bytes] = []
    for line in lines:
        chunk.append(line)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


@cache
def _adapter(model: type[P]) -> TypeAdapter[list[P]]:
    return TypeAdapter(list[model])  # type: ignore[valid-type]


@dataclass
class _Cycle:
    """What one fetch has learned so far (mutable scratch space, not shared)."""

    sites: dict[str, Site]  # mapped RSE -> site
    unmapped: set[str]
    invalid: int = 0


def build(config: RucioSourceConfig, sites: Mapping[str, str]) -> RucioSource:
    """The factory the service uses for ``type = "rucio"``; ``sites`` is ``Config.sites``."""
    return RucioSource(config, sites)


class RucioSource:
    """A :class:`~hydrator.adapters.sources.Source` reading one Rucio server.

    ``sleep`` is the backoff clock (seconds). After each fetch,
    ``calls_last_fetch`` maps client method -> API calls made (retries included) and
    ``deep_checks_last_fetch`` / ``deep_checks_skipped_last_fetch`` count exact checks done and
    left out because of ``deep_check_limit``.
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
        self._logged_names: set[str] = set()
        self._logged_unmapped: set[str] = set()
        self._listings: dict[str, _Listing] = {}  # RSE -> its last summary answer, parsed
        self._names: dict[tuple[str, str], DatasetId] = {}  # the last fetch's dataset ids
        self.calls_last_fetch: dict[str, int] = {}
        self.deep_checks_last_fetch = 0
        self.deep_checks_skipped_last_fetch = 0

    @property
    def deferred_last_fetch(self) -> int:
        """Deep checks left to later cycles (the lagging summary was used instead)."""
        return self.deep_checks_skipped_last_fetch

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
        """This cycle's snapshot, or raise Transient/PermanentSourceError (nothing partial)."""
        self._calls = Counter()
        self.deep_checks_last_fetch = self.deep_checks_skipped_last_fetch = 0
        try:
            client = self._connected_client()
            cycle = self._map_rses(client)
            rows = self._summary_rows(client, cycle)
            listed = {(row.dataset.scope, row.dataset.name) for row in rows}
            rules = self._active_rules(client, cycle, listed)
            moving = self._rule_coverage(client, rules, cycle)
            replicas, pending = _classify(rows, moving, cycle.sites)
            replicas += self._deep_checks(client, pending, moving, cycle, context)
        except PermanentSourceError:
            self._client = None  # rebuilt (password file re-read) next cycle
            raise
        finally:
            self.calls_last_fetch = dict(self._calls)
        return Snapshot.of(
            self.name,
            replicas,
            sites=cycle.sites.values(),
            invalid=cycle.invalid,
            unmapped=cycle.unmapped,
        )

    def _map_rses(self, client: Any) -> _Cycle:
        """RSEs of the expression -> site: ``[sites]`` first, else the site attribute."""
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
        for record in found:
            rse = record.get("rse") if isinstance(record, dict) else None
            if not isinstance(rse, str):
                cycle.invalid += 1
                continue
            site = self.site_overrides.get(rse) or self._site_attribute(client, rse)
            if site is None:
                cycle.unmapped.add(rse)
                self._log_unmapped(rse)
            else:
                cycle.sites[rse] = site
        return cycle

    def _site_attribute(self, client: Any, rse: str) -> Site | None:
        attrs = self._call("list_rse_attributes", partial(client.list_rse_attributes, rse))
        value = attrs.get(self.config.site_attribute) if isinstance(attrs, dict) else None
        if value is None:
            return None
        try:
            return check_site(str(value))
        except InvalidNameError:
            log.warning(
                "rucio: RSE %s has an invalid %s attribute %r; ignoring the RSE",
                rse,
                self.config.site_attribute,
                value,
            )
            return None

    def _log_unmapped(self, rse: str) -> None:
        if rse not in self._logged_unmapped:
            self._logged_unmapped.add(rse)
            log.warning(
                "rucio: RSE %s has no %r attribute and no [sites] entry; its datasets are ignored",
                rse,
                self.config.site_attribute,
            )

    def _summary_rows(self, client: Any, cycle: _Cycle) -> list[_Row]:
        """Every dataset row of the summary table at every mapped RSE.

        An RSE whose answer is byte-identical to the last fetch's (same SHA-256) contributes
        the rows parsed then, so an unchanged RSE costs its transfer and a hash.
        """
        rows: list[_Row] = []
        names: dict[tuple[str, str], DatasetId] = {}
        for rse in sorted(cycle.sites):
            path = f"{_REPLICAS}/rse/{quote(rse, safe='')}"
            listing = self._call(
                "list_datasets_per_rse", partial(self._rse_listing, client, path, rse, names)
            )
            cycle.invalid += listing.invalid
            rows += listing.rows
            self._listings[rse] = listing  # at once: the old rows need not outlive this RSE
        for rse in self._listings.keys() - cycle.sites.keys():
            del self._listings[rse]
        self._names = names
        return rows

    def _rse_listing(
        self, client: Any, path: str, rse: str, names: dict[tuple[str, str], DatasetId]
    ) -> _Listing:
        body = self._get(client, path).content
        listing = _Listing(hashlib.sha256(body).digest())
        known = self._listings.get(rse)
        if known is not None and known.digest == listing.digest:
            names.update(((r.dataset.scope, r.dataset.name), r.dataset) for r in known.rows)
            return known
        for chunk in _chunks(body.splitlines()):
            for row in self._parse_all(_DatasetRow, chunk, listing):
                dataset = self._interned(row, names, listing)
                if dataset is None:
                    continue
                counts = _Counts(
                    row.length or 0,
                    row.available_length or 0,
                    row.bytes or 0,
                    row.available_bytes or 0,
                )
                complete = row.state == "AVAILABLE" and counts.available >= counts.length > 0
                listing.rows.append(_Row(dataset, rse, complete, counts))
        return listing

    def _active_rules(
        self, client: Any, cycle: _Cycle, listed: set[tuple[str, str]]
    ) -> list[_Rule]:
        """The transfers of the REPLICATING and STUCK rules on the ``listed`` datasets.

        Rules are listed for the whole server (state filter by one-letter code); those on other
        datasets are irrelevant here and skipped without validation (their names are not this
        source's to count), as are container rules (their datasets get a deep check). The
        transfer follows the lock counts, which the rule engine keeps current, before the
        rule's state, which waits for the judge: any STUCK lock -> stuck, else any
        REPLICATING lock -> replicating, all locks OK -> no transfer (done).
        """
        rules: list[_Rule] = []
        for code in ("R", "S"):
            tally = _Tally()
            records = self._call(
                "list_replication_rules", partial(self._rule_listing, client, code, tally)
            )
            cycle.invalid += tally.invalid
            for rule in records:
                if rule.did_type != "DATASET":
                    continue
                if (rule.scope, rule.name) not in listed:
                    continue
                transfer = _transfer(rule, code)
                if transfer is Transfer.NONE:
                    continue
                dataset = DatasetId(rule.scope, rule.name)  # valid: a listed row has it
                total = rule.locks_ok_cnt + rule.locks_replicating_cnt + rule.locks_stuck_cnt
                progress = min(1.0, max(0.0, rule.locks_ok_cnt / total)) if total > 0 else 0.0
                rules.append(_Rule(dataset, rule.rse_expression, transfer, progress))
        return rules

    def _rule_coverage(
        self, client: Any, rules: list[_Rule], cycle: _Cycle
    ) -> dict[tuple[Site, DatasetId], _SiteTransfer]:
        """(site, dataset) -> the transfer towards the site, for the mapped RSEs each rule's
        expression covers (several rules: :func:`_merge_transfers`).

        Only rules on datasets with a summary row at a mapped RSE are passed in. An expression
        that is just one of those RSE names needs no call; others are resolved once each.
        """
        resolved: dict[str, frozenset[str]] = {}
        covered: dict[tuple[Site, DatasetId], _SiteTransfer] = {}
        for rule in rules:
            if rule.expression not in resolved:
                resolved[rule.expression] = self._resolve(client, rule.expression, cycle)
            rses = resolved[rule.expression]
            at = {cycle.sites[rse] for rse in rses}
            single = len(at) == 1  # the rule's locks are all at one site
            for site in at:
                new = _SiteTransfer(
                    rule.transfer,
                    rule.progress,
                    rule.progress if single else 0.0,
                    rses if single else None,
                )
                old = covered.get((site, rule.dataset))
                covered[(site, rule.dataset)] = new if old is None else _merge_transfers(old, new)
        return covered

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

    def _deep_checks(
        self, client: Any, pending: _Pending, moving: _Moving, cycle: _Cycle, context: FetchContext
    ) -> list[Replica]:
        """Exact presence for the (site, dataset) pairs the summary cannot settle: most wanted
        datasets first, then those no rule's locks vouch for. Beyond ``deep_check_limit`` the
        lagging summary (or the locks, where they prove more) is used."""

        def order(dataset: DatasetId) -> tuple[int, bool, DatasetId]:
            vouched = any(
                (m := moving.get((site, dataset))) is not None and m.floor > 0
                for site in pending[dataset]
            )
            return (-context.wanted.get(dataset, 0), vouched, dataset)

        ordered = sorted(pending, key=order)
        limit = self.config.deep_check_limit
        replicas: list[Replica] = []
        for dataset in ordered[limit:]:
            for site, rows in pending[dataset].items():
                replicas += _fallback(dataset, site, rows, moving.get((site, dataset)))
        self.deep_checks_skipped_last_fetch = max(0, len(ordered) - limit)
        if self.deep_checks_skipped_last_fetch:
            log.warning(
                "rucio: %d datasets over deep_check_limit=%d used the lagging summary",
                self.deep_checks_skipped_last_fetch,
                limit,
            )
        for dataset in ordered[:limit]:
            replicas += self._checked(client, dataset, pending[dataset], moving, cycle)
        self.deep_checks_last_fetch = min(limit, len(ordered))
        return replicas

    def _checked(
        self,
        client: Any,
        dataset: DatasetId,
        sites: Mapping[Site, list[_Row]],
        moving: _Moving,
        cycle: _Cycle,
    ) -> list[Replica]:
        """One exact listing for ``dataset``: per file when some site has summary rows at two
        or more of its RSEs (the union needs to know which files they share), else per RSE."""
        if any(len(rows) > 1 for rows in sites.values()):
            exact = self._file_union(client, dataset, cycle)
        else:
            exact = self._deep_counts(client, dataset, cycle)
        replicas: list[Replica] = []
        for site in sites:
            counts = exact.get(site, _NOTHING)
            found = _replica(
                dataset, site, counts.files_share, counts.bytes_share, moving.get((site, dataset))
            )
            replicas += [found] if found is not None else []
        return replicas

    def _deep_counts(self, client: Any, dataset: DatasetId, cycle: _Cycle) -> dict[Site, _Counts]:
        """Site -> files and bytes of one dataset present there, from the file replicas
        (``list_dataset_replicas(deep=True)``, per RSE; several RSEs of a site: the best, a
        lower bound, as this listing cannot tell which files they share)."""
        records = self._call(
            "list_dataset_replicas",
            partial(_as_list, client.list_dataset_replicas, dataset.scope, dataset.name, deep=True),
        )
        counts: dict[Site, _Counts] = {}
        for record in records:
            row = self._parse(_DeepRow, record, cycle)
            site = cycle.sites.get(row.rse) if row is not None else None
            if row is None or site is None:
                continue
            found = _Counts(
                row.length or 0, row.available_length or 0, row.bytes or 0, row.available_bytes or 0
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

    def _rule_listing(self, client: Any, code: str, tally: _Tally) -> list[_RuleRow]:
        """The rules in state ``code``, validated (malformed ones counted in ``tally``), read
        a chunk of lines at a time as the answer streams in: a million rules are about a
        gigabyte of JSON."""
        tally.invalid = 0  # a retried call starts again
        response = self._get(client, f"{_RULES}/", {"state": code}, stream=True)
        rules: list[_RuleRow] = []
        for chunk in _chunks(response.iter_lines(chunk_size=_READ_BYTES)):
            rules += self._parse_all(_RuleRow, chunk, tally)
        return rules

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

    def _parse_all(self, model: type[P], lines: list[bytes], tally: _Counter) -> list[P]:
        """Validate a chunk of JSON lines at once (one pydantic call, which reads the JSON
        itself); if any record is malformed, record by record, counting and skipping the bad
        ones. A line that is not JSON raises ``JSONDecodeError`` (a broken answer: transient,
        as when rucio-clients read it)."""
        lines = [line for line in lines if line.strip()]
        try:
            return _adapter(model).validate_json(b"[" + b",".join(lines) + b"]")
        except ValidationError:
            pass
        parsed = [self._parse(model, json.loads(line), tally) for line in lines]
        return [p for p in parsed if p is not None]

    def _interned(
        self, row: _DatasetRow, names: dict[tuple[str, str], DatasetId], tally: _Counter
    ) -> DatasetId | None:
        """The row's dataset id, one object per dataset: the last fetch's (checked then) or
        checked now (None when out of scope, or invalid: counted in ``tally``, logged once)."""
        key = (row.scope, row.name)
        found = names.get(key) or self._names.get(key)
        if found is None:
            found = self._dataset(row, tally)
            if found is None:
                return None
        names[key] = found
        return found

    def _parse(self, model: type[P], record: Any, tally: _Counter) -> P | None:
        """Validate one untrusted record; a malformed one is counted and skipped."""
        try:
            return model.model_validate(record)
        except ValidationError as exc:
            tally.invalid += 1
            log.debug("rucio: skipping a malformed %s record: %s", model.__name__, exc)
            return None

    def _dataset(self, record: _DatasetRow, tally: _Counter) -> DatasetId | None:
        """The record's dataset id, or None when out of scope or invalid (counted, logged once)."""
        if self.config.scopes and record.scope not in self.config.scopes:
            return None
        try:
            return DatasetId(record.scope, record.name)
        except InvalidNameError as exc:
            tally.invalid += 1
            key = f"{record.scope}:{record.name}"
            if key not in self._logged_names and len(self._logged_names) < _MAX_LOGGED_NAMES:
                self._logged_names.add(key)
                log.warning("rucio: skipping a dataset with an invalid name: %s", exc)
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


_Pending = dict[DatasetId, dict[Site, list[_Row]]]  # dataset -> site -> its summary rows there
_Moving = Mapping[tuple[Site, DatasetId], _SiteTransfer]
_NOTHING = _Counts(0, 0, 0, 0)


def _transfer(rule: _RuleRow, code: str) -> Transfer:
    """A rule's transfer from its lock counts; its listed state only when it has no locks."""
    if rule.locks_stuck_cnt > 0:
        return Transfer.STUCK
    if rule.locks_replicating_cnt > 0:
        return Transfer.REPLICATING
    if rule.locks_ok_cnt > 0:
        return Transfer.NONE  # every lock OK: done, though the judge has not re-evaluated yet
    return Transfer.STUCK if code == "S" else Transfer.REPLICATING


def _merge_transfers(a: _SiteTransfer, b: _SiteTransfer) -> _SiteTransfer:
    """Two rules towards one site: a stuck one wins (it needs an operator), then progress."""
    rank = {Transfer.NONE: 0, Transfer.REPLICATING: 1, Transfer.STUCK: 2}
    first = a if (rank[a.transfer], a.progress) >= (rank[b.transfer], b.progress) else b
    return _SiteTransfer(first.transfer, first.progress, max(a.floor, b.floor))  # not "only"


def _classify(
    rows: Iterable[_Row], moving: _Moving, sites: Mapping[str, Site]
) -> tuple[list[Replica], _Pending]:
    """Settle each (site, dataset) whose summary says complete at one of the site's RSEs
    (presence wins over any transfer), or that one rule's locks count exactly (the rule's RSEs
    are all at the site and hold every summary row of the site; the bytes share is taken to be
    the files share); return the others, with the pairs only a rule names, as pending
    (``list_datasets_per_rse`` rows per RSE are not a union over a site's RSEs)."""
    by_key: dict[tuple[Site, DatasetId], list[_Row]] = {}
    for row in rows:
        by_key.setdefault((sites[row.rse], row.dataset), []).append(row)
    for key in moving:
        by_key.setdefault(key, [])
    replicas: list[Replica] = []
    pending: _Pending = {}
    for key, here in by_key.items():
        site, dataset = key
        rule = moving.get(key)
        # most pairs have one row: test it without a generator (a million pairs per fetch)
        if here and (here[0].available_summary or any(row.available_summary for row in here)):
            found = _replica(dataset, site, 1.0, 1.0, rule)
        elif rule is not None and rule.only is not None and all(r.rse in rule.only for r in here):
            found = _replica(dataset, site, rule.floor, rule.floor, rule)
        else:
            pending.setdefault(dataset, {})[site] = here
            continue
        replicas += [found] if found is not None else []
    return replicas, pending


def _replica(
    dataset: DatasetId, site: Site, files: float, bytes_: float, moving: _SiteTransfer | None
) -> Replica | None:
    if moving is None:
        return holding(dataset, site, files, bytes_)
    return holding(dataset, site, files, bytes_, transfer=moving.transfer, progress=moving.progress)


def _fallback(
    dataset: DatasetId, site: Site, rows: list[_Row], moving: _SiteTransfer | None
) -> list[Replica]:
    """Without a deep check: the best summary row of the site's RSEs (a lower bound that lags),
    or the share of files the rules' OK locks prove present, whichever shows more."""
    best = max((row.counts for row in rows), key=lambda c: c.available, default=_NOTHING)
    files, bytes_ = best.files_share, best.bytes_share
    if moving is not None and moving.floor > files:
        files = bytes_ = moving.floor  # locks count files, not bytes: the file share stands in
    found = _replica(dataset, site, files, bytes_, moving)
    return [found] if found is not None else []


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


def _line(exc: Exception) -> str:
    """The first line of a library error, redacted (it may quote a header or a URL)."""
    text = str(exc).strip().splitlines()
    return redact(text[0])[:200] if text else type(exc).__name__
