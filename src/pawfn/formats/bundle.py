"""Program bundles: a `.paw` zip or an extracted folder with meta.json, prompt_template.txt, adapter.gguf."""

from __future__ import annotations

import fcntl
import json
import lzma
import shutil
import stat
import tempfile
import time
import zipfile
import zlib
from collections.abc import Generator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import cast

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from ..core.errors import BundleError, describe_validation_error
from ..core.templates import NumberedTemplate, TemplateError

__all__ = [
    "INPUT_PLACEHOLDER",
    "MAX_ARCHIVE_BYTES",
    "MAX_ARCHIVE_MEMBERS",
    "MAX_EXPANDED_BYTES",
    "ProgramBundle",
    "ProgramMeta",
    "PromptTemplate",
    "extract_archive",
    "open_bundle",
    "read_bundle_folder",
    "read_meta",
]

INPUT_PLACEHOLDER = "{INPUT_PLACEHOLDER}"
MAX_ARCHIVE_BYTES = 256 * 1024 * 1024
"""Largest `.paw` archive accepted, in bytes (as the official SDK)."""
MAX_ARCHIVE_MEMBERS = 256
"""Most members in a `.paw` archive (as the official SDK)."""
MAX_EXPANDED_BYTES = 512 * 1024 * 1024
"""Largest total extracted size of a `.paw` archive, in bytes (as the official SDK)."""
MIN_ADAPTER_BYTES = 1024
MAX_META_BYTES = 1024 * 1024
"""Largest meta.json read, in bytes (the hub's are under 2 KB)."""
MAX_TEMPLATE_BYTES = 1024 * 1024
"""Largest prompt_template.txt read, in bytes (the hub's are a few KB; a template must fit the context window)."""
_COPY_CHUNK = 1024 * 1024


VISION_MANIFEST_VERSION = 2
"""The official runtime manifest version of the vision runtime (numbered templates, text and image arguments)."""


class ProgramMeta(BaseModel):
    """`meta.json` of a program; fields pawfn does not know are kept in `model_extra`."""

    model_config = ConfigDict(extra="allow", frozen=True)

    interpreter: str
    program_id: str | None = None
    spec: str | None = None
    compiler_snapshot: str | None = None
    runtime_id: str | None = None
    created_at: str | None = None
    runtime_manifest_version: int | None = None
    """2 for a program of the official vision runtime (numbered `{INPUT_N}` template, every prompt rendered whole)."""

    @property
    def numbered(self) -> bool:
        """Whether the program declares the official vision runtime (its manifest version 2, an embedded manifest of
        that version, or its input and vision fields), whose `prompt_template.txt` holds numbered slots; recognized as
        the official SDK does, malformed or downgraded manifests included."""
        if self.runtime_manifest_version == VISION_MANIFEST_VERSION:
            return True
        runtime = (self.model_extra or {}).get("runtime")
        if not isinstance(runtime, dict):
            return False
        declared = cast("dict[str, object]", runtime)  # cast: JSON object with unknown values
        local, prompt = declared.get("local_sdk"), declared.get("prompt_template")
        return (
            declared.get("manifest_version") == VISION_MANIFEST_VERSION
            or "input" in declared
            or (isinstance(local, dict) and "vision" in local)
            or (isinstance(prompt, dict) and cast("dict[str, object]", prompt).get("format") == "chat_messages")  # cast: JSON object
        )

    @field_validator("interpreter")
    @classmethod
    def _non_empty(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must be a non-empty string")
        return value


@dataclass(frozen=True)
class PromptTemplate:
    """A rendered prompt split at its single `{INPUT_PLACEHOLDER}`."""

    prefix: str
    suffix: str

    @classmethod
    def parse(cls, text: str, source: Path | str = "prompt_template.txt") -> PromptTemplate:
        """Split `text` at its placeholder; exactly one is required."""
        count = text.count(INPUT_PLACEHOLDER)
        if count != 1:
            raise BundleError(source, f"the prompt template must contain exactly one {INPUT_PLACEHOLDER}, found {count}")
        prefix, suffix = text.split(INPUT_PLACEHOLDER)
        return cls(prefix=prefix, suffix=suffix)


@dataclass(frozen=True)
class ProgramBundle:
    """A validated bundle; `adapter_path` is valid only inside `open_bundle`'s block."""

    source: Path
    meta: ProgramMeta
    template: PromptTemplate | NumberedTemplate
    """Split at its placeholder, or numbered (a program of the official vision runtime: `ProgramMeta.numbered`)."""
    adapter_path: Path

    @property
    def name(self) -> str:
        """The program id when meta.json has one, else the bundle's path."""
        return self.meta.program_id or str(self.source)


@contextmanager
def open_bundle(path: Path | str, staging: Path | None = None) -> Generator[ProgramBundle, None, None]:
    """Validate and open a bundle folder or `.paw` zip; a zip is extracted to a temporary folder in `staging` (the
    system temp dir when None), removed afterwards, and by a later open if this process dies first."""
    source = Path(path)
    if source.is_symlink():
        raise BundleError(source, "bundles must not be symbolic links; pass the real path")
    if source.is_dir():
        yield _read_folder(source, source)
        return
    if not source.exists():
        raise BundleError(source, "no such bundle: pass a .paw file or an extracted bundle folder")
    if staging is not None:
        _remove_abandoned(staging)
    folder = Path(tempfile.mkdtemp(prefix=_STAGED_PREFIX, dir=staging))
    try:
        with (folder / _IN_USE).open("a+b") as in_use:
            fcntl.flock(in_use.fileno(), fcntl.LOCK_EX)  # held while open: a killed process lets go of it
            extracted = folder / "bundle"
            extracted.mkdir()
            _extract_zip(source, extracted)
            yield _read_folder(extracted, source)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


_STAGED_PREFIX = "pawfn-bundle-"
_IN_USE = ".in-use"
_ABANDONED_AFTER_S = 60.0


def _remove_abandoned(staging: Path) -> None:
    """Remove the extraction folders in `staging` whose process died (their `.in-use` lock is free)."""
    for folder in staging.glob(_STAGED_PREFIX + "*"):
        try:
            if time.time() - folder.stat().st_mtime < _ABANDONED_AFTER_S:
                continue  # perhaps still being made: its `.in-use` may not be locked yet
            with (folder / _IN_USE).open("a+b") as in_use:
                fcntl.flock(in_use.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held by a live process (BlockingIOError), or not ours to touch
            continue
        shutil.rmtree(folder, ignore_errors=True)


def _regular_file(folder: Path, name: str, source: Path) -> Path:
    member = folder / name
    if member.is_symlink():
        raise BundleError(source, f"{name} is a symbolic link; bundles must hold regular files")
    if not member.is_file():
        raise BundleError(source, f"{name} is missing; a bundle needs meta.json, prompt_template.txt and adapter.gguf")
    if member.stat().st_size == 0:
        raise BundleError(source, f"{name} is empty")
    return member


def read_bundle_folder(folder: Path, source: Path) -> ProgramBundle:
    """Validate an extracted bundle in `folder`; errors name `source`."""
    return _read_folder(folder, source)


def extract_archive(archive: Path, destination: Path) -> None:
    """Safely extract a `.paw` zip into the existing, empty folder `destination`."""
    _extract_zip(archive, destination)


def _read_folder(folder: Path, source: Path) -> ProgramBundle:
    meta_path = _regular_file(folder, "meta.json", source)
    template_path = _regular_file(folder, "prompt_template.txt", source)
    adapter_path = _regular_file(folder, "adapter.gguf", source)

    for path, limit in ((meta_path, MAX_META_BYTES), (template_path, MAX_TEMPLATE_BYTES)):
        size = path.stat().st_size
        if size > limit:
            raise BundleError(source, f"{path.name} is {size} bytes, more than the {limit} a bundle may hold")
    meta = _parse_meta(meta_path.read_bytes(), source)

    try:
        template_text = template_path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BundleError(source, f"prompt_template.txt is not UTF-8: {exc}") from exc
    template: PromptTemplate | NumberedTemplate
    if meta.numbered:
        try:
            template = NumberedTemplate.parse(template_text)
        except TemplateError as exc:
            raise BundleError(source, str(exc)) from exc
    else:
        template = PromptTemplate.parse(template_text, source)

    with adapter_path.open("rb") as handle:
        magic = handle.read(4)
    if magic != b"GGUF":
        raise BundleError(source, "adapter.gguf is not a GGUF file (bad magic)")
    if adapter_path.stat().st_size < MIN_ADAPTER_BYTES:
        raise BundleError(source, f"adapter.gguf is smaller than {MIN_ADAPTER_BYTES} bytes; it is truncated")
    return ProgramBundle(source=source, meta=meta, template=template, adapter_path=adapter_path)


def _parse_meta(raw: bytes, source: Path) -> ProgramMeta:
    try:
        raw_meta: object = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # bad UTF-8 or JSON, a number too long to convert, deep nesting
        problem = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise BundleError(source, f"meta.json is not valid JSON: {problem}") from exc
    if not isinstance(raw_meta, dict):
        raise BundleError(source, "meta.json must hold a JSON object")
    try:
        return ProgramMeta.model_validate(raw_meta)
    except ValidationError as exc:
        raise BundleError(source, f"meta.json is invalid: {describe_validation_error(exc)}") from exc


def read_meta(path: Path | str) -> ProgramMeta:
    """A bundle folder's or `.paw` zip's `meta.json` alone, read in place (a zip is not extracted); the rest of
    the bundle is checked when it is opened (`open_bundle`)."""
    source = Path(path)
    if source.is_dir() or source.is_symlink() or not source.exists():
        with open_bundle(source) as bundle:  # a folder costs nothing to check whole; the others raise its error
            return bundle.meta
    with _open_archive(source) as archive:
        try:
            member = archive.getinfo("meta.json")
        except KeyError as exc:
            raise BundleError(source, "meta.json is missing; a bundle needs meta.json, prompt_template.txt and adapter.gguf") from exc
        if member.file_size > MAX_META_BYTES:
            raise BundleError(source, f"meta.json is {member.file_size} bytes, more than the {MAX_META_BYTES} a bundle may hold")
        try:
            with archive.open(member) as reader:
                raw = reader.read(MAX_META_BYTES + 1)
        except _MEMBER_ERRORS as exc:
            raise BundleError(source, f"cannot extract 'meta.json': {exc}") from exc  # as `_extract_zip` says it
    if len(raw) > MAX_META_BYTES:
        raise BundleError(source, f"meta.json is more than the {MAX_META_BYTES} bytes a bundle may hold")
    return _parse_meta(raw, source)


def _safe_member_path(name: str, source: Path) -> PurePosixPath:
    if not name or "\\" in name or name.startswith("/"):
        raise BundleError(source, f"unsafe path in archive: {name!r}")
    parts = PurePosixPath(name).parts
    if parts and ":" in parts[0]:
        raise BundleError(source, f"unsafe path in archive: {name!r}")
    trimmed = name[:-1] if name.endswith("/") else name
    for part in trimmed.split("/"):
        if part in ("", ".", ".."):
            raise BundleError(source, f"unsafe path in archive: {name!r}")
    return PurePosixPath(trimmed)


_MEMBER_ERRORS = (zipfile.BadZipFile, OSError, EOFError, zlib.error, lzma.LZMAError, NotImplementedError, RuntimeError)
"""What reading a member can raise: damaged data, a compression method zipfile lacks (NotImplementedError), an
encrypted member (RuntimeError): the archive is unusable either way."""


def _open_archive(source: Path) -> zipfile.ZipFile:
    """A `.paw` zip opened for reading, its size within bounds."""
    size = source.stat().st_size
    if size > MAX_ARCHIVE_BYTES:
        raise BundleError(source, f"archive is too large ({size} bytes; limit {MAX_ARCHIVE_BYTES})")
    try:
        return zipfile.ZipFile(source)
    except zipfile.BadZipFile as exc:
        raise BundleError(source, f"not a .paw archive or bundle folder: {exc}") from exc


def _extract_zip(source: Path, destination: Path) -> None:
    with _open_archive(source) as archive:
        members = archive.infolist()
        if len(members) > MAX_ARCHIVE_MEMBERS:
            raise BundleError(source, f"archive has too many members ({len(members)}; limit {MAX_ARCHIVE_MEMBERS})")
        declared = sum(member.file_size for member in members)
        if declared > MAX_EXPANDED_BYTES:
            raise BundleError(source, f"archive expands to {declared} bytes; limit {MAX_EXPANDED_BYTES}")
        seen: set[PurePosixPath] = set()
        for member in members:
            relative = _safe_member_path(member.filename, source)
            if relative in seen:
                raise BundleError(source, f"duplicate path in archive: {member.filename!r}")
            seen.add(relative)
            mode = member.external_attr >> 16
            # Many writers (Python's writestr included) record permission bits only: no file type means regular.
            if stat.S_IFMT(mode) and not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                raise BundleError(source, f"archive member {member.filename!r} is not a regular file or folder")
        written = 0
        for member in members:
            target = destination.joinpath(*_safe_member_path(member.filename, source).parts)
            if member.is_dir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                with archive.open(member) as reader, target.open("xb") as writer:
                    while chunk := reader.read(_COPY_CHUNK):
                        written += len(chunk)
                        if written > MAX_EXPANDED_BYTES:
                            raise BundleError(source, f"archive expands past {MAX_EXPANDED_BYTES} bytes")
                        writer.write(chunk)
            except _MEMBER_ERRORS as exc:
                raise BundleError(source, f"cannot extract {member.filename!r}: {exc}") from exc
