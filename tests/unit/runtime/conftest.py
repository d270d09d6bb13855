"""Fixtures of the runtime's unit tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.event_cycles import Catalogue, build
from tests.unit.factories import rep


@pytest.fixture
def setup(tmp_path: Path, request: pytest.FixtureRequest) -> Any:
    """The service and its event cycles over a catalogue holding ``A:obs1``, or over the
    catalogue a test gives (``@pytest.mark.parametrize("setup", [...], indirect=True)``)."""
    source = getattr(request, "param", None) or Catalogue(rep("A", "obs1"))
    parts = build(tmp_path, source)
    yield parts
    parts[0].close()
