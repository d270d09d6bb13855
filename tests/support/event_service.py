"""An in-process daemon's service with events on for the event tests (tests/events/): its
configuration on the test Rucio server and broker, and what the tests read of it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hydrator.config import Config, parse_config
from hydrator.domain import Site
from hydrator.runtime.full_read_gate import FullReadGate
from hydrator.runtime.json_views import sites_json
from hydrator.runtime.metrics import Metrics
from hydrator.runtime.service import Service
from tests.support.activemq import DESTINATION, Broker
from tests.support.rucio_server import RucioServer, source_config, unique

CALLS = "hydrator_source_api_calls_total"  # the sources' requests, by method


@dataclass
class EventService:
    service: Service
    metrics: Metrics  # the service's (handed to it, its event cycles and gate)
    gate: FullReadGate
    site: str
    dst: str
    src: str
    scope: str

    def sample(self, name: str, **labels: str) -> float:
        value = self.metrics.registry.get_sample_value(name, labels)
        return 0.0 if value is None else value

    def lists(self) -> tuple[list[str], list[str]]:
        view = self.service.published.ads[Site(self.site)].view
        return [str(d) for d in view.available], [str(d) for d, _ in view.replicating]

    def origin(self) -> str | None:
        sites = {s["site"]: s for s in sites_json(self.service.published)["sites"]}
        origin: str | None = sites[self.site]["origin"]
        return origin

    def full_reads(self) -> float:
        """Full reads of the Rucio source (event cycles are not fetches)."""
        return self.sample("hydrator_source_fetch_duration_seconds_count", source="rucio")


def daemon_config(
    server: RucioServer, broker: Broker, tmp_path: Path, tag: str, heartbeat_s: float = 2.0
) -> Config:
    """The daemon's configuration: one Rucio source with events on (heart-beats every
    ``heartbeat_s`` both ways; a beat missing for 1.5 of them is a lost connection)."""
    rucio = source_config(server, rse_expression=f"rse_type=DISK&fed={tag}").model_dump(
        mode="json", exclude_none=True
    )
    rucio["events"] = {
        "enabled": True,
        "brokers": [f"127.0.0.1:{broker.port}"],
        "destination": DESTINATION,
        "client_id": unique("hydrator-"),
        "username": "hydrator",
        "password_file": str(broker.password_file("hydrator")),
        "heartbeat_s": heartbeat_s,
        "reconnect_initial_s": 0.2,
        "reconnect_max_s": 1.0,
        "event_debounce_s": 0.5,
    }
    return parse_config(
        {"daemon": {"state_path": str(tmp_path / "state.sqlite")}, "sources": [rucio]}, tmp_path
    )
