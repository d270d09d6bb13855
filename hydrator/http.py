"""The one HTTP listener: site ClassAds, JSON, metrics, probes; served by :mod:`.httpserver`.

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
each cycle, so a request never sees half a cycle. ClassAds and probes are answered on the event
loop from bytes rendered once per change; JSON and metrics are built in the server's thread pool.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from hydrator.domain import SITE_PATTERN, Site
from hydrator.httpserver import Deferred, HttpServer, Request, Response
from hydrator.report import site_json, sites_json
from hydrator.service import Service, SiteAd

log = logging.getLogger(__name__)

_NOT_FOUND = Response(HTTPStatus.NOT_FOUND, b"not found\n")
_UNKNOWN_SITE = Response(HTTPStatus.NOT_FOUND, b"unknown site\n")
_OK = Response(HTTPStatus.OK, b"ok\n")
_NOT_OK = Response(HTTPStatus.SERVICE_UNAVAILABLE, b"not ok\n")
_CLASSAD_TYPE = "text/plain; charset=utf-8"


class Routes:
    """Maps a request to a response; the only part of the endpoint that knows the service."""

    def __init__(self, service: Service, max_age_s: int, wedged_after_s: float) -> None:
        self.service = service
        self.cache_control = f"max-age={max_age_s}"
        self.wedged_after_s = wedged_after_s

    def __call__(self, request: Request) -> Response | Deferred:
        parts = [p for p in request.path.split("/") if p]
        if len(parts) == 4 and parts[:2] == ["v1", "sites"] and parts[3] == "classad":
            return self._classad(parts[2], request)
        if len(parts) == 3 and parts[:2] == ["v1", "sites"]:
            ad = self._ad(parts[2])
            return _UNKNOWN_SITE if ad is None else lambda: _json(site_json(ad.view))
        return self._fixed.get("/".join(parts), lambda: _NOT_FOUND)()

    @property
    def _fixed(self) -> dict[str, Callable[[], Response | Deferred]]:
        return {
            "v1/sites": self._sites,
            "metrics": lambda: self._metrics,
            "healthz": self._health,
            "readyz": lambda: _OK if self.service.ready.is_set() else _NOT_OK,
        }

    def _sites(self) -> Deferred:
        published = self.service.published
        return lambda: _json(sites_json(published))

    def _health(self) -> Response:
        idle_s = time.monotonic() - self.service.last_cycle_end
        return _OK if idle_s < self.wedged_after_s else _NOT_OK

    def _ad(self, name: str) -> SiteAd | None:
        return self.service.published.ads.get(Site(name)) if SITE_PATTERN.fullmatch(name) else None

    def _classad(self, name: str, request: Request) -> Response:
        ad = self._ad(name)
        if ad is None:
            return _UNKNOWN_SITE
        headers = (("ETag", ad.etag), ("Cache-Control", self.cache_control))
        if _matches(ad.etag, request.headers.get("if-none-match")):
            return Response(HTTPStatus.NOT_MODIFIED, content_type=None, headers=headers)
        return Response(HTTPStatus.OK, ad.body, _CLASSAD_TYPE, headers)

    def _metrics(self) -> Response:
        body = generate_latest(self.service.metrics.registry)
        return Response(HTTPStatus.OK, body, CONTENT_TYPE_LATEST)


def _json(doc: Any) -> Response:
    body = json.dumps(doc, indent=1).encode() + b"\n"
    return Response(HTTPStatus.OK, body, "application/json")


def _matches(etag: str, header: str | None) -> bool:
    """RFC 9110 If-None-Match: ``*`` or any listed tag, weak comparison."""
    if not header:
        return False
    tags = {tag.strip().removeprefix("W/") for tag in header.split(",")}
    return "*" in tags or etag in tags


class HttpEndpoint:
    """The listener; ``port`` is the bound port (useful with port 0)."""

    def __init__(
        self, service: Service, host: str, port: int, max_age_s: int, wedged_after_s: float
    ) -> None:
        self.routes = Routes(service, max_age_s, wedged_after_s)
        self.server = HttpServer(self.routes, host, port)
        self.port = self.server.port

    def start(self) -> None:
        self.server.start()
        log.info("listening on http://%s:%d", self.server.address[0], self.port)

    def stop(self) -> None:
        self.server.stop()
