"""The HTTP server: a child process serving, with aiohttp, the files the daemon writes.

The daemon (:class:`~hydrator.runtime.http_endpoint.HttpEndpoint`) binds the public socket,
writes what is to be served into a private directory after each cycle (each file atomically:
temp file, rename), and starts this module with ``subprocess`` (``python -m
hydrator.adapters.http.server``; exec, not fork) and the socket as an inherited descriptor.
Nothing else passes between the two processes: the daemon never waits for this one, and this one
exits when its standard input (a pipe the daemon holds open) ends, i.e. when the daemon stops or
dies, and then removes the directory.

Why a process of its own: a cycle is CPU-bound Python, and in the daemon's process it would
stall the server through the GIL. The measurements behind that, and why aiohttp:
``docs/http.md``.

===============================  ===============================  ==========================
``GET /v1/sites/<site>/classad``  ``classad/<site>``               ``ETag`` (hash of the
                                                                   body), ``304`` on
                                                                   ``If-None-Match``,
                                                                   ``Cache-Control``
``GET /v1/sites``                 ``sites.json``                   JSON, ``ETag``, ``304``
``GET /v1/sites/<site>``          ``site/<site>.json``             JSON, ``ETag``, ``304``
``GET /v1/demand``                ``demand.json``                  JSON, ``ETag``, ``304``
``GET /metrics``                  ``metrics.txt``                  the daemon's metrics, then
                                                                   this process's own
``GET /healthz``, ``/readyz``     ``status.json``                  see :func:`healthz`
===============================  ===============================  ==========================

A file is re-read when its inode changes (one ``stat`` per request), so an answer is always one
whole file as the daemon last renamed it into place. An absent file is a ``404``.

Limits (``[http]`` in the configuration): at most ``max_connections`` client connections (more
are closed as soon as accepted, and counted); a request line or header field longer than
``max_header_bytes`` gets ``400``; a connection with no complete request within
``idle_timeout_s`` of its opening or of its previous answer is closed (clients that send
nothing, bare CRLFs, or one byte a second); the daemon sets the listen backlog and
``TCP_USER_TIMEOUT`` on the socket (a client that stops reading is dropped by the kernel).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import resource
import shutil
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_request import BaseRequest
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    generate_latest,
)

from hydrator.core.render import etag
from hydrator.logs import setup_logging

log = logging.getLogger("hydrator.adapters.http.server")

CLASSAD_TYPE = "text/plain; charset=utf-8"
JSON_TYPE = "application/json"
SITE = r"{site:[A-Za-z0-9][A-Za-z0-9_.\-]{0,99}}"  # names.SITE_PATTERN: safe as a file name
MAX_HEADERS = 64
"""Header fields per request; a hook or a squid sends fewer than ten."""


@dataclass(frozen=True)
class Route:
    """``path`` (aiohttp pattern) answered with the file ``file`` (``{site}`` filled in)."""

    name: str
    path: str
    file: str
    content_type: str


ROUTES = (
    Route("classad", f"/v1/sites/{SITE}/classad", "classad/{site}", CLASSAD_TYPE),
    Route("json", "/v1/sites", "sites.json", JSON_TYPE),
    Route("json", f"/v1/sites/{SITE}", "site/{site}.json", JSON_TYPE),
    Route("json", "/v1/demand", "demand.json", JSON_TYPE),
)
"""What the daemon writes and this process serves; a new JSON view is one more line here and
one in :data:`hydrator.runtime.http_endpoint.DOCUMENTS`."""


@dataclass(frozen=True)
class Limits:
    max_age_s: int
    stale_if_error_s: int
    max_connections: int
    max_header_bytes: int
    idle_timeout_s: float
    backlog: int


@dataclass(frozen=True)
class Held:
    """One file as read: ``key`` identifies the version (inode, mtime, size)."""

    key: tuple[int, int, int]
    body: bytes
    etag: str


class Files:
    """The daemon's directory; each file read again only when it was replaced."""

    def __init__(self, root: Path) -> None:
        self.root = f"{root}/"  # a str: pathlib costs more than the stat (profiled)
        self._held: dict[str, Held] = {}

    def get(self, name: str) -> Held | None:
        path = self.root + name
        try:
            st = os.stat(path)
            key = (st.st_ino, st.st_mtime_ns, st.st_size)
            held = self._held.get(name)
            if held is None or held.key != key:
                with open(path, "rb") as f:
                    body = f.read()
                held = Held(key, body, etag(body.decode("utf-8", "replace")))
                self._held[name] = held
            return held
        except FileNotFoundError:
            self._held.pop(name, None)
            return None


class ServerMetrics:
    """This process's own metrics, appended to the daemon's on ``/metrics``."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "hydrator_http_requests",
            "Requests answered on the public port, by route (classad, json, metrics, healthz,"
            " readyz, other, invalid) and status code.",
            ["route", "code"],
            registry=self.registry,
        )
        self.connections = Gauge(
            "hydrator_http_connections",
            "Client connections open on the public port.",
            registry=self.registry,
        )
        self.rejected = Counter(
            "hydrator_http_rejected_connections",
            "Client connections closed on arrival because max_connections were open.",
            registry=self.registry,
        )

    def answered(self, route: str, status: int) -> None:
        """One answer on the public port (``route``: a bounded label, never the site)."""
        self.requests.labels(route, str(status)).inc()

    def refused(self) -> None:
        """One connection closed on arrival (``max_connections`` were open)."""
        self.rejected.inc()

    def count_connections(self, open_now: Callable[[], int]) -> None:
        """Export ``open_now()`` as the open connections at each scrape."""
        self.connections.set_function(open_now)


def healthz(status: dict[str, object], now: float) -> tuple[int, str]:
    """``200`` while the daemon's last cycle ended less than ``wedged_after_s`` ago (both
    processes read the same ``CLOCK_MONOTONIC``), else ``503``."""
    idle_s = now - float(status["cycle_end_monotonic"])  # type: ignore[arg-type]
    wedged_after_s = float(status["wedged_after_s"])  # type: ignore[arg-type]
    if idle_s < wedged_after_s:
        return 200, "ok\n"
    return 503, f"not ok: no cycle ended for {idle_s:.0f} s (limit {wedged_after_s:.0f} s)\n"


def readyz(status: dict[str, object]) -> tuple[int, str]:
    """``200`` once the daemon says every source answered once or has last-known-good state,
    else ``503``; the body says why (:meth:`hydrator.runtime.service.Service.readiness`)."""
    reason = str(status["reason"])
    return (200, f"ready: {reason}\n") if status["ready"] else (503, f"not ready: {reason}\n")


class Handlers:
    """The request handlers, serving from :class:`Files`."""

    def __init__(self, files: Files, limits: Limits, metrics: ServerMetrics) -> None:
        self.files = files
        self.metrics = metrics
        self.cache_control = f"max-age={limits.max_age_s}, stale-if-error={limits.stale_if_error_s}"

    def route(self, route: Route) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def handler(request: web.Request) -> web.StreamResponse:
            request["route"] = route.name
            held = self.files.get(route.file.format(**request.match_info))
            if held is None:
                return web.Response(status=404, text="not found\n")
            headers = {"ETag": held.etag}
            if route.name == "classad":  # what hooks and site squids cache
                headers["Cache-Control"] = self.cache_control
            if etag_matches(held.etag, request.headers.get("If-None-Match")):
                return web.Response(status=304, headers=headers)
            response = web.Response(body=held.body, headers=headers)
            response.headers["Content-Type"] = route.content_type
            return response

        return handler

    async def metrics_text(self, request: web.Request) -> web.StreamResponse:
        request["route"] = "metrics"
        held = self.files.get("metrics.txt")
        body = (held.body if held else b"") + generate_latest(self.metrics.registry)
        response = web.Response(body=body)
        response.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return response

    async def probe(self, request: web.Request) -> web.StreamResponse:
        request["route"] = request.path[1:]
        held = self.files.get("status.json")
        if held is None:
            return web.Response(status=503, text="not ok: no status from the daemon yet\n")
        status = json.loads(held.body)
        if request.path == "/healthz":
            code, text = healthz(status, time.monotonic())
        else:
            code, text = readyz(status)
        return web.Response(status=code, text=text)


def etag_matches(tag: str, header: str | None) -> bool:
    """RFC 9110 ``If-None-Match``: ``*`` or any listed tag, weak comparison."""
    if not header:
        return False
    tags = {t.strip().removeprefix("W/") for t in header.split(",")}
    return "*" in tags or tag in tags


def make_app(files: Files, limits: Limits, metrics: ServerMetrics) -> web.Application:
    handlers = Handlers(files, limits, metrics)
    app = web.Application()
    app.on_response_prepare.append(_plain_server_header)
    for route in ROUTES:
        app.router.add_get(route.path, handlers.route(route))
    app.router.add_get("/metrics", handlers.metrics_text)
    app.router.add_get("/healthz", handlers.probe)
    app.router.add_get("/readyz", handlers.probe)
    return app


async def _plain_server_header(request: web.Request, response: web.StreamResponse) -> None:
    """``Server: hydrator``, not aiohttp's default that names the aiohttp and Python versions
    (a scanner's shortcut to known holes). aiohttp only sets its own when none is set."""
    response.headers["Server"] = "hydrator"


def counting(metrics: ServerMetrics) -> type[AbstractAccessLogger]:
    """An aiohttp access logger that counts every answer (malformed requests included) by
    route and status instead of logging it; the route is a bounded label, never the site."""

    class Counting(AbstractAccessLogger):
        def log(self, request: BaseRequest, response: web.StreamResponse, time: float) -> None:
            route = request.get("route") or ("invalid" if response.status == 400 else "other")
            metrics.answered(route, response.status)

    return Counting


class _Refused(asyncio.Protocol):
    """A connection over ``max_connections``: closed as soon as it is accepted."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.close()


class _BadRequests(logging.Filter):
    """aiohttp logs each malformed request with a traceback: a hostile client must not be able
    to fill the logs. They are counted (``route="invalid"``); one line at debug level here."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            log.debug("malformed request: %s", exc.message)
            return False
        return True


async def serve(sock: socket.socket, files: Files, limits: Limits, lifeline: int) -> None:
    """Serve on ``sock`` until ``lifeline`` (a pipe from the daemon) reaches its end."""
    metrics = ServerMetrics()
    logging.getLogger("aiohttp.server").addFilter(_BadRequests())
    runner = web.AppRunner(
        make_app(files, limits, metrics),
        access_log=log,
        access_log_class=counting(metrics),
        keepalive_timeout=limits.idle_timeout_s,
        max_line_size=limits.max_header_bytes,
        max_field_size=limits.max_header_bytes,
        max_headers=MAX_HEADERS,
        shutdown_timeout=1.0,
    )
    await runner.setup()
    handlers = runner.server
    assert handlers is not None
    metrics.count_connections(lambda: len(handlers.connections))

    def protocol() -> asyncio.BaseProtocol:
        if len(handlers.connections) >= limits.max_connections:
            metrics.refused()
            return _Refused()
        return handlers()

    loop = asyncio.get_running_loop()
    server = await loop.create_server(protocol, sock=sock, backlog=limits.backlog)
    ended = asyncio.Event()

    def read_lifeline() -> None:
        if not os.read(lifeline, 4096):
            ended.set()

    loop.add_reader(lifeline, read_lifeline)
    await ended.wait()
    loop.remove_reader(lifeline)
    server.close()
    await runner.cleanup()


def raise_descriptor_limit(wanted: int) -> None:
    """Lift the soft limit on open files to the hard one: every client connection is a
    descriptor. Warn when even the hard limit is below ``wanted``."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if hard != resource.RLIM_INFINITY and hard < wanted:
        log.warning(
            "only %d open files allowed (http.max_connections needs %d): fewer connections fit",
            hard,
            wanted,
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hydrator.adapters.http.server", description=__doc__)
    p.add_argument("--fd", type=int, required=True, help="the listening socket, inherited")
    p.add_argument("--dir", type=Path, required=True, help="the files the daemon writes")
    for name in ("max-age-s", "stale-if-error-s", "max-connections", "max-header-bytes"):
        p.add_argument(f"--{name}", type=int, required=True)
    p.add_argument("--idle-timeout-s", type=float, required=True)
    p.add_argument("--backlog", type=int, required=True)
    p.add_argument("--log-format", choices=["text", "json"], default="text")
    p.add_argument("--log-level", default="INFO")
    args = p.parse_args(argv)
    setup_logging(args.log_format, args.log_level)
    limits = Limits(
        args.max_age_s,
        args.stale_if_error_s,
        args.max_connections,
        args.max_header_bytes,
        args.idle_timeout_s,
        args.backlog,
    )
    raise_descriptor_limit(limits.max_connections + 64)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the daemon decides when we stop
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sock = socket.socket(fileno=args.fd)
    asyncio.run(serve(sock, Files(args.dir), limits, sys.stdin.fileno()))
    # The daemon stopped or died (SIGKILL leaves it no chance): its directory goes too.
    shutil.rmtree(args.dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
