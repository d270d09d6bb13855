"""A Rucio listing line that is not JSON: the fetch fails with one
:class:`~hydrator.errors.TransientSourceError` line naming the listing, the RSE and the line's
position, the line cut and free of ``$``; the next good answer is read exactly again.

The server here is a stand-in for the rucio-clients ``Client`` at its public attributes (the
wire's ``client_factory``); the same failure against the real Rucio server, through a proxy
that corrupts one line, is in ``tests/sources/rucio/test_rucio_not_json.py``.
"""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

import pytest
import requests

from hydrator.adapters.sources.rucio import RucioSource
from hydrator.adapters.sources.rucio.listing import (
    SUMMARY_LINES,
    Mark,
    NotJsonLine,
    parse_lines,
)
from hydrator.config import RucioSourceConfig
from hydrator.core.ports import FetchContext
from hydrator.domain import Snapshot
from hydrator.errors import TransientSourceError
from tests.support.rucio_client import ClientAttributes


def row(name: str, rse: str) -> bytes:
    """One complete summary row as the server sends it."""
    record = {"scope": "ska", "name": name, "rse": rse, "state": "AVAILABLE", "length": 2,
              "available_length": 2, "bytes": 2000, "available_bytes": 2000}  # fmt: skip
    return json.dumps(record).encode()


class Session:
    """The stand-in client's ``requests`` session: each RSE's summary as scripted lines."""

    def __init__(self, summaries: dict[str, list[bytes]]) -> None:
        self.summaries = summaries
        self.hooks: dict[str, list[Any]] = {"response": []}

    def get(self, url: str, **kwargs: Any) -> requests.Response:
        path = urlparse(url).path
        body = b""  # no rule, no bad replica, no file replica checked exactly
        if path.startswith("/replicas/rse/"):
            body = b"\n".join(self.summaries[unquote(path.removeprefix("/replicas/rse/"))])
        elif path == "/rules/":
            assert parse_qs(urlparse(url).query)["state"]
        response = requests.Response()
        response.status_code = 200
        response.raw = io.BytesIO(body + b"\n")
        return response


class Client(ClientAttributes):
    """The rucio-clients ``Client`` calls the source uses: two RSEs, both at SITE_A."""

    def __init__(self, summaries: dict[str, list[bytes]]) -> None:
        self.session = Session(summaries)

    def list_rses(self, expression: str | None) -> list[dict[str, Any]]:
        return [{"rse": rse, "availability_read": True} for rse in self.session.summaries]

    def list_rse_attributes(self, rse: str) -> dict[str, str]:
        return {"site": "SITE_A"}


@pytest.fixture
def summaries() -> dict[str, list[bytes]]:
    return {
        "A_DISK": [row("obs_1", "A_DISK"), row("obs_2", "A_DISK")],
        "B_DISK": [row("obs_3", "B_DISK"), row("obs_4", "B_DISK"), row("obs_5", "B_DISK")],
    }


def fetch(source: RucioSource) -> Snapshot:
    return source.fetch(FetchContext(now=datetime.now(UTC)))


def make_source(summaries: dict[str, list[bytes]]) -> RucioSource:
    config = RucioSourceConfig(type="rucio", rse_expression="all", max_attempts=1)
    client = Client(summaries)
    return RucioSource(config, {}, sleep=lambda _: None, client_factory=lambda: client)


def names(snapshot: Snapshot) -> set[str]:
    return {r.dataset.name for r in snapshot.replicas}


@pytest.mark.parametrize("first", [True, False], ids=["first-read", "incremental"])
def test_a_summary_line_that_is_not_json_fails_the_fetch_in_one_line(
    summaries: dict[str, list[bytes]], first: bool
) -> None:
    source = make_source(summaries)
    if not first:
        assert names(fetch(source)) == {"obs_1", "obs_2", "obs_3", "obs_4", "obs_5"}
    good = summaries["B_DISK"][2]
    summaries["B_DISK"][2] = b'{"scope": "ska", "name": "$(HOME)\x1b[31m' + b"x" * 500
    with pytest.raises(TransientSourceError) as failed:
        fetch(source)
    message = str(failed.value)
    assert message.startswith("rucio: the dataset summary of RSE B_DISK (list_datasets_per_rse)")
    assert "line 3 is not JSON" in message
    assert "$" not in message and "\x1b" not in message and "\n" not in message
    assert "... (538 bytes)" in message and len(message) < 250
    summaries["B_DISK"][2] = good
    assert names(fetch(source)) == {"obs_1", "obs_2", "obs_3", "obs_4", "obs_5"}


def test_a_line_smuggling_a_second_record_is_not_json(summaries: dict[str, list[bytes]]) -> None:
    """Two records on one line would make a batch of more records than lines."""
    source = make_source(summaries)
    fetch(source)
    summaries["A_DISK"][1] = row("obs_2", "A_DISK") + b", " + row("obs_9", "A_DISK")
    with pytest.raises(TransientSourceError, match=r"RSE A_DISK .*: line 2 is not JSON"):
        fetch(source)


@pytest.mark.parametrize("line", [b"[1, 2", b"\xff\xfe", b"{} {}", b"NaN,"])
def test_parse_lines_names_the_listing_of_a_line_that_is_not_json(line: bytes) -> None:
    lines = [row("obs_1", "A_DISK"), line, b"", row("obs_2", "A_DISK")]
    with pytest.raises(NotJsonLine, match=r"^rucio: the listing: a line is not JSON: '") as failed:
        parse_lines(SUMMARY_LINES, lines, "the listing")
    assert failed.value.line == line
    assert failed.value.at(b"\n".join(lines)).number == 2


def test_malformed_records_are_still_counted_not_failed() -> None:
    lines = [row("obs_1", "A_DISK"), b'{"scope": "ska"}', b"[]", b"  "]
    first, *rest = parse_lines(SUMMARY_LINES, lines, "the listing")
    assert isinstance(first, dict) and first["name"] == "obs_1"
    assert rest == [Mark.INVALID, Mark.INVALID, Mark.SKIPPED]
