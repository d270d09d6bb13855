"""The one HTTP listener (stdlib ``ThreadingHTTPServer``): site ClassAds, JSON, metrics, probes.

==============================  =====================================================
``GET /v1/sites``               JSON: every site with counts, digest, updated; sources
``GET /v1/sites/<site>``        JSON: one site's datasets by state, with fractions
``GET /v1/sites/<site>/classad`` text/plain old-syntax ClassAd + ``- update:true``;
                                ``ETag``, ``Cache-Control: max-age``, ``304`` on
                                ``If-None-Match``, ``404`` for an unknown site
``GET /metrics``                Prometheus text format
``GET /healthz``                200 while the cycle loop is not wedged
``GET /readyz``                 200 after the first successful cycle, else 503
==============================  =====================================================

Responses are built from :attr:`Service.published`, an immutable object replaced whole after
each cycle, so a request never sees half a cycle.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from hydrator.domain import SITE_PATTERN, Site
from hydrator.report import site_json, sites_json
from hydrator.service import Service

log = logging.getLogger(__name__)


class HydratorHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    # socketserver's default listen backlog is 5: a burst of new connections (a squid or a
    # wave of glideins) overflows it, the kernel drops the SYNs and the clients retry after
    # 1 s; that was the p99 latency under wrk -c50 (benchmarks/RESULTS.md).
    request_queue_size = 128

    def __init__(
        self, address: tuple[str, int], service: Service, max_age_s: int, wedged_after_s: float
    ) -> None:
        super().__init__(address, Handler)
        self.service = service
        self.max_age_s = max_age_s
        self.wedged_after_s = wedged_after_s

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hangs up mid-request (squid, wrk, a killed hook) is routine: log it at
        debug level instead of printing a traceback to stderr; anything else is an error."""
        exc = sys.exc_info()[1]
        if isinstance(exc, ConnectionError | TimeoutError):
            log.debug("client %s went away: %s", client_address, exc)
        else:
            log.exception("error while answering %s", client_address)


class Handler(BaseHTTPRequestHandler):
    server: HydratorHTTPServer
    protocol_version = "HTTP/1.1"  # keep-alive for squids and scrapers
    # Headers and body go out in two writes; without TCP_NODELAY, Nagle's algorithm holds the
    # body back until the client's delayed ACK of the headers (up to 40 ms on Linux).
    disable_nagle_algorithm = True
    timeout = 30  # an idle keep-alive connection does not hold a thread forever
    server_version = "hydrator"
    sys_version = ""

    def do_GET(self) -> None:
        self._route(head=False)

    def do_HEAD(self) -> None:
        self._route(head=True)

    def _route(self, head: bool) -> None:
        path = self.path.split("?", 1)[0]
        parts = [p for p in path.split("/") if p]
        if parts == ["v1", "sites"]:
            self._json(sites_json(self.server.service.published), head)
        elif len(parts) == 3 and parts[:2] == ["v1", "sites"]:
            self._site(parts[2], head, classad=False)
        elif len(parts) == 4 and parts[:2] == ["v1", "sites"] and parts[3] == "classad":
            self._site(parts[2], head, classad=True)
        elif parts == ["metrics"]:
            body = generate_latest(self.server.service.metrics.registry)
            self._send(HTTPStatus.OK, body, CONTENT_TYPE_LATEST, head)
        elif parts == ["healthz"]:
            self._probe(self._healthy(), head)
        elif parts == ["readyz"]:
            self._probe(self.server.service.ready.is_set(), head)
        else:
            self._send(HTTPStatus.NOT_FOUND, b"not found\n", "text/plain", head)

    def _site(self, name: str, head: bool, classad: bool) -> None:
        ad = (
            self.server.service.published.ads.get(Site(name))
            if SITE_PATTERN.fullmatch(name)
            else None
        )
        if ad is None:
            self._send(HTTPStatus.NOT_FOUND, b"unknown site\n", "text/plain", head)
        elif not classad:
            self._json(site_json(ad.view), head)
        elif ad.etag in _etags(self.headers.get("If-None-Match")):
            self._send(HTTPStatus.NOT_MODIFIED, b"", None, head=True, etag=ad.etag)
        else:
            self._send(HTTPStatus.OK, ad.body, "text/plain; charset=utf-8", head, etag=ad.etag)

    def _healthy(self) -> bool:
        idle_s = time.monotonic() - self.server.service.last_cycle_end
        return idle_s < self.server.wedged_after_s

    def _probe(self, ok: bool, head: bool) -> None:
        status = HTTPStatus.OK if ok else HTTPStatus.SERVICE_UNAVAILABLE
        self._send(status, b"ok\n" if ok else b"not ok\n", "text/plain", head)

    def _json(self, doc: Any, head: bool) -> None:
        body = json.dumps(doc, indent=1).encode() + b"\n"
        self._send(HTTPStatus.OK, body, "application/json", head)

    def _send(
        self,
        status: HTTPStatus,
        body: bytes,
        ctype: str | None,
        head: bool,
        etag: str | None = None,
    ) -> None:
        self.send_response(status)
        if ctype:
            self.send_header("Content-Type", ctype)
        if etag:
            self.send_header("ETag", etag)
            self.send_header("Cache-Control", f"max-age={self.server.max_age_s}")
        self.send_header(
            "Content-Length", "0" if status == HTTPStatus.NOT_MODIFIED else str(len(body))
        )
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)


def _etags(header: str | None) -> set[str]:
    if not header:
        return set()
    return {tag.strip().removeprefix("W/") for tag in header.split(",")}


class HttpEndpoint:
    """Runs the server in a thread; ``port`` is the bound port (useful with port 0)."""

    def __init__(
        self, service: Service, host: str, port: int, max_age_s: int, wedged_after_s: float
    ) -> None:
        self.server = HydratorHTTPServer((host, port), service, max_age_s, wedged_after_s)
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, name="http", daemon=True)

    def start(self) -> None:
        self._thread.start()
        log.info("listening on http://%s:%d", self.server.server_address[0], self.port)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=5)
