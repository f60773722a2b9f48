"""pawfn's record that a cached base file was hashed (`record_verified`), so it is not hashed again while its size
and mtime are unchanged, and the check a cached file passes before use (`verified_file`)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from ..core.files import write_atomically
from ..core.hashing import file_sha256
from .types import BaseModelSource

__all__ = ["marker_path", "record_verified", "verified_file", "verified_sha256", "write_json_atomically"]


class _VerifiedMarker(BaseModel):
    """pawfn's record that a base file was hashed: skip re-hashing while size and mtime are unchanged."""

    model_config = ConfigDict(extra="forbid")

    size: int
    mtime_ns: int
    sha256: str


def marker_path(path: Path) -> Path:
    """Where pawfn records that `path` was verified (a dot-file beside it)."""
    return path.with_name(f".{path.name}.pawfn-verified")


def verified_sha256(path: Path) -> str | None:
    """The sha256 pawfn verified `path` to have, if its marker still describes the file (size and mtime)."""
    try:
        stat = path.stat()
        recorded = _VerifiedMarker.model_validate_json(marker_path(path).read_bytes())
    except (OSError, ValidationError):
        return None
    return recorded.sha256 if (recorded.size, recorded.mtime_ns) == (stat.st_size, stat.st_mtime_ns) else None


def record_verified(path: Path, sha256: str, stat: os.stat_result | None = None) -> None:
    """Record that `path` has `sha256` while its size and mtime stay `stat`'s (taken before it was hashed, so a file
    changed meanwhile no longer matches; None: as it is now)."""
    stat = path.stat() if stat is None else stat
    write_json_atomically(marker_path(path), _VerifiedMarker(size=stat.st_size, mtime_ns=stat.st_mtime_ns, sha256=sha256).model_dump())


def verified_file(path: Path, source: BaseModelSource) -> Path | None:
    """`path` if it is a regular GGUF file with `source`'s size and (hashed once, then remembered) sha256."""
    if path.is_symlink() or not path.is_file():
        return None
    stat = path.stat()
    if source.size_bytes is not None and stat.st_size != source.size_bytes:
        return None
    with path.open("rb") as handle:
        if handle.read(4) != b"GGUF":
            return None
    if source.sha256 is None:
        return path
    if verified_sha256(path) == source.sha256:
        return path
    if file_sha256(path) != source.sha256:
        return None
    record_verified(path, source.sha256, stat)
    return path


def write_json_atomically(path: Path, data: object) -> None:
    """`data` as JSON at `path` (sorted keys, indent 2), written beside it, synced and moved in."""

    def write(temporary: Path) -> None:
        with temporary.open("w", encoding="utf-8") as handle:
            json.dump(data, handle, indent=2, sort_keys=True)
            handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())

    write_atomically(path, write)
