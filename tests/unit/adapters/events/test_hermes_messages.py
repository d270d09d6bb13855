"""What a message body is (:func:`parse_message`, total: it never raises)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hydrator.adapters.events.hermes_messages import Dropped, parse_message
from hydrator.core.event_hints import Ignored, RucioEvent
from hydrator.domain import DatasetId


def body(
    event_type: str = "rule_ok", created_at: Any = "2026-11-26 10:55:12", **payload: Any
) -> bytes:
    payload = payload or {"scope": "ska", "name": "obs1"}
    return json.dumps(
        {"event_type": event_type, "payload": payload, "created_at": created_at}
    ).encode()


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"x" * 5000, Ignored.TOO_LARGE),
        (b'{"event_type": "rule_ok", "payload": {}, "created_at": "\xff"}', Ignored.NOT_UTF8),
        (b"{not json", Ignored.NOT_JSON),
        (b"", Ignored.NOT_JSON),
        (b'{"event_type": "rule_ok", "payload": {}, "extra": 1}', Ignored.MALFORMED),
        (b'{"event_type": "rule_ok", "payload": []}', Ignored.MALFORMED),
        (body(created_at="yesterday"), Ignored.BAD_TIME),
        (body(created_at="0001-01-01 00:00:00+05:00"), Ignored.BAD_TIME),  # no UTC equivalent
        (body(created_at="9999-12-31 23:59:59-05:00"), Ignored.BAD_TIME),
        (body(scope="ska", name="obs 1"), Ignored.INVALID_NAME),
        (body(scope="ska", name="$(ENV)"), Ignored.INVALID_NAME),
        (
            body("transfer-done", scope="ska", name="f", datasetScope="ska", dataset="a,b"),
            Ignored.INVALID_NAME,
        ),
    ],
)
def test_each_kind_of_bad_body_is_named(raw: bytes, reason: Ignored) -> None:
    found = parse_message(raw, 4096)
    assert isinstance(found, Dropped) and found.reason is reason, found


def test_a_valid_body_is_an_event_with_checked_names() -> None:
    found = parse_message(
        body("transfer-done", scope="ska", name="f1", datasetScope="ska", dataset="obs1"), 4096
    )
    assert isinstance(found, RucioEvent)
    assert found.dataset == DatasetId("ska", "obs1") and found.file == ("ska", "f1")
    assert found.created_at is not None and found.created_at.utcoffset() is not None
    unnamed = parse_message(body("transfer-done", scope="ska", name="f1"), 4096)
    assert isinstance(unnamed, RucioEvent) and unnamed.dataset is None  # the next full read


@given(st.binary(max_size=300) | st.text(max_size=300))
def test_parse_message_never_raises(raw: bytes | str) -> None:
    assert isinstance(parse_message(raw, 256), RucioEvent | Dropped)


@given(st.dictionaries(st.text(max_size=12), st.none() | st.text(max_size=40) | st.integers()))
def test_any_payload_is_an_event_or_a_drop(payload: dict[str, Any]) -> None:
    raw = json.dumps({"event_type": "transfer-done", "payload": payload, "created_at": None})
    assert isinstance(parse_message(raw, 65536), RucioEvent | Dropped)
