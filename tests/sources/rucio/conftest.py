"""Fixtures for the Rucio source tests: the real server (session) and one populated federation."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from hydrator.adapters.sources.rucio import RucioSource
from tests.support.rucio_server import (  # noqa: F401  (fixtures)
    Federation,
    RucioAdmin,
    RucioServer,
    build_federation,
    running_rucio,
    source_config,
)


@pytest.fixture(scope="session")
def federation(rucio_admin: RucioAdmin) -> Federation:
    """The shared read-only federation; tests that change data make their own datasets."""
    return build_federation(rucio_admin)


@pytest.fixture()
def make_source(
    rucio_server: RucioServer,
    federation: Federation,
) -> Iterator[Callable[..., RucioSource]]:
    """Build sources on the federation (closed after the test); keywords override the config."""
    made: list[RucioSource] = []

    def make(sites: dict[str, str] | None = None, **overrides: Any) -> RucioSource:
        overrides.setdefault("rse_expression", federation.expression)
        source = RucioSource(
            source_config(rucio_server, **overrides),
            federation.overrides if sites is None else sites,
        )
        made.append(source)
        return source

    yield make
    for source in made:
        source.close()


@pytest.fixture()
def wrong_password_file(tmp_path: Path) -> Path:
    path = tmp_path / "password"
    path.write_text("not-the-password\n")
    return path
