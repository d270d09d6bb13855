"""The one HTTP listener: site ClassAds, JSON, metrics, probes; served by :mod:`.httpserver`.

==============================  =====================================================
``GET /v1/sites``               JSON: every site with counts, digest, updated; sources
``GET /v1/sites/<site>``        JSON: one site's datasets by state, with fractions
``GET /v1/demand``              JSON: idle data-bound jobs per site (``[jobs]``); ``ETag``,
                                ``304`` on ``If-None-Match``
``GET /v1/sites/<site>/classad`` text/plain old-syntax ClassAd + ``- update:true``;
                                ``ETag``, ``Cache-Control: max-age``, ``304`` on
                                ``If-None-Match``, ``404`` for an unknown site
``GET /metrics``                Prometheus text format
``GET /healthz``                200 while the cycle loop is not wedged
``GET /readyz``                 200 after the first successful cycle, else 503
==============================  =====================================================

Two processes answer. The public port belongs to the front (:mod:`hydrator.httpd`), a child
process that serves ClassAds and probes from bytes the daemon sends it after each cycle (only
the sites whose ETag changed), so their latency does not depend on the daemon's cycles. The
front forwards JSON and ``/metrics`` to :class:`Routes` on a private ``127.0.0.1`` listener in
the daemon, built from :attr:`Service.published`, an immutable object replaced whole after each
cycle, so a request never sees half a cycle.

:class:`HttpEndpoint` owns both: it binds the public socket itself (a busy port fails at start),
hands it to the front, waits for the front to acknowledge every update (after a cycle returns,
the front serves what it published), and restarts a front that dies.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import subprocess
import sys
import threading
import time
from http import HTTPStatus
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from hydrator.domain import SITE_PATTERN, Site
from hydrator.httpd import Ad, Update, encode, etag_matches
from hydrator.httpserver import Deferred, HttpServer, Request, Response, listen
from hydrator.observe import JsonFormatter
from hydrator.render import etag
from hydrator.report import demand_json, site_json, sites_json
from hydrator.service import Service

log = logging.getLogger(__name__)

_NOT_FOUND = Response(HTTPStatus.NOT_FOUND, b"not found\n")
_UNKNOWN_SITE = Response(HTTPStatus.NOT_FOUND, b"unknown site\n")

ACK_TIMEOUT_S = 10.0
"""How long an update may take the front to apply before it is replaced."""
RESTART_DELAY_S = 1.0


class Routes:
    """The daemon's own answers: JSON views and metrics, built in the server's thread pool."""

    def __init__(self, service: Service) -> None:
        self.service = service

    def __call__(self, request: Request) -> Response | Deferred:
        parts = [p for p in request.path.split("/") if p]
        if parts == ["v1", "sites"]:
            published = self.service.published
            return lambda: _json(sites_json(published))
        if len(parts) == 3 and parts[:2] == ["v1", "sites"]:
            name = parts[2]
            ad = (
                self.service.published.ads.get(Site(name)) if SITE_PATTERN.fullmatch(name) else None
            )
            return _UNKNOWN_SITE if ad is None else lambda: _json(site_json(ad.view))
        if parts == ["v1", "demand"]:
            published = self.service.published
            return lambda: _tagged_json(demand_json(published), request)
        if parts == ["metrics"]:
            return self._metrics
        return _NOT_FOUND

    def _metrics(self) -> Response:
        body = generate_latest(self.service.metrics.registry)
        return Response(HTTPStatus.OK, body, CONTENT_TYPE_LATEST)


def _json(doc: Any) -> Response:
    body = json.dumps(doc, indent=1).encode() + b"\n"
    return Response(HTTPStatus.OK, body, "application/json")


def _tagged_json(doc: Any, request: Request) -> Response:
    """JSON with an ``ETag``; ``304`` when the client holds it already."""
    text = json.dumps(doc, indent=1) + "\n"
    headers = (("ETag", etag(text)),)
    if etag_matches(headers[0][1], request.headers.get("if-none-match")):
        return Response(HTTPStatus.NOT_MODIFIED, content_type=None, headers=headers)
    return Response(HTTPStatus.OK, text.encode(), "application/json", headers)


class HttpEndpoint:
    """The public listener (``port``: the bound port, useful with port 0); see the module doc."""

    def __init__(
        self, service: Service, host: str, port: int, max_age_s: int, wedged_after_s: float
    ) -> None:
        self.service = service
        self.sock = listen(host, port)
        self.port: int = self.sock.getsockname()[1]
        self.backend = HttpServer(Routes(service), listen("127.0.0.1", 0))
        self._options = ["--max-age-s", str(max_age_s), "--wedged-after-s", str(wedged_after_s)]
        self._lock = threading.Lock()  # one update at a time; guards the fields below
        self._front: subprocess.Popen[bytes] | None = None
        self._sent: dict[Site, str] = {}  # the ETags the front holds
        self._seq = 0
        self._acks = b""
        self._stopping = threading.Event()
        self._listening = False
        self._watcher = threading.Thread(target=self._watch, name="http-front", daemon=True)

    def start(self) -> None:
        self.backend.start()
        self.service.add_listener(self.push)  # first: no cycle can end unseen by the front
        self._listening = True
        with self._lock:
            self._spawn()
        self._watcher.start()
        log.info("listening on http://%s:%d", self.sock.getsockname()[0], self.port)

    def push(self) -> None:
        """Send the front what changed in :attr:`Service.published`; return once it serves it."""
        with self._lock:
            if self._front is not None and not self._stopping.is_set():
                self._send()

    def stop(self) -> None:
        """Stop the front (its stdin closes), the private listener and the public socket."""
        self._stopping.set()
        if self._listening:
            self.service.remove_listener(self.push)
            self._listening = False
        with self._lock:
            front, self._front = self._front, None
        if front is not None:
            _end(front)
        if self._watcher.is_alive():
            self._watcher.join(timeout=5)
        self.backend.stop()
        self.sock.close()

    def _spawn(self) -> None:
        """Start a front on the public socket and send it everything (under the lock)."""
        fd = self.sock.fileno()
        root = logging.getLogger()
        fmt = (
            "json" if any(isinstance(h.formatter, JsonFormatter) for h in root.handlers) else "text"
        )
        # -P: the working directory (the state directory, say) is not put on sys.path
        command = [sys.executable, "-P", "-m", "hydrator.httpd", "--fd", str(fd)]
        command += ["--backend-port", str(self.backend.port), *self._options]
        command += [
            "--log-format",
            fmt,
            "--log-level",
            logging.getLevelName(root.getEffectiveLevel()),
        ]
        self._front = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, pass_fds=(fd,)
        )
        self._sent, self._acks = {}, b""
        self._send()

    def _send(self) -> None:
        front = self._front
        assert front is not None and front.stdin is not None
        published = self.service.published
        ads: dict[str, Ad] = {
            site: Ad(ad.etag, ad.body)
            for site, ad in published.ads.items()
            if self._sent.get(site) != ad.etag
        }
        removed = tuple(site for site in self._sent if site not in published.ads)
        self._seq += 1
        ready, last_cycle_end = self.service.ready.is_set(), self.service.last_cycle_end
        update = Update(self._seq, ready, last_cycle_end, ads, removed)
        try:
            front.stdin.write(encode(update))
            front.stdin.flush()
            self._await_ack(front, self._seq)
        except (OSError, ValueError, TimeoutError) as exc:  # ValueError: its pipe is closed
            log.error("the HTTP front did not take update %d (%s): restarting it", self._seq, exc)
            front.kill()  # the watcher starts a new one, which is sent everything
            return
        self._sent = {site: ad.etag for site, ad in published.ads.items()}

    def _await_ack(self, front: subprocess.Popen[bytes], seq: int) -> None:
        assert front.stdout is not None
        fd, deadline = front.stdout.fileno(), time.monotonic() + ACK_TIMEOUT_S
        while not self._acks.endswith(f"{seq}\n".encode()):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError(f"no acknowledgement within {ACK_TIMEOUT_S:.0f} s")
            chunk = os.read(fd, 4096)
            if not chunk:
                raise ConnectionError("the front exited")
            self._acks = (self._acks + chunk)[-64:]

    def _watch(self) -> None:
        """Restart the front whenever it exits while the endpoint is running."""
        while not self._stopping.is_set():
            front = self._front
            if front is not None:
                code = front.wait()
                if self._stopping.is_set():
                    return
                log.error("the HTTP front exited with status %s: restarting it", code)
                self.service.metrics.http_front_restarts.inc()
                with self._lock:
                    _end(front)
            if self._stopping.wait(RESTART_DELAY_S):
                return
            with self._lock:
                if self._stopping.is_set():
                    return
                try:
                    self._spawn()
                except OSError as exc:
                    log.error("could not start the HTTP front: %s", exc)
                    self._front = None


def _end(front: subprocess.Popen[bytes]) -> None:
    """Close the front's stdin (it exits), wait, kill if it does not; close its pipes."""
    for pipe in (front.stdin, front.stdout):
        if pipe is not None:
            with contextlib.suppress(OSError):
                pipe.close()
    try:
        front.wait(timeout=5)
    except subprocess.TimeoutExpired:
        front.kill()
        front.wait()
