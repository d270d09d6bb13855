"""The container image, built from the Dockerfile by ``scripts/image`` and run with podman.

Every container runs the way ``deploy/kubernetes/deployment.yaml`` runs the pod, with its
options read from that manifest (:class:`PodSpec`): user and group, a read-only root file system
with only the manifest's ``emptyDir`` mounts writable, the configuration directory mounted
read-only where the ConfigMap goes, the state on a volume where the PVC goes, the memory limit,
no capabilities, no privilege escalation, the container arguments and environment. So a manifest
that drifts from the image fails here, not at the first operator's deploy. The configuration is
the demo's (static inventory) with the Kubernetes base's ``state_path`` and ``listen``.

Published ports are on 127.0.0.1 only; every container and volume is removed afterwards, also on
failure (names are unique, so several sessions can run at once).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import tomllib
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.healthcheck import HEALTHCHECK, status
from tests.support.deploy import DEPLOY, REPO, quantity_bytes

pytestmark = pytest.mark.image

MANIFEST = DEPLOY / "kubernetes" / "deployment.yaml"
K8S_CONFIG = DEPLOY / "kubernetes" / "hydrator.toml"
# What docs/platform.md says this machine kind needs (crun fails on hybrid cgroups). Podman's
# default rlimits (nofile 1048576, nproc 4194304) cannot be set by runc here: explicit, modest ones.
PODMAN = ["podman", "--runtime", "runc", "--cgroup-manager=cgroupfs"]
ULIMITS = ["--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096"]
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0
DEMO_SITES = ["SRCNET_AU", "SRCNET_CH", "SRCNET_ES", "SRCNET_UK"]


def podman(
    *args: str, timeout: float = 60.0, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run one podman command; raise with its stderr when ``check`` and it fails."""
    result = subprocess.run(
        [*PODMAN, *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and result.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)}: exit {result.returncode}\n{result.stderr}")
    return result


@dataclass(frozen=True)
class PodSpec:
    """What the Deployment's pod asks of the image."""

    user: int
    group: int
    fs_group: int
    read_only_root: bool
    no_new_privileges: bool
    drop_all_capabilities: bool
    config_mount: str
    state_mount: str
    scratch_mounts: dict[str, int]  # emptyDir mount path -> sizeLimit in bytes
    memory_limit_bytes: int
    port: int
    liveness_path: str
    readiness_path: str
    args: list[str]
    env: dict[str, str]
    termination_grace_s: int

    @classmethod
    def load(cls) -> PodSpec:
        pod = yaml.safe_load(MANIFEST.read_text())["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        mounts = {m["mountPath"]: (m, volumes[m["name"]]) for m in container["volumeMounts"]}
        config = next(p for p, (m, v) in mounts.items() if "configMap" in v and m["readOnly"])
        state = next(p for p, (_, v) in mounts.items() if "persistentVolumeClaim" in v)
        scratch = {
            p: quantity_bytes(v["emptyDir"]["sizeLimit"])
            for p, (_, v) in mounts.items()
            if "emptyDir" in v
        }
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        liveness, readiness = container["livenessProbe"], container["readinessProbe"]
        assert ports[liveness["httpGet"]["port"]] == ports[readiness["httpGet"]["port"]]
        security = container["securityContext"]
        return cls(
            user=pod["securityContext"]["runAsUser"],
            group=pod["securityContext"]["runAsGroup"],
            fs_group=pod["securityContext"]["fsGroup"],
            read_only_root=security["readOnlyRootFilesystem"],
            no_new_privileges=not security["allowPrivilegeEscalation"],
            drop_all_capabilities=security["capabilities"]["drop"] == ["ALL"],
            config_mount=config,
            state_mount=state,
            scratch_mounts=scratch,
            memory_limit_bytes=quantity_bytes(container["resources"]["limits"]["memory"]),
            port=ports[readiness["httpGet"]["port"]],
            liveness_path=liveness["httpGet"]["path"],
            readiness_path=readiness["httpGet"]["path"],
            args=container["args"],
            env={e["name"]: e["value"] for e in container["env"]},
            termination_grace_s=pod["terminationGracePeriodSeconds"],
        )

    def run_options(self) -> list[str]:
        """``podman run`` options that reproduce the pod's container (volumes apart)."""
        options = [
            "--user",
            f"{self.user}:{self.group}",
            "--memory",
            str(self.memory_limit_bytes),
            "--publish",
            f"127.0.0.1::{self.port}",
            *ULIMITS,
        ]
        if self.read_only_root:
            options += ["--read-only", "--read-only-tmpfs=false"]
        for path, size in self.scratch_mounts.items():
            options += ["--tmpfs", f"{path}:size={size}"]
        if self.no_new_privileges:
            options += ["--security-opt", "no-new-privileges"]
        if self.drop_all_capabilities:
            options += ["--cap-drop", "ALL"]
        for name, value in self.env.items():
            options += ["--env", f"{name}={value}"]
        return options


SPEC = PodSpec.load()


@pytest.fixture(scope="module")
def image() -> str:
    """The image's id: ``scripts/image`` builds it, or finds it current in a second (the id,
    not the tag, so a later build elsewhere on the machine does not change it under the tests)."""
    result = subprocess.run(
        [str(REPO / "scripts" / "image")], capture_output=True, text=True, timeout=1800, check=False
    )
    if result.returncode != 0:
        raise RuntimeError(f"scripts/image failed:\n{result.stderr[-4000:]}")
    reference = result.stdout.split()[-1]
    return podman("image", "inspect", "--format", "{{.Id}}", reference).stdout.strip()


@pytest.fixture(scope="module")
def config_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ConfigMap's directory: the demo configuration, with the Kubernetes base's
    ``state_path`` and ``listen``, and its inventory (old mtime: settled at once)."""
    base = tomllib.loads(K8S_CONFIG.read_text())
    directory = tmp_path_factory.mktemp("config")
    demo = (REPO / "config" / "demo.toml").read_text()
    for old, new in (
        ('"127.0.0.1:9620"', base["http"]["listen"]),
        ('"demo-state.sqlite"', base["daemon"]["state_path"]),
    ):
        assert old in demo, f"config/demo.toml no longer has {old}"
        demo = demo.replace(old, json.dumps(new))
    (directory / "hydrator.toml").write_text(demo)
    inventory = directory / "demo-inventory.toml"
    inventory.write_text((REPO / "config" / "demo-inventory.toml").read_text())
    os.utime(inventory, (time.time() - 60, time.time() - 60))
    directory.chmod(0o755)  # the container's user reads it
    for path in directory.iterdir():
        path.chmod(0o644)
    return directory


@dataclass
class Container:
    name: str
    base_url: str


class Pod:
    """Containers sharing one state volume; :meth:`remove` deletes all of them and the volume."""

    def __init__(self, image: str, config_dir: Path) -> None:
        self.image, self.config_dir = image, config_dir
        self.prefix = f"hydrator-test-{uuid.uuid4().hex[:10]}"
        self.volume = f"{self.prefix}-state"
        self.names: list[str] = []
        podman("volume", "create", self.volume)

    def options(self, name: str) -> list[str]:
        self.names.append(name)
        return [
            "--name",
            name,
            *SPEC.run_options(),
            "--volume",
            f"{self.config_dir}:{SPEC.config_mount}:ro",
            "--volume",
            f"{self.volume}:{SPEC.state_mount}",
        ]

    def start(self) -> Container:
        """A detached container; returns once its readiness probe path answers 200."""
        name = f"{self.prefix}-{len(self.names)}"
        podman("run", "--detach", *self.options(name), self.image, *SPEC.args)
        host_port = podman("port", name, f"{SPEC.port}/tcp").stdout.split()[0]
        assert host_port.startswith("127.0.0.1:"), host_port
        container = Container(name, f"http://{host_port}")
        deadline = time.monotonic() + READY_TIMEOUT_S
        while status(container.base_url + SPEC.readiness_path) != 200:
            if not self.running(name) or time.monotonic() > deadline:
                pytest.fail(f"{name} not ready:\n{self.logs(name)}")
            time.sleep(0.2)
        return container

    def run_foreground(self, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        """A container run to its end (e.g. ``show``), same pod options."""
        name = f"{self.prefix}-{len(self.names)}"
        return podman("run", *self.options(name), self.image, *args, timeout=timeout, check=False)

    def running(self, name: str) -> bool:
        state = podman("inspect", "--format", "{{.State.Running}}", name, check=False).stdout
        return state.strip() == "true"

    def logs(self, name: str) -> str:
        result = podman("logs", name, check=False)
        return result.stdout + result.stderr

    def remove(self) -> None:
        for name in self.names:
            podman("rm", "--force", "--volumes", "--time", "0", name, check=False)
        podman("volume", "rm", "--force", self.volume, check=False)


@pytest.fixture
def pod(image: str, config_dir: Path) -> Iterator[Pod]:
    made = Pod(image, config_dir)
    try:
        yield made
    finally:
        made.remove()


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def metric_sum(base_url: str, name: str) -> float:
    """Sum of a metric's samples over all label sets, from ``/metrics``."""
    with urllib.request.urlopen(f"{base_url}/metrics", timeout=5) as response:
        text = response.read().decode()
    pattern = re.compile(rf"^{name}(?:{{[^}}]*}})? (\S+)$", re.MULTILINE)
    return sum(float(value) for value in pattern.findall(text))


def wait_for_a_cycle(pod: Pod, container: Container) -> None:
    """Until the container's ``/metrics`` counts one finished cycle."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while metric_sum(container.base_url, "hydrator_cycles_total") < 1:
        assert time.monotonic() < deadline, pod.logs(container.name)
        time.sleep(0.2)


def exec_in(name: str, *command: str) -> subprocess.CompletedProcess[str]:
    return podman("exec", name, *command, check=False)


def test_image_is_what_the_manifest_expects(image: str) -> None:
    (inspected,) = json.loads(podman("image", "inspect", image).stdout)
    config = inspected["Config"]
    assert config["User"] == f"{SPEC.user}:{SPEC.group}" and SPEC.fs_group == SPEC.group
    assert set(config["Volumes"]) == {SPEC.state_mount}  # the image's VOLUME is the PVC's path
    assert set(config["ExposedPorts"]) == {f"{SPEC.port}/tcp"}
    assert config["Entrypoint"] == ["hydrator"] and SPEC.args[0] == config["Cmd"][0] == "run"
    config_path = SPEC.args[SPEC.args.index("--config") + 1]
    assert f"HYDRATOR_CONFIG={config_path}" in config["Env"]
    assert SPEC.env["HYDRATOR_CONFIG"] == config_path
    assert Path(config_path).parent == Path(SPEC.config_mount)
    assert config["StopSignal"] == "SIGTERM"
    # the HEALTHCHECK (kept: scripts/image builds in docker format) probes the liveness path
    assert inspected["Healthcheck"]["Test"] == [
        "CMD",
        "python3",
        "/usr/local/bin/hydrator-healthcheck",
    ]
    default_url = re.search(r'DEFAULT_URL = "([^"]+)"', HEALTHCHECK.read_text())
    assert default_url and default_url[1] == f"http://127.0.0.1:{SPEC.port}{SPEC.liveness_path}"
    assert SPEC.termination_grace_s >= STOP_TIMEOUT_S


def test_container_serves_the_demo_read_only_as_the_manifest_user(pod: Pod) -> None:
    container = pod.start()
    sites = get_json(f"{container.base_url}/v1/sites")["sites"]
    assert [site["site"] for site in sites] == DEMO_SITES
    assert status(container.base_url + SPEC.liveness_path) == 200
    ids = (
        exec_in(container.name, "id", "-u", "-n").stdout.strip(),
        exec_in(container.name, "id", "-u").stdout.strip(),
        exec_in(container.name, "id", "-g").stdout.strip(),
    )
    assert ids == ("hydrator", str(SPEC.user), str(SPEC.group))  # the image's own account
    users = podman("top", container.name, "user", "args").stdout.splitlines()[1:]
    assert users and all(line.split()[0] == "hydrator" for line in users), users
    for path in ("/opt/hydrator/written", f"{SPEC.config_mount}/written"):
        touched = exec_in(container.name, "touch", path)
        assert touched.returncode != 0 and "Read-only file system" in touched.stderr, path
    for path in (SPEC.state_mount, *SPEC.scratch_mounts):  # what the pod can write
        assert exec_in(container.name, "touch", f"{path}/written").returncode == 0, path
    state = tomllib.loads((pod.config_dir / "hydrator.toml").read_text())["daemon"]["state_path"]
    assert exec_in(container.name, "test", "-s", state).returncode == 0


def health(name: str) -> dict[str, Any]:
    """The container's health as podman recorded it (``Status``, ``FailingStreak``, ``Log``)."""
    inspected = podman("inspect", "--format", "{{json .State.Health}}", name).stdout
    recorded: dict[str, Any] = json.loads(inspected)
    return recorded


def test_image_healthcheck_follows_healthz(pod: Pod) -> None:
    container = pod.start()
    healthy = podman("healthcheck", "run", container.name, check=False)
    assert healthy.returncode == 0, healthy.stdout + healthy.stderr
    assert health(container.name)["Status"] == "healthy"
    # Stop the HTTP server process (the daemon's child): /healthz no longer answers, as when
    # the server is wedged; the image's own HEALTHCHECK command must say so.
    top = podman("top", container.name, "hpid", "args").stdout.splitlines()
    (server_pid,) = [
        int(line.split()[0]) for line in top if "hydrator.adapters.http.server" in line
    ]
    os.kill(server_pid, signal.SIGSTOP)
    try:
        unhealthy = podman("healthcheck", "run", container.name, check=False)
    finally:
        os.kill(server_pid, signal.SIGCONT)
    assert unhealthy.returncode == 1 and "unhealthy" in unhealthy.stdout, unhealthy
    last = health(container.name)["Log"][-1]  # podman recorded the script's own verdict
    assert last["ExitCode"] == 1 and last["Output"].startswith("unhealthy: "), last
    assert podman("healthcheck", "run", container.name, check=False).returncode == 0


def test_sigterm_saves_the_state_and_a_new_container_resumes_without_churn(pod: Pod) -> None:
    first = pod.start()
    wait_for_a_cycle(pod, first)
    before = {s["site"]: s["digest"] for s in get_json(f"{first.base_url}/v1/sites")["sites"]}
    assert metric_sum(first.base_url, "hydrator_changes_total") > 0  # the first cycle adds
    started = time.monotonic()
    podman("stop", "--time", str(int(STOP_TIMEOUT_S)), first.name, timeout=STOP_TIMEOUT_S + 30)
    stopped_s = time.monotonic() - started
    exit_code = podman("inspect", "--format", "{{.State.ExitCode}}", first.name).stdout.strip()
    assert exit_code == "0", pod.logs(first.name)  # SIGTERM handled, not SIGKILL (137)
    assert stopped_s < STOP_TIMEOUT_S
    assert "received SIGTERM" in pod.logs(first.name)

    shown = pod.run_foreground("show", "SRCNET_CH")  # the saved state, read without a daemon
    assert shown.returncode == 0, shown.stderr
    assert f'DataLocalityDigest = "{before["SRCNET_CH"]}"' in shown.stdout

    second = pod.start()
    wait_for_a_cycle(pod, second)
    assert metric_sum(second.base_url, "hydrator_changes_total") == 0
    assert metric_sum(second.base_url, "hydrator_state_rows_written_total") == 0
    after = {s["site"]: s["digest"] for s in get_json(f"{second.base_url}/v1/sites")["sites"]}
    assert after == before


def test_a_second_container_on_the_same_volume_is_refused_by_the_state_lock(pod: Pod) -> None:
    first = pod.start()
    second = pod.run_foreground(*SPEC.args, timeout=60)
    assert second.returncode == 2, second.stdout + second.stderr
    assert "is in use by another hydrator" in second.stderr
    assert status(first.base_url + SPEC.readiness_path) == 200  # the first one is unharmed
