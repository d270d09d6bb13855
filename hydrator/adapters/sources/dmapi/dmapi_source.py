"""The DMAPI source (:class:`DmapiSource`): which of the wanted datasets each site holds, one
locate per dataset.

Cost: one locate request per dataset, as the API has no bulk query, and one Site
Capabilities ``/nodes`` request per fetch (what it states of availability is fresh within a
cycle: docs/security.md). A dataset never located
before is located in the cycle it appears; of those located before, at most
``max_relocates_per_cycle`` are located again per cycle, longest-unchecked first, and the others
keep their last answer. With 50,000 datasets wanted and the default 1000, each is re-checked
every 50 cycles while a new one is seen at once; the answer kept is in memory only, so the
first cycle after a start locates everything.

Where the documentation is silent (choices made here, see the comments at each place): the
status for an unknown DID (taken as 404: located nowhere), the status for an expired or wrong
token (401 retried once with a fresh token; 403 taken as "not allowed to see this dataset"),
and whether a listed RSE holds *all* files of a dataset (taken as yes: :mod:`.checks`).
Merged with a Rucio source for the same site, its presence and Rucio's transfer are combined
fact by fact (:func:`hydrator.core.presence.combine`).

Errors: any locate that still fails after its retries fails the whole fetch
(TransientSourceError), because a dataset whose locate failed must not vanish from the sites
that hold it. Authentication failures and malformed answers are PermanentSourceError.

Bounds: the whole fetch (tokens, /nodes, locates, retry waits) ends
at ``deadline_s`` (TransientSourceError), and no answer body is read beyond
``max_answer_bytes`` (PermanentSourceError); see :mod:`.client` for how.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import replace
from functools import partial
from urllib.parse import quote

from hydrator.adapters.sources.call_counts import CallCounts
from hydrator.adapters.sources.dmapi.checks import (
    NOT_FOUND,
    LocateResult,
    Location,
    NodesMap,
    NotFound,
    Rejected,
    check_answers,
    check_not_all_refused,
    cut,
    element_of,
    json_body,
    mapped_element,
    mapped_statuses,
    parse_location,
    parse_nodes,
    storage_statuses,
    unavailable_areas,
)
from hydrator.adapters.sources.dmapi.client import REQUEST, Answer, HttpClient, RetryPolicy, Run
from hydrator.adapters.sources.dmapi.site_capabilities import NODES_QUERY
from hydrator.adapters.sources.dmapi.tokens import (
    Clock,
    StaticToken,
    TokenProvider,
    token_provider,
)
from hydrator.config import DmapiSourceConfig
from hydrator.core.check_order import relocate_order
from hydrator.core.index import merged_snapshot
from hydrator.core.ports import FetchContext
from hydrator.domain import DatasetId, ElementCount, Replica, ReplicaState, Site, Snapshot
from hydrator.errors import PermanentSourceError, TransientSourceError
from hydrator.logs import ProblemLog
from hydrator.names import InvalidNameError

log = logging.getLogger("hydrator.adapters.sources.dmapi")

# for locates to end once their connections were shut at the deadline (milliseconds, in
# practice); less than the service's own grace (runtime.fetching.GRACE_S), so that this
# source reports its deadline itself rather than being abandoned
DEADLINE_GRACE_S = 0.5


class DmapiSource:
    """Locates a list of datasets through the DMAPI; one instance per configured source.

    After each :meth:`fetch`, ``calls_last_fetch`` is ``{"request": n}``, ``n`` the HTTP
    requests it sent (token, /nodes, locate, retries included); its duration is the
    runtime's to measure (``hydrator_source_fetch_duration_seconds``).
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
        tokens = partial(token_provider, config, self._http, clock=clock)
        self._dm_token = tokens(config.audience, config.scope, config.token_file)
        self._sc_token: TokenProvider | None = None
        if config.site_capabilities_url is not None:
            self._sc_token = tokens(
                config.site_capabilities_audience,
                config.site_capabilities_scope,
                config.site_capabilities_token_file,
            )
        self._pool = ThreadPoolExecutor(config.max_concurrency, f"dmapi-{config.name}")
        self._nodes: NodesMap | None = None
        self._nodes_at = 0.0
        self._problems: ProblemLog[str] = ProblemLog(log, once_per_process=True)
        self._fetches = 0
        self._known: dict[DatasetId, tuple[LocateResult, int]] = {}  # answer, fetch number
        self.calls_last_fetch: dict[str, int] = {REQUEST: 0}
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
        run = Run(deadline=time.monotonic() + self._config.deadline_s, calls=CallCounts([REQUEST]))
        try:
            with run.watchdog():
                return self._fetch(context, run)
        finally:
            self.calls_last_fetch = run.calls.counts()

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
            check_answers(located)
            self._fetches += 1
            known = {d: self._known[d] for d in datasets if d in self._known}
            known.update((d, (result, self._fetches)) for d, result in located.items())
            self._known = known  # also forgets the datasets no longer wanted
            results = {d: result for d, (result, _) in known.items()}
            check_not_all_refused(results)
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
                self._problems.problem(f"config:{text}", "skipping configured dataset: %s", exc)
        if self._config.datasets_from_queue:
            wanted.update(context.wanted)
        return sorted(wanted), invalid

    def _due(self, datasets: list[DatasetId]) -> list[DatasetId]:
        """Those to locate this fetch: every new one, then the budget, longest-unchecked first
        (:func:`~hydrator.core.check_order.relocate_order`, from the fetch that last located
        each known one)."""
        located_in = {d: fetch for d, (_, fetch) in self._known.items()}
        budget = self._config.max_relocates_per_cycle
        due, self.deferred_last_fetch = relocate_order(datasets, located_in, budget)
        if self.deferred_last_fetch:
            known = budget + self.deferred_last_fetch
            log.debug("%s: locating %d of %d known datasets again", self.name, budget, known)
        return due

    # ---- storage areas -> sites

    def _site_capabilities(self, run: Run) -> NodesMap | None:
        """The /nodes map, read at every fetch: the storage areas' sites and what is stated of
        their availability (downtimes, ``is_force_disabled``) come in the one answer, and an
        availability statement must reach the ads in the cycle after it is made.

        If the read fails, the last good map stands in while it is younger than
        ``site_capabilities_ttl_s`` (a warning says so); older, or with none at all, the error
        propagates and the fetch fails (the source keeps its last good answer, marked stale).
        """
        url = self._config.site_capabilities_url
        if url is None or self._sc_token is None:
            return None
        try:
            nodes_url = f"{url.rstrip('/')}/nodes{NODES_QUERY}"
            resp = self._authorized_get(nodes_url, self._sc_token, run, "/nodes")
            if resp.status_code != 200:
                raise PermanentSourceError(f"site capabilities /nodes: HTTP {resp.status_code}")
            nodes = parse_nodes(json_body(resp, "site capabilities /nodes"))
        except (TransientSourceError, PermanentSourceError) as exc:
            age_s = self._clock() - self._nodes_at
            if self._nodes is None or age_s >= self._config.site_capabilities_ttl_s:
                raise
            log.warning(
                "%s; using the /nodes answer read %.0f s ago (site_capabilities_ttl_s)", exc, age_s
            )
            return self._nodes
        for bad in nodes.bad_sites:
            self._problems.problem(
                f"site:{bad}", "site capabilities: ignoring invalid site name %s", bad
            )
        for bad in nodes.bad_downtimes:
            self._problems.problem(
                f"downtime:{bad}", "site capabilities: skipping downtime %s", bad
            )
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
            # check_answers)
            return NOT_FOUND
        if resp.status_code == 204:
            # what the SRCNet datalink service answers for "no replicas": an empty list
            return []
        if 400 <= resp.status_code < 500:
            self._problems.problem(
                f"{resp.status_code}:{dataset}", "%s: HTTP %d, skipped", label, resp.status_code
            )
            return Rejected(resp.status_code)
        if resp.status_code != 200:
            raise PermanentSourceError(f"{label}: unexpected HTTP {resp.status_code}")
        body = json_body(resp, label)
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
        (:func:`storage_statuses`) or on a drained ``[sites]`` element
        (:func:`mapped_statuses`) are left out, so a site keeps a dataset only while an
        available storage element of it holds the dataset. Per storage element, its site and the
        datasets located there (``Snapshot.elements``, for the site guard: an element whose
        entries vanish holds its site back, :func:`.checks.element_of` names it)."""
        statuses = storage_statuses(nodes, results, context.wanted, context.drains, context.now)
        judged = (context.wanted, context.drains, context.now)
        mapped = mapped_statuses(self._overrides, statuses, results, judged)
        down = unavailable_areas(nodes, statuses)
        drained = {s.storage for s in mapped if not s.available}
        replicas: list[Replica] = []
        held: dict[str, tuple[Site, set[DatasetId]]] = {}  # element -> its site, its datasets
        unmapped: dict[str, str | None] = {}  # RSE name -> its storage area id
        for dataset, result in results.items():
            if isinstance(result, Rejected):
                invalid += 1
                continue
            if isinstance(result, NotFound):
                continue
            for location in result:
                if location is None:
                    invalid += 1
                    self._problems.problem(
                        f"malformed:{dataset}", "locate %s: malformed entry skipped", dataset
                    )
                    continue
                if not self._serves(location, down, drained):
                    continue
                site = self._site_for(location, nodes)
                if site is None:
                    unmapped.setdefault(location.identifier, location.storage_area_id)
                    continue
                # The API has no completeness or transfer state: a listed replica is complete,
                # with no transfer (the Replica defaults).
                replicas.append(Replica(dataset, site, ReplicaState.AVAILABLE))
                element = element_of(location, nodes, self._overrides)
                held.setdefault(element, (site, set()))[1].add(dataset)
        covered = set(self._overrides.values()) | set(nodes.areas.values() if nodes else ())
        listed = self._listed_unmapped(unmapped)
        more = len(unmapped) - len(listed)
        answer = merged_snapshot(
            self.name,
            replicas,
            covered,
            invalid,
            listed,
            unmapped_more=more,
            storages=statuses + mapped,
        )
        elements = {e: ElementCount(site, len(found)) for e, (site, found) in held.items()}
        return replace(answer, elements=elements)

    def _serves(self, location: Location, down: frozenset[str], drained: set[str]) -> bool:
        """Whether a located entry counts: it lists replicas, on a storage area that can serve
        (not in ``down``) and not on a drained ``[sites]`` element."""
        return (
            location.has_replicas
            and location.storage_area_id not in down
            and mapped_element(location, self._overrides) not in drained
        )

    def _listed_unmapped(self, unmapped: Mapping[str, str | None]) -> list[str]:
        """The first ``max_listed_unmapped`` RSE names with no site (in name order, each cut
        to ``MAX_NAME_CHARS``), each logged once; the rest only counted, in one line whenever
        their number changes: a catalogue of many unmapped RSEs must not make megabytes of
        status and logs."""
        limit = self._config.max_listed_unmapped
        first = sorted(unmapped)[:limit]
        for name in first:
            self._problems.problem(
                f"unmapped:{name}",
                "no site for RSE %r (storage area %s); add it to [sites]",
                cut(name),
                cut(unmapped[name] or ""),
            )
        if len(unmapped) > limit:
            self._problems.problem(
                f"unmapped-more:{len(unmapped)}",
                "%d storage elements have no site; the first %d are listed "
                "(max_listed_unmapped), the others only counted",
                len(unmapped),
                limit,
            )
        return [cut(name) for name in first]


def build(config: DmapiSourceConfig, sites: Mapping[str, str]) -> DmapiSource:
    """The DMAPI source for ``config``; ``sites`` is the top-level [sites] mapping."""
    return DmapiSource(config, sites)
