"""Configuration errors: one line that names the key; shipped configs are valid."""

from __future__ import annotations

from pathlib import Path

import pytest

from hydrator.cli import main
from hydrator.config import load_config

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
    monkeypatch.setenv("HYDRATOR_CONFIG", str(tmp_path / "h.toml"))
    assert main(["check-config"]) == 0
    assert "ok: 1 source(s)" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["demo.toml", "hydrator.example.toml"])
def test_shipped_configs_are_valid(name: str) -> None:
    config = load_config(REPO / "config" / name)
    assert config.sources


def test_relative_paths_resolve_against_the_config_directory() -> None:
    config = load_config(REPO / "config" / "demo.toml")
    assert config.daemon.state_path == REPO / "config" / "demo-state.sqlite"
    assert config.sources[0].path == REPO / "config" / "demo-inventory.toml"  # type: ignore[union-attr]


def test_every_key_is_documented_in_the_example() -> None:
    """Each field of every model appears in the example config."""
    from hydrator.config import Config

    example = (REPO / "config" / "hydrator.example.toml").read_text()

    def walk(model: type) -> set[str]:
        keys: set[str] = set()
        for name, field in model.model_fields.items():  # type: ignore[attr-defined]
            keys.add(name)
            annotation = field.annotation
            if hasattr(annotation, "model_fields"):
                keys |= walk(annotation)
        return keys

    from hydrator.config import DmapiSourceConfig, RucioSourceConfig, StaticSourceConfig

    keys = (
        walk(Config) | walk(StaticSourceConfig) | walk(RucioSourceConfig) | walk(DmapiSourceConfig)
    )
    missing = sorted(
        k
        for k in keys
        if f"{k} =" not in example and f"[{k}]" not in example and f"[[{k}]]" not in example
    )
    assert missing == []
