"""Which maintained HTTP server library to serve site ClassAds with: candidates side by side.

``python -m benchmarks.http_candidates`` serves the same answer (a 2 KB ClassAd with an ``ETag``,
``304`` on ``If-None-Match``) with each candidate in a process of its own on 127.0.0.1, then

- runs ``wrk`` (Debian package) with conditional GETs at 50 connections for a few seconds;
- opens a connection that sends a bare CRLF every second (slowloris) and reports whether the
  server closes it within its idle timeout (2 s here) plus a margin;
- sends a 64 KiB header and reports the status (or that the connection was closed).

Candidates: aiohttp (its own asyncio loop), uvicorn + Starlette (httptools parser, with and
without uvloop). Prints a JSON document; docs/http.md has the numbers and the choice. Only
aiohttp is a project dependency: ``.venv/bin/pip install uvicorn starlette httptools uvloop``
first.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import http_bench

BODY = (b'AvailableDatasets = { "ska:obs_%04d" }\n' * 50) + b"- update:true\n"
ETAG = '"0123456789abcdef0123456789abcdef"'
IDLE_TIMEOUT_S = 2
CANDIDATES = ("aiohttp", "uvicorn-starlette", "uvicorn-starlette-uvloop")
LUA = http_bench.LUA % {
    "paths": '"/v1/sites/S/classad"',
    "etags": json.dumps(ETAG),
    "conditional": "true",
}


def serve_aiohttp(sock: socket.socket) -> None:
    from aiohttp import web

    async def classad(request: web.Request) -> web.Response:
        headers = {"ETag": ETAG, "Cache-Control": "max-age=60"}
        if request.headers.get("If-None-Match") == ETAG:
            return web.Response(status=304, headers=headers)
        return web.Response(body=BODY, headers=headers, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/v1/sites/{site}/classad", classad)
    web.run_app(app, sock=sock, keepalive_timeout=IDLE_TIMEOUT_S, print=None, access_log=None)


def serve_uvicorn(sock: socket.socket, loop: str) -> None:
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    async def classad(request: Request) -> Response:
        headers = {"ETag": ETAG, "Cache-Control": "max-age=60"}
        if request.headers.get("if-none-match") == ETAG:
            return Response(status_code=304, headers=headers)
        return Response(BODY, headers=headers, media_type="text/plain")

    app = Starlette(routes=[Route("/v1/sites/{site}/classad", classad)])
    config = uvicorn.Config(
        app,
        fd=sock.fileno(),
        http="httptools",
        loop=loop,
        timeout_keep_alive=IDLE_TIMEOUT_S,
        access_log=False,
        log_level="warning",
    )
    uvicorn.Server(config).run()


def serve(name: str, fd: int) -> None:
    sock = socket.socket(fileno=fd)
    if name == "aiohttp":
        serve_aiohttp(sock)
    else:
        serve_uvicorn(sock, "uvloop" if name.endswith("uvloop") else "asyncio")


def slowloris(port: int) -> dict[str, Any]:
    """Send a bare CRLF every second; how long until the server closes (None: it did not)."""
    t0 = time.monotonic()
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.settimeout(1.0)
        while time.monotonic() - t0 < IDLE_TIMEOUT_S + 8:
            try:
                sock.sendall(b"\r\n")
                if sock.recv(1024) == b"":
                    return {"closed_after_s": round(time.monotonic() - t0, 1)}
            except TimeoutError:
                continue
            except OSError:
                return {"closed_after_s": round(time.monotonic() - t0, 1)}
    return {"closed_after_s": None}


def big_header(port: int) -> str:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        try:
            sock.sendall(b"GET /v1/sites/S/classad HTTP/1.1\r\nHost: x\r\nX: " + b"a" * 65536)
            sock.sendall(b"\r\n\r\n")
            answer = sock.recv(1024)
        except OSError as exc:
            return f"connection error {exc.__class__.__name__}"
    return answer.split(b"\r\n", 1)[0].decode() or "closed"


def measure(name: str, seconds: int) -> dict[str, Any]:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1024)
    port = listener.getsockname()[1]
    command = [sys.executable, "-m", "benchmarks.http_candidates", "serve", name]
    server = subprocess.Popen(
        [*command, "--fd", str(listener.fileno())], pass_fds=(listener.fileno(),)
    )
    listener.close()
    try:
        time.sleep(1.5)
        with tempfile.TemporaryDirectory() as tmp:
            lua = Path(tmp) / "c.lua"
            lua.write_text(LUA)
            result = http_bench._wrk(
                http_bench.ensure_wrk(), f"http://127.0.0.1:{port}", lua, 2, 50, seconds
            )
        result["slowloris"] = slowloris(port)
        result["header_64KiB"] = big_header(port)
        return result
    finally:
        server.terminate()
        server.wait(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["serve", "measure"], nargs="?", default="measure")
    parser.add_argument("name", nargs="?", choices=CANDIDATES)
    parser.add_argument("--fd", type=int)
    parser.add_argument("--seconds", type=int, default=5)
    args = parser.parse_args()
    if args.mode == "serve":
        serve(args.name, args.fd)
        return
    results = {name: measure(name, args.seconds) for name in CANDIDATES}
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
