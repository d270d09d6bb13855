"""The SKA SRCNet Data Management API (DMAPI) as a catalogue source.

What this adapter relies on, and where it comes from (no public DMAPI server or OpenAPI
document exists; the shapes below are those its public callers use):

- ``GET {base_url}/data/locate/{namespace}/{name}`` with ``Authorization: Bearer <token>``
  answers a JSON list, one entry per storage element holding replicas::

      [{"identifier": "<RSE name>", "associated_storage_area_id": "<uuid>",
        "replicas": ["davs://host:port/path", ...], "is_dataset": false}]

  (ska-telescope/ska-src-clients ``api/data.py``; astroquery ``srcnet/core.py``; the SRCNet
  path-finder models, which also show ``is_dataset``; the datalink service also sees
  ``colocated_services``). Optional query parameters ``sort`` and ``ip_address`` only order
  the answer, so none are sent. The namespace is the Rucio scope.
- ``GET {site_capabilities_url}/nodes`` answers ``[{"name", "sites": [{"id", "name",
  "storages": [{"id", "areas": [{"id", "name", "type", ...}]}]}]}]`` (path-finder models,
  ska-src-site-capabilities-api). A storage area ``id`` is what a locate entry's
  ``associated_storage_area_id`` names; the SRCNet site ``name`` becomes our site.
- Tokens: services use an OAuth2 ``client_credentials`` grant at SKA IAM
  (``https://ska-iam.stfc.ac.uk/token``) with form fields ``audience`` and ``scope``; the
  datalink service asks for audience ``data-management-api``. The Site Capabilities API wants
  audience ``site-capabilities-api`` and scope ``site-capabilities-api-service`` (its README),
  so it gets its own token. Client authentication is HTTP Basic (RFC 6749 §2.3.1; what
  authlib, used by the datalink service, sends by default). Users instead exchange a login
  token at the Auth API (``/token/exchange/{service}``); a token obtained that way can be
  given to this adapter as a static ``token_file``.

Where the documentation is silent (choices made here, see the comments at each place):
the status for an unknown DID (taken as 404: located nowhere), the status for an expired or
wrong token (401 retried once with a fresh token; 403 taken as "not allowed to see this
dataset"), and whether a listed RSE holds *all* files of a dataset. Of the two facts
the hydrator keeps per (dataset, site), the API answers only presence, and only as "listed or
not": an entry with replica URLs is reported complete (AVAILABLE), one without is absent; it
reports no completeness, rule or transfer state, so the transfer is always none and this
source never produces PARTIAL, REPLICATING or STUCK entries. Merged with a Rucio source for
the same site, its presence and Rucio's transfer are combined fact by fact
(:func:`hydrator.domain.combine`).

Cost: one locate request per dataset, as the API has no bulk query. A dataset never located
before is located in the cycle it appears; of those located before, at most
``max_relocates_per_cycle`` are located again per cycle, longest-unchecked first, and the others
keep their last answer. With 50,000 datasets wanted and the default 1000, each is re-checked
every 50 cycles while a new one is seen at once; the answer kept is in memory only, so the
first cycle after a start locates everything.

Errors: any locate that still fails after its retries fails the whole fetch
(TransientSourceError), because a dataset whose locate failed must not vanish from the sites
that hold it. Authentication failures and malformed answers are PermanentSourceError.

What counts as an answer (issue 26, item 5): a 200 must say it is JSON (``Content-Type``
``application/json`` or ``+json``); an HTML page from a gateway is not an empty list. A fetch
whose every locate answered 404, or whose every entry is malformed, fails
(PermanentSourceError): a wrong ``base_url`` or a broken ingress looks exactly like that, and
must not empty the sites. A single 404 among datasets that were found is "located nowhere".

Bounds (issue 26, items 3 and 4): the whole fetch (tokens, /nodes, locates, retry waits) ends
at ``deadline_s`` (TransientSourceError), and no answer body is read beyond
``max_answer_bytes`` (PermanentSourceError); see :mod:`._http` for how.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote

from hydrator.adapters.sources import OnceLog, site_or_none
from hydrator.adapters.sources._http import Answer, HttpClient, RetryPolicy, Run
from hydrator.adapters.sources._site_capabilities import (
    NODES_QUERY,
    children,
    storage_statements,
)
from hydrator.config import DmapiSourceConfig
from hydrator.core.ports import FetchContext
from hydrator.core.storage import Statement, judge
from hydrator.domain import (
    DatasetId,
    InvalidNameError,
    Replica,
    ReplicaState,
    Site,
    Snapshot,
    StorageStatus,
)
from hydrator.errors import PermanentSourceError, TransientSourceError
from hydrator.redact import checked_secret, read_secret

log = logging.getLogger(__name__)

Clock = Callable[[], float]
# RFC 6749 §5.1 makes expires_in only RECOMMENDED; without it, assume this lifetime.
DEFAULT_TOKEN_LIFETIME_S = 300.0
MAX_NAME_CHARS = 200  # of a server-given name in a list or a log line
# for locates to end once their connections were shut at the deadline (milliseconds, in
# practice); less than the service's own grace (runtime.fetching.GRACE_S), so that this
# source reports its deadline itself rather than being abandoned
DEADLINE_GRACE_S = 0.5


# --------------------------------------------------------------------------- tokens


class TokenProvider(Protocol):
    """Gives a bearer token; ``invalidate`` drops one the server refused (HTTP 401)."""

    def token(self, run: Run) -> str: ...

    def invalidate(self, token: str) -> None: ...


class StaticToken:
    """A bearer token kept in a file by someone else (re-read each cycle and after a 401)."""

    def __init__(self, path: Path, what: str) -> None:
        self._path = path
        self._what = what
        self._lock = threading.Lock()
        self._token: str | None = None

    def token(self, run: Run) -> str:
        with self._lock:
            if self._token is None:
                self._token = read_secret(self._path, self._what)
            return self._token

    def invalidate(self, token: str) -> None:
        with self._lock:
            if self._token == token:
                self._token = None

    def reset(self) -> None:
        """Forget the cached token so the next use re-reads the file (once per cycle)."""
        with self._lock:
            self._token = None


class ClientCredentials:
    """OAuth2 client-credentials tokens for one audience, refreshed before they expire.

    The grant itself (request, client authentication, answer) is authlib's, through
    :meth:`HttpClient.client_credentials`; the expiry is judged on ``clock`` (authlib's own
    check reads the wall clock). A new token is fetched when
    ``clock() >= expires_at - margin_s`` (monotonic seconds). Concurrent callers share one
    refresh (the lock is held while fetching). The margin is at most half the token's
    lifetime: with ``expires_in`` at or below ``margin_s``, every request used to fetch a new
    token (31 grants for 30 locates, issue 26 item 10).
    """

    def __init__(
        self,
        http: HttpClient,
        *,
        token_url: str,
        id_file: Path,
        secret_file: Path,
        audience: str,
        scope: str,
        margin_s: float,
        clock: Clock = time.monotonic,
    ) -> None:
        self._http, self._url = http, token_url
        self._id_file, self._secret_file = id_file, secret_file
        self._audience, self._scope = audience, scope
        self._margin_s, self._clock = margin_s, clock
        self._lock = threading.Lock()
        self._token: str | None = None
        self._refresh_at = 0.0

    def token(self, run: Run) -> str:
        with self._lock:
            if self._token is None or self._clock() >= self._refresh_at:
                self._token, lifetime_s = self._fetch(run)
                margin_s = min(self._margin_s, lifetime_s / 2)
                self._refresh_at = self._clock() + lifetime_s - margin_s
            return self._token

    def invalidate(self, token: str) -> None:
        with self._lock:
            if self._token == token:
                self._token = None

    def _fetch(self, run: Run) -> tuple[str, float]:
        """A new token and its lifetime (seconds), by authlib's client-credentials grant.

        The client id and secret are re-read from their files at every grant (rotation needs
        no restart); the token is checked (:func:`checked_secret`) before it is used.
        """
        label = f"token for audience {self._audience!r}"
        client_id = read_secret(self._id_file, "client id")
        client = (client_id, read_secret(self._secret_file, "client secret"))
        form = {"audience": self._audience}
        if self._scope:
            form["scope"] = self._scope
        body = self._http.client_credentials(self._url, run, label=label, client=client, form=form)
        token = body.get("access_token")
        if not isinstance(token, str) or not token:
            raise PermanentSourceError(f"{label}: token endpoint answer has no access_token")
        checked_secret(token, f"{label}: the access_token from the token endpoint {self._url}")
        expires_in = body.get("expires_in")
        if not isinstance(expires_in, int | float) or isinstance(expires_in, bool):
            expires_in = DEFAULT_TOKEN_LIFETIME_S
        log.info("obtained a %s valid for %.0f s", label, expires_in)
        return token, float(expires_in)


# --------------------------------------------------------------------------- parsing


@dataclass(frozen=True)
class Location:
    """One entry of a locate answer that names a storage element holding replicas."""

    identifier: str  # the RSE name
    storage_area_id: str | None
    has_replicas: bool


def parse_location(entry: object) -> Location | None:
    """A locate entry as a :class:`Location`, or None when it is malformed."""
    if not isinstance(entry, dict):
        return None
    identifier = entry.get("identifier")
    area = entry.get("associated_storage_area_id")
    replicas = entry.get("replicas")
    if not isinstance(identifier, str) or not identifier:
        return None
    if area is not None and not isinstance(area, str):
        return None
    if not isinstance(replicas, list) or not all(isinstance(r, str) for r in replicas):
        return None
    return Location(identifier, area or None, bool(replicas))


@dataclass(frozen=True)
class NodesMap:
    """Storage-area id -> site from /nodes, plus site names that were not valid sites; and per
    storage-area id what the API states of its availability (:func:`storage_statements`), with
    the entries that could not be read."""

    areas: Mapping[str, Site]
    bad_sites: frozenset[str]
    statements: Mapping[str, Statement] = field(default_factory=dict)
    bad_downtimes: frozenset[str] = frozenset()


def parse_nodes(body: object) -> NodesMap:
    """Map every storage area id listed under nodes -> sites -> storages -> areas to its site.

    Pieces of the wrong type are skipped; a site name that is not a valid :data:`Site` is
    reported in ``bad_sites`` and its areas left unmapped. Raise PermanentSourceError if the
    answer is not a list.
    """
    if not isinstance(body, list):
        raise PermanentSourceError("site capabilities /nodes: answer is not a JSON list")
    areas: dict[str, Site] = {}
    bad: set[str] = set()
    for site in children(body, "sites"):
        site_name = site_or_none(site.get("name"))
        if site_name is None:
            bad.add(repr(site.get("name")))
            continue
        for storage in children(site.get("storages"), None):
            for area in children(storage.get("areas"), None):
                if isinstance(area.get("id"), str) and area["id"]:
                    areas[area["id"]] = site_name
    statements, bad_downtimes = storage_statements(body)
    return NodesMap(areas, frozenset(bad), statements, frozenset(bad_downtimes))


# ---- availability (issue 24): what /nodes states is read by _site_capabilities.py


def storage_statuses(
    nodes: NodesMap | None,
    results: Mapping[DatasetId, LocateResult],
    context: FetchContext,
) -> tuple[StorageStatus, ...]:
    """Every storage area /nodes lists, judged at ``context.now`` with the operator's drains
    (:func:`hydrator.core.storage.judge`); an unavailable one counts the wanted datasets it
    holds."""
    if nodes is None:
        return ()
    held: dict[str, set[DatasetId]] = {}
    for dataset, result in results.items():
        if isinstance(result, list) and dataset in context.wanted:
            for location in result:
                if location is not None and location.storage_area_id is not None:
                    held.setdefault(location.storage_area_id, set()).add(dataset)
    return tuple(
        judge(stated, context.drains, context.now, len(held.get(area_id, ())))
        for area_id, stated in nodes.statements.items()
    )


def _check_not_all_refused(results: Mapping[DatasetId, LocateResult]) -> None:
    """One refused dataset is skipped; every one refused is an access problem of ours."""
    rejected = [r.status for r in results.values() if isinstance(r, _Rejected)]
    if results and len(rejected) == len(results):
        raise PermanentSourceError(
            f"every locate was refused (HTTP {sorted(set(rejected))}); check access"
        )


def _json(resp: Answer, label: str) -> Any:
    """The answer's JSON body; PermanentSourceError if it is not JSON or not labelled JSON
    (a gateway's HTML error page with status 200 is no answer: issue 26, item 5)."""
    kind = resp.headers.get("Content-Type", "").partition(";")[0].strip().lower()
    structured = kind.startswith("application/") and kind.endswith("+json")  # RFC 6839
    if kind != "application/json" and not structured:
        raise PermanentSourceError(
            f"{label}: HTTP {resp.status_code} answer is {kind[:60] or 'untyped'!r}, not JSON"
        )
    try:
        return resp.json()
    except ValueError as exc:  # JSONDecodeError is a ValueError
        raise PermanentSourceError(f"{label}: HTTP {resp.status_code} body is not JSON") from exc


def _unavailable_areas(
    nodes: NodesMap | None, statuses: tuple[StorageStatus, ...]
) -> frozenset[str]:
    """Ids of the storage areas ``statuses`` says cannot serve."""
    if nodes is None:
        return frozenset()
    down = {(s.site, s.storage) for s in statuses if not s.available}
    return frozenset(
        area_id for area_id, st in nodes.statements.items() if (st.site, st.storage) in down
    )


# --------------------------------------------------------------------------- the source


@dataclass(frozen=True)
class _Rejected:
    """A locate the API refused for this dataset alone (HTTP 4xx other than 401, 404, 408, 429)."""

    status: int


@dataclass(frozen=True)
class _NotFound:
    """A locate answered 404: the DID is unknown, located nowhere."""


NOT_FOUND = _NotFound()
LocateResult = list[Location | None] | _Rejected | _NotFound  # None: a malformed entry


def _check_answers(located: Mapping[DatasetId, LocateResult]) -> None:
    """Raise PermanentSourceError when this fetch's locates, all of them, answered 404, or
    every entry they listed is malformed: no catalogue answer looks like that (issue 26)."""
    if not located:
        return
    if all(isinstance(r, _NotFound) for r in located.values()):
        raise PermanentSourceError(
            f"every locate ({len(located)}) answered HTTP 404: a wrong base_url or a broken "
            "gateway? (taken as no answer, not as an empty catalogue)"
        )
    entries = [e for r in located.values() if isinstance(r, list) for e in r]
    if entries and all(e is None for e in entries):
        raise PermanentSourceError(
            f"every locate entry ({len(entries)}) is malformed (taken as no answer)"
        )


class DmapiSource:
    """Locates a list of datasets through the DMAPI; one instance per configured source.

    After each :meth:`fetch`, ``calls_last_fetch`` is the number of HTTP requests it sent
    (token, /nodes, locate, retries included) and ``seconds_last_fetch`` its duration.
    """

    def __init__(
        self,
        config: DmapiSourceConfig,
        sites: Mapping[str, str],
        clock: Clock = time.monotonic,
    ) -> None:
        self._config = config
        self._overrides = {element: Site(site) for element, site in sites.items()}
        self._clock = clock
        policy = RetryPolicy(
            config.max_attempts, config.backoff_s, config.max_backoff_s, config.max_retry_after_s
        )
        verify: bool | str = str(config.ca_cert) if config.ca_cert else True
        self._http = HttpClient(
            policy, config.timeout_s, verify, config.max_concurrency, config.max_answer_bytes
        )
        self._dm_token = self._token_provider(config.audience, config.scope, config.token_file)
        self._sc_token: TokenProvider | None = None
        if config.site_capabilities_url is not None:
            self._sc_token = self._token_provider(
                config.site_capabilities_audience,
                config.site_capabilities_scope,
                config.site_capabilities_token_file,
            )
        self._pool = ThreadPoolExecutor(config.max_concurrency, f"dmapi-{config.name}")
        self._nodes: NodesMap | None = None
        self._nodes_at = 0.0
        self._problems = OnceLog(log)
        self._fetches = 0
        self._known: dict[DatasetId, tuple[LocateResult, int]] = {}  # answer, fetch number
        self.calls_last_fetch = 0
        self.seconds_last_fetch = 0.0
        self.deferred_last_fetch = 0  # known datasets not located again (over the budget)

    @property
    def name(self) -> str:
        return self._config.name

    def close(self) -> None:
        # not waiting: a locate may still sit in a read that its deadline is about to end
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._http.close()

    def fetch(self, context: FetchContext) -> Snapshot:
        """Locate this cycle's datasets; raise TransientSourceError if any locate failed or
        ``deadline_s`` passed."""
        started = time.monotonic()
        run = Run(deadline=started + self._config.deadline_s)
        try:
            with run.watchdog():
                return self._fetch(context, run)
        finally:
            self.calls_last_fetch = run.calls
            self.seconds_last_fetch = time.monotonic() - started

    def _fetch(self, context: FetchContext, run: Run) -> Snapshot:
        try:
            for provider in (self._dm_token, self._sc_token):
                if isinstance(provider, StaticToken):
                    provider.reset()
            datasets, invalid = self._targets(context)
            due = self._due(datasets)
            nodes = self._site_capabilities(run)
            if due:
                self._dm_token.token(run)  # fail here, once, rather than in every worker
            located = self._locate_all(due, run)
            _check_answers(located)
            self._fetches += 1
            known = {d: self._known[d] for d in datasets if d in self._known}
            known.update((d, (result, self._fetches)) for d, result in located.items())
            self._known = known  # also forgets the datasets no longer wanted
            results = {d: result for d, (result, _) in known.items()}
            _check_not_all_refused(results)
            return self._snapshot(results, nodes, invalid, context)
        except TransientSourceError as exc:
            if run.expired:
                raise TransientSourceError(
                    f"no answer within deadline_s = {self._config.deadline_s:g} s ({exc})"
                ) from exc
            raise

    # ---- what to locate

    def _targets(self, context: FetchContext) -> tuple[list[DatasetId], int]:
        """Configured datasets plus (if enabled) queued jobs' ones, sorted; and bad-name count."""
        wanted: set[DatasetId] = set()
        invalid = 0
        for text in self._config.datasets:
            try:
                wanted.add(DatasetId.parse(text))
            except InvalidNameError as exc:
                invalid += 1
                self._problems.warn(f"config:{text}", "skipping configured dataset: %s", exc)
        if self._config.datasets_from_queue:
            wanted.update(context.wanted)
        return sorted(wanted), invalid

    def _due(self, datasets: list[DatasetId]) -> list[DatasetId]:
        """Those to locate this fetch: every new one, then the budget, longest-unchecked first."""
        new = [d for d in datasets if d not in self._known]
        known = sorted((d for d in datasets if d in self._known), key=lambda d: self._known[d][1])
        budget = self._config.max_relocates_per_cycle
        self.deferred_last_fetch = max(0, len(known) - budget) if budget else 0
        if self.deferred_last_fetch:
            log.debug("%s: locating %d of %d known datasets again", self.name, budget, len(known))
            known = known[:budget]
        return new + known

    # ---- storage areas -> sites

    def _site_capabilities(self, run: Run) -> NodesMap | None:
        """The /nodes map, fetched at most once per ``site_capabilities_ttl_s``.

        If a refresh fails and an older map exists, the older map is used (storage areas
        rarely move); with no map at all the error propagates and the fetch fails.
        """
        url = self._config.site_capabilities_url
        if url is None or self._sc_token is None:
            return None
        age_s = self._clock() - self._nodes_at
        if self._nodes is not None and age_s < self._config.site_capabilities_ttl_s:
            return self._nodes
        try:
            nodes_url = f"{url.rstrip('/')}/nodes{NODES_QUERY}"
            resp = self._authorized_get(nodes_url, self._sc_token, run, "/nodes")
            if resp.status_code != 200:
                raise PermanentSourceError(f"site capabilities /nodes: HTTP {resp.status_code}")
            nodes = parse_nodes(_json(resp, "site capabilities /nodes"))
        except (TransientSourceError, PermanentSourceError) as exc:
            if self._nodes is None:
                raise
            log.warning("%s; using the storage-area map fetched earlier", exc)
            return self._nodes
        for bad in nodes.bad_sites:
            self._problems.warn(
                f"site:{bad}", "site capabilities: ignoring invalid site name %s", bad
            )
        for bad in nodes.bad_downtimes:
            self._problems.warn(f"downtime:{bad}", "site capabilities: skipping downtime %s", bad)
        self._nodes, self._nodes_at = nodes, self._clock()
        return nodes

    def _site_for(self, location: Location, nodes: NodesMap | None) -> Site | None:
        """[sites] by RSE name, then [sites] by storage-area id, then /nodes by storage-area id."""
        if location.identifier in self._overrides:
            return self._overrides[location.identifier]
        area = location.storage_area_id
        if area is not None and area in self._overrides:
            return self._overrides[area]
        if area is not None and nodes is not None:
            return nodes.areas.get(area)
        return None

    # ---- locating

    def _locate_all(self, datasets: list[DatasetId], run: Run) -> dict[DatasetId, LocateResult]:
        """Locate every dataset with at most ``max_concurrency`` requests in flight.

        The first failure aborts the others (their pending retries end at once) and is raised;
        so does the deadline. Either way the answers already in are kept for the next fetch
        (:meth:`_keep_answered`): a first fetch of more datasets than one deadline allows
        then completes over a few cycles instead of failing for ever.
        """
        futures: dict[Future[LocateResult], DatasetId] = {
            self._pool.submit(self._locate, dataset, run): dataset for dataset in datasets
        }
        done, pending = wait(futures, timeout=max(0.0, run.left_s()), return_when=FIRST_EXCEPTION)
        if pending and not any(f.exception() is not None for f in done):
            run.expire()  # the deadline: end the reads still under way, then report it
            done, pending = wait(futures, timeout=DEADLINE_GRACE_S, return_when=FIRST_EXCEPTION)
            if pending:
                for future in pending:
                    future.cancel()
                self._keep_answered(futures, done)
                raise TransientSourceError(
                    f"{len(pending)} of {len(futures)} locates unanswered at the deadline"
                )
        failed = next((f for f in done if f.exception() is not None), None)
        if failed is not None:
            run.abort.set()
            for future in pending:
                future.cancel()
            wait(pending)
            self._keep_answered(futures, done)
            error = failed.exception()
            assert error is not None
            raise error
        return {futures[f]: f.result() for f in done}

    def _keep_answered(
        self,
        futures: Mapping[Future[LocateResult], DatasetId],
        done: Iterable[Future[LocateResult]],
    ) -> None:
        """Remember the answers of a failed fetch's locates that did answer, as of this fetch
        (they are true; the next fetch then locates the others first)."""
        for future in done:
            if not future.cancelled() and future.exception() is None:
                self._known[futures[future]] = (future.result(), self._fetches + 1)

    def _locate(self, dataset: DatasetId, run: Run) -> LocateResult:
        # Names may contain "/"; it is percent-encoded too so that dot segments in a name
        # ("a/../b") cannot be normalised away by the HTTP stack. The docs do not say how the
        # DMAPI expects a "/" in a name; Rucio's own REST API also takes names in the path.
        url = (
            f"{self._config.base_url.rstrip('/')}/data/locate/"
            f"{quote(dataset.scope, safe='')}/{quote(dataset.name, safe='')}"
        )
        label = f"locate {dataset}"
        resp = self._authorized_get(url, self._dm_token, run, label)
        if resp.status_code == 404:
            # Undocumented: taken as "no such DID", located nowhere (unless all are: see
            # _check_answers)
            return NOT_FOUND
        if resp.status_code == 204:
            # what the SRCNet datalink service answers for "no replicas": an empty list
            return []
        if 400 <= resp.status_code < 500:
            self._problems.warn(
                f"{resp.status_code}:{dataset}", "%s: HTTP %d, skipped", label, resp.status_code
            )
            return _Rejected(resp.status_code)
        if resp.status_code != 200:
            raise PermanentSourceError(f"{label}: unexpected HTTP {resp.status_code}")
        body = _json(resp, label)
        if not isinstance(body, list):
            raise PermanentSourceError(f"{label}: answer is not a JSON list")
        return [parse_location(entry) for entry in body]

    def _authorized_get(self, url: str, tokens: TokenProvider, run: Run, label: str) -> Answer:
        """GET with a bearer token; after an HTTP 401, exactly one retry with a fresh token."""
        refreshed = False
        while True:
            token = tokens.token(run)
            resp = self._http.send(
                "GET", url, run, label=label, headers={"Authorization": f"Bearer {token}"}
            )
            if resp.status_code != 401:
                return resp
            if refreshed:
                raise PermanentSourceError(
                    f"{label}: HTTP 401 again with a fresh token; check the credentials, "
                    "audience and scope"
                )
            log.info("%s: HTTP 401, fetching a fresh token and retrying once", label)
            tokens.invalidate(token)
            refreshed = True

    # ---- the answer

    def _snapshot(
        self,
        results: Mapping[DatasetId, LocateResult],
        nodes: NodesMap | None,
        invalid: int,
        context: FetchContext,
    ) -> Snapshot:
        """Located replicas at their sites; those on a storage area that cannot serve
        (:func:`storage_statuses`) are left out, so a site keeps a dataset only while an
        available storage area of it holds the dataset."""
        statuses = storage_statuses(nodes, results, context)
        down = _unavailable_areas(nodes, statuses)
        replicas: list[Replica] = []
        unmapped: dict[str, str | None] = {}  # RSE name -> its storage area id
        for dataset, result in results.items():
            if isinstance(result, _Rejected):
                invalid += 1
                continue
            if isinstance(result, _NotFound):
                continue
            for location in result:
                if location is None:
                    invalid += 1
                    self._problems.warn(
                        f"malformed:{dataset}", "locate %s: malformed entry skipped", dataset
                    )
                    continue
                if not location.has_replicas or location.storage_area_id in down:
                    continue
                site = self._site_for(location, nodes)
                if site is None:
                    unmapped.setdefault(location.identifier, location.storage_area_id)
                    continue
                # The API has no completeness or transfer state: a listed replica is complete,
                # with no transfer (the Replica defaults).
                replicas.append(Replica(dataset, site, ReplicaState.AVAILABLE))
        covered = set(self._overrides.values()) | set(nodes.areas.values() if nodes else ())
        listed = self._listed_unmapped(unmapped)
        more = len(unmapped) - len(listed)
        return Snapshot.of(
            self.name, replicas, covered, invalid, listed, unmapped_more=more, storages=statuses
        )

    def _listed_unmapped(self, unmapped: Mapping[str, str | None]) -> list[str]:
        """The first ``max_listed_unmapped`` RSE names with no site (in name order, each cut
        to ``MAX_NAME_CHARS``), each logged once; the rest only counted, in one line whenever
        their number changes. 600,001 of them made a 19 MB ``once --json`` (issue 26)."""
        limit = self._config.max_listed_unmapped
        first = sorted(unmapped)[:limit]
        for name in first:
            self._problems.warn(
                f"unmapped:{name}",
                "no site for RSE %r (storage area %s); add it to [sites]",
                _cut(name),
                _cut(unmapped[name] or ""),
            )
        if len(unmapped) > limit:
            self._problems.warn(
                f"unmapped-more:{len(unmapped)}",
                "%d storage elements have no site; the first %d are listed "
                "(max_listed_unmapped), the others only counted",
                len(unmapped),
                limit,
            )
        return [_cut(name) for name in first]

    def _token_provider(self, audience: str, scope: str, token_file: Path | None) -> TokenProvider:
        config = self._config
        if config.token_url and config.client_id_file and config.client_secret_file:
            return ClientCredentials(
                self._http,
                token_url=config.token_url,
                id_file=config.client_id_file,
                secret_file=config.client_secret_file,
                audience=audience,
                scope=scope,
                margin_s=config.token_refresh_margin_s,
                clock=self._clock,
            )
        if token_file is None:  # excluded by DmapiSourceConfig's validator
            raise PermanentSourceError(f"no token file configured for audience {audience!r}")
        return StaticToken(token_file, f"{audience} token")


def _cut(text: str) -> str:
    """``text``, or its first ``MAX_NAME_CHARS`` characters and an ellipsis."""
    return text if len(text) <= MAX_NAME_CHARS else text[:MAX_NAME_CHARS] + "…"


def build(config: DmapiSourceConfig, sites: Mapping[str, str]) -> DmapiSource:
    """The DMAPI source for ``config``; ``sites`` is the top-level [sites] mapping."""
    return DmapiSource(config, sites)
