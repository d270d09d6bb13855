"""A real Prometheus server and a real ``hydrator run`` daemon, for tests and the dashboard demo.

Prometheus comes from Debian's ``prometheus`` package (installed with apt-get if missing). Both
listen on 127.0.0.1 on free ports, write only into the given directory, and are stopped when the
context manager exits (also after a failure); ``setpriv --pdeathsig`` stops them if the caller
is killed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests
import yaml

from tests.support.daemon import Daemon
from tests.support.ports import free_port
from tests.support.process import die_with_parent, stop
from tests.support.wait import wait_for

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "deploy" / "prometheus" / "hydrator.rules.yml"


def ensure_prometheus() -> str:
    """Path of the ``prometheus`` server binary, installing the Debian package if needed."""
    found = shutil.which("prometheus")
    if found is None:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        command = ["apt-get", "install", "-y", "--no-install-recommends", "prometheus"]
        if subprocess.run(command, capture_output=True, env=env, check=False).returncode != 0:
            subprocess.run(["apt-get", "update"], capture_output=True, env=env, check=False)
            subprocess.run(command, capture_output=True, env=env, check=True)
        found = shutil.which("prometheus")
    if found is None:
        raise RuntimeError("prometheus is missing after installing the Debian package")
    return found


@dataclass(frozen=True)
class PrometheusServer:
    url: str

    def query(self, expr: str) -> list[dict[str, Any]]:
        """Instant query; the ``result`` list of a vector (raises on an error answer)."""
        r = requests.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=5)
        r.raise_for_status()
        body = r.json()
        if body["status"] != "success":
            raise AssertionError(f"{expr}: {body}")
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def value(self, expr: str) -> float | None:
        """The single sample's value of an instant query, None when the result is empty."""
        result = self.query(expr)
        if not result:
            return None
        assert len(result) == 1, result
        return float(result[0]["value"][1])

    def rules(self) -> list[dict[str, Any]]:
        r = requests.get(f"{self.url}/api/v1/rules", timeout=5)
        r.raise_for_status()
        return [rule for g in r.json()["data"]["groups"] for rule in g["rules"]]


def prometheus_config(
    targets: Sequence[str], scrape_interval_s: float, rule_files: Sequence[Path] = ()
) -> str:
    interval = f"{int(scrape_interval_s * 1000)}ms"
    return yaml.safe_dump(
        {
            "global": {"scrape_interval": interval, "evaluation_interval": interval},
            "rule_files": [str(p) for p in rule_files],
            "scrape_configs": [
                {
                    "job_name": "hydrator",
                    "scrape_timeout": interval,
                    "static_configs": [{"targets": list(targets)}],
                }
            ],
        }
    )


@contextlib.contextmanager
def running_prometheus(
    directory: Path,
    targets: Sequence[str],
    *,
    scrape_interval_s: float = 1.0,
    rule_files: Sequence[Path] = (),
) -> Iterator[PrometheusServer]:
    """Prometheus scraping ``targets`` (host:port) as job ``hydrator``; data in ``directory``."""
    binary = ensure_prometheus()
    directory.mkdir(parents=True, exist_ok=True)
    config = directory / "prometheus.yml"
    config.write_text(prometheus_config(targets, scrape_interval_s, rule_files))
    port = free_port()
    log = (directory / "prometheus.log").open("ab")
    proc = subprocess.Popen(
        [
            *die_with_parent(),
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={directory / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--web.enable-lifecycle",
        ],
        stdout=log,
        stderr=log,
    )
    server = PrometheusServer(f"http://127.0.0.1:{port}")
    try:
        wait_for(
            "prometheus ready",
            lambda: requests.get(f"{server.url}/-/ready", timeout=2).ok,
            timeout_s=20.0,
            ignore=(requests.RequestException,),
        )
        yield server
    finally:
        stop(proc)
        log.close()


def demo_inventory(daemon: Daemon) -> Path:
    """The inventory file of a :func:`running_demo_daemon`: edit it while the daemon runs."""
    return daemon.directory / "demo-inventory.toml"


@contextlib.contextmanager
def running_demo_daemon(
    directory: Path, *, interval_s: int = 1, extra_config: str = "", extra_inventory: str = ""
) -> Iterator[Daemon]:
    """The shipped demo configuration on a free port, ``interval_s`` between cycles;
    ``extra_config`` and ``extra_inventory`` are appended to the copied files."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in ("demo.toml", "demo-inventory.toml"):
        shutil.copy2(REPO / "config" / name, directory / name)
    daemon = Daemon(directory)
    config = directory / "demo.toml"
    text = config.read_text()
    text = text.replace('listen = "127.0.0.1:9620"', f'listen = "{daemon.target}"')
    text = text.replace("interval_s = 10", f"interval_s = {interval_s}")
    config.write_text(text + extra_config)
    inventory = directory / "demo-inventory.toml"
    inventory.write_text(inventory.read_text() + extra_inventory)
    settled = time.time() - 60  # as if written a minute ago: past the static source's settle_s
    os.utime(inventory, (settled, settled))
    with daemon:
        daemon.start(config, ready_timeout_s=20.0)
        yield daemon
