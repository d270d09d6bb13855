"""Fixtures of the hook tests: the answer server (tests/support/hook.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.hook import Answer, answer_server


@pytest.fixture
def server() -> Iterator[tuple[str, Answer]]:
    with answer_server() as served:
        yield served
