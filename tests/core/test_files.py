"""Atomic writes: the old file or the whole new one, and no temporary file left on any failure."""

from __future__ import annotations

from pathlib import Path

import pytest

from pawfn.core.files import write_atomically


def test_a_write_replaces_the_file_whole(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "data.bin"
    write_atomically(target, lambda temporary: temporary.write_bytes(b"first"))
    write_atomically(target, lambda temporary: temporary.write_bytes(b"second"))
    assert target.read_bytes() == b"second" and [path.name for path in target.parent.iterdir()] == ["data.bin"]


@pytest.mark.parametrize("error", [OSError("disk full"), KeyboardInterrupt()])
def test_a_failed_write_keeps_the_old_file_and_leaves_nothing(tmp_path: Path, error: BaseException) -> None:
    target = tmp_path / "data.bin"
    target.write_bytes(b"old")

    def fail(temporary: Path) -> None:
        temporary.write_bytes(b"half")
        raise error

    with pytest.raises(type(error)):
        write_atomically(target, fail)
    assert target.read_bytes() == b"old" and [path.name for path in tmp_path.iterdir()] == ["data.bin"]
