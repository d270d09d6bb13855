"""The daemon's side of the HTTP endpoint: the public socket, the files served, the server child.

==============================  =====================================================
``GET /v1/sites``               JSON: every site with counts, digest, updated; sources
``GET /v1/sites/<site>``        JSON: one site's datasets by state, with fractions
``GET /v1/sites/<site>/classad`` text/plain old-syntax ClassAd + ``- update:true``;
                                ``ETag``, ``Cache-Control: max-age, stale-if-error``,
                                ``304`` on ``If-None-Match``, ``404`` for an unknown site
``GET /metrics``                Prometheus text format (the daemon's and the server's)
``GET /healthz``                200 while the cycle loop is not wedged
``GET /readyz``                 200 once every source answered once or has saved state
==============================  =====================================================

:class:`HttpEndpoint` binds the public socket (a busy address is a
:class:`~hydrator.errors.ConfigError` at start-up), writes what is served into a private
directory after every cycle, each file atomically (temp file, rename), and starts the
server (:mod:`hydrator.adapters.http.server`, aiohttp) as a child process that inherits the
socket and serves
those files. The daemon never waits for the server: if it is slow, stopped or dead, cycles go on
and only the files change. A server that exits is started again (the socket stays open
meanwhile, so clients wait in the accept queue rather than being refused); the server exits when
the daemon does, as its standard input (a pipe the daemon holds) then ends.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Mapping
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

from prometheus_client import generate_latest

from hydrator.config import HttpConfig
from hydrator.core.slot_coverage import SiteCoverage
from hydrator.domain import Site, SiteView
from hydrator.errors import ConfigError
from hydrator.logs import JsonFormatter
from hydrator.runtime.json_views import demand_json, site_json, sites_json
from hydrator.runtime.metrics import Metrics
from hydrator.runtime.observe import record_http_front_restart
from hydrator.runtime.service import Service

log = logging.getLogger(__name__)

RESTART_DELAY_S = 1.0

DOCUMENTS: dict[str, Callable[[Service, Mapping[Site, SiteCoverage]], Any]] = {
    "sites.json": lambda service, coverage: sites_json(service.published, coverage),
    "demand.json": lambda service, _coverage: demand_json(service.published),
}
"""JSON views rewritten after every cycle: file name -> builder of the service's published
state and the slots' coverage (see :data:`hydrator.adapters.http.server.ROUTES` for the URL
of each)."""


def listen(host: str, port: int, backlog: int, send_timeout_s: float) -> socket.socket:
    """A listening TCP socket on ``host:port`` (port 0: any free one). ``::`` listens on IPv6
    and IPv4 alike (``[http] listen = "[::]:9620"``). Raises :class:`ConfigError` naming
    ``http.listen`` when the address is busy or cannot be had.

    ``TCP_USER_TIMEOUT`` (Linux, tcp(7)), inherited by every accepted connection: the kernel
    drops a connection whose sent data stays unacknowledged, or whose window stays zero, for
    ``send_timeout_s``, so a client that stops reading cannot hold its connection and the
    answer buffered for it."""
    try:
        if host == "::":  # every address: IPv6 and, where the system can, IPv4 on the same socket
            dualstack = socket.has_dualstack_ipv6()
            sock = socket.create_server(
                (host, port), family=socket.AF_INET6, backlog=backlog, dualstack_ipv6=dualstack
            )
        else:
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            sock = socket.create_server((host, port), family=family, backlog=backlog)
    except OSError as exc:
        where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        raise ConfigError("http.listen", f"cannot listen on {where}: {exc.strerror}") from exc
    if hasattr(socket, "TCP_USER_TIMEOUT"):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, int(send_timeout_s * 1000))
    return sock


class Spool:
    """A private directory of files, each replaced atomically (temp file, rename).

    No fsync: ``rename`` alone makes readers see the old file or the new one, never a part,
    and durability buys nothing here: the directory is made at start-up and removed at stop,
    so after a crash nothing reads it again (the cost of the fsyncs: docs/performance.md)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def write(self, name: str, body: bytes) -> None:
        path = self.root / name
        tmp = path.with_name(f".{path.name}.tmp")
        with open(tmp, "wb") as f:
            f.write(body)
        os.replace(tmp, path)

    def read(self, name: str) -> bytes:
        return (self.root / name).read_bytes()

    def remove(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.root / name).unlink()


class HttpEndpoint:
    """The public listener (``port``: the bound port, useful with port 0); see the module doc.
    ``service`` is what is served (:meth:`attach` swaps it on a reload); ``metrics`` is what
    ``/metrics`` shows and the server's restarts are counted in: the daemon's, kept across
    reloads."""

    def __init__(
        self, service: Service, config: HttpConfig, wedged_after_s: float, *, metrics: Metrics
    ) -> None:
        self.service = service
        self.metrics = metrics
        self.config = config
        self.wedged_after_s = wedged_after_s
        self.sock = listen(config.host, config.port, config.backlog, config.send_timeout_s)
        self.port: int = self.sock.getsockname()[1]
        self.directory = Path(tempfile.mkdtemp(prefix="hydrator-http-"))  # mode 0700
        for sub in ("classad", "site"):
            (self.directory / sub).mkdir()
        self.spool = Spool(self.directory)
        self._written: dict[Site, tuple[str, SiteView]] = {}
        """Site -> the ETag of its ClassAd file, and the view its JSON file was made from."""
        self._lock = threading.Lock()  # guards _child
        self._writing = threading.Lock()  # one writer at a time: cycles, the watcher
        self._child: subprocess.Popen[bytes] | None = None
        self._stopping = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="http-server", daemon=True)
        self.threads_down: Callable[[], list[str]] = list
        """The supervised threads now down (:meth:`.supervise.Supervisor.down`): ``/readyz``
        names them."""
        self.coverage: Callable[[], Mapping[Site, SiteCoverage]] = dict
        """The slots' coverage per site as the repair watch last looked
        (:attr:`~hydrator.runtime.repair.RepairWatch.coverage`; none without a watch)."""

    def start(self) -> None:
        self.write()
        self.service.add_listener(self.write)
        with self._lock:
            self._spawn()
        self._watcher.start()
        log.info("listening on http://%s:%d", self.config.host, self.port)

    def detach(self) -> None:
        """Stop following the service (before it is closed, on a reload); what was written
        is served meanwhile."""
        with contextlib.suppress(ValueError):
            self.service.remove_listener(self.write)

    def attach(self, service: Service) -> None:
        """Serve ``service`` from now on (the one a reload built) and write what it publishes."""
        self.service = service
        service.add_listener(self.write)
        self.write()

    def write(self) -> None:
        """Write what the service now publishes (changed ads and site views only); never
        raises: a file that cannot be written is logged, and the server keeps the old one."""
        with self._writing:
            self._write_all()

    def _write_all(self) -> None:
        try:
            self._write_sites()
            for name, build in DOCUMENTS.items():
                self.spool.write(name, _json(build(self.service, self.coverage())))
            self._write_status()
        except OSError as exc:
            log.error("cannot write the files the HTTP server serves: %s", exc)

    def write_status(self) -> None:
        """Write the metrics and the probes' status only (a listener's connection change, a
        supervised thread's death or return: no cycle ran); never raises, as :meth:`write`."""
        with self._writing:
            try:
                self._write_status()
            except OSError as exc:
                log.error("cannot write the files the HTTP server serves: %s", exc)

    def _write_status(self) -> None:
        self.spool.write("metrics.txt", generate_latest(self.metrics.registry))
        ready, reason = self.service.readiness()
        down = self.threads_down()
        if down:
            ready, reason = False, f"thread(s) down, being restarted: {', '.join(down)}; {reason}"
        status = {
            "ready": ready,
            "reason": reason,
            "cycle_end_monotonic": self.service.last_cycle_end,
            "wedged_after_s": self.wedged_after_s,
        }
        self.spool.write("status.json", _json(status))

    def watcher_alive(self) -> bool:
        """The thread that restarts the server child runs (or the endpoint is stopping)."""
        return self._watcher.is_alive() or self._stopping.is_set()

    def restart_watcher(self) -> None:
        """Start the watcher again (supervision: it was found dead)."""
        if self.watcher_alive():
            return
        self._watcher = threading.Thread(target=self._watch, name="http-server", daemon=True)
        self._watcher.start()

    def _write_sites(self) -> None:
        """Every changed ClassAd first (what glideins and the startd hook fetch), then the
        site documents (larger, read by people and provisioners), so that a new ad is served
        without waiting for them."""
        published = self.service.published
        ads = published.ads
        for site, ad in ads.items():
            if self._written.get(site, ("", None))[0] != ad.etag:
                self.spool.write(f"classad/{site}", ad.body)
        for site, ad in ads.items():
            view = published.view(site)  # the full lists: only the ad is cut
            old = self._written.get(site, ("", None))[1]
            name = f"site/{site}.json"
            new = site_file_bytes(view, old, partial(self.spool.read, name))
            if new is not None:
                self.spool.write(name, new)
            self._written[site] = (ad.etag, view)
        for site in [s for s in self._written if s not in ads]:
            self.spool.remove(f"classad/{site}")
            self.spool.remove(f"site/{site}.json")
            del self._written[site]

    def stop(self) -> None:
        """Stop the server child, close the public socket, remove the directory."""
        self._stopping.set()
        with contextlib.suppress(ValueError):
            self.service.remove_listener(self.write)
        with self._lock:
            child, self._child = self._child, None
        if child is not None:
            _end(child)
        if self._watcher.is_alive():
            self._watcher.join(timeout=5)
        self.sock.close()
        shutil.rmtree(self.directory, ignore_errors=True)

    def _command(self) -> list[str]:
        c, root = self.config, logging.getLogger()
        fmt = (
            "json" if any(isinstance(h.formatter, JsonFormatter) for h in root.handlers) else "text"
        )
        # -P: the working directory (the state directory, say) is not put on sys.path
        return [
            *(sys.executable, "-P", "-m", "hydrator.adapters.http.server"),
            *("--fd", str(self.sock.fileno())),
            *("--dir", str(self.directory), "--max-age-s", str(c.max_age_s)),
            *("--stale-if-error-s", str(c.stale_if_error_s)),
            *("--max-connections", str(c.max_connections)),
            *("--max-header-bytes", str(c.max_header_bytes)),
            *("--idle-timeout-s", str(c.idle_timeout_s), "--backlog", str(c.backlog)),
            *("--log-format", fmt, "--log-level", logging.getLevelName(root.getEffectiveLevel())),
        ]

    def _spawn(self) -> None:
        """Start the server on the public socket (under the lock). Its stdin is a pipe this
        process holds and never writes: it ends when the daemon stops or dies."""
        self._child = subprocess.Popen(
            self._command(), stdin=subprocess.PIPE, pass_fds=(self.sock.fileno(),)
        )

    def _watch(self) -> None:
        """Restart the server whenever it exits while the endpoint is running."""
        while not self._stopping.is_set():
            child = self._child
            if child is not None:
                code = child.wait()
                if self._stopping.is_set():
                    return
                log.error("the HTTP server exited with status %s: restarting it", code)
                record_http_front_restart(self.metrics)
                self.write()  # the count, on /metrics
                _end(child)
            if self._stopping.wait(RESTART_DELAY_S):
                return
            with self._lock:
                if self._stopping.is_set():
                    return
                try:
                    self._spawn()
                except OSError as exc:
                    log.error("could not start the HTTP server: %s", exc)
                    self._child = None


EMPTY_LISTS: dict[str, Any] = dict.fromkeys(
    ("available", "partial", "replicating", "stuck", "incoming", "partial_bytes"), ()
)
"""A site view's lists, emptied: what :func:`_head` leaves out to format ``updated`` alone."""


def site_file_bytes(
    view: SiteView, old: SiteView | None, read_old: Callable[[], bytes]
) -> bytes | None:
    """The JSON file of ``view`` (:func:`site_json`), given ``old``, the view the file
    ``read_old`` returns was made from; None if ``view`` equals ``old``. A view that differs
    only in ``updated`` (every cycle in which its sources answered and nothing changed) gets
    the old file with its head (``site``, ``updated``) replaced instead of its lists formatted
    again, so no document is held between cycles (what each costs: docs/performance.md).
    Views are compared only when their digests are equal."""
    if old is None or old.digest != view.digest:
        return _json(site_json(view))
    if old == view:
        return None
    if replace(old, updated=view.updated) != view:
        return _json(site_json(view))
    before = _head(old)
    try:
        body = read_old()
    except OSError:
        body = b""
    if not body.startswith(before):  # a file not of our making: format it again
        return _json(site_json(view))
    return _head(view) + body[len(before) :]


def _head(view: SiteView) -> bytes:
    """The start of ``view``'s JSON file up to its ``updated`` value (``site_json``'s first
    two keys, which the rest of the document follows after a comma)."""
    doc = site_json(replace(view, **EMPTY_LISTS))
    return _json({"site": doc["site"], "updated": doc["updated"]})[: -len(b"}\n")]


def _json(doc: Any) -> bytes:
    """Compact JSON and a newline: without ``indent`` the encoder is the C one, not the
    pure-Python one (how much faster: docs/performance.md)."""
    return json.dumps(doc, separators=(",", ":")).encode() + b"\n"


def _end(child: subprocess.Popen[bytes]) -> None:
    """Close the child's stdin (it exits), wait, kill if it does not."""
    if child.stdin is not None:
        with contextlib.suppress(OSError):
            child.stdin.close()
    try:
        child.wait(timeout=5)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
