"""Scripted stand-ins for ports, shared by several test modules."""

from __future__ import annotations

from hydrator.core.jobs import GroupEdit, ScheddFailure, ScheddQueue
from hydrator.core.ports import QueueAdapter
from hydrator.errors import PoolError


class ScriptedQueue(QueueAdapter):
    """A QueueAdapter answering from a script: reads per cycle, schedds that refuse edits, and
    an exception every edit raises instead (``broken``, a stand-in for an adapter's bug)."""

    def __init__(self) -> None:
        self.reads: list[list[ScheddQueue | ScheddFailure] | PoolError] = []
        self.refuse: set[str] = set()
        self.applied: list[GroupEdit] = []
        self.broken: Exception | None = None

    def read(self) -> list[ScheddQueue | ScheddFailure]:
        step = self.reads.pop(0)
        if isinstance(step, PoolError):
            raise step
        return step

    def apply(self, edit: GroupEdit) -> int:
        if self.broken is not None:
            raise self.broken
        if edit.schedd in self.refuse:
            raise PoolError("may not change attributes for jobs they do not own")
        self.applied.append(edit)
        return len(edit.calls)

    def close(self) -> None:
        pass
