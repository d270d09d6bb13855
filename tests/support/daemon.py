"""The one daemon runner of the tests: :class:`Daemon`, ``python -m hydrator run`` as a process.

:meth:`Daemon.start` starts it on a config file and returns once ``GET /readyz`` answers 200
(AssertionError naming the log's tail if it exits first or is not ready in time);
:meth:`Daemon.stop` sends SIGTERM and waits, then SIGKILL; :meth:`Daemon.output` is what it
wrote to stdout and stderr (appended to ``daemon.log`` in its directory, across restarts). With
``setpriv`` on the machine the daemon also gets SIGTERM when the test process dies.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import TracebackType

import requests
from prometheus_client.parser import text_string_to_metric_families

from tests.support.ports import free_port
from tests.support.process import die_with_parent, stop
from tests.support.wait import wait_for


class Daemon:
    """``hydrator run --config <config>`` in ``directory``, its HTTP endpoint on ``port``.

    The config must set ``[http] listen`` to :attr:`target`.
    Usable as a context manager that stops it on exit, also after a failure."""

    def __init__(self, directory: Path, port: int | None = None) -> None:
        self.directory = directory
        self.port = free_port() if port is None else port
        self.proc: subprocess.Popen[bytes] | None = None
        self.config: Path | None = None

    @property
    def target(self) -> str:
        """``host:port`` of the HTTP endpoint (a Prometheus scrape target)."""
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.target}"

    @property
    def log(self) -> Path:
        return self.directory / "daemon.log"

    def start(self, config: Path, *, ready_timeout_s: float = 30.0, ready: bool = True) -> None:
        """Start on ``config`` (cwd: :attr:`directory`) and wait up to ``ready_timeout_s`` seconds
        for ``/readyz`` to answer 200; with ``ready=False`` for it to answer at all (a daemon
        whose sources are meant to fail is never ready)."""
        if self.running():
            raise AssertionError(f"daemon in {self.directory} is already running")
        self.config = config
        command = [sys.executable, "-m", "hydrator", "run", "--config", str(config)]
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [*die_with_parent(), *command],
                cwd=self.directory,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        ignore = (requests.RequestException,)
        done = (lambda answer: answer.ok) if ready else (lambda answer: True)
        wait_for("daemon ready", self._readyz, done=done, timeout_s=ready_timeout_s, ignore=ignore)

    def _readyz(self) -> requests.Response:
        if not self.running():
            raise AssertionError(f"daemon exited before it was ready:\n{self.output()[-4000:]}")
        return requests.get(f"{self.url}/readyz", timeout=2)

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM, then SIGKILL after ``timeout_s`` seconds; the exit code (None: not started)."""
        proc, self.proc = self.proc, None
        return None if proc is None else stop(proc, timeout_s)

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def output(self) -> str:
        """Everything the daemon wrote to stdout and stderr so far."""
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def metrics(self) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        """Every sample of ``GET /metrics``, by (name, labels)."""
        text = requests.get(f"{self.url}/metrics", timeout=5).text
        return {
            (s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }

    def metric(self, name: str, **labels: str) -> float | None:
        """One sample of ``GET /metrics``; None when it is not exported."""
        return self.metrics().get((name, frozenset(labels.items())))

    def __enter__(self) -> Daemon:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
