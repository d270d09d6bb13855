"""Wiring: one typed factory per adapter, found by configuration type; adapters load lazily."""

from __future__ import annotations

import subprocess
import sys
import typing
from pathlib import Path

from hydrator.config import SourceConfig
from hydrator.runtime.wiring import SOURCE_FACTORIES

REPO = Path(__file__).parents[3]


def test_every_source_configuration_type_has_a_factory_taking_that_type() -> None:
    (union, *_) = typing.get_args(SourceConfig)  # Annotated[A | B | C, discriminator]
    kinds = set(typing.get_args(union))
    assert set(SOURCE_FACTORIES) == kinds
    for kind, factory in SOURCE_FACTORIES.items():
        hints = typing.get_type_hints(factory)
        assert hints["config"] is kind, factory.__name__


STATIC_ONLY = """
import sys
from pathlib import Path
from hydrator.config import parse_config
from hydrator.runtime.wiring import build_service

tmp = Path(sys.argv[1])
inventory = '[storage.A_DISK]\\nsite = "SITE_A"\\navailable = ["ska:obs_1"]\\n'
(tmp / "inventory.toml").write_text(inventory)
config = parse_config(
    {
        "daemon": {"state_path": str(tmp / "state.sqlite")},
        "sources": [
            {"type": "static", "name": "inv", "path": "inventory.toml", "settle_s": 0}
        ],
    },
    tmp,
)
service = build_service(config)
try:
    report = service.run_cycle()
finally:
    service.close()
assert report.outcome == "ok", report
print(" ".join(m for m in ("rucio", "htcondor2") if m in sys.modules) or "neither")
"""


def test_a_static_only_setup_imports_neither_rucio_nor_htcondor2(tmp_path: Path) -> None:
    """A fresh interpreter runs a cycle on an inventory file; the catalogue and pool libraries
    stay unloaded (their imports cost seconds and read HTCondor's configuration)."""
    done = subprocess.run(
        [sys.executable, "-c", STATIC_ONLY, str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "neither"
