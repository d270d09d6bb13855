"""The Rucio source's parent lookup for ``deletion-done`` (``list_parent_dids`` through the
wire): datasets only, names checked, a bounded number per file, errors translated."""

from __future__ import annotations

import time
from typing import Any

import pytest
import requests

from hydrator.adapters.sources.rucio.rucio_source import RucioSource
from hydrator.adapters.sources.rucio.targeted import MAX_PARENTS_PER_FILE
from hydrator.config import RucioSourceConfig
from hydrator.domain import DatasetId
from hydrator.errors import TransientSourceError
from tests.support.rucio_client import ClientAttributes


class Session:
    hooks: dict[str, list[Any]]

    def __init__(self) -> None:
        self.hooks = {"response": []}


class Client(ClientAttributes):
    """The rucio-clients ``Client`` attributes the wire reads, and ``list_parent_dids``."""

    def __init__(self, parents: dict[tuple[str, str], list[Any]]) -> None:
        self.parents = parents
        self.session = Session()
        self.asked: list[tuple[str, str]] = []

    def list_parent_dids(self, scope: str, name: str) -> list[Any]:
        self.asked.append((scope, name))
        if (scope, name) not in self.parents:
            raise requests.ConnectionError("scripted outage")
        return self.parents[(scope, name)]


def source(client: Client) -> RucioSource:
    config = RucioSourceConfig(type="rucio", rse_expression="all", max_attempts=1)
    return RucioSource(config, {}, sleep=lambda _: None, client_factory=lambda: client)


def test_the_datasets_that_contain_the_files_are_named_once() -> None:
    client = Client(
        {
            ("ska", "f1"): [
                {"scope": "ska", "name": "obs1", "type": "DATASET"},
                {"scope": "ska", "name": "all_obs", "type": "CONTAINER"},  # not a dataset
                {"scope": "ska", "name": "bad name", "type": "DATASET"},  # invalid: skipped
                "not a record",
            ],
            ("ska", "f2"): [{"scope": "ska", "name": "obs1", "type": "DATASET"}],
        }
    )
    found = source(client).parent_datasets([("ska", "f1"), ("ska", "f2")])
    assert found == [DatasetId("ska", "obs1")]
    assert client.asked == [("ska", "f1"), ("ska", "f2")]  # one call a file


def test_a_file_in_very_many_datasets_is_bounded() -> None:
    many = [
        {"scope": "ska", "name": f"obs{i}", "type": "DATASET"}
        for i in range(MAX_PARENTS_PER_FILE + 5)
    ]
    found = source(Client({("ska", "f1"): many})).parent_datasets([("ska", "f1")])
    assert len(found) == MAX_PARENTS_PER_FILE


def test_a_failed_lookup_raises_a_source_error() -> None:
    with pytest.raises(TransientSourceError):
        source(Client({})).parent_datasets([("ska", "f1")])


class SlowClient(Client):
    """Each lookup takes ``delay_s`` (a server answering slowly)."""

    def __init__(self, parents: dict[tuple[str, str], list[Any]], delay_s: float) -> None:
        super().__init__(parents)
        self.delay_s = delay_s

    def list_parent_dids(self, scope: str, name: str) -> list[Any]:
        time.sleep(self.delay_s)
        return super().list_parent_dids(scope, name)


def timed_source(client: Client, deadline_s: float) -> RucioSource:
    config = RucioSourceConfig(
        type="rucio", rse_expression="all", max_attempts=1, deadline_s=deadline_s
    )
    return RucioSource(config, {}, sleep=lambda _: None, client_factory=lambda: client)


def test_a_lookup_long_after_the_last_read_gets_its_own_deadline() -> None:
    obs1 = [{"scope": "ska", "name": "obs1", "type": "DATASET"}]
    src = timed_source(Client({("ska", "f1"): obs1}), deadline_s=0.05)
    src.wire.begin(src.config.deadline_s)  # a full read, long over
    src.wire.end()
    time.sleep(0.1)
    assert src.parent_datasets([("ska", "f1")]) == [DatasetId("ska", "obs1")]


def test_a_slow_lookup_ends_by_the_deadline() -> None:
    obs1 = [{"scope": "ska", "name": "obs1", "type": "DATASET"}]
    client = SlowClient({("ska", f"f{i}"): obs1 for i in range(50)}, delay_s=0.05)
    src = timed_source(client, deadline_s=0.2)
    started = time.monotonic()
    with pytest.raises(TransientSourceError, match="deadline"):
        src.parent_datasets([("ska", f"f{i}") for i in range(50)])
    assert time.monotonic() - started < 1.0  # not the 2.5 s of 50 lookups
    assert len(client.asked) < 50
