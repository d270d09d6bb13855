"""What a message of Rucio's hermes says (its ``deliver_to_activemq`` envelope): a
:class:`~hydrator.core.event_hints.RucioEvent`, or why the body cannot be used
(:func:`parse_message`). Everything in a body is hostile until checked here: its size, its
encoding, its JSON, the envelope's fields, the time and the names it carries. The transport
is :mod:`hydrator.adapters.events.stomp_listener`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, StringConstraints, ValidationError

from hydrator.core.event_hints import TRANSFER_TYPES, Ignored, RucioEvent, message_key
from hydrator.domain import DatasetId
from hydrator.names import InvalidNameError


class _Envelope(BaseModel):
    """hermes' message body (``deliver_to_activemq``, Rucio 41.5.1)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    event_type: Annotated[str, StringConstraints(min_length=1, max_length=64)]
    payload: dict[str, Any]
    created_at: Annotated[str, StringConstraints(max_length=64)] | None = None


@dataclass(frozen=True)
class Dropped:
    """Why a message body cannot be used: the reason counted and a short detail logged."""

    reason: Ignored
    detail: str


def parse_message(body: str | bytes, max_bytes: int) -> RucioEvent | Dropped:
    """One message body as an event, or why it is dropped; never raises."""
    raw = body.encode("utf-8", "replace") if isinstance(body, str) else body
    if len(raw) > max_bytes:
        return Dropped(Ignored.TOO_LARGE, f"{len(raw)} bytes, over max_message_bytes {max_bytes}")
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return Dropped(Ignored.NOT_UTF8, f"not UTF-8 at byte {exc.start}")
    try:
        envelope = _Envelope.model_validate_json(raw)
    except ValidationError as exc:
        kinds = {e["type"] for e in exc.errors()}
        if "json_invalid" in kinds:
            return Dropped(Ignored.NOT_JSON, "not JSON")
        return Dropped(Ignored.MALFORMED, "not hermes' envelope: " + ", ".join(sorted(kinds)))
    created = _created_at(envelope.created_at)
    if envelope.created_at is not None and created is None:
        return Dropped(Ignored.BAD_TIME, f"created_at {envelope.created_at[:64]!r} is no UTC time")
    return _event(envelope, created, raw)


def _event(envelope: _Envelope, created: datetime | None, raw: bytes) -> RucioEvent | Dropped:
    """The event of a valid envelope, or INVALID_NAME when a name it carries breaks the rules."""
    kind = envelope.event_type.lower()
    payload = envelope.payload
    if kind in TRANSFER_TYPES:
        scope, name, rse = (
            payload.get("datasetScope"),
            payload.get("dataset"),
            payload.get("dst-rse"),
        )
    else:
        scope, name = payload.get("scope"), payload.get("name")
        rse = payload.get("rse")
    try:
        dataset = _named(scope, name)
        file = _named(payload.get("scope"), payload.get("name"))
    except InvalidNameError as exc:
        return Dropped(Ignored.INVALID_NAME, str(exc))
    return RucioEvent(
        event_type=kind,
        created_at=created,
        dataset=dataset,
        file=None if file is None else (file.scope, file.name),
        rse=rse if isinstance(rse, str) else None,
        key=message_key(raw),
    )


def _named(scope: object, name: object) -> DatasetId | None:
    """A checked (scope, name) when both are strings; None when either is absent or not a
    string; raises :class:`InvalidNameError` when they break the name rules."""
    if not isinstance(scope, str) or not isinstance(name, str):
        return None
    return DatasetId(scope, name)


def _created_at(text: str | None) -> datetime | None:
    """hermes' ``str(datetime)`` (UTC, naive: ``2026-11-26 10:55:12.123456``) as aware UTC;
    None when it is no time, or one that has no UTC equivalent (year 1 at +05:00)."""
    if text is None:
        return None
    try:
        when = datetime.fromisoformat(text)
        return when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)
    except (ValueError, OverflowError):
        return None
