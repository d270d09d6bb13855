"""Configuration: a TOML file validated by pydantic (the only place pydantic meets user input).

Every key is documented in ``config/hydrator.example.toml``. Unknown keys are rejected; units are
in the names (``*_s`` seconds, ``*_bytes`` bytes). Relative paths are relative to the directory of
the configuration file. Secrets are never written in the TOML itself: keys ending in ``_file``
name files that hold them.

:func:`load_config` raises :class:`~hydrator.errors.ConfigError` whose message names the key,
e.g. ``sources[0].timeout_s: Input should be greater than 0``.
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from hydrator.domain import check_site
from hydrator.errors import ConfigError
from hydrator.files import FileRefused, open_regular, read_capped
from hydrator.names import SCOPE_PATTERN, InvalidNameError

DEFAULT_CONFIG_PATH = Path("/etc/hydrator/hydrator.toml")
ATTRIBUTE_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,99}")
SOURCE_NAME_PATTERN = re.compile(r"[a-z][a-z0-9_\-]{0,31}")

PositiveSeconds = Annotated[float, Field(gt=0)]
DEFAULT_DEADLINE_S = 30.0  # half the default interval_s: a slow source leaves time for the rest
MAX_CONFIG_BYTES = 8 * 1024 * 1024  # room for a long DMAPI dataset list (docs/performance.md)
MAX_SECRET_FILE_BYTES = 64 * 1024  # as hydrator.redact.MAX_SECRET_BYTES
# Strict models take a TOML string for a path: the one conversion allowed.
ConfigPath = Annotated[Path, Field(strict=False)]


def host_port(value: str, *, any_port: bool = False) -> tuple[str, int]:
    """``host:port`` as (host, port): an IPv6 host in brackets (``[::1]:9618``, returned
    without them), a port from 1 to 65535 (0 too with ``any_port``: the system picks one).
    ValueError naming ``value`` otherwise. The one parser of addresses in the configuration."""
    host, sep, port = value.rpartition(":")
    bracketed = host.startswith("[") and host.endswith("]")
    name = host[1:-1] if bracketed else host
    low = 0 if any_port else 1
    if (
        not sep
        or not name
        or "[" in name
        or "]" in name
        or not port.isdigit()
        or not low <= int(port) <= 65535
    ):
        raise ValueError(f"expected host:port, got {value!r}")
    return name, int(port)


class _Model(BaseModel):
    # strict: "60", "yes" and true are not coerced to numbers/booleans (an int is a float);
    # allow_inf_nan=False: inf and nan are refused wherever a number is expected.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


class DaemonConfig(_Model):
    """``[daemon]``: the loop and where its state lives."""

    interval_s: PositiveSeconds = 60.0
    """Seconds between cycle starts."""
    jitter_s: float = Field(5.0, ge=0)
    """Up to this many seconds of random delay added to each cycle start."""
    state_path: ConfigPath = Path("/var/lib/hydrator/state.sqlite")
    """SQLite file holding the last good state; created if missing."""
    log_format: Literal["text", "json"] = "text"
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    thread_restart_backoff_s: list[Annotated[float, Field(ge=0)]] = Field(
        default_factory=lambda: [1.0, 5.0, 30.0], min_length=1, max_length=20
    )
    """Waits before restarting a supervised thread found dead (event-cycle worker, event
    listener, HTTP server watcher), seconds: one per restart in a row, the last repeating; a
    thread that has run for the last wait starts again from the first (docs/events.md)."""


class SafetyConfig(_Model):
    """``[safety]``: when a source's answer is too suspicious to act on."""

    max_drop_fraction: float = Field(0.5, ge=0, le=1)
    """An answer with fewer than (1 - this) x the previous entries is held back as stale."""
    drop_min_entries: int = Field(20, ge=0)
    """Sources with fewer previous entries than this are never held back."""
    accept_drop_after_cycles: int = Field(10, ge=0)
    """A drop held back this many consecutive cycles is accepted; 0 holds it forever."""
    site_max_drop_fraction: float = Field(0.5, ge=0, le=1)
    """The same per site, for a source that answered: a site left with no entries, or with
    fewer than (1 - this) x its previous ones from that source, keeps its previous ones for
    accept_drop_after_cycles cycles (a storage element missing from an answer)."""
    site_drop_min_entries: int = Field(20, ge=0)
    """Sites with fewer previous entries (from one source) than this are never held back."""
    accept_site_drops: list[str] = Field(default_factory=list)
    """Sites whose drops are accepted at once (an operator confirming a real removal; reload
    with SIGHUP, and remove the site again afterwards)."""


class HttpConfig(_Model):
    """``[http]``: the one listener for ClassAds, metrics and probes."""

    enabled: bool = True
    listen: str = "127.0.0.1:9620"
    """host:port; use 0.0.0.0 only behind a firewall or in a pod."""
    max_age_s: int = Field(60, ge=0)
    """Cache-Control max-age of site ClassAds, so site squids can absorb glidein fetches."""
    stale_if_error_s: int = Field(86400, ge=0)
    """Cache-Control stale-if-error of site ClassAds: how long a squid may go on serving its
    copy while the hydrator cannot be reached (jobs can check DataLocalityUpdated)."""
    max_connections: int = Field(16384, ge=1)
    """Client connections open at once; more are closed on arrival (and counted). Each is a
    file descriptor: the server lifts its soft limit to the hard one."""
    max_header_bytes: int = Field(8190, ge=256, le=65536)
    """Longest request line or header field accepted (longer: 400); a hook sends ~100."""
    idle_timeout_s: float = Field(15.0, gt=0)
    """A connection with no complete request within this many seconds of its opening or of
    its previous answer is closed: idle keep-alive, bare CRLFs, one byte a second."""
    send_timeout_s: float = Field(60.0, gt=0)
    """A connection whose client takes none of its answer (nothing acknowledged, or a zero
    window) for this long is dropped by the kernel (TCP_USER_TIMEOUT), freeing what it held."""
    backlog: int = Field(1024, ge=1, le=65535)
    """Listen backlog: connections the kernel queues before they are accepted (a wave of
    glideins, a restart of the server); capped by net.core.somaxconn."""

    @field_validator("listen")
    @classmethod
    def _host_port(cls, value: str) -> str:
        host_port(value, any_port=True)
        return value

    @property
    def host(self) -> str:
        return host_port(self.listen, any_port=True)[0]

    @property
    def port(self) -> int:
        return host_port(self.listen, any_port=True)[1]


class ClassAdConfig(_Model):
    """``[classad]``: the attribute names written into machine ads."""

    available_attribute: str = "AvailableDatasets"
    """Datasets whose every file is at the site (whatever any transfer does)."""
    partial_attribute: str = "PartialDatasets"
    """Datasets with some files at the site, whether a transfer is active, stuck or none."""
    replicating_attribute: str = "ReplicatingDatasets"
    """Datasets with no file at the site yet and an active transfer towards it."""
    stuck_attribute: str = "StuckDatasets"
    """Datasets whose transfer towards the site is stuck, whatever is present (only written
    with advertise_stuck)."""
    advertise_stuck: bool = False
    """Also write stuck_attribute into the ads; stuck transfers are always in /v1, `hydrator
    show` and hydrator_transfers."""
    site_attribute: str = "DataLocalitySite"
    updated_attribute: str = "DataLocalityUpdated"
    digest_attribute: str = "DataLocalityDigest"
    updated_resolution_s: int = Field(300, ge=1)
    """DataLocalityUpdated is rounded down to this many seconds, so an unchanged site's ad (and
    its ETag) stays the same between refreshes; it never claims more freshness than is true."""

    advertise: Literal["all", "demand"] = "all"
    """"demand": advertise only datasets that queued jobs declare in RequiredDatasets (needs
    [collector] enabled = true to read the schedds)."""
    max_datasets_per_site: int = Field(0, ge=0)
    """Budget of dataset names per site ad (all lists together); the most-demanded win. 0: none."""
    max_ad_bytes: int = Field(60000, ge=1024, le=60000)
    """Largest site ad in bytes, as served to the execute-node hook (whose own limit, default
    60000 because STARTD_CRON reads lines into a 64 KiB buffer, must not be smaller: hook option
    --max-bytes / HYDRATOR_MAX_BYTES). A larger ad is cut, least-demanded datasets first."""
    unavailable_attribute: str = "DataLocalityUnavailable"
    """Why some of the site's storage cannot serve (catalogue statement, downtime, operator
    drain), one "RSE X_DISK: reason" per storage element joined by "; ". When all can, the
    hook's answer leaves it out and collector merges write "" (a merge cannot remove one).
    What only such storage holds is already left out of the lists."""
    near_attribute: str = "DataLocalityNearSites"
    """The sites this site reads from cheaply (within [distances] max_distance), a list;
    written only with [distances] enabled (docs/near.md)."""

    @model_validator(mode="after")
    def _valid_unique(self) -> ClassAdConfig:
        names = {k: v for k, v in self.model_dump().items() if k.endswith("_attribute")}
        for key, value in names.items():
            if not ATTRIBUTE_PATTERN.fullmatch(value):
                raise ValueError(f"{key}: {value!r} is not a ClassAd attribute name")
        lowered = [v.lower() for v in names.values()]
        if len(set(lowered)) != len(lowered):
            raise ValueError("attribute names must differ (ClassAd names ignore case)")
        return self


class _SourceBase(_Model):
    name: str
    """Unique name of this source in logs, metrics and the state database."""
    states_mapped_elements: ClassVar[bool] = False
    """The source states every storage element ``[sites]`` maps, whether or not it holds
    data (so ``hydrator drain --storage`` may name one before any answer reports it)."""

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not SOURCE_NAME_PATTERN.fullmatch(value):
            raise ValueError(f"{value!r}: use 1-32 of a-z 0-9 _ - starting with a letter")
        return value


class StaticSourceConfig(_SourceBase):
    """A TOML inventory file: the demo, tests, and sites no catalogue covers."""

    type: Literal["static"]
    name: str = "static"
    path: ConfigPath
    """Inventory file; re-read every cycle (format in config/demo-inventory.toml)."""
    settle_s: float = Field(2.0, ge=0)
    """Seconds the file must be unmodified before a cycle uses it, so one rewritten in place is
    never read half-written; replace it by writing a temporary file and renaming it instead."""
    deadline_s: PositiveSeconds = DEFAULT_DEADLINE_S
    """Longest a fetch of this source may take, seconds; past it the source has failed this
    cycle (its last good answer is kept) and the cycle goes on without it."""
    max_inventory_bytes: int = Field(64 * 1024 * 1024, ge=1)
    """Largest inventory file read, bytes; a larger one fails the source (last good kept)."""


class RucioEventsConfig(_Model):
    """``[sources.events]`` of a Rucio source: follow the ``rucio-hermes`` event stream from an
    ActiveMQ broker over STOMP (docs/events.md). Off by default. Messages are hints: each names
    datasets that an *event cycle* re-reads exactly; the full read stays as reconciliation."""

    enabled: bool = False
    """Listen to the broker; false: poll only (every [daemon] interval_s)."""
    brokers: list[str] = Field(default_factory=list, max_length=16)
    """``host:port`` of the brokers' STOMP connectors, tried in order on each (re)connect."""
    destination: str = Field(
        "/topic/rucio.events", pattern=r"^/(topic|queue)/[A-Za-z0-9_.\-/]{1,190}$"
    )
    """Where hermes sends (its ``[messaging-hermes] destination``): ``/topic/...`` or
    ``/queue/...``."""
    client_id: str = Field("hydrator", pattern=r"^[A-Za-z0-9_.\-]{1,100}$")
    """STOMP ``client-id`` of the durable subscription; one daemon per id (the broker refuses
    a second connection with the same id)."""
    subscription_name: str = Field("hydrator", pattern=r"^[A-Za-z0-9_.\-]{1,100}$")
    """Name of the durable subscription: messages sent while the daemon is away wait there."""
    username: str | None = None
    """Broker user (a read-only subscriber: docs/events.md has the ACL)."""
    password_file: ConfigPath | None = None
    """File holding the broker password (first line); read at each connect."""
    use_ssl: bool = False
    """TLS to the broker."""
    ca_cert: ConfigPath | None = None
    """CA file to verify the broker (use_ssl); unset: the broker is not verified."""
    client_cert: ConfigPath | None = None
    """Client certificate for TLS authentication at the broker (use_ssl)."""
    client_key: ConfigPath | None = None
    """Its private key."""
    heartbeat_s: float = Field(10.0, ge=0)
    """STOMP heart-beat both ways, seconds (0: none); a silent connection is dropped after
    1.5 times this and reconnected."""
    reconnect_initial_s: float = Field(1.0, gt=0)
    """First wait before trying the brokers again, seconds; grows by half each failed round
    (with jitter), back to this after each subscription."""
    reconnect_max_s: float = Field(5.0, gt=0)
    """Longest wait between rounds, seconds: also how long a broker back from an outage
    may wait for the listener."""
    max_message_bytes: int = Field(65536, ge=1024)
    """A larger message is counted as malformed and dropped."""
    event_debounce_s: float = Field(1.0, ge=0)
    """An event cycle starts this long after the first hint, with every hint come by then."""
    max_event_reads_per_cycle: int = Field(500, ge=1)
    """Datasets one event cycle re-reads at most; the rest wait for the next full read."""
    max_pending_datasets: int = Field(100_000, ge=1)
    """Datasets held between event cycles at most (memory bound under a flood); beyond, the
    next full read covers them."""
    reconcile_interval_s: PositiveSeconds = 1800.0
    """Full read while events flow, seconds; [daemon] interval_s while the listener is
    disconnected or silent; once at start-up and after every reconnect."""
    silence_s: PositiveSeconds = 600.0
    """No message for this long counts as a silent stream: poll at [daemon] interval_s."""
    max_parent_lookups_per_cycle: int = Field(20, ge=0)
    """``deletion-done`` names a file, no dataset: an event cycle looks up the datasets of at
    most this many such files (``list_parent_dids``, one call each) and re-reads them; the
    others wait for the next cycles (ten cycles' worth at most; beyond, and all with 0, the
    next full read)."""
    timeout_s: float = Field(10.0, gt=0)
    """Deadline of each network step with a broker, seconds: the TCP connect, the STOMP
    CONNECT/CONNECTED exchange, the receipt for SUBSCRIBE. On a deadline the attempt fails
    (one line) and the next round follows after the reconnect wait."""

    @field_validator("brokers")
    @classmethod
    def _brokers(cls, value: list[str]) -> list[str]:
        for broker in value:
            host_port(broker)
        return value

    @property
    def addresses(self) -> list[tuple[str, int]]:
        """``brokers`` as (host, port) pairs, in order."""
        return [host_port(broker) for broker in self.brokers]

    @model_validator(mode="after")
    def _complete(self) -> RucioEventsConfig:
        if self.enabled and not self.brokers:
            raise ValueError("enabled = true needs at least one broker in brokers")
        if (self.username is None) != (self.password_file is None):
            raise ValueError("username and password_file go together")
        return self


class RucioSourceConfig(_SourceBase):
    """Rucio via rucio-clients. Without rucio_host, the client reads ``$RUCIO_CONFIG``."""

    type: Literal["rucio"]
    name: str = "rucio"
    rucio_host: str | None = None
    """Server URL, e.g. https://rucio.example.org; unset: everything comes from $RUCIO_CONFIG."""
    auth_host: str | None = None
    """Authentication server URL (often the same as rucio_host)."""
    account: str | None = None
    """Rucio account to act as; needs read access only."""
    vo: str | None = None
    """Virtual organisation on a multi-VO server; unset: the default VO."""
    auth_type: Literal["userpass", "x509", "x509_proxy", "oidc"] | None = None
    """How to authenticate; unset: from $RUCIO_CONFIG."""
    username: str | None = None
    """Userpass identity (auth_type = userpass)."""
    password_file: ConfigPath | None = None
    """File holding the userpass password (first line); re-read after an auth failure."""
    client_cert: ConfigPath | None = None
    """X.509 certificate (auth_type = x509)."""
    client_key: ConfigPath | None = None
    """X.509 private key, mode 0400 or 0600 (auth_type = x509)."""
    client_proxy: ConfigPath | None = None
    """X.509 proxy (auth_type = x509_proxy)."""
    token_file: ConfigPath | None = None
    """File holding an OIDC bearer token (auth_type = oidc)."""
    ca_cert: ConfigPath | None = None
    """CA bundle or directory to verify the server; unset: the system/certifi bundle."""
    timeout_s: PositiveSeconds = 30.0
    """Timeout of one HTTP request, seconds."""
    rse_expression: str = "rse_type=DISK"
    """Which RSEs count; tape-only data is not available to a job (checked: Rucio 41.5.1
    resolves ``rse_type=DISK``)."""
    site_attribute: str = "site"
    """RSE attribute naming the site; [sites] overrides it."""
    scopes: list[str] = Field(default_factory=list)
    """Only datasets in these scopes; empty means all."""
    deep_check_limit: int = Field(500, ge=0)
    """At most this many exact (deep, one call each) dataset checks per cycle, for datasets the
    lagging summary table cannot settle; the rest use the summary."""
    deep_check_max_age_s: float = Field(600.0, ge=0)
    """Seconds a deep check's answer is reused while nothing it read changed (the dataset's
    summary rows and rules, the RSE -> site map); 0: check every cycle. A change the source
    does see (abacus updating a row, a lock count moving) re-checks at once; this bound covers
    what it does not: files lost or arriving with no lock and before abacus updates the row.
    The default is of the order of abacus' own lag, which complete rows are trusted across."""
    rse_attributes_max_age_s: float = Field(600.0, ge=0)
    """Seconds an RSE's site attribute, once read, is used before it is read again (one
    ``list_rse_attributes`` call per RSE not in [sites]); 0: read every cycle. An RSE newly
    listed is read at once; a site attribute changed on the server is seen within this time."""
    max_attempts: int = Field(3, ge=1)
    """Tries per API call on transient errors (connection, timeout, HTTP 5xx)."""
    backoff_s: float = Field(1.0, ge=0)
    """Wait before the second try, seconds; doubles with each further try."""
    max_retry_after_s: float = Field(30.0, ge=0)
    """Longest ``Retry-After`` (429/503) honoured, seconds; a longer hint fails the cycle."""
    deadline_s: PositiveSeconds = DEFAULT_DEADLINE_S
    """Longest a fetch of this source may take, seconds (requests, retries, token requests and
    parsing); past it the fetch is abandoned, the source has failed this cycle (its last good
    answer is kept) and the cycle goes on without it. Raise it for a catalogue whose full
    fetch takes longer (millions of replicas)."""
    events: RucioEventsConfig = RucioEventsConfig()
    """The event stream (``[sources.events]``); off by default."""
    max_answer_bytes: int = Field(512 * 1024 * 1024, ge=1024)
    """Largest answer body read (one RSE's summary table, the rules in one state, a token or
    RSE answer, ...), bytes, after decompression; a larger one fails the source, naming the
    request (its last good answer is kept). The default holds one RSE's summary table well
    beyond its share of a ten-million-replica catalogue; but the listing of the rules in one
    state covers the whole catalogue, so raise it (with deadline_s) for a catalogue of several
    million replicas (the sizes measured: docs/performance.md)."""
    max_line_bytes: int = Field(1024 * 1024, ge=256)
    """Longest line (one JSON record) of a listing, bytes; a longer one fails the source
    likewise. Rucio's records are ~0.4 kB. Set below 1 MiB, listings are read in blocks of
    this size (slower)."""
    bad_replicas_max: int = Field(1000, ge=0)
    """Replicas read per fetch from each of Rucio's bad-replica listings (``BAD`` and
    ``TEMPORARY_UNAVAILABLE``, one request each); the datasets holding them are checked exactly
    at their RSEs' sites every fetch they stay listed, whatever the summary says. More listed
    than this: the rest waits (a warning). 0: the listings are not read."""
    bad_parent_lookups_max: int = Field(100, ge=0)
    """``list_parent_dids`` calls per fetch to find the datasets of newly listed bad replicas
    (answers kept while the file stays listed); the rest is looked up in later fetches."""

    @field_validator("scopes")
    @classmethod
    def _scopes(cls, value: list[str]) -> list[str]:
        for scope in value:
            if not SCOPE_PATTERN.fullmatch(scope):
                raise ValueError(f"invalid scope {scope!r}")
        return value


class DmapiSourceConfig(_SourceBase):
    """The SKA SRCNet Data Management API (``GET /data/locate/{namespace}/{name}``).

    Authentication is either OAuth2 client credentials against SKA IAM (``token_url`` with
    ``client_id_file`` and ``client_secret_file``; one token per audience) or static bearer
    tokens read from files (``token_file``, ``site_capabilities_token_file``), never both.
    """

    states_mapped_elements: ClassVar[bool] = True  # :mod:`hydrator.adapters.sources.dmapi`

    type: Literal["dmapi"]
    name: str = "dmapi"
    base_url: str
    """e.g. https://data-management.srcnet.skao.int/api/v1"""
    token_file: ConfigPath | None = None
    """A static bearer token for the DMAPI, re-read every cycle and after an HTTP 401."""
    token_url: str | None = None
    """OAuth2 token endpoint for the client-credentials grant, e.g. https://ska-iam.stfc.ac.uk/token"""
    client_id_file: ConfigPath | None = None
    client_secret_file: ConfigPath | None = None
    audience: str = "data-management-api"
    """Audience requested for the DMAPI token (the DMAPI checks the token's ``aud``)."""
    scope: str = "data-management-api-service"
    """Scope(s) requested for the DMAPI token, space-separated."""
    site_capabilities_url: str | None = None
    """Site Capabilities API base (…/api/v1); maps storage-area ids to sites via /nodes."""
    site_capabilities_token_file: ConfigPath | None = None
    """Static bearer token for the Site Capabilities API (needed with token_file)."""
    site_capabilities_audience: str = "site-capabilities-api"
    """Audience requested for the Site Capabilities token (client credentials)."""
    site_capabilities_scope: str = "site-capabilities-api-service"
    """Scope(s) requested for the Site Capabilities token, space-separated."""
    site_capabilities_ttl_s: PositiveSeconds = 600.0
    """/nodes is read every cycle (availability is fresh within a cycle); when a read fails,
    the last good answer stands in for this many seconds after it was read, then the fetch
    fails (the source keeps its last good answer, marked stale)."""
    datasets: list[str] = Field(default_factory=list)
    """Datasets (namespace:name) to locate every cycle."""
    datasets_from_queue: bool = False
    """Also locate the datasets queued jobs declare in RequiredDatasets (needs [collector])."""
    max_relocates_per_cycle: int = Field(1000, ge=0)
    """Datasets located in an earlier cycle that are located again per cycle, longest-unchecked
    first (0: all, every cycle). Datasets never located yet are always located."""
    timeout_s: PositiveSeconds = 10.0
    """Timeout of one HTTP request (connect and each read), seconds."""
    max_attempts: int = Field(3, ge=1)
    """Attempts per request on connection errors, HTTP 5xx and 429 (1 = no retry)."""
    backoff_s: float = Field(1.0, ge=0)
    """Wait before the 2nd attempt, seconds; doubles per attempt up to max_backoff_s."""
    max_backoff_s: float = Field(30.0, ge=0)
    """Upper bound of one backoff wait, seconds."""
    max_retry_after_s: float = Field(30.0, ge=0)
    """Longest ``Retry-After`` (429/503) honoured, seconds; a longer hint fails the cycle."""
    token_refresh_margin_s: float = Field(60.0, ge=0)
    """Fetch a new client-credentials token this many seconds before the old one expires (at
    most half its lifetime before, so a short-lived token is not fetched for every request)."""
    max_concurrency: int = Field(8, ge=1, le=64)
    """Locate requests in flight at once."""
    ca_cert: ConfigPath | None = None
    """CA bundle for TLS verification; default: the system/certifi bundle."""
    deadline_s: PositiveSeconds = DEFAULT_DEADLINE_S
    """Longest a fetch of this source may take, seconds: connections, headers, bodies, token
    requests and retry waits together (a server sending one byte a second meets it too). Past
    it the source has failed this cycle (its last good answer is kept) and the cycle goes on."""
    max_answer_bytes: int = Field(8 * 1024 * 1024, ge=1024)
    """Largest answer body read (locate, /nodes, token endpoint), bytes, after decompression;
    a larger one fails the source (its last good answer is kept)."""
    max_listed_unmapped: int = Field(20, ge=0)
    """Storage elements with no site listed by name in ``once --json``, ``/v1/sites`` and the
    log (the first ones in name order); all are counted."""

    @model_validator(mode="after")
    def _auth(self) -> DmapiSourceConfig:
        creds = (self.token_url, self.client_id_file, self.client_secret_file)
        if self.token_file is None and not all(creds):
            raise ValueError(
                "set token_file, or token_url with client_id_file and client_secret_file"
            )
        if self.token_file is not None and any(creds):
            raise ValueError("set either token_file or the client-credentials keys, not both")
        if (
            self.token_file is not None
            and self.site_capabilities_url is not None
            and self.site_capabilities_token_file is None
        ):
            raise ValueError("site_capabilities_token_file is required with token_file")
        return self


SourceConfig = Annotated[
    StaticSourceConfig | RucioSourceConfig | DmapiSourceConfig, Field(discriminator="type")
]


class CollectorConfig(_Model):
    """``[collector]``: publishing into the HTCondor collector (off by default)."""

    enabled: bool = False
    pool: str | None = None
    """Collector host:port; empty uses the local HTCondor configuration."""
    token_dir: ConfigPath | None = None
    """Directory with an IDTOKEN allowed to MERGE_STARTD_AD (sets _CONDOR_SEC_TOKEN_DIRECTORY)."""
    slot_site_attribute: str = "GLIDEIN_Site"
    """Slot-ad attribute naming the slot's site."""
    merge_slots: bool = True
    """Merge the site attributes into matching slot ads every cycle."""
    site_ads: bool = True
    """Advertise one ad per site with MyType = "DataLocality"."""
    refresh_s: PositiveSeconds = 900.0
    """Re-merge a current slot whose DataLocalityUpdated is older than this."""
    merge_min_interval_s: float = Field(0.0, ge=0)
    """Merge changed lists into a slot at most once per this many seconds (its
    DataLocalityMerged, written with every full merge, holds the time of the last change);
    slots without one (new, or wiped by their startd's update) are merged at once and do not
    restart the window, site ads follow every cycle. A change arriving within the window
    reaches the slot when it ends (the repair watch merges it then). Slot ads lag the
    catalogue by up to this long, removals included. 0 (default): no window; the collector's
    load is bounded by merge_budget_bytes_per_s instead. refresh_s still holds: a slot whose
    DataLocalityUpdated is older than refresh_s while a newer exists is re-merged, so larger
    values act as refresh_s (docs/coverage.md)."""
    batch_size: int = Field(50, ge=1)
    """Ads per advertise call (one connection each). Each site's slot merges reuse this many
    ads, so smaller batches copy a site's lists into fewer ads; each call and each copy has
    its cost (docs/performance.md)."""
    timeout_s: PositiveSeconds = 20.0
    locality_metrics: bool = True
    """Read the schedds and slot ads each cycle for the matchmaking-quality metrics
    (``hydrator_jobs_running_data_local_ratio`` ...): one collector query and one projected
    query per schedd."""
    queue_max_age_s: float | None = Field(None, ge=0)
    """Seconds an event cycle (docs/events.md) reuses the last read of the schedds' queues
    (the demand, the matchmaking probe and job annotation all take theirs from it) instead of
    querying every schedd again; scheduled cycles always read. Unset: [daemon] interval_s
    (event cycles between two scheduled ones reuse, at most one read per schedd per
    interval). 0: every cycle reads."""
    repair_interval_s: float = Field(0.5, ge=0)
    """Every this many seconds, one collector query for the slot ads of our sites that lack
    their site's current digest (wiped by their startd's update, new, or stale), and merges
    into exactly those (docs/coverage.md); also measures coverage. Looks are paced to take
    at most a fifth of the time (a large pool's look takes longer). 0: off (slots wait for
    the next cycle)."""
    reschedule_min_interval_s: float = Field(0.0, ge=0)
    """After a cycle that changed a site's published lists, ask every schedd ([jobs] schedds,
    else all the collector knows) for a negotiation cycle, as condor_reschedule does, at most
    once per this many seconds: an idle job the change makes matchable need not wait for
    NEGOTIATOR_INTERVAL (docs/events.md). Needs WRITE on the schedds. Schedds of HTCondor
    25.14 and later no longer forward the request to the negotiator: there it changes
    nothing. 0: off."""
    merge_budget_bytes_per_s: float = Field(10_000_000.0, ge=0)
    """Bytes per second of merges that replace a slot's lists with its site's new ones, on
    average, in bursts of up to a minute's worth: a change goes to every slot of its site at
    once while it fits, and what does not waits for the next repair look. Merges into bare
    slots (wiped by their startd's update, or new) are not counted. Default: the load a
    change of every site every 120 s puts on a collector of 20,000 slot ads of 60 kB lists
    (docs/coverage.md, "The merge budget"). 0: no bound."""


class JobsConfig(_Model):
    """``[jobs]``: write where their data is onto idle data-bound jobs (off by default), for
    provisioners that decide from job attributes (docs/provisioning.md). Finds the schedds
    through ``[collector] pool`` and authenticates with ``[collector] token_dir`` (whether or
    not ``[collector] enabled``); that identity must be allowed to edit others' jobs."""

    annotate: bool = False
    """Each cycle, edit idle jobs matching ``constraint``: the attributes below, only when
    their value changed."""
    schedds: list[str] = Field(default_factory=list)
    """Schedd names to annotate; empty: every schedd the collector knows."""
    constraint: str = "JobStatus == 1 && RequiredDatasets isnt undefined"
    """ClassAd constraint selecting the jobs to annotate; always ANDed with JobStatus == 1, so
    running and held jobs are never touched."""
    max_edits_per_cycle: int = Field(1000, ge=1)
    """At most this many job groups (one distinct RequiredDatasets value on one schedd) written
    per cycle; each costs one Schedd.edit call per changed attribute. The rest wait a cycle."""
    sites_attribute: str = "DataLocalitySites"
    """Job attribute: ClassAd list of sites holding every required dataset completely."""
    partial_sites_attribute: str = "DataLocalityPartialSites"
    """Job attribute: sites holding or receiving every required dataset (complete, partial or
    being replicated there), not all of them complete."""
    updated_attribute: str = "DataLocalitySitesUpdated"
    """Job attribute: epoch (s) of the hydrator state the two lists were computed from."""
    desired_sites_attribute: str | None = None
    """Also write the complete sites as a comma-separated string into this attribute (the
    CMS/GlideinWMS convention: "DESIRED_Sites"); unset: not written."""
    overwrite_desired_sites: bool = False
    """Replace a desired_sites_attribute value the job set itself (at submit); default: leave
    such jobs alone."""

    @field_validator("schedds")
    @classmethod
    def _schedd_names(cls, value: list[str]) -> list[str]:
        for name in value:
            if not name or any(c in name for c in '"\\\n'):
                raise ValueError(f"invalid schedd name {name!r}")
        return value

    @model_validator(mode="after")
    def _valid_unique(self) -> JobsConfig:
        names = {k: v for k, v in self.model_dump().items() if k.endswith("_attribute") and v}
        for key, value in names.items():
            if not ATTRIBUTE_PATTERN.fullmatch(value):
                raise ValueError(f"{key}: {value!r} is not a ClassAd attribute name")
        lowered = [v.lower() for v in names.values()]
        if len(set(lowered)) != len(lowered) or "requireddatasets" in lowered:
            raise ValueError("attribute names must differ from each other and RequiredDatasets")
        return self


class DistancesConfig(_Model):
    """``[distances]``: near sites from network distances (docs/near.md); off by default."""

    enabled: bool = False
    source: str | None = None
    """Name of the Rucio source whose catalogue's distances are read (one request per
    refresh: its export, which needs the account's export permission); unset: the operator
    table ``sites`` alone."""
    refresh_s: PositiveSeconds = 3600.0
    """Seconds between reads of the distances (they change rarely); a failed read keeps the
    last good near lists and is tried again after this long."""
    max_distance: int = Field(1, ge=0)
    """Largest distance (the catalogue's unit, an integer) at which another site is near."""
    remote_budget: int = Field(10, ge=1)
    """Jobs that may read remotely from one site at once: the negotiator's limit
    (CONCURRENCY_LIMIT_DEFAULT_REMOTE in deploy/condor/60-hydrator-near.conf); here for the
    metrics and `hydrator expr --near`. 0 is refused."""
    max_answer_bytes: int = Field(64 * 1024 * 1024, ge=1024)
    """Largest distance answer read (the catalogue's export), bytes; a larger one is a failed
    read (the last good near lists are kept)."""
    sites: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """Operator table, site -> {other site: distance}, for catalogues without distances
    (DMAPI); used when ``source`` is unset. Checked as a catalogue's answer is."""

    @field_validator("sites")
    @classmethod
    def _site_names(cls, value: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        for site, row in value.items():
            for name in (site, *row):
                try:
                    check_site(name)
                except InvalidNameError as exc:
                    raise ValueError(f"[distances.sites] {exc}") from None
        return value


class Config(_Model):
    """The whole file."""

    daemon: DaemonConfig = DaemonConfig()
    safety: SafetyConfig = SafetyConfig()
    http: HttpConfig = HttpConfig()
    classad: ClassAdConfig = ClassAdConfig()
    sources: list[SourceConfig] = Field(min_length=1)
    sites: dict[str, str] = Field(default_factory=dict)
    """Storage element (RSE / storage area) -> site; wins over what catalogues say."""
    collector: CollectorConfig = CollectorConfig()
    jobs: JobsConfig = JobsConfig()
    distances: DistancesConfig = DistancesConfig()

    @field_validator("sites")
    @classmethod
    def _sites(cls, value: dict[str, str]) -> dict[str, str]:
        spelled: dict[str, str] = {}
        for element, site in value.items():
            try:
                check_site(site)
            except InvalidNameError as exc:
                raise ValueError(f"{element}: {exc}") from None
            other = spelled.setdefault(site.casefold(), site)
            if other != site:
                raise ValueError(
                    f"{element}: site {site} differs only in case from {other} (ClassAd == "
                    "ignores case: they would be one site to the pool); spell them alike"
                )
        return value

    @model_validator(mode="after")
    def _unique_sources(self) -> Config:
        names = [s.name for s in self.sources]
        for name in names:
            if names.count(name) > 1:
                raise ValueError(f"two sources are named {name!r}; give each a unique name")
        return self

    @model_validator(mode="after")
    def _distance_source(self) -> Config:
        """[distances] source names a Rucio source of this file."""
        name = self.distances.source
        rucio = {s.name for s in self.sources if isinstance(s, RucioSourceConfig)}
        if name is not None and name not in rucio:
            raise ValueError(f"[distances] source: {name!r} is no Rucio source of this file")
        return self

    @model_validator(mode="after")
    def _unique_client_ids(self) -> Config:
        """Two sources following events at one broker need two client-ids: it refuses a
        second connection with one."""
        seen: dict[str, tuple[int, set[str]]] = {}
        for index, source in enumerate(self.sources):
            if not isinstance(source, RucioSourceConfig) or not source.events.enabled:
                continue
            events = source.events
            other = seen.setdefault(events.client_id, (index, set(events.brokers)))
            if other[0] != index and other[1] & set(events.brokers):
                raise ValueError(
                    f"sources[{index}].events.client_id: {events.client_id!r} is also "
                    f"sources[{other[0]}]'s at the same broker, which refuses the second; "
                    "give each source its own client_id"
                )
        return self


def default_config_path() -> Path:
    """``$HYDRATOR_CONFIG``, else ``/etc/hydrator/hydrator.toml``."""
    return Path(os.environ.get("HYDRATOR_CONFIG") or DEFAULT_CONFIG_PATH)


def load_config(path: Path) -> Config:
    """Read, validate and resolve a configuration file; raise ConfigError naming the key.

    A UTF-8 byte order mark (which some editors write) is stripped. The file must be a
    regular file of at most ``MAX_CONFIG_BYTES``. Every file a ``*_file`` key (or
    ``client_cert``/``client_key``/``client_proxy``) names must be a readable regular file of
    at most ``MAX_SECRET_FILE_BYTES``; a static inventory that exists must be a regular file.
    """
    try:
        raw = tomllib.loads(read_capped(path, MAX_CONFIG_BYTES).decode("utf-8-sig"))
    except FileRefused as exc:
        if exc.missing:
            raise ConfigError("", f"{path}: no such configuration file") from None
        raise ConfigError("", f"{path}: {exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError("", f"{path}: not valid TOML: {exc}") from None
    config = parse_config(raw, base_dir=path.parent)
    check_files(config)
    return config


_FILE_KEYS = ("client_cert", "client_key", "client_proxy")


def check_files(config: Config, *, inventories: bool = False) -> None:
    """Raise ConfigError naming the first key whose file is missing, not a regular file,
    over its size cap or unreadable by this process (secrets are re-read later; a typo must
    not wait for that). A static ``path`` that exists must be a regular file (a FIFO would
    hang every read); with ``inventories`` (``check-config``) it must also exist and fit
    ``max_inventory_bytes``."""
    for index, source in enumerate(config.sources):
        tables: list[tuple[str, _Model]] = [(f"sources[{index}]", source)]
        if isinstance(source, RucioSourceConfig):
            tables.append((f"sources[{index}].events", source.events))
        for where, table in tables:
            for key, value in table:
                if isinstance(value, Path) and (key.endswith("_file") or key in _FILE_KEYS):
                    problem = _unreadable(value, MAX_SECRET_FILE_BYTES)
                    if problem:
                        raise ConfigError(f"{where}.{key}", f"{value}: {problem}")
        if isinstance(source, StaticSourceConfig):
            problem = _unreadable(source.path, source.max_inventory_bytes)
            if problem and (inventories or not problem.missing):
                raise ConfigError(f"sources[{index}].path", f"{source.path}: {problem}")


def _unreadable(path: Path, max_bytes: int) -> FileRefused | None:
    """Why ``path`` cannot be read as a regular file of at most ``max_bytes``, or None
    (opened non-blocking and judged by fstat: opening a FIFO must not block)."""
    try:
        with open_regular(path) as handle:
            size = os.fstat(handle.fileno()).st_size
            handle.read(0)
    except FileRefused as exc:
        return exc
    except OSError as exc:
        return FileRefused(f"cannot read: {exc.strerror}")
    if size > max_bytes:
        return FileRefused(f"larger than the limit of {max_bytes} bytes")
    return None


def parse_config(raw: dict[str, Any], base_dir: Path) -> Config:
    """Validate a parsed TOML document; relative paths are resolved against ``base_dir``."""
    try:
        config = Config.model_validate(raw)
    except ValidationError as exc:
        error = exc.errors()[0]
        raise ConfigError(_dotted(error["loc"], raw), _message(error)) from None
    return _resolve_paths(config, base_dir.resolve())


def _message(error: Any) -> str:
    if error["type"] == "extra_forbidden":
        return "unknown key"
    if error["type"] == "missing":
        return "required key is missing"
    message = str(error["msg"]).removeprefix("Value error, ")
    given = error.get("input")
    if error["type"] in ("int_type", "float_type", "bool_type"):
        if isinstance(given, str):
            return f"{message}, not the string {given[:40]!r} (write it without quotes)"
        if isinstance(given, bool):
            return f"{message}, not a boolean"
    return message


def _dotted(loc: tuple[Any, ...], raw: dict[str, Any]) -> str:
    """``("sources", 0, "rucio", "timeout_s")`` -> ``sources[0].timeout_s``."""
    parts: list[str] = []
    node: Any = raw
    for item in loc:
        if isinstance(item, int):
            parts[-1] += f"[{item}]"
            node = node[item] if isinstance(node, list) and item < len(node) else None
            continue
        # pydantic inserts the discriminator value of a tagged union; it is not a key
        if isinstance(node, dict) and item not in node and node.get("type") == item:
            continue
        parts.append(str(item))
        node = node.get(item) if isinstance(node, dict) else None
    return ".".join(parts)


def _resolve_paths(config: Config, base: Path) -> Config:
    def fix(model: _Model) -> _Model:
        updates: dict[str, Any] = {}
        for key, value in model:
            if isinstance(value, Path) and not value.is_absolute():
                updates[key] = base / value
            elif isinstance(value, _Model) and (inner := fix(value)) is not value:
                updates[key] = inner  # a nested table: [sources.events]
        return model.model_copy(update=updates) if updates else model

    return config.model_copy(
        update={
            "daemon": fix(config.daemon),
            "collector": fix(config.collector),
            "sources": [fix(s) for s in config.sources],
        }
    )
