"""State files of earlier releases (tests/unit/adapters/state/data), with the configuration that
wrote them: the demo inventories as two static sources and their [sites]."""

from __future__ import annotations

import shutil
from pathlib import Path

DATA = Path(__file__).parents[1] / "unit" / "adapters" / "state" / "data"


def old_state_config(tmp_path: Path, state_file: str) -> Path:
    """``state_file`` (e.g. ``state-v2.sqlite``) copied to ``tmp_path/state.sqlite`` with its
    inventories, and the path of a config like the one that wrote it."""
    shutil.copy(DATA / state_file, tmp_path / "state.sqlite")
    for name in ("inventory.toml", "inventory-extra.toml"):
        shutil.copy(DATA / name, tmp_path / name)
    path = tmp_path / "hydrator.toml"
    path.write_text(
        '[daemon]\nstate_path = "state.sqlite"\n'
        '[[sources]]\ntype = "static"\nname = "demo"\npath = "inventory.toml"\n'
        '[[sources]]\ntype = "static"\nname = "extra"\npath = "inventory-extra.toml"\n'
        '[sites]\nCH_DISK = "SRCNET_CH"\nUK_DISK = "SRCNET_UK"\nUK_SCRATCH = "SRCNET_UK"\n'
        'ES_DISK = "SRCNET_ES"\n'
    )
    return path
