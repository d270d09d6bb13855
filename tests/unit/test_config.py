"""Configuration errors: one line that names the key; shipped configs are valid."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from hydrator.config import (
    HttpConfig,
    RucioEventsConfig,
    StaticSourceConfig,
    host_port,
    load_config,
    parse_config,
)
from hydrator.runtime.cli import main
from tests.support.privileges import file_modes_enforced

REPO = Path(__file__).parents[2]
STATIC = '[[sources]]\ntype = "static"\npath = "inv.toml"\n'


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        (
            STATIC + "[daemon]\ninterval_s = 0\n",
            "daemon.interval_s: Input should be greater than 0",
        ),
        (STATIC + "[daemon]\nintervl_s = 5\n", "daemon.intervl_s: unknown key"),
        (STATIC + '[http]\nlisten = "9620"\n', "http.listen: expected host:port"),
        ('[[sources]]\ntype = "rucio"\ntimeout_s = -1\n', "sources[0].timeout_s: Input should be"),
        ('[[sources]]\ntype = "static"\n', "sources[0].path: required key is missing"),
        ('[[sources]]\ntype = "gridftp"\n', "sources[0]: Input tag 'gridftp'"),
        ('[[sources]]\ntype = "dmapi"\nbase_url = "https://x"\n', "sources[0]: set token_file"),
        (STATIC + '[sites]\nCH_DISK = "bad site"\n', "sites: CH_DISK: invalid site name"),
        (
            STATIC + '[classad]\navailable_attribute = "Avail-Data"\n',
            "classad: available_attribute",
        ),
        (STATIC + STATIC, "two sources are named 'static'"),
        ("[daemon]\n", "sources: required key is missing"),
        ("[daemon\n", "not valid TOML"),
        # strict: no coercion, finite numbers only
        (STATIC + "[daemon]\ninterval_s = inf\n", "daemon.interval_s: Input should be a finite"),
        (STATIC + "[daemon]\ninterval_s = nan\n", "daemon.interval_s: Input should be a finite"),
        (
            STATIC + '[daemon]\ninterval_s = "60"\n',
            "daemon.interval_s: Input should be a valid number, not the string '60'",
        ),
        (STATIC + '[http]\nenabled = "yes"\n', "http.enabled: Input should be a valid boolean"),
        (STATIC + "[http]\nenabled = 1\n", "http.enabled: Input should be a valid boolean"),
        (STATIC + "[http]\nmax_age_s = true\n", "http.max_age_s: Input should be a valid integer"),
        (STATIC + "[safety]\nmax_drop_fraction = true\n", "safety.max_drop_fraction: Input"),
        (STATIC + "[classad]\nupdated_resolution_s = 1.5\n", "classad.updated_resolution_s:"),
        # near sites: a budget of 0 and names that could not be sites are refused
        (STATIC + "[distances]\nremote_budget = 0\n", "distances.remote_budget: Input should"),
        (STATIC + '[distances]\nsource = "static"\n', "source: 'static' is no Rucio source"),
        (STATIC + '[distances.sites]\nA = { "B C" = 1 }\n', "invalid site name"),
    ],
)
def test_bad_config_exits_2_with_one_line_naming_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], toml: str, message: str
) -> None:
    path = tmp_path / "h.toml"
    path.write_text(toml)
    assert main(["check-config", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert message in err


def test_missing_file_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check-config", "--config", str(tmp_path / "nope.toml")]) == 2
    assert "nope.toml: no such configuration file" in capsys.readouterr().err


def test_default_path_comes_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "h.toml").write_text(STATIC)
    (tmp_path / "inv.toml").write_text("")  # check-config checks that the inventory exists
    monkeypatch.setenv("HYDRATOR_CONFIG", str(tmp_path / "h.toml"))
    assert main(["check-config"]) == 0
    assert "ok: 1 source(s)" in capsys.readouterr().out


SHIPPED = sorted(
    p
    for p in [*REPO.glob("config/*.toml"), *REPO.glob("deploy/**/*.toml")]
    if "inventory" not in p.name and p.name != "pyproject.toml"  # deploy/toil: a package
)


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(REPO)))
def test_shipped_configs_are_valid(path: Path) -> None:
    """Every configuration the repository ships passes the strict schema (its secret files
    exist only where it is deployed, so those are checked by the next test, not here)."""
    config = parse_config(tomllib.loads(path.read_text()), base_dir=path.parent)
    assert config.sources


def test_shipped_configs_include_the_demo_and_the_deployments() -> None:
    names = {str(p.relative_to(REPO)) for p in SHIPPED}
    assert {"config/demo.toml", "config/hydrator.example.toml"} <= names
    assert "deploy/kubernetes/hydrator.toml" in names
    load_config(REPO / "config" / "demo.toml")  # the demo needs no secret file: loads fully


def test_a_secret_file_that_does_not_exist_is_named_with_its_key(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The example names credentials under /run/credentials, absent on a developer machine."""
    assert main(["check-config", "--config", str(REPO / "config" / "hydrator.example.toml")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "sources[1].token_file: /run/credentials/hydrator.service/hydrator_rucio-token:" in err


DMAPI = '[[sources]]\ntype = "dmapi"\nbase_url = "https://x"\ntoken_file = "{}"\n'


@pytest.mark.parametrize(
    ("make", "problem"),
    [
        (lambda d: d / "missing.token", "no such file"),
        (lambda d: d, "not a regular file"),
    ],
    ids=["missing", "directory"],
)
def test_a_file_key_must_name_a_readable_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], make: Any, problem: str
) -> None:
    target = make(tmp_path)
    (tmp_path / "h.toml").write_text(DMAPI.format(target))
    assert main(["check-config", "--config", str(tmp_path / "h.toml")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert f"sources[0].token_file: {target}: {problem}" in err
    (tmp_path / "tok").write_text("abc\n")
    (tmp_path / "h.toml").write_text(DMAPI.format(tmp_path / "tok"))
    assert main(["check-config", "--config", str(tmp_path / "h.toml")]) == 0


def test_an_unreadable_file_key_is_refused(tmp_path: Path) -> None:
    token = tmp_path / "tok"
    token.write_text("abc\n")
    token.chmod(0o000)
    (tmp_path / "h.toml").write_text(DMAPI.format(token))
    command = [sys.executable, "-m", "hydrator", "check-config", "--config", f"{tmp_path}/h.toml"]
    result = subprocess.run(
        file_modes_enforced(command), capture_output=True, text=True, check=False, cwd=REPO
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert f"sources[0].token_file: {token}: cannot read: Permission denied" in result.stderr


def test_a_utf8_byte_order_mark_is_accepted(tmp_path: Path) -> None:
    """Editors on Windows save one; it is stripped rather than reported as bad TOML."""
    (tmp_path / "h.toml").write_bytes(b"\xef\xbb\xbf" + STATIC.encode())
    assert load_config(tmp_path / "h.toml").sources[0].name == "static"


def test_relative_paths_resolve_against_the_config_directory() -> None:
    config = load_config(REPO / "config" / "demo.toml")
    assert config.daemon.state_path == REPO / "config" / "demo-state.sqlite"
    inventory = config.sources[0]
    assert isinstance(inventory, StaticSourceConfig)
    assert inventory.path == REPO / "config" / "demo-inventory.toml"


def test_every_key_is_documented_in_the_example() -> None:
    """Each field of every model appears in the example config."""
    from hydrator.config import Config

    example = (REPO / "config" / "hydrator.example.toml").read_text()

    def walk(model: type[BaseModel]) -> set[str]:
        keys: set[str] = set()
        for name, field in model.model_fields.items():
            keys.add(name)
            annotation = field.annotation
            if isinstance(annotation, type) and issubclass(annotation, BaseModel):
                keys |= walk(annotation)
        return keys

    from hydrator.config import DmapiSourceConfig, RucioSourceConfig

    keys = (
        walk(Config) | walk(StaticSourceConfig) | walk(RucioSourceConfig) | walk(DmapiSourceConfig)
    )
    missing = sorted(
        k
        for k in keys
        if f"{k} =" not in example
        and f"[{k}]" not in example
        and f"[[{k}]]" not in example
        and f".{k}]" not in example  # a nested table: [sources.events]
    )
    assert missing == []


def test_the_example_gives_the_site_capabilities_fallback_its_documented_default() -> None:
    """What the example says of ``site_capabilities_ttl_s`` is what a missing key means."""
    from hydrator.config import DmapiSourceConfig

    example = tomllib.loads((REPO / "config" / "hydrator.example.toml").read_text())
    (dmapi,) = [s for s in example["sources"] if s["type"] == "dmapi"]
    default = DmapiSourceConfig.model_fields["site_capabilities_ttl_s"].default
    assert dmapi["site_capabilities_ttl_s"] == default


# ---- every file the daemon reads is a regular file of bounded size


def hydrator_process(*args: str) -> subprocess.CompletedProcess[str]:
    """``hydrator ARGS`` as a process, bounded: a FIFO used to hang it for good."""
    command = [sys.executable, "-m", "hydrator", *args]
    return subprocess.run(command, capture_output=True, text=True, check=False, timeout=30)


@pytest.mark.parametrize("command", ["check-config", "once"])
def test_a_static_path_that_is_a_fifo_is_refused_in_one_line(tmp_path: Path, command: str) -> None:
    os.mkfifo(tmp_path / "inv.toml")
    (tmp_path / "h.toml").write_text(STATIC + '[daemon]\nstate_path = "s.sqlite"\n')
    result = hydrator_process(command, "--config", str(tmp_path / "h.toml"))
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert f"sources[0].path: {tmp_path}/inv.toml: not a regular file (a FIFO)" in result.stderr


def test_check_config_requires_the_static_inventory_to_exist(tmp_path: Path) -> None:
    (tmp_path / "h.toml").write_text(STATIC)
    result = hydrator_process("check-config", "--config", str(tmp_path / "h.toml"))
    assert result.returncode == 2
    assert f"sources[0].path: {tmp_path}/inv.toml: no such file" in result.stderr
    (tmp_path / "inv.toml").write_text('[storage.A]\nsite = "A"\navailable = ["ska:x"]\n')
    assert hydrator_process("check-config", "--config", str(tmp_path / "h.toml")).returncode == 0


def test_a_static_inventory_over_its_cap_fails_check_config(tmp_path: Path) -> None:
    (tmp_path / "inv.toml").write_text("#" * 5000)
    (tmp_path / "h.toml").write_text(STATIC + "max_inventory_bytes = 4096\n")
    result = hydrator_process("check-config", "--config", str(tmp_path / "h.toml"))
    assert result.returncode == 2
    assert "sources[0].path" in result.stderr and "larger than the limit of 4096" in result.stderr


@pytest.mark.parametrize(
    ("make", "problem"),
    [
        (os.mkfifo, "not a regular file (a FIFO)"),
        (lambda p: p.symlink_to("/dev/zero"), "not a regular file (a character device)"),
        (lambda p: p.write_bytes(b"x" * 70_000), "larger than the limit of 65536 bytes"),
    ],
    ids=["fifo", "dev-zero", "75-kB"],
)
def test_a_secret_file_must_be_a_small_regular_file(
    tmp_path: Path, make: Any, problem: str
) -> None:
    """A 75 MB token file was sent as a header 30 times; a FIFO blocked the read."""
    make(tmp_path / "tok")
    (tmp_path / "h.toml").write_text(DMAPI.format(tmp_path / "tok"))
    result = hydrator_process("check-config", "--config", str(tmp_path / "h.toml"))
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1, result.stderr
    assert f"sources[0].token_file: {tmp_path}/tok: {problem}" in result.stderr


@pytest.mark.parametrize(
    ("make", "problem"),
    [
        (os.mkfifo, "not a regular file (a FIFO)"),
        (lambda p: p.symlink_to("/dev/zero"), "not a regular file (a character device)"),
        (lambda p: p.write_bytes(STATIC.encode() + b"#" * (9 << 20)), "larger than the limit"),
    ],
    ids=["fifo", "dev-zero", "9-MB"],
)
def test_the_configuration_file_must_be_a_bounded_regular_file(
    tmp_path: Path, make: Any, problem: str
) -> None:
    make(tmp_path / "h.toml")
    result = hydrator_process("check-config", "--config", str(tmp_path / "h.toml"))
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1, result.stderr
    assert f"{tmp_path}/h.toml: {problem}" in result.stderr


@pytest.mark.parametrize(
    ("value", "parsed"),
    [
        ("127.0.0.1:61613", ("127.0.0.1", 61613)),
        ("broker.example.org:61614", ("broker.example.org", 61614)),
        ("[::1]:9618", ("::1", 9618)),
        ("[2001:db8::5]:1", ("2001:db8::5", 1)),
    ],
)
def test_an_address_is_parsed_once_the_same_everywhere(value: str, parsed: tuple[str, int]) -> None:
    assert host_port(value) == parsed
    events = RucioEventsConfig(enabled=True, brokers=[value, "127.0.0.1:1"])
    assert events.addresses == [parsed, ("127.0.0.1", 1)]
    http = HttpConfig(listen=value)
    assert (http.host, http.port) == parsed


@pytest.mark.parametrize(
    "value", ["9618", ":9618", "host:", "host:port", "host:65536", "[::1:9618", "[]:80", "h:-1"]
)
def test_a_bad_address_is_one_error_naming_it(value: str) -> None:
    with pytest.raises(ValueError, match="expected host:port"):
        host_port(value)
    with pytest.raises(ValueError, match="expected host:port"):
        RucioEventsConfig(enabled=True, brokers=[value])


def test_port_0_is_for_listening_only() -> None:
    assert HttpConfig(listen="127.0.0.1:0").port == 0
    with pytest.raises(ValueError, match="expected host:port"):
        host_port("127.0.0.1:0")
