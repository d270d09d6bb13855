"""A Rucio fetch bounded in time and size:
it ends by itself at ``deadline_s``, a trickling server is cut there, an answer or a line
over its cap fails the source naming the RSE, and no private token directory outlives the
daemon. Against the real Rucio server (tests/support/rucio_server.py) and, for the trickle, a
server that sends a status line then one header line every half second (tests/support/trickle.py).
"""

from __future__ import annotations

import json
import os
import signal
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from hydrator.adapters.sources.rucio import RucioSource
from hydrator.config import RucioSourceConfig, parse_config
from hydrator.core.ports import FetchContext
from hydrator.domain import Snapshot
from hydrator.errors import PermanentSourceError, SourceError, TransientSourceError
from hydrator.runtime.wiring import build_service
from tests.support.rucio_server import RucioAdmin, RucioServer, source_config, unique
from tests.support.trickle import TrickleServer, trickling
from tests.support.wait import wait_for

pytestmark = pytest.mark.rucio


def now() -> FetchContext:
    return FetchContext(now=datetime.now(UTC))


def timed_fetch(source: RucioSource, wait_s: float) -> tuple[Snapshot | SourceError, float]:
    """The fetch's answer or error and how long it took, waiting at most ``wait_s`` seconds
    for it (in a thread: a fetch that never ends must fail the test, not hang it)."""
    result: list[Snapshot | SourceError] = []

    def fetch() -> None:
        try:
            result.append(source.fetch(now()))
        except SourceError as exc:
            result.append(exc)

    started = time.monotonic()
    thread = threading.Thread(target=fetch, daemon=True)
    thread.start()
    thread.join(wait_s)
    assert result, f"the fetch did not end within {wait_s:g} s"
    return result[0], time.monotonic() - started


def trickle_config(server: TrickleServer, password: Path, **overrides: object) -> RucioSourceConfig:
    password.write_text("not-a-real-password\n")
    values: dict[str, object] = {
        "type": "rucio",
        "rucio_host": server.url,
        "auth_host": server.url,
        "account": "root",
        "auth_type": "userpass",
        "username": "root",
        "password_file": password,
        "timeout_s": 1.0,
        "max_attempts": 3,
        "backoff_s": 0.05,
    }
    values.update(overrides)
    return RucioSourceConfig.model_validate(values)


def test_a_fetch_ends_by_itself_at_its_deadline(
    rucio_admin: RucioAdmin, running_rucio: RucioServer
) -> None:
    """A server that stopped answering: each call's timeout (30 s here) is cut to the time
    left, so the fetch fails at deadline_s instead of lingering past it."""
    _, expression = own_rse(rucio_admin, 2)
    config = source_config(running_rucio, rse_expression=expression, timeout_s=30.0, deadline_s=2.0)
    source = RucioSource(config, {})
    try:
        source.fetch(now())
        assert running_rucio.process is not None
        os.killpg(running_rucio.process.pid, signal.SIGSTOP)
        try:
            error, took = timed_fetch(source, 10)
        finally:
            os.killpg(running_rucio.process.pid, signal.SIGCONT)
        assert isinstance(error, TransientSourceError)
        assert "deadline passed (deadline_s = 2 s)" in str(error)
        assert took < 4
        assert isinstance(source.fetch(now()), Snapshot)  # the next fetch is a normal one
    finally:
        source.close()


def test_a_trickling_server_is_cut_at_the_deadline(tmp_path: Path) -> None:
    """A status line, then a header line every half second: per-read timeouts never fire;
    the deadline shuts the connection down (the server sees it hang up)."""
    with trickling(0.5) as server:
        source = RucioSource(trickle_config(server, tmp_path / "pw", deadline_s=2.0), {})
        try:
            error, took = timed_fetch(source, 10)
            assert isinstance(error, TransientSourceError)
            assert "deadline passed (deadline_s = 2 s)" in str(error)
            assert took < 4
            assert server.counts["requests"] == 1  # no retry after the deadline
            wait_for("a hang-up", lambda: server.counts["hung_up"], timeout_s=3.0, interval_s=0.1)
            assert server.counts["hung_up"] == 1, "the connection was cut, not left open"
        finally:
            source.close()


def own_rse(admin: RucioAdmin, datasets: int, long_name: bool = False) -> tuple[str, str]:
    """An RSE of its own (selected by ``fed=<tag>``) holding complete datasets; with
    ``long_name`` one more whose name is 200 characters long (a longer summary line)."""
    tag = unique("c").lower()
    rse = admin.rse(f"SITE-{tag}", attributes={"fed": tag})
    scope = admin.scope()
    admin.many_datasets(scope, datasets, rse)
    if long_name:
        name = admin.dataset(scope, 1, name=unique("long").ljust(200, "x"), at=[rse])
        admin.rule(scope, name, rse)
    admin.server.run_abacus()
    return rse, f"fed={tag}"


def test_an_answer_over_its_cap_fails_naming_the_rse(
    rucio_admin: RucioAdmin, rucio_server: RucioServer
) -> None:
    # The cap must let every other answer through: the listing of every RSE (read each fetch
    # for availability_read) grows with what the session's other tests made, so the cap is
    # set above it and the RSE's summary is made larger still (~400 bytes a row).
    listed = sum(len(json.dumps(r, default=str)) + 1 for r in rucio_admin.client.list_rses())
    cap = max(4096, 2 * listed + 4096)
    datasets = cap // 300 + 20
    rse, expression = own_rse(rucio_admin, datasets)
    config = source_config(rucio_server, rse_expression=expression)
    source = RucioSource(config, {})
    try:
        good = source.fetch(now())
        assert len(good.replicas) == datasets
        source.config = config.model_copy(update={"max_answer_bytes": cap})
        with pytest.raises(PermanentSourceError) as raised:
            source.fetch(now())
        assert str(raised.value) == (
            f"rucio: list_datasets_per_rse: answer from /replicas/rse/{rse} larger than "
            f"max_answer_bytes = {cap}"
        )
        assert source.calls_last_fetch["list_datasets_per_rse"] == 1  # not retried
        source.config = config
        assert source.fetch(now()).replicas == good.replicas
    finally:
        source.close()


def test_rucio_clients_own_calls_are_capped_too(
    rucio_admin: RucioAdmin, rucio_server: RucioServer
) -> None:
    """The answers rucio-clients reads itself (here ``list_rse_attributes``: 6 attributes of
    200 characters) have the same cap, on the adapter mounted on its session."""
    tag = unique("m").lower()
    padding = {f"pad{i}": "x" * 200 for i in range(6)}
    rse = rucio_admin.rse(f"SITE-{tag}", attributes={"fed": tag, **padding})
    config = source_config(rucio_server, rse_expression=f"fed={tag}")
    source = RucioSource(config.model_copy(update={"max_answer_bytes": 1024}), {})
    try:
        with pytest.raises(PermanentSourceError) as raised:
            source.fetch(now())
        assert str(raised.value) == (
            f"rucio: list_rse_attributes: answer from /rses/{rse}/attr/ larger than "
            "max_answer_bytes = 1024"
        )
        source.config = config
        assert source.fetch(now()).sites == {f"SITE-{tag}"}
    finally:
        source.close()


def test_a_line_over_its_cap_fails_naming_the_rse(
    rucio_admin: RucioAdmin, rucio_server: RucioServer
) -> None:
    rse, expression = own_rse(rucio_admin, 3, long_name=True)
    config = source_config(rucio_server, rse_expression=expression)
    source = RucioSource(config, {})
    try:
        assert len(source.fetch(now()).replicas) == 4
        # the lines are 328 bytes, and 516 with the long name
        source.config = config.model_copy(update={"max_line_bytes": 400})
        with pytest.raises(PermanentSourceError) as raised:
            source.fetch(now())
        assert str(raised.value) == (
            f"rucio: list_datasets_per_rse: RSE {rse}: a line longer than max_line_bytes = 400"
        )
        source.config = config  # (not 600: the rules listing is the server's, other tests')
        assert len(source.fetch(now()).replicas) == 4
    finally:
        source.close()


def test_a_busy_sources_token_directory_is_removed_at_shutdown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The daemon stops while a Rucio fetch is still running (abandoned): its private token
    directory does not stay behind in the temporary directory."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    with trickling(0.5) as server:
        source = trickle_config(server, tmp_path / "pw", deadline_s=60.0)
        config = parse_config(
            {
                "daemon": {"state_path": str(tmp_path / "state.sqlite")},
                "sources": [source.model_dump(mode="json", exclude_none=True)],
            },
            tmp_path,
        )
        service = build_service(config)
        cycle = threading.Thread(target=service.run_cycle, daemon=True)
        cycle.start()
        wait_for(
            "the fetch in its token request",
            lambda: server.counts["requests"] == 1,
            timeout_s=5.0,
            interval_s=0.05,
        )
        assert [p.name[:15] for p in temp.iterdir()] == ["hydrator-rucio-"]
        service.stop()
        cycle.join(5)
        assert not cycle.is_alive()
        assert service.busy_sources() == ["rucio"]
        service.close()
        wait_for(  # the fetch ended (cut at close)
            "no busy source", lambda: not service.busy_sources(), timeout_s=5.0, interval_s=0.05
        )
        assert list(temp.iterdir()) == []
