"""File hashing shared by downloads and the cache."""

from __future__ import annotations

import hashlib
from pathlib import Path

__all__ = ["file_sha256"]

_CHUNK = 1024 * 1024


def file_sha256(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()
