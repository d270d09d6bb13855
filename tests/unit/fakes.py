"""Scripted stand-ins for ports in unit tests (shared by several test modules)."""

from __future__ import annotations

from hydrator.core.jobs import GroupEdit, ScheddFailure, ScheddQueue
from hydrator.errors import PublishError


class Scripted:
    """A QueueAdapter answering from a script: reads per cycle, schedds that refuse edits."""

    def __init__(self) -> None:
        self.reads: list[list[ScheddQueue | ScheddFailure] | PublishError] = []
        self.refuse: set[str] = set()
        self.applied: list[GroupEdit] = []

    def read(self) -> list[ScheddQueue | ScheddFailure]:
        step = self.reads.pop(0)
        if isinstance(step, PublishError):
            raise step
        return step

    def apply(self, edit: GroupEdit) -> int:
        if edit.schedd in self.refuse:
            raise PublishError("may not change attributes for jobs they do not own")
        self.applied.append(edit)
        return len(edit.calls)

    def close(self) -> None:
        pass
