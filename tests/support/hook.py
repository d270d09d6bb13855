"""The execute-node hook (deploy/condor/hydrator-classad-hook) and what it talks to, for tests.

:class:`AnswerServer` is a small HTTP server in the test process that serves exactly the good,
bad or hostile answer a test is about; :func:`served_hydrator` is the real daemon (a static
inventory, its real HTTP endpoint) for tests that need the answers the daemon really makes;
:func:`run_hook` runs the real script the way the startd does.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
HOOK = REPO / "deploy" / "condor" / "hydrator-classad-hook"
GLIDEIN = REPO / "deploy" / "glidein" / "hydrator_glidein.sh"

GOOD = (
    'AvailableDatasets = { "ska:obs_1","ska:skymodel_v3" }\n'
    "PartialDatasets = {  }\n"
    'ReplicatingDatasets = { "ska:obs_9" }\n'
    'DataLocalitySite = "SITE_A"\n'
    "DataLocalityUpdated = 1795390000\n"
    'DataLocalityDigest = "0123456789abcdef"\n'
    'DataLocalityUnavailable = ""\n'
    "- update:true\n"
)
GOOD_LINES = GOOD.removesuffix("- update:true\n")

STREAM_CAP_BYTES = 200 * 2**20  # a test server must end some day; no hook should get near it


@dataclass
class Answer:
    """What the test server answers for /v1/sites/SITE_A/classad (404 for any other path);
    a request whose If-None-Match equals ``etag`` gets a 304 while ``status`` is 200."""

    status: int = 200
    body: str = GOOD
    etag: str = '"v1"'
    delay_s: float = 0.0
    endless: bool = False  # a chunked answer that never ends (up to STREAM_CAP_BYTES)
    sent_bytes: int = 0
    requests: list[dict[str, str]] = field(default_factory=list)


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        answer = self.server.answer
        answer.requests.append({"path": self.path, **{k: v for k, v in self.headers.items()}})
        time.sleep(answer.delay_s)
        if self.path != "/v1/sites/SITE_A/classad":
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if self.headers.get("If-None-Match") == answer.etag and answer.status == 200:
            self.send_response(304)
            self.send_header("ETag", answer.etag)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if answer.endless:
            self._stream_without_end(answer)
            return
        body = answer.body.encode()
        self.send_response(answer.status)
        self.send_header("ETag", answer.etag)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _stream_without_end(self, answer: Answer) -> None:
        """What a broken or hostile endpoint may do: chunk after chunk of plausible lines."""
        self.send_response(200)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        line = b'AvailableDatasets = { "ska:obs_1" }\n' * 1800
        chunk = f"{len(line):x}\r\n".encode() + line + b"\r\n"
        try:
            while answer.sent_bytes < STREAM_CAP_BYTES:
                self.wfile.write(chunk)
                answer.sent_bytes += len(line)
                time.sleep(0.0005)  # some 100 MB/s at most, so a test cannot fill the disk
        except OSError:
            return  # the client hung up: what a bounded hook does

    def log_message(self, format: str, *args: object) -> None:
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    answer: Answer


@contextlib.contextmanager
def answer_server() -> Iterator[tuple[str, Answer]]:
    """A server on 127.0.0.1 and a free port: its base URL and the :class:`Answer` to edit."""
    srv = _Server(("127.0.0.1", 0), _Handler)
    srv.answer = Answer()
    thread = threading.Thread(target=srv.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}", srv.answer
    finally:
        srv.shutdown()
        srv.server_close()


def run_hook(
    url: str,
    cache: Path,
    *args: str,
    site: str = "SITE_A",
    timeout_s: float = 10,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """One STARTD_CRON-style run of the real hook with ``--cache-dir cache``."""
    full_env = {"PATH": os.environ["PATH"], "HOME": str(cache.parent), **(env or {})}
    return subprocess.run(
        [str(HOOK), "--url", url, "--site", site, "--cache-dir", str(cache), *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout_s,
        check=False,
    )


@dataclass
class ServedHydrator:
    """A real hydrator (static source, state, HTTP endpoint) serving ``url``."""

    url: str
    service: Any  # hydrator.runtime.service.Service (imported lazily: no package import here)


@contextlib.contextmanager
def served_hydrator(
    tmp_path: Path,
    inventory: str,
    classad: Mapping[str, object] | None = None,
    distances: Mapping[str, object] | None = None,
) -> Iterator[ServedHydrator]:
    """The daemon with ``inventory`` as its static source, ``[classad]`` = ``classad`` and
    ``[distances]`` = ``distances``, one cycle run, its HTTP endpoint on 127.0.0.1 and a free
    port; stopped on exit."""
    from prometheus_client import CollectorRegistry

    from hydrator.config import parse_config
    from hydrator.runtime.http_endpoint import HttpEndpoint
    from hydrator.runtime.metrics import Metrics
    from hydrator.runtime.wiring import build_service

    (tmp_path / "inv.toml").write_text(inventory)
    config = parse_config(
        {
            "daemon": {"state_path": "s.sqlite"},
            "sources": [{"type": "static", "path": "inv.toml", "settle_s": 0}],
            "http": {"listen": "127.0.0.1:0"},
            "classad": dict(classad or {}),
            "distances": dict(distances or {}),
        },
        tmp_path,
    )
    metrics = Metrics(CollectorRegistry())
    service = build_service(config, metrics)
    try:
        service.run_cycle()
        endpoint = HttpEndpoint(service, config.http, wedged_after_s=300, metrics=metrics)
        endpoint.start()
        try:
            yield ServedHydrator(f"http://127.0.0.1:{endpoint.port}", service)
        finally:
            endpoint.stop()
    finally:
        service.close()


@dataclass
class Glidein:
    """A glidein's directory as GlideinWMS leaves it for custom scripts: ``glidein_config``
    with the helper functions of add_config_line.source (gconfig_add, add_condor_vars_line)
    and the condor_vars list they append to."""

    config: Path
    condor_vars: Path

    @classmethod
    def make(cls, directory: Path, url: str, extra: str = "") -> Glidein:
        """A glidein for SITE_A fetching from ``url``; ``extra``: more glidein_config lines."""
        helpers = directory / "add_config_line.source"
        helpers.write_text(
            'gconfig_add() { echo "$1 $2" >> "$glidein_config"; }\n'
            'add_condor_vars_line() { echo "$*" >> "$condor_vars_file"; }\n'
        )
        condor_vars = directory / "condor_vars.lst"
        condor_vars.write_text("")
        config = directory / "glidein_config"
        config.write_text(
            f"ADD_CONFIG_LINE_SOURCE {helpers}\nCONDOR_VARS_FILE {condor_vars}\n"
            f"GLIDEIN_Site SITE_A\nHYDRATOR_URL {url}\n{extra}"
        )
        return cls(config, condor_vars)

    def run(self, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """One run of the glidein script, as GlideinWMS calls it: ``script glidein_config id``."""
        return subprocess.run(
            [str(GLIDEIN), str(self.config), "main"],
            capture_output=True,
            text=True,
            check=False,
            timeout=10,
            env={"PATH": os.environ["PATH"], **(env or {})},
        )
