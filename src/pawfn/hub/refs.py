"""Program references: hash ids, `user/slug`, bare official slugs, pinned `user/slug@vN`, local paths."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ..core.errors import ConfigError

__all__ = [
    "MAX_HUB_REFERENCE_CHARS",
    "PROGRAM_ID",
    "ProgramReference",
    "checked_program_id",
    "checked_slug",
    "is_hub_reference",
    "is_program_id",
    "parse_hub_reference",
    "parse_reference",
    "shown_reference",
]

PROGRAM_ID = re.compile(r"^[a-f0-9]{16,64}$")
MAX_HUB_REFERENCE_CHARS = 200
"""The longest id or slug (`user/slug@vN`) pawfn sends to a hub; a longer reference names no program."""
_MAX_PATH_CHARS = 4096
"""Longer text is never tried as a path (Linux's PATH_MAX; the file system would refuse it with ENAMETOOLONG)."""
_PINNED = re.compile(r"@v\d+$")
_SLUG = re.compile(r"^(?:[A-Za-z0-9][A-Za-z0-9_.-]*/)?[a-z0-9][a-z0-9-]*[a-z0-9](?:@v\d+)?$")

ReferenceKind = Literal["id", "slug", "path"]


def is_program_id(text: str) -> bool:
    """Whether `text` is a program hash id (16-64 lowercase hex digits)."""
    return bool(PROGRAM_ID.match(text))


def is_hub_reference(text: str) -> bool:
    """Whether `text` names a program on the hub (an id or a slug) by its syntax alone, never a local path."""
    return len(text) <= MAX_HUB_REFERENCE_CHARS and (is_program_id(text) or bool(_SLUG.match(text)))


def shown_reference(text: str, limit: int = 80) -> str:
    """`text` quoted for a message, cut to `limit` characters (a reference from a client may be any length)."""
    return repr(text) if len(text) <= limit else f"{text[:limit]!r}... ({len(text)} characters)"


def checked_program_id(text: str) -> str:
    """`text` if it is a program id, else a `ConfigError` saying what an id looks like."""
    if not is_program_id(text):
        raise ConfigError(f"{text!r} is not a program id (16-64 lowercase hex digits); name a slug with the slug loaders")
    return text


def checked_slug(text: str) -> str:
    """`text` if it is a slug (`user/slug`, bare official slug, `user/slug@vN`), else a `ConfigError`."""
    if parse_reference(text).kind != "slug":
        raise ConfigError(f"{text!r} is not a slug (user/slug, slug or user/slug@vN); name ids with the id loaders")
    return text


@dataclass(frozen=True)
class ProgramReference:
    """A parsed reference; `text` is the literal string (the slug cache is keyed by it, as the official SDK)."""

    kind: ReferenceKind
    text: str

    @property
    def pinned(self) -> bool:
        """A `@vN` slug: immutable, served from the cache with no network call."""
        return self.kind == "slug" and bool(_PINNED.search(self.text))

    @property
    def path(self) -> Path:
        """The local bundle path of a `path` reference."""
        return Path(self.text).expanduser()


def parse_hub_reference(text: str) -> ProgramReference:
    """`text` as a hub program's id or slug, never a local path (what a server takes from its clients); anything
    else is a `ConfigError`."""
    if is_program_id(text):
        return ProgramReference("id", text)
    if is_hub_reference(text):
        return ProgramReference("slug", text)
    raise ConfigError(
        f"{shown_reference(text)} is not a program id or slug (user/slug, slug or user/slug@vN, at most {MAX_HUB_REFERENCE_CHARS} characters)"
    )


def _is_local(text: str) -> bool:
    """Whether `text` names something on this machine's file system (a name too long for it names nothing)."""
    if len(text) > _MAX_PATH_CHARS:
        return False
    try:
        return Path(text).expanduser().exists()
    except (OSError, RuntimeError):  # ENAMETOOLONG for one component; RuntimeError: `~user` with no such user
        return False


def parse_reference(text: str) -> ProgramReference:
    """Classify `text`: an existing local path, else a program id, else a slug; anything else is refused."""
    if not text or text != text.strip() or "\0" in text:
        raise ConfigError(f"invalid program reference {shown_reference(text)}: use a program id, user/slug, slug@vN or a path")
    if _is_local(text):
        return ProgramReference("path", text)
    if is_program_id(text):
        return ProgramReference("id", text)
    if is_hub_reference(text):
        return ProgramReference("slug", text)
    if text.endswith(".paw") or text.startswith(("/", "./", "../", "~", ".\\", "..\\")) or text.count("/") > 1:
        raise ConfigError(
            f"no such bundle: {text if len(text) <= 300 else shown_reference(text)}; pass a .paw file, a bundle folder, a program id or a slug"
        )
    raise ConfigError(
        f"invalid program reference {shown_reference(text)}: use a program id (hex), user/slug, a bare official slug, "
        "user/slug@vN, or the path of a .paw file or bundle folder"
    )
