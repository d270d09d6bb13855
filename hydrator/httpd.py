"""The HTTP front: a child process that answers the public port while the daemon runs cycles.

Why a process of its own: a cycle is CPU-bound Python. In the daemon's process every socket call
of the HTTP thread gives up the GIL and waits up to a switch interval (5 ms) to get it back from
the cycle thread, and a full garbage collection holds it for longer; with cycles running, the
conditional-GET p99 was 0.5 s and the worst request 1.1 s (``benchmarks/RESULTS.md``). Here the
front has its own interpreter and only bytes to serve.

What it answers itself, from what the daemon sent it:

- ``GET|HEAD /v1/sites/<site>/classad``: body, ``ETag``, ``Cache-Control: max-age``, ``304`` on
  ``If-None-Match``, ``404`` for a site it does not hold;
- ``/healthz``: ``200`` while the daemon's last cycle ended less than ``wedged_after_s`` ago
  (both processes read the same ``CLOCK_MONOTONIC``);
- ``/readyz``: ``200`` once the daemon says a cycle has saved state.

Everything else (JSON views, ``/metrics``, unknown paths) is forwarded to the daemon's private
listener on ``127.0.0.1`` and the answer relayed (``502`` if the daemon does not answer). The
front's own metrics (:class:`FrontMetrics`: requests by route and status, open connections) are
appended to the daemon's ``/metrics`` answer, so one scrape sees both processes.

The daemon (:class:`hydrator.http.HttpEndpoint`) starts this module with the listening socket as
an inherited descriptor and writes :func:`encode` frames to its stdin; after applying a frame the
front writes the frame's sequence number and a newline to stdout. It ignores SIGINT and SIGTERM
and exits when its stdin closes: when the daemon stops, or dies.
"""

from __future__ import annotations

import argparse
import collections
import http.client
import json
import logging
import resource
import signal
import socket
import struct
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import BinaryIO

from prometheus_client import CollectorRegistry, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily, Metric

from hydrator.httpserver import Deferred, HttpServer, Request, Response
from hydrator.observe import setup_logging

log = logging.getLogger("hydrator.httpd")

_HEADER = struct.Struct(">I")
_CLASSAD_TYPE = "text/plain; charset=utf-8"
_OK = Response(HTTPStatus.OK, b"ok\n")
_NOT_OK = Response(HTTPStatus.SERVICE_UNAVAILABLE, b"not ok\n")
_UNKNOWN_SITE = Response(HTTPStatus.NOT_FOUND, b"unknown site\n")
_RELAYED_HEADERS = frozenset({"etag", "cache-control", "allow"})


@dataclass(frozen=True, slots=True)
class Ad:
    etag: str
    body: bytes


@dataclass(frozen=True, slots=True)
class Update:
    """One frame: what changed since the previous frame. The daemon diffs against what the front
    acknowledged, and a new front starts empty, so a first frame simply lists every ad."""

    seq: int
    ready: bool
    last_cycle_end: float
    ads: Mapping[str, Ad] = field(default_factory=dict)
    removed: tuple[str, ...] = ()


def encode(update: Update) -> bytes:
    """Length of a JSON header, the header (sites, ETags, body lengths), then the bodies."""
    header = {
        "seq": update.seq,
        "ready": update.ready,
        "last_cycle_end": update.last_cycle_end,
        "removed": list(update.removed),
        "ads": [[site, ad.etag, len(ad.body)] for site, ad in update.ads.items()],
    }
    raw = json.dumps(header).encode()
    return b"".join([_HEADER.pack(len(raw)), raw, *(ad.body for ad in update.ads.values())])


def read_update(stream: BinaryIO) -> Update | None:
    """The next frame from ``stream``, or ``None`` at its end."""
    size = _read_exactly(stream, _HEADER.size)
    if size is None:
        return None
    raw = _read_exactly(stream, _HEADER.unpack(size)[0])
    if raw is None:
        return None
    header = json.loads(raw)
    ads: dict[str, Ad] = {}
    for site, etag, length in header["ads"]:
        body = _read_exactly(stream, length)
        if body is None:
            return None
        ads[site] = Ad(etag, body)
    removed = tuple(header["removed"])
    return Update(header["seq"], header["ready"], header["last_cycle_end"], ads, removed)


def _read_exactly(stream: BinaryIO, size: int) -> bytes | None:
    chunks, left = [], size
    while left:
        chunk = stream.read(left)
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


@dataclass(frozen=True, slots=True)
class Held:
    """What the front serves; replaced whole per frame, so a request sees one frame's state."""

    ads: Mapping[str, Ad] = field(default_factory=dict)
    ready: bool = False
    last_cycle_end: float = 0.0

    def apply(self, update: Update) -> Held:
        ads = dict(self.ads)
        for site in update.removed:
            ads.pop(site, None)
        ads.update(update.ads)
        return Held(ads, update.ready, update.last_cycle_end)


class FrontMetrics:
    """What the front counts; exposed with the daemon's metrics (see the module doc).

    Requests are counted in a plain dict by the event loop and turned into
    ``hydrator_http_requests_total`` only when scraped. Measured here: 0.7 us per request,
    against 2.5 us for a ``prometheus_client`` counter (a lock and a label lookup), of about
    25 us of front CPU per conditional GET.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.counts: collections.Counter[tuple[str, int]] = collections.Counter()
        registry.register(self)
        self.connections = Gauge(
            "http_connections",
            "Client connections open on the public port.",
            namespace="hydrator",
            registry=registry,
        )

    def observe(self, request: Request, status: HTTPStatus) -> None:
        self.counts[route_of(request.path), status.value] += 1

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "hydrator_http_requests",
            "Requests answered on the public port, by route (classad, healthz, readyz, json,"
            " metrics, other, invalid) and status code.",
            labels=["route", "code"],
        )
        for (route, code), count in sorted(self.counts.copy().items()):
            family.add_metric([route, str(code)], count)
        yield family


def route_of(path: str) -> str:
    """A bounded label for a request path (never the site name)."""
    if not path:
        return "invalid"
    if path.startswith("/v1/sites/") and path.endswith("/classad"):
        return "classad"
    if path in ("/healthz", "/readyz", "/metrics"):
        return path[1:]
    return "json" if path.startswith("/v1/sites") else "other"


class FrontRoutes:
    """Answers ClassAds and probes from :attr:`held`; hands the rest to the daemon."""

    def __init__(
        self,
        backend_port: int,
        max_age_s: int,
        wedged_after_s: float,
        metrics: FrontMetrics | None = None,
    ) -> None:
        self.held = Held()
        self.metrics = metrics
        self.backend_port = backend_port
        self.cache_control = f"max-age={max_age_s}"
        self.wedged_after_s = wedged_after_s

    def __call__(self, request: Request) -> Response | Deferred:
        parts = request.path.split("/")
        if len(parts) == 5 and parts[:3] == ["", "v1", "sites"] and parts[4] == "classad":
            return self._classad(parts[3], request)
        if request.path == "/healthz":
            idle_s = time.monotonic() - self.held.last_cycle_end
            return _OK if idle_s < self.wedged_after_s else _NOT_OK
        if request.path == "/readyz":
            return _OK if self.held.ready else _NOT_OK
        return lambda: self._forward(request)

    def _classad(self, site: str, request: Request) -> Response:
        ad = self.held.ads.get(site)
        if ad is None:
            return _UNKNOWN_SITE
        headers = (("ETag", ad.etag), ("Cache-Control", self.cache_control))
        if etag_matches(ad.etag, request.headers.get("if-none-match")):
            return Response(HTTPStatus.NOT_MODIFIED, content_type=None, headers=headers)
        return Response(HTTPStatus.OK, ad.body, _CLASSAD_TYPE, headers)

    def _forward(self, request: Request) -> Response:
        """The daemon's answer to the same request (as GET: HEAD drops the body here)."""
        connection = http.client.HTTPConnection("127.0.0.1", self.backend_port, timeout=60)
        try:
            relayed = {"If-None-Match": request.headers.get("if-none-match", "")}
            connection.request("GET", request.path, headers={k: v for k, v in relayed.items() if v})
            answer = connection.getresponse()
            body = answer.read()
        except OSError as exc:
            log.warning("the daemon did not answer %s: %s", request.path, exc)
            return Response(HTTPStatus.BAD_GATEWAY, b"the daemon did not answer\n")
        finally:
            connection.close()
        headers = tuple((k, v) for k, v in answer.getheaders() if k.lower() in _RELAYED_HEADERS)
        if request.path == "/metrics" and answer.status == HTTPStatus.OK and self.metrics:
            body += generate_latest(self.metrics.registry)
        return Response(HTTPStatus(answer.status), body, answer.getheader("Content-Type"), headers)


def etag_matches(etag: str, header: str | None) -> bool:
    """RFC 9110 ``If-None-Match``: ``*`` or any listed tag, weak comparison."""
    if not header:
        return False
    tags = {tag.strip().removeprefix("W/") for tag in header.split(",")}
    return "*" in tags or etag in tags


def serve(routes: FrontRoutes, server: HttpServer, updates: BinaryIO, acks: BinaryIO) -> None:
    """Apply frames from ``updates`` and acknowledge each, until ``updates`` ends. The server
    starts accepting only once the first frame is applied: until then a client waits in the
    accept queue rather than being told that no site exists."""
    while (update := read_update(updates)) is not None:
        routes.held = routes.held.apply(update)
        if not server.running:
            server.start()
        acks.write(f"{update.seq}\n".encode())
        acks.flush()
    server.stop()


def raise_descriptor_limit() -> None:
    """Lift the soft limit on open files to the hard one: every client connection is a
    descriptor, and glideins fetching without a squid can hold thousands at once."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    limit = hard if hard != resource.RLIM_INFINITY else soft
    if 0 < limit < 4096:
        log.warning("only %d open files allowed: as many client connections at most", limit)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hydrator.httpd", description=__doc__)
    parser.add_argument("--fd", type=int, required=True, help="the listening socket, inherited")
    parser.add_argument("--backend-port", type=int, required=True)
    parser.add_argument("--max-age-s", type=int, required=True)
    parser.add_argument("--wedged-after-s", type=float, required=True)
    parser.add_argument("--log-format", choices=["text", "json"], default="text")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    setup_logging(args.log_format, args.log_level)
    raise_descriptor_limit()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the daemon decides when we stop
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    metrics = FrontMetrics(CollectorRegistry())
    routes = FrontRoutes(args.backend_port, args.max_age_s, args.wedged_after_s, metrics)
    server = HttpServer(routes, socket.socket(fileno=args.fd), observer=metrics.observe)
    metrics.connections.set_function(lambda: len(server.connections))
    serve(routes, server, sys.stdin.buffer, sys.stdout.buffer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
