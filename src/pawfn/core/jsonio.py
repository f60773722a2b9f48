"""Typed JSON reading: objects come back as `dict[str, object]`, never as untyped containers."""

from __future__ import annotations

from pathlib import Path

from pydantic import TypeAdapter, ValidationError

__all__ = ["parse_json_object", "read_json_object"]

_OBJECT = TypeAdapter(dict[str, object])


def parse_json_object(data: bytes | str) -> dict[str, object] | None:
    """`data` as a JSON object, or None when it is not valid JSON or not an object."""
    try:
        return _OBJECT.validate_json(data)
    except ValidationError:
        return None


def read_json_object(path: Path) -> dict[str, object] | None:
    """The JSON object in file `path`, or None when the file is missing, unreadable or not an object."""
    try:
        return parse_json_object(path.read_bytes())
    except OSError:
        return None
