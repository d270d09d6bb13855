"""Files the configuration names are refused with the error tree's FileRefused, and callers
tell a missing file from a refused one by a flag, never by the message's text."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hydrator.errors import FileRefused, HydratorError
from hydrator.files import open_regular, read_capped


def test_a_missing_file_is_refused_as_missing(tmp_path: Path) -> None:
    with pytest.raises(FileRefused) as caught:
        open_regular(tmp_path / "absent")
    assert isinstance(caught.value, HydratorError)
    assert caught.value.missing
    assert str(caught.value) == "no such file"


def test_a_fifo_or_an_oversized_file_is_refused_but_not_missing(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(FileRefused) as caught:
        open_regular(fifo)
    assert not caught.value.missing
    assert "FIFO" in str(caught.value)
    big = tmp_path / "big"
    big.write_bytes(b"x" * 11)
    with pytest.raises(FileRefused) as caught:
        read_capped(big, 10)
    assert not caught.value.missing
