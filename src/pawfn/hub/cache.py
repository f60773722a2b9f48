"""The on-disk cache, laid out exactly as the official SDK lays it out, so both SDKs share it.

    <root>/programs/<id>/{meta.json, prompt_template.txt, adapter.gguf, ...}
    <root>/base_models/<file>.gguf
    <root>/base_models/sha256/<digest>.gguf       (a version-2 runtime's base and projector, by content)
    <root>/runtimes/<runtime_id>.json and <runtime_id>.v<version>.json
    <root>/slug_cache.json
    <root>/.locks/...

pawfn's own files are dot-files the official SDK ignores (`.pawfn-*`). Installs are atomic: a staging folder
renamed into place under a cross-process lock.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from ..formats.bundle import ProgramBundle, ProgramMeta, extract_archive, read_bundle_folder
from ..core.config import DEFAULT_LOCK_TIMEOUT_S
from ..core.errors import BundleError
from ..formats.ggufio import GGUFFile, GGUFFormatError
from ..core.hashing import file_sha256
from ..core.jsonio import read_json_object
from .refs import is_program_id
from .locks import file_lock
from .types import BaseModelSource, RuntimeManifest
from .verified import marker_path, record_verified, verified_file, verified_sha256, write_json_atomically

__all__ = ["CachedProgram", "PawCache"]

_BUNDLE_FILES = ("meta.json", "prompt_template.txt", "adapter.gguf")
_LOG = logging.getLogger("pawfn")


@dataclass(frozen=True)
class CachedProgram:
    """A program installed in the cache."""

    program_id: str
    path: Path
    slugs: tuple[str, ...]
    interpreter: str
    spec: str | None
    runtime_id: str | None


class PawCache:
    """The cache at `root` (`PawConfig.cache_dir`)."""

    def __init__(self, root: Path, lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S) -> None:
        self.root = root
        self.lock_timeout_s = lock_timeout_s
        """Longest wait for a lock another process holds, in seconds (`PawConfig.lock_timeout_s`)."""

    @property
    def programs_dir(self) -> Path:
        """`<root>/programs`."""
        return self.root / "programs"

    @property
    def base_models_dir(self) -> Path:
        """`<root>/base_models`."""
        return self.root / "base_models"

    @property
    def runtimes_dir(self) -> Path:
        """`<root>/runtimes`."""
        return self.root / "runtimes"

    @property
    def staging_root(self) -> Path:
        """`<root>/.staging`, where archives are extracted and downloads staged."""
        return self.root / ".staging"

    def staging_dir(self) -> Path | None:
        """`staging_root`, made if missing; None when it cannot be made."""
        folder = self.staging_root
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError:
            return None  # a read-only cache: the system temp dir serves
        return folder

    @property
    def slug_cache_path(self) -> Path:
        """`<root>/slug_cache.json`."""
        return self.root / "slug_cache.json"

    @contextlib.contextmanager
    def lock(self, *parts: str) -> Generator[None, None, None]:
        """Exclusive lock on `<root>/.locks/<parts>.lock`, across threads and processes; a wait says (in the
        ``pawfn`` log) what it waits for and gives up after `lock_timeout_s` with `CacheLockError`."""
        with file_lock(self.root.joinpath(".locks", *parts[:-1], parts[-1] + ".lock"), "/".join(parts), self.lock_timeout_s):
            yield

    # -- programs ---------------------------------------------------------------------------------------

    def program_dir(self, program_id: str) -> Path:
        """Where program `program_id` is (or would be) installed."""
        if not is_program_id(program_id):
            raise ValueError(f"invalid program id {program_id!r}")
        return self.programs_dir / program_id

    def read_program(self, program_id: str) -> ProgramBundle | None:
        """The installed program if it is complete and valid (its meta.json names this id, its adapter's GGUF
        header and tensor table are whole), else None."""
        bundle, _ = self._checked_program(program_id)
        return bundle

    def program_problem(self, program_id: str) -> str | None:
        """Why the installed program `program_id` is unusable; None when it is valid or not installed at all."""
        return self._checked_program(program_id)[1]

    def _checked_program(self, program_id: str) -> tuple[ProgramBundle | None, str | None]:
        folder = self.program_dir(program_id)
        if folder.is_symlink():
            return None, "its folder is a symbolic link"
        if not folder.is_dir():
            return None, None
        try:
            bundle = read_bundle_folder(folder, folder)
            GGUFFile(bundle.adapter_path)  # a damaged adapter is found here, not at every later load
        except BundleError as exc:
            return None, exc.problem
        except GGUFFormatError as exc:
            return None, f"adapter.gguf: {exc}"
        if bundle.meta.program_id != program_id:
            return None, f"its meta.json names program {bundle.meta.program_id!r}"
        return bundle, None

    def install_program(self, program_id: str, archive: Path, runtime_for: Callable[[ProgramMeta], RuntimeManifest | None]) -> ProgramBundle:
        """Extract `archive`, check it, embed `runtime_for(meta)` in meta.json and rename it into place (atomically).

        Call it holding `lock("programs", program_id)`, the lock the official SDK holds while it installs.
        """
        folder = self.program_dir(program_id)
        staging_root = self.programs_dir / ".staging"
        staging_root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f"{program_id}.", dir=staging_root))
        try:
            extracted = staging / "extracted"
            extracted.mkdir()
            extract_archive(archive, extracted)
            bundle = read_bundle_folder(extracted, archive)
            if bundle.meta.program_id != program_id:
                raise BundleError(archive, f"meta.json names program {bundle.meta.program_id!r}, expected {program_id!r}")
            _hydrate_meta(extracted / "meta.json", runtime_for(bundle.meta))
            backup: Path | None = None
            if folder.exists() or folder.is_symlink():
                backup = folder.with_name(f".{program_id}.replaced.{os.getpid()}.{time.time_ns()}")
                os.replace(folder, backup)
            try:
                os.replace(extracted, folder)
            except OSError:
                if backup is not None:
                    os.replace(backup, folder)
                raise
            if backup is not None:
                shutil.rmtree(backup, ignore_errors=True) if backup.is_dir() else backup.unlink()
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        installed = self.read_program(program_id)
        if installed is None:
            raise BundleError(folder, "the installed program does not validate; delete it and download again")
        return installed

    def list_programs(self) -> list[CachedProgram]:
        """Valid installed programs, with the slugs that point at them."""
        slugs = self.read_slugs()
        programs: list[CachedProgram] = []
        if not self.programs_dir.is_dir():
            return programs
        for folder in sorted(self.programs_dir.iterdir()):
            if not is_program_id(folder.name):
                continue
            bundle = self.read_program(folder.name)
            if bundle is None:
                continue
            names = tuple(sorted(ref for ref, target in slugs.items() if target == folder.name))
            programs.append(
                CachedProgram(
                    program_id=folder.name,
                    path=folder,
                    slugs=names,
                    interpreter=bundle.meta.interpreter,
                    spec=bundle.meta.spec,
                    runtime_id=bundle.meta.runtime_id,
                )
            )
        return programs

    def derived_dir(self, bundle: Path) -> Path | None:
        """Where a backend may keep files derived from `bundle` (e.g. its evaluated prefix): an installed
        program's own folder; for any other bundle `<root>/.pawfn-derived/<hash of its files>`, so a user's own
        folders are never written to. None when the cache cannot be written."""
        try:
            if bundle.resolve().parent == self.programs_dir.resolve() and bundle.is_dir() and is_program_id(bundle.name):
                return bundle
            members = [bundle] if bundle.is_file() else [bundle / name for name in _BUNDLE_FILES]
            digest = hashlib.sha256()
            for member in members:
                digest.update(member.name.encode() + b"\0" + file_sha256(member).encode())
            folder = self.root / ".pawfn-derived" / digest.hexdigest()[:32]
            folder.mkdir(parents=True, exist_ok=True)
        except OSError:
            return None  # an unreadable bundle fails when it opens; a read-only cache only costs speed
        return folder

    def base_derived_dir(self) -> Path:
        """Where a backend may keep files derived from base weights (e.g. converted weights, named by a hash of
        the base's identity): `<root>/.pawfn-derived/bases`, created by the first backend that writes there."""
        return self.root / ".pawfn-derived" / "bases"

    def remove_program(self, program_id: str) -> bool:
        """Delete an installed program; True if there was one."""
        folder = self.program_dir(program_id)
        with self.lock("programs", program_id):
            if not folder.exists():
                return False
            shutil.rmtree(folder)
            return True

    # -- slugs ------------------------------------------------------------------------------------------

    def read_slugs(self) -> dict[str, str]:
        """`slug_cache.json` (literal reference -> program id); unreadable entries are dropped, like the official SDK."""
        loaded = read_json_object(self.slug_cache_path) or {}
        return {key: value for key, value in loaded.items() if key and key == key.strip() and isinstance(value, str) and is_program_id(value)}

    def cached_slug(self, reference: str) -> str | None:
        """The program id cached for `reference`, only while that program is installed and valid."""
        program_id = self.read_slugs().get(reference)
        return program_id if program_id is not None and self.read_program(program_id) is not None else None

    def remember_slug(self, reference: str, program_id: str) -> None:
        """Record `reference` -> `program_id` in `slug_cache.json` (atomic rewrite under the slug lock)."""
        with self.lock("slug_cache"):
            entries = read_json_object(self.slug_cache_path) or {}  # every entry: the official SDK's data too
            entries[reference] = program_id
            write_json_atomically(self.slug_cache_path, entries)

    # -- runtimes ---------------------------------------------------------------------------------------

    def read_runtime(self, runtime_id: str, version: int | None = None) -> RuntimeManifest | None:
        """A cached runtime manifest (`<id>.v<version>.json`, then `<id>.json`), if valid."""
        names = [f"{runtime_id}.v{version or 1}.json", f"{runtime_id}.json"]
        for name in names:
            path = self.runtimes_dir / name
            if path.is_file() and not path.is_symlink():
                try:
                    manifest = RuntimeManifest.model_validate_json(path.read_bytes())
                except (OSError, ValidationError):
                    continue
                if manifest.runtime_id == runtime_id:
                    return manifest
        return None

    def save_runtime(self, manifest: RuntimeManifest) -> None:
        """Write `<id>.json` and `<id>.v<version>.json`, as the official SDK does."""
        data = manifest.model_dump(mode="json", exclude_none=False)
        with self.lock("runtimes", manifest.runtime_id):
            for name in (f"{manifest.runtime_id}.v{manifest.manifest_version}.json", f"{manifest.runtime_id}.json"):
                write_json_atomically(self.runtimes_dir / name, data)

    # -- base models ------------------------------------------------------------------------------------

    def base_model_path(self, source: BaseModelSource) -> Path:
        """Where `source` is (or will be) cached: `<root>/base_models/<file>`, unless that name holds a file verified
        with another sha256 (another runtime's base, which a download must never replace); then a file of its own
        beside it, `<stem>.sha256-<16 hex digits><suffix>`."""
        plain = self.base_models_dir / source.file
        if source.sha256 is None:
            return plain
        recorded = verified_sha256(plain)
        if recorded is None or recorded == source.sha256:
            return plain
        return plain.with_name(f"{plain.stem}.sha256-{source.sha256[:16]}{plain.suffix}")

    def asset_path(self, source: BaseModelSource) -> Path:
        """Where a version-2 runtime's file (base or projector) is cached: `<root>/base_models/sha256/<digest>.gguf`,
        whatever its source file name, as the official SDK keeps it."""
        if source.sha256 is None:
            raise ValueError(f"{source.file} has no sha256: a content-addressed file needs one")
        return self.base_models_dir / "sha256" / f"{source.sha256}.gguf"

    def verified_asset(self, source: BaseModelSource) -> Path | None:
        """A version-2 runtime's file at its content address, verified; else one cached under its file name (by
        either SDK's text runtime) adopted there (a hard link, or a copy), as the official SDK adopts it. Callers hold
        `lock("vision_assets", sha256)`, the official SDK's lock for it (`cached_asset` takes it)."""
        path = self.asset_path(source)
        found = verified_file(path, source)
        if found is not None:
            return found
        legacy = verified_file(self.base_models_dir / source.file, source)
        if legacy is None:
            return None
        return self._adopt(legacy, path, source)

    def adopt_base_file(self, original: Path, source: BaseModelSource, *, content_addressed: bool) -> Path | None:
        """A local file recorded as `source` in the cache (under its sha256 for a version-2 runtime, else its name): a
        hard link, or a copy, verified; None if the file is not `source`'s content. Callers hold the file's lock."""
        path = self.asset_path(source) if content_addressed else self.base_model_path(source)
        return verified_file(path, source) or self._adopt(original, path, source)

    def _adopt(self, original: Path, path: Path, source: BaseModelSource) -> Path | None:
        """`original` at `path`, staged beside it and moved in once verified (no second hash of a hard link to a
        file already verified); None if it is not `source`'s content."""
        path.parent.mkdir(parents=True, exist_ok=True)
        staged = path.with_name(f".adopt-{os.getpid()}-{threading.get_ident()}.tmp")
        staged.unlink(missing_ok=True)
        try:
            try:
                os.link(original, staged)
                linked = verified_sha256(original) == source.sha256  # one file: still as verified, no second hash
            except OSError:  # another file system, or no hard links: a copy
                shutil.copyfile(original, staged)
                linked = False
            if not linked and verified_file(staged, source) is None:
                return None  # not that content, or changed while adopted
            os.replace(staged, path)
        finally:
            staged.unlink(missing_ok=True)
            marker_path(staged).unlink(missing_ok=True)
        if linked:
            record_verified(path, str(source.sha256))
        return verified_file(path, source)

    def cached_asset(self, source: BaseModelSource) -> Path | None:
        """`verified_asset` under the official SDK's lock for it; None at once, no lock taken (a read-only cache
        stays untouched), when neither its content address nor its name holds a file."""
        if source.sha256 is None or not (self.asset_path(source).exists() or (self.base_models_dir / source.file).exists()):
            return None
        with self.lock("vision_assets", source.sha256):
            return self.verified_asset(source)

    def verified_base_model(self, source: BaseModelSource) -> Path | None:
        """The cached base file if it exists, is GGUF, has the pinned size and (hashed once) the pinned sha256."""
        return verified_file(self.base_model_path(source), source)

    def clear(self) -> None:
        """Delete every program, base model, runtime manifest, the slug cache, pawfn's derived files and staged downloads."""
        for folder in (self.programs_dir, self.base_models_dir, self.runtimes_dir, self.root / ".pawfn-derived", self.staging_root):
            shutil.rmtree(folder, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            self.slug_cache_path.unlink()


def _hydrate_meta(meta_path: Path, runtime: RuntimeManifest | None) -> None:
    """Embed the runtime manifest in meta.json, as the official SDK does at install (sorted keys, indent 2)."""
    meta = read_json_object(meta_path)
    if meta is None:
        raise BundleError(meta_path, "meta.json must hold a JSON object")
    if runtime is not None:
        meta["runtime"] = runtime.model_dump(mode="json")
        meta.setdefault("runtime_id", runtime.runtime_id)
        meta.setdefault("runtime_manifest_version", runtime.manifest_version)
    write_json_atomically(meta_path, meta)
