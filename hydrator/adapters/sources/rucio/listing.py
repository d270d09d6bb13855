"""Listings as lines: how the Rucio source reads an answer against the last one.

Each listing is kept as the hash of each distinct line and what it gave (:class:`Lines`: 16
bytes a line). A new answer is compared line by line (:func:`diff`), so only its new lines
are parsed (:func:`parse_lines`: one pydantic-core call per batch of lines into plain dicts,
record by record only when a batch holds a malformed one). A malformed line is kept as a
mark (:class:`Mark`), counted every fetch, never used. A line that is not JSON at all (or holds
more than one record) is no answer: the listing fails (:class:`NotJsonLine`).

Line identity is Python's 64-bit ``hash`` of the line's bytes (random per process): two
different lines of one listing colliding (odds about 3 in 10^10 per million new lines read
against listings of 5,000 lines) would make the source miss one change until that line
changes again.
"""

from __future__ import annotations

import enum
import json
import logging
from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from itertools import repeat
from typing import Any, Generic, NotRequired, TypeVar, cast

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError
from typing_extensions import TypedDict  # pydantic needs this one on Python < 3.12

from hydrator.errors import TransientSourceError
from hydrator.redact import redact

log = logging.getLogger("hydrator.adapters.sources.rucio")

SHOWN_LINE_BYTES = 60  # of a line that is not JSON, in the error (untrusted: cut, printable)


class NotJsonLine(TransientSourceError):
    """A line of the listing ``what`` that is not one JSON value (``line``, untrusted bytes;
    ``number``, its 1-based position in the answer, when known): the listing is broken or was
    altered on its way, so none of it is used. Transient, as a broken stream is (retried within
    the call where the listing is parsed inside it: rules, deep checks).

    The message is one line naming the listing, the position and the line's first
    :data:`SHOWN_LINE_BYTES` bytes, printable ASCII only and without ``$`` (each other
    character shown as ``?``): it ends in logs and in the source's status."""

    def __init__(self, what: str, line: bytes, number: int | None = None) -> None:
        where = f"line {number}" if number is not None else "a line"
        super().__init__(f"rucio: {what}: {where} is not JSON: {shown_line(line)}")
        self.what, self.line, self.number = what, line, number

    def at(self, body: bytes) -> NotJsonLine:
        """The same error with the line's position in ``body``, the whole answer (its first
        line equal to :attr:`line`: read only when the listing fails)."""
        for number, text in enumerate(body.splitlines(), 1):
            if text == self.line:
                return NotJsonLine(self.what, self.line, number)
        return self


def shown_line(line: bytes) -> str:
    """``line`` quoted for a message: its first :data:`SHOWN_LINE_BYTES` bytes as printable
    ASCII without ``$`` (others as ``?``), redacted, and its length when cut."""
    head = line[:SHOWN_LINE_BYTES].decode("ascii", "replace")
    text = redact("".join(c if " " <= c <= "~" and c != "$" else "?" for c in head))
    return f"'{text}'" if len(line) <= SHOWN_LINE_BYTES else f"'{text}'... ({len(line)} bytes)"


class DatasetRow(TypedDict):
    """One row of ``list_datasets_per_rse`` (the ``collection_replicas`` summary)."""

    scope: str
    name: str
    state: str
    length: NotRequired[int | None]
    available_length: NotRequired[int | None]
    bytes: NotRequired[int | None]
    available_bytes: NotRequired[int | None]


class RuleRow(TypedDict):
    """The fields of a replication rule the source uses."""

    scope: str
    name: str
    did_type: str
    rse_expression: str
    state: str
    locks_ok_cnt: int
    locks_replicating_cnt: int
    locks_stuck_cnt: int


class DeepLine(TypedDict):
    """One row of ``list_dataset_replicas(deep=True)``: exact file counts at one RSE."""

    rse: str
    length: NotRequired[int | None]
    available_length: NotRequired[int | None]
    bytes: NotRequired[int | None]
    available_bytes: NotRequired[int | None]


R = TypeVar("R", DatasetRow, RuleRow, DeepLine)


@dataclass(frozen=True)
class LineSchema(Generic[R]):
    """How the lines of a bulk listing are validated: pydantic's validators of one record and
    of a JSON array of them, building plain dicts (the TypedDict ``R``; unknown keys dropped)
    instead of a model object per line (less time: docs/performance.md). Validation is
    lax as a pydantic model's (``"3"`` is 3); a ``NotRequired[int | None]`` field may be
    absent or null (as in the summary table before abacus fills it)."""

    one: TypeAdapter[R]
    many: TypeAdapter[list[R]]


_BATCH = ConfigDict(cache_strings="keys")  # values are mostly distinct (docs/performance.md)
SUMMARY_LINES = LineSchema(TypeAdapter(DatasetRow), TypeAdapter(list[DatasetRow], config=_BATCH))
RULE_LINES = LineSchema(TypeAdapter(RuleRow), TypeAdapter(list[RuleRow], config=_BATCH))
DEEP_LINES = LineSchema(TypeAdapter(DeepLine), TypeAdapter(list[DeepLine]))


class FileRow(BaseModel):
    """One file of ``list_replicas(all_states=True)``: its size and its state per RSE."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    bytes: int | None = None
    states: dict[str, str] = {}


class Mark(enum.Enum):
    """What a line of a listing gave besides a value (kept, so the line is not read again)."""

    INVALID = "invalid"  # malformed or an invalid name: counted every fetch, never used
    SKIPPED = "skipped"  # out of the configured scopes, a container rule, a finished rule


class New(enum.Enum):
    LINE = "new"  # placeholder for a line not in the last answer, until it is parsed


V = TypeVar("V")


@dataclass
class Lines(Generic[V]):
    """A listing's last answer as the source keeps it: per distinct line (identical lines
    count once) its hash and what it gave, in answer order. The next answer is compared line
    by line (Python's 64-bit ``hash`` of the bytes, per process), so only new lines are parsed.
    ``unique`` is False when two different lines named one dataset (only the first counts):
    the next change to that answer is then read whole. ``digest`` is the SHA-256 of the
    answer whose lines these are (an identical answer is not split again)."""

    hashes: array[int] = field(default_factory=lambda: array("q"))
    values: list[V] = field(default_factory=list)
    digest: bytes = b""
    unique: bool = True

    @cached_property
    def invalid(self) -> int:
        """Lines marked invalid (counted once: ``values`` is complete when this is read)."""
        return self.values.count(Mark.INVALID)  # type: ignore[arg-type]

    @cached_property
    def listed(self) -> int:
        """Lines that gave a value, neither invalid nor skipped: counted once, as
        :attr:`invalid` (one more C-level scan), or set by the caller that knows it from the
        last answer's count and the lines added and gone."""
        return len(self.values) - self.invalid - self.values.count(Mark.SKIPPED)  # type: ignore[arg-type]


def diff(old: Lines[V] | None, hashes: array[int]) -> tuple[list[V | New], list[V]] | None:
    """Against ``old``, the value of each line of a new answer (``New.LINE`` where the line
    is new) and the values of ``old``'s lines that are gone; None when ``old`` cannot be
    compared line by line (none yet, or it named a dataset twice)."""
    if old is None or not old.unique:
        return None
    index = dict(zip(old.hashes, old.values, strict=True))
    values: list[V | New] = list(map(index.get, hashes, repeat(New.LINE)))
    gone = [index[h] for h in index.keys() - set(hashes)]
    return values, gone


def new_positions(values: list[Any]) -> list[int]:
    """Indices of the ``New.LINE`` placeholders (C-level scans: most lines are not new)."""
    out: list[int] = []
    start = 0
    while True:
        try:
            start = values.index(New.LINE, start)
        except ValueError:
            return out
        out.append(start)
        start += 1


def line_blocks(chunks: Iterable[bytes]) -> Iterator[list[bytes]]:
    """The non-empty lines of a streamed answer (``chunks``: its bytes as they arrive), a
    block of lines per chunk (split in C, not a generator step per line)."""
    rest = b""
    for block in chunks:
        data = rest + block
        lines = data.splitlines()
        rest = b"" if data.endswith((b"\n", b"\r")) or not lines else lines.pop()
        yield list(filter(None, lines))
    if rest:
        yield [rest]


def parse_lines(
    schema: LineSchema[R], lines: list[bytes], what: str = "a Rucio listing"
) -> list[R | Mark]:
    """Validate JSON lines at once (one pydantic call, which reads the JSON itself); if
    any record is malformed, record by record, marking the bad ones ``Mark.INVALID``
    (counted) and blank lines ``Mark.SKIPPED``. A line that is not one JSON value raises
    :class:`NotJsonLine` naming the listing ``what`` (a broken answer: transient, as when
    rucio-clients read it)."""
    if not lines:
        return []
    stripped = list(map(bytes.strip, lines))
    if all(stripped):  # no blank line (the usual answer): the records as pydantic gives them
        try:
            records = schema.many.validate_json(b"[" + b",".join(lines) + b"]")
            if len(records) == len(lines):  # else a line held two records: one by one below
                return cast(list[R | Mark], records)
        except ValidationError:
            pass  # record by record, below
    blank = [not line for line in stripped]
    text = [line for line, empty in zip(lines, blank, strict=True) if not empty]
    try:
        parsed: list[R | None] = cast(
            list[R | None], schema.many.validate_json(b"[" + b",".join(text) + b"]")
        )
    except ValidationError:
        parsed = []
    if len(parsed) != len(text):
        parsed = [_validated(schema, _json(line, what)) for line in text]
    found = iter(parsed)
    return [
        Mark.SKIPPED if empty else (Mark.INVALID if (p := next(found)) is None else p)
        for empty in blank
    ]


def _json(line: bytes, what: str) -> Any:
    """One line's JSON value; :class:`NotJsonLine` when it is not one."""
    try:
        return json.loads(line)
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        raise NotJsonLine(what, line) from exc


def parse_file(record: Any) -> FileRow | None:
    """One untrusted file record of ``list_replicas``; None (logged) when malformed."""
    try:
        return FileRow.model_validate(record)
    except ValidationError as exc:
        log.debug("rucio: skipping a malformed FileRow record: %s", exc)
        return None


def _validated(schema: LineSchema[R], record: Any) -> R | None:
    """One untrusted record as ``schema`` reads it; None (logged) when malformed."""
    try:
        return schema.one.validate_python(record)
    except ValidationError as exc:
        log.debug("rucio: skipping a malformed record: %s", exc)
        return None
