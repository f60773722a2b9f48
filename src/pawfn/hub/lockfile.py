"""`pawfn.lock`: the programs an application runs, pinned as uv pins packages (TOML, committed with the application).

Each name pins one program id, the sha256 of the files that decide its tokens (adapter.gguf and prompt_template.txt:
meta.json is rewritten when a program is installed, and the cache keeps no `.paw`), its interpreter, runtime, base
weights and projector by sha256, the compiler snapshot and the reference it came from. Loading by name
(`locked_program`) asks the hub for nothing but a missing file by its id, and refuses any file whose hash differs.
"""

from __future__ import annotations

import keyword
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

import tomli_w
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ..core.config import PawConfig
from ..core.errors import HubError, IntegrityError, NotFoundError, OfflineError, PawError, describe_validation_error
from ..core.files import write_atomically
from ..core.hashing import file_sha256
from .client import PawClient
from .prepare import PreparedProgram, prepare_program
from .refs import checked_program_id, is_hub_reference, parse_hub_reference
from .types import BaseModelSource, RuntimeManifest

__all__ = [
    "LOCK_FILE_NAME",
    "LockError",
    "LockFile",
    "LockedProgram",
    "Returns",
    "ReturnsPattern",
    "ReturnsSchema",
    "check_locked",
    "find_lock",
    "lock_entry",
    "locked_program",
    "read_lock",
    "verify_locked",
    "write_lock",
]

LOCK_FILE_NAME = "pawfn.lock"
LOCK_VERSION: Final = 1
MAX_LOCK_BYTES = 1024 * 1024
"""Largest lock file read, in bytes (a program's entry is ~600 bytes)."""
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_NAME_RULE = "a letter, then letters, digits and _ (a Python identifier, not a keyword, up to 64 characters)"
_HEADER = "# pawfn.lock: the programs this application runs, pinned by `pawfn lock`. Commit it; change it with `pawfn lock`.\n"


def _is_name(text: str) -> bool:
    """Whether `text` can name a locked program: a Python identifier (an attribute of the generated handles)."""
    return bool(_NAME.fullmatch(text)) and not keyword.iskeyword(text)


class LockError(PawError, ValueError):
    """A lock file is missing, malformed, or does not name the program asked for."""


def _sha256(value: str | None) -> str | None:
    if value is not None and not _SHA256.fullmatch(value):
        raise ValueError("must be 64 lowercase hex digits")
    return value


class ReturnsPattern(BaseModel):
    """A declared output that matches a regular expression as a whole: `returns = { pattern = "[A-Z]{3}-[0-9]{4}" }`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    pattern: str = Field(max_length=1000)

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"not a regular expression: {exc}") from exc
        return value


class ReturnsSchema(BaseModel):
    """A declared JSON output: `returns = { json_schema = { type = "object", properties = { ... } } }`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    json_schema: dict[str, object]


Scalar = Literal["str", "int", "float", "bool"]
Returns = list[str] | Scalar | ReturnsPattern | ReturnsSchema
"""What a locked program's calls return, for `pawfn lock codegen`: choices (a list of texts), a scalar type's name,
a pattern, or a JSON schema."""


class LockedProgram(BaseModel):
    """One name in `pawfn.lock`: the program it pins and the hashes its files must have."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    reference: str
    """What `pawfn lock add` was given (an id, a slug, or a pinned `user/slug@vN`): what `pawfn lock update` follows."""
    program_id: str
    interpreter: str
    adapter_sha256: str
    template_sha256: str
    runtime_id: str | None = None
    base_file: str | None = None
    base_sha256: str | None = None
    projector_file: str | None = None
    projector_sha256: str | None = None
    compiler_snapshot: str | None = None
    cases: str | None = None
    """A cases file for this program (relative to the lock's folder): `pawfn lock update` evaluates both versions on it."""
    returns: Returns | None = None
    """Its declared output type, for `pawfn lock codegen` (`TypedFn` handles); None: text (`PawFn`)."""

    @field_validator("returns")
    @classmethod
    def _choices(cls, value: Returns | None) -> Returns | None:
        if isinstance(value, list) and (not value or len(set(value)) != len(value) or len(value) > 1000):
            raise ValueError("choices must be 1 to 1000 distinct texts")
        return value

    @field_validator("reference")
    @classmethod
    def _hub_reference(cls, value: str) -> str:
        if not is_hub_reference(value):
            raise ValueError("must be a program id or a hub slug (a lock never names a local path)")
        return value

    @field_validator("program_id")
    @classmethod
    def _program_id(cls, value: str) -> str:
        return checked_program_id(value)

    @field_validator("adapter_sha256", "template_sha256", "base_sha256", "projector_sha256")
    @classmethod
    def _hex(cls, value: str | None) -> str | None:
        return _sha256(value)

    @property
    def pinned(self) -> bool:
        """Whether the reference names one version for good (an id or `user/slug@vN`): nothing for `update` to follow."""
        parsed = parse_hub_reference(self.reference)
        return parsed.kind == "id" or parsed.pinned


class CodegenTarget(BaseModel):
    """Where `pawfn lock codegen` writes the typed handles (relative to the lock's folder) and their backend; kept in
    the lock so that `lock add`, `update` and `check` find the module to rewrite or compare."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str
    backend: Literal["torch", "llamacpp", "remote"] = "torch"

    @field_validator("path")
    @classmethod
    def _python_file_inside(cls, value: str) -> str:
        parts = Path(value).parts
        if not value.endswith(".py") or Path(value).is_absolute() or ".." in parts:
            raise ValueError("must be a .py file inside the lock's folder, as a relative path")
        return value


class LockFile(BaseModel):
    """The whole `pawfn.lock`."""

    model_config = ConfigDict(extra="forbid")

    version: Literal[1] = LOCK_VERSION
    codegen: CodegenTarget | None = None
    programs: dict[str, LockedProgram] = Field(default_factory=dict[str, LockedProgram])

    @field_validator("programs")
    @classmethod
    def _names(cls, value: dict[str, LockedProgram]) -> dict[str, LockedProgram]:
        for name in value:
            if not _is_name(name):
                raise ValueError(
                    f"{name!r} is not a program name: a letter, then letters, digits and _ (a Python identifier, not a keyword, up to 64 characters)"
                )
        return value

    def entry(self, name: str, path: Path) -> LockedProgram:
        """The program locked as `name`; a `LockError` naming the names there are."""
        found = self.programs.get(name)
        if found is None:
            known = ", ".join(sorted(self.programs)) or "none"
            raise LockError(f"{path} locks no program named {name!r} (it locks: {known}); add it with `pawfn lock add {name} REF`")
        return found


def check_name(name: str) -> str:
    """`name` if it can name a locked program, else a `LockError` saying what can."""
    if not _is_name(name):
        raise LockError(
            f"{name!r} cannot name a locked program: a letter, then letters, digits and _ (a Python identifier, not a keyword, up to 64 characters)"
        )
    return name


def find_lock(start: Path | None = None) -> Path | None:
    """The nearest `pawfn.lock` in `start` (the current directory) or a folder above it, as uv finds `uv.lock`."""
    folder = (start or Path.cwd()).resolve()
    for candidate in (folder, *folder.parents):
        path = candidate / LOCK_FILE_NAME
        if path.is_file():
            return path
    return None


def lock_path(explicit: str | os.PathLike[str] | None) -> Path:
    """The lock file to read: `explicit`, else `PAWFN_LOCK`, else the nearest `pawfn.lock` upward; a `LockError` if none."""
    named = explicit if explicit is not None else os.environ.get("PAWFN_LOCK") or None
    if named is not None:
        return Path(named)
    found = find_lock()
    if found is None:
        raise LockError(f"no {LOCK_FILE_NAME} in {Path.cwd()} or a folder above it: create one with `pawfn lock add NAME REF`")
    return found


def read_lock(path: Path) -> LockFile:
    """`path` parsed and checked; a `LockError` naming the file and what is wrong in it."""
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_LOCK_BYTES + 1)
    except FileNotFoundError:
        raise LockError(f"{path}: no such lock file; create it with `pawfn lock add NAME REF`") from None
    if len(data) > MAX_LOCK_BYTES:
        raise LockError(f"{path}: over {MAX_LOCK_BYTES} bytes, which no lock file is; is it the right file?")
    try:
        parsed = tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise LockError(f"{path}: not valid TOML ({exc}); restore it from version control or recreate it with `pawfn lock add`") from exc
    try:
        return LockFile.model_validate(parsed)
    except ValidationError as exc:
        raise LockError(f"{path}: {describe_validation_error(exc)}; restore it from version control or recreate it with `pawfn lock add`") from exc


def write_lock(path: Path, lock: LockFile) -> None:
    """Write `lock` to `path` atomically, names sorted, fields in a fixed order (a stable diff in review)."""
    data = lock.model_dump(mode="json", exclude_none=True)
    programs: Mapping[str, object] = data["programs"]
    data["programs"] = {name: programs[name] for name in sorted(programs)}
    text = _HEADER + tomli_w.dumps(data)

    def write(temporary: Path) -> None:
        temporary.write_text(text, encoding="utf-8")
        temporary.chmod(0o644)  # a file to commit and share, not the private temporary file's 0600

    write_atomically(path, write)


def lock_entry(reference: str, prepared: PreparedProgram, *, cases: str | None = None, returns: Returns | None = None) -> LockedProgram:
    """The entry pinning `prepared` (a hub program prepared from `reference`, with its runtime); `cases` and
    `returns` are the user's, carried over."""
    if prepared.program_id is None:
        raise LockError(f"{reference}: the program has no id, so it cannot be locked; lock a hub program (an id or a slug)")
    base = _runtime_base(prepared.runtime)
    projector = None if prepared.runtime is None or prepared.runtime.local_sdk.vision is None else prepared.runtime.local_sdk.vision.projector
    return LockedProgram(
        reference=reference,
        program_id=prepared.program_id,
        interpreter=prepared.meta.interpreter,
        adapter_sha256=file_sha256(prepared.bundle / "adapter.gguf"),
        template_sha256=file_sha256(prepared.bundle / "prompt_template.txt"),
        runtime_id=None if prepared.runtime is None else prepared.runtime.runtime_id,
        base_file=None if base is None else base.file,
        base_sha256=None if base is None else base.sha256,
        projector_file=None if projector is None else projector.file,
        projector_sha256=None if projector is None else projector.sha256,
        compiler_snapshot=prepared.meta.compiler_snapshot,
        cases=cases,
        returns=returns,
    )


def _runtime_base(runtime: RuntimeManifest | None) -> BaseModelSource | None:
    return None if runtime is None else runtime.local_sdk.base_model


@dataclass(frozen=True)
class Mismatch:
    """One file of a locked program that is not what the lock pins."""

    what: str
    expected: str | None
    found: str | None

    def __str__(self) -> str:
        return f"{self.what} is {self.found or 'not pinned'}, the lock pins {self.expected or 'none'}"


def verify_locked(entry: LockedProgram, prepared: PreparedProgram) -> list[Mismatch]:
    """What in `prepared` differs from `entry`: the program's files by sha256, its interpreter, its runtime's base and
    projector (the cache verified those files against the runtime's sha256 when it stored them)."""
    found = lock_entry(entry.reference, prepared)
    fields = ("program_id", "interpreter", "adapter_sha256", "template_sha256", "runtime_id", "base_sha256", "projector_sha256")
    what = {"adapter_sha256": "adapter.gguf's sha256", "template_sha256": "prompt_template.txt's sha256", "base_sha256": "the base's sha256"}
    what["projector_sha256"] = "the projector's sha256"
    mismatches: list[Mismatch] = []
    for field in fields:
        expected, got = getattr(entry, field), getattr(found, field)
        if expected != got:
            mismatches.append(Mismatch(what.get(field, field.replace("_", " ")), expected, got))
    return mismatches


def locked_program(name: str, *, lock: str | os.PathLike[str] | None = None, config: PawConfig | None = None) -> PreparedProgram:
    """The program locked as `name`, ready to load (`PawFn[...].load_sync(locked_program("triage"))`): fetched by its
    id if the cache lacks it (never a slug resolved), its files checked against the lock's hashes.

    `lock`: the lock file (default: `PAWFN_LOCK`, else the nearest `pawfn.lock` from the current directory up).
    Raises `LockError` (no lock, no such name), `IntegrityError` (a file differs from the lock), `OfflineError`."""
    path = lock_path(lock)
    entry = read_lock(path).entry(check_name(name), path)
    try:
        prepared = prepare_program(entry.program_id, config, local_paths=False)
    except OfflineError as exc:
        raise OfflineError(f"{name} ({path}): {exc}; `pawfn cache prepare --locked` fetches every locked program") from exc
    mismatches = verify_locked(entry, prepared)
    if mismatches:
        raise IntegrityError(
            f"{name} ({path}, program {entry.program_id}): {'; '.join(map(str, mismatches))}. The cached files are not the "
            f"locked ones: run `pawfn lock check` to see why; delete {prepared.bundle} and run `pawfn cache prepare --locked` "
            "to fetch them again, or `pawfn lock update` to lock what the hub now serves"
        )
    return prepared


def check_locked(name: str, entry: LockedProgram, config: PawConfig, client: PawClient | None) -> list[str]:
    """Every drift of locked program `name`, one line each: between the lock and the cache (offline, no request),
    and with `client` between the lock and the hub (the reference moved to another id, the program gone, its
    runtime naming other base weights). An empty list: all as locked."""
    problems: list[str] = []
    try:
        prepared = prepare_program(entry.program_id, config.model_copy(update={"offline": True}), local_paths=False)
    except (OfflineError, PawError) as exc:
        problems.append(f"{name}: not ready in the cache ({exc}); `pawfn cache prepare --locked` fetches it")
    else:
        problems += [f"{name}: in the cache, {mismatch}" for mismatch in verify_locked(entry, prepared)]
    if client is None:
        return problems
    try:
        if not entry.pinned:
            now = client.resolve(entry.reference)
            if now != entry.program_id:
                problems.append(
                    f"{name}: {entry.reference} now resolves to {now} on the hub, the lock pins {entry.program_id}; "
                    f"evaluate it, then `pawfn lock update {name}` to move"
                )
        client.program_info(entry.program_id)
        if entry.runtime_id is not None:
            base = _runtime_base(client.runtime_manifest(entry.runtime_id))
            if base is not None and base.sha256 != entry.base_sha256:
                problems.append(
                    f"{name}: runtime {entry.runtime_id} now names base {base.file} ({base.sha256}) on the hub, the lock pins {entry.base_sha256}"
                )
    except NotFoundError as exc:
        problems.append(f"{name}: the hub no longer has it ({exc}); a fresh machine cannot fetch it: lock another program")
    except HubError as exc:
        problems.append(f"{name}: cannot ask the hub ({exc}); run again, or with --offline to check the cache alone")
    return problems
