"""Fixtures of the runtime's unit tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.event_cycles import Catalogue, build
from tests.unit.factories import rep


@pytest.fixture
def setup(tmp_path: Path) -> Any:
    parts = build(tmp_path, Catalogue(rep("A", "obs1")))
    yield parts
    parts[0].close()
