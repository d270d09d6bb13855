"""Fixtures for the DMAPI source: a running fake SRCNet and a source factory."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from hydrator.adapters.sources.dmapi import DmapiSource
from hydrator.config import DmapiSourceConfig
from tests.support.dmapi import MakeSource
from tests.support.fake_dmapi import FakeSrcnet


@pytest.fixture
def fake() -> Iterator[FakeSrcnet]:
    server = FakeSrcnet()
    with server.running():
        yield server


@pytest.fixture
def secret_files(tmp_path: Path, fake: FakeSrcnet) -> dict[str, Path]:
    id_file = tmp_path / "client_id"
    secret_file = tmp_path / "client_secret"
    id_file.write_text(fake.client_id + "\n")
    secret_file.write_text(fake.client_secret + "\n")
    return {"client_id_file": id_file, "client_secret_file": secret_file}


@pytest.fixture
def make_source(fake: FakeSrcnet, secret_files: dict[str, Path]) -> Iterator[MakeSource]:
    """Build a DmapiSource against the fake; keyword arguments override config keys.

    Defaults keep tests fast: backoff 0.05 s (max 0.2 s), Retry-After honoured up to 3 s.
    ``auth="static"`` drops the client-credentials keys (pass token_file yourself).
    """
    created: list[DmapiSource] = []

    def make(
        sites: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        auth: str = "client_credentials",
        **overrides: Any,
    ) -> DmapiSource:
        raw: dict[str, Any] = {
            "type": "dmapi",
            "base_url": fake.base_url,
            "site_capabilities_url": fake.base_url,
            "timeout_s": 5.0,
            "max_attempts": 3,
            "backoff_s": 0.05,
            "max_backoff_s": 0.2,
            "max_retry_after_s": 3.0,
            "max_concurrency": 4,
        }
        if auth == "client_credentials":
            raw |= {"token_url": fake.token_url, **secret_files}
        raw |= overrides
        source = DmapiSource(DmapiSourceConfig.model_validate(raw), sites or {}, clock=clock)
        created.append(source)
        return source

    yield make
    for source in created:
        source.close()
