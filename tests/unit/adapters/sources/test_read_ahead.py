"""The Rucio source reads the next RSE's answer while it parses this one
(``rucio.summaries.read_ahead``): the wait for a catalogue's bytes overlaps the parsing, one
request at a time, none left running after a fetch, and a failed read raises in its turn."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from hydrator.adapters.sources.rucio.summaries import read_ahead

TIMEOUT_S = 10.0


class Reads:
    """A ``read`` that records what it did and when, and fails for ``fail``."""

    def __init__(self, fail: str | None = None) -> None:
        self.fail = fail
        self.started: dict[str, threading.Event] = {}
        self.log: list[str] = []
        self.running = 0
        self.most = 0
        self.lock = threading.Lock()

    def started_event(self, key: str) -> threading.Event:
        with self.lock:
            return self.started.setdefault(key, threading.Event())

    def __call__(self, key: str) -> str:
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
            self.log.append(f"start {key}")
        self.started_event(key).set()
        try:
            if key == self.fail:
                raise OSError(f"no answer for {key}")
            return f"body of {key}"
        finally:
            with self.lock:
                self.running -= 1
                self.log.append(f"end {key}")


def test_the_next_answer_is_read_while_this_one_is_parsed() -> None:
    keys = ["RSE_1", "RSE_2", "RSE_3"]
    reads = Reads()
    got = []
    with ThreadPoolExecutor(1) as reader:
        for key, body in zip(keys, read_ahead(reader, reads, keys), strict=True):
            got.append(body)
            if key != keys[-1]:  # "parsing" this one: the next read has begun meanwhile
                nxt = keys[keys.index(key) + 1]
                assert reads.started_event(nxt).wait(TIMEOUT_S), f"{nxt} not read ahead"
    assert got == [f"body of {k}" for k in keys]  # in order
    assert reads.most == 1  # one request at a time, as without the thread
    assert reads.running == 0


def test_a_failed_read_raises_in_its_turn_and_nothing_runs_after() -> None:
    keys = ["RSE_1", "RSE_2", "RSE_3", "RSE_4"]
    reads = Reads(fail="RSE_2")
    got = []
    # (the reader's exit, waiting for what it runs, comes before the error gets out)
    with pytest.raises(OSError, match="no answer for RSE_2"), ThreadPoolExecutor(1) as reader:
        for body in read_ahead(reader, reads, keys):
            got.append(body)
    assert got == ["body of RSE_1"]  # RSE_1 was parsed before RSE_2's failure surfaced
    assert "start RSE_4" not in reads.log  # at most the one after the failed read was begun
    assert reads.running == 0  # and it ended with the reader


def test_no_keys_reads_nothing() -> None:
    reads = Reads()
    with ThreadPoolExecutor(1) as reader:
        assert list(read_ahead(reader, reads, [])) == []
    assert reads.log == []
