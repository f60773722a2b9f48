"""From a reference to an open program: the one load path every `PawFn` constructor, the builder and the CLI
go through (resolve and download with `prepare_program`, choose the interpreter, open on the backend)."""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from ..core.backends import Backend, LlamaCpp, Remote, Torch
from ..formats.bundle import ProgramMeta, open_bundle, read_meta
from ..core.config import PawConfig
from ..core.errors import BaseModelError, CacheLockError, ConfigError, InterpreterMismatchError, OfflineError
from ..core.guard import check_real_program
from ..core.hashing import file_sha256
from ..hub.cache import PawCache
from ..hub.refs import parse_reference
from ..hub.usage import prune_derived
from ..hub.prepare import PreparedProgram, find_cached_base, find_cached_projector, prepare_program
from ..llamacpp import LlamaCppProgram
from ..core.models import InterpreterModel, model_for_interpreter
from ..core.progress import load_step, loading
from ..remote import RemoteProgram
from ..calls.runtime import ProgramFiles, ProgramRuntime, RuntimeOpener
from ..core.templates import INPUT_PLACEHOLDER, NumberedTemplate

__all__ = [
    "ModelChoice",
    "Opened",
    "bound_derived",
    "expect_model",
    "known_interpreter",
    "open_files",
    "open_reference",
    "prepare_reference",
    "runtime_opener",
]

_LOG = logging.getLogger("pawfn")

ModelChoice = Callable[[ProgramMeta, str], type[InterpreterModel]]
"""The interpreter model a program runs as, from its meta and its name; raises where it cannot run."""


@dataclass(frozen=True)
class Opened:
    """A program open on a backend, with what `PawFn` keeps of its load."""

    model: type[InterpreterModel]
    runtime: ProgramRuntime
    meta: ProgramMeta
    source: Path
    """The bundle loaded (on `Remote`: the reference the server was asked for)."""
    load_ms: float
    identity: str | None = None
    """What determines the program's outputs besides the call (its files, base, backend and settings), when a result
    cache is on (`PawConfig.result_cache_bytes`); None: its calls are not cached."""


def _torch_opener() -> RuntimeOpener:
    from ..torch import TorchProgram  # torch comes with the first Torch load, not with `import pawfn`

    return TorchProgram.open


_OPENERS: Mapping[type[Backend], Callable[[], RuntimeOpener]] = {Torch: _torch_opener, LlamaCpp: lambda: LlamaCppProgram.open}
"""Each backend's opener, imported when first asked for (a Remote-only client never imports torch)."""


def runtime_opener(backend: type[Backend]) -> RuntimeOpener:
    """How programs open on `backend` (a subclass of a built-in backend opens like it); refused while real programs
    are blocked (`pawfn.testing`)."""
    check_real_program(f"opening a program on {backend.__name__}")
    for kind in backend.__mro__:
        opener = _OPENERS.get(cast("type[Backend]", kind))  # cast: MRO entries are classes
        if opener is not None:
            return opener()
    if issubclass(backend, Remote):
        raise ConfigError(
            f"{backend.__name__} runs programs on a server, not from files: load them by reference (load_sync, load) with PawConfig.server_url set"
        )
    raise ConfigError(f"backend {backend.__name__} has no implementation; use Torch or LlamaCpp (or a subclass)")


def expect_model(model: type[InterpreterModel]) -> ModelChoice:
    """Run as `model`, refusing a program compiled for another interpreter before any weights load."""

    def choose(meta: ProgramMeta, name: str) -> type[InterpreterModel]:
        if not model.accepts(meta.interpreter):
            suggestion = model_for_interpreter(meta.interpreter)
            raise InterpreterMismatchError(
                name, meta.interpreter, model.interpreter_id, model.__name__, None if suggestion is None else suggestion.__name__
            )
        return model

    return choose


def known_interpreter(meta: ProgramMeta, name: str) -> type[InterpreterModel]:
    """Run as the interpreter model the program's meta names."""
    model = model_for_interpreter(meta.interpreter)
    if model is None:
        raise ConfigError(f"program {name} needs interpreter {meta.interpreter!r}, which pawfn does not know")
    return model


def open_files(
    backend: type[Backend],
    choose: ModelChoice,
    bundle: Path,
    base: Path | None,
    derived_dir: Path | None,
    config: PawConfig,
    started: float | None = None,
) -> Opened:
    """Open a local bundle on `backend`: its interpreter checked, its base found (`base`, else the cache's), its
    derived files (stored prefixes) in `derived_dir` (`PawCache.derived_dir`: it hashes a local bundle's files, so
    the caller's one computation is passed on)."""
    started = time.perf_counter() if started is None else started
    with loading(bundle.name, config.progress):
        load_step(f"the {backend.__name__} backend")  # Torch's first load imports torch: seconds
        opener = runtime_opener(backend)
        cache = PawCache(config.cache_dir, config.lock_timeout_s)
        with open_bundle(bundle, cache.staging_dir()) as opened:
            model = choose(opened.meta, opened.name)
            base = _base_weights(base, model, opened.meta, cache, ", or load by reference with load_sync (it downloads what is missing)")
            projector = _projector(model, base, opened.meta, cache)
            runtime = opener(model, ProgramFiles(opened, base, derived_dir, cache.base_derived_dir(), projector=projector), config)
            identity = program_identity(backend, model, [bundle, base, projector], config)
    bound_derived(cache, config)
    return Opened(model, runtime, opened.meta, bundle, (time.perf_counter() - started) * 1e3, identity)


def program_identity(backend: type[Backend], model: type[InterpreterModel], files: Sequence[Path | None], config: PawConfig) -> str | None:
    """A digest of what determines a program's outputs besides the call, for the result cache's keys: the backend,
    the interpreter, the settings, and each file's content (by sha256; a file over 64 MiB, a base, by its resolved path,
    size and modification time); None when no result cache is on."""
    if config.result_cache_bytes <= 0:
        return None
    digest = hashlib.sha256(f"{backend.__name__}\0{model.__name__}\0{config.model_dump_json()}".encode())
    for given in files:
        if given is None:
            continue
        members = sorted(path for path in given.rglob("*") if path.is_file()) if given.is_dir() else [given]
        for path in members:
            stat = path.stat()
            if stat.st_size <= _HASHED_BYTES:
                digest.update(f"{path.name}\0{file_sha256(path)}\0".encode())
            else:
                digest.update(f"{path.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}\0".encode())
    return digest.hexdigest()


_HASHED_BYTES = 64 << 20
"""Files up to this size (adapters, templates, projectors) count in a program's identity by content; larger ones (bases)
by path, size and time: hashing 600 MB on every load would cost more than the cache saves."""


def bound_derived(cache: PawCache, config: PawConfig) -> None:
    """Keep pawfn's derived files under `config.derived_cache_max_bytes` after a load (which may have written some);
    a cache that cannot be pruned (read-only, its lock held too long) is left as it is, the load unharmed."""
    try:
        removed = prune_derived(cache, config.derived_cache_max_bytes)
    except (OSError, CacheLockError) as exc:
        _LOG.warning("could not prune pawfn's derived files in %s: %s", cache.root, exc)
        return
    if removed:
        freed = sum(item.size_bytes for item in removed)
        bound = config.derived_cache_max_bytes
        _LOG.info("pruned %d derived files (%d bytes, least recently used) to stay under %d bytes", len(removed), freed, bound)


def _base_weights(base: Path | None, model: type[InterpreterModel], meta: ProgramMeta, cache: PawCache, otherwise: str) -> Path:
    """`base`, else the verified base in the cache; `BaseModelError` naming where to get one (`otherwise`: another way)."""
    found = base or find_cached_base(model, meta, cache)
    if found is None:
        raise BaseModelError(
            None,
            f"no base weights for {model.__name__} in the cache: pass base=PATH (CLI: --base PATH), a GGUF file such as "
            f"{model.default_gguf.file} ({model.default_gguf.url}) or a Hugging Face folder of {model.default_hf_repo}{otherwise}",
        )
    return found


def _projector(model: type[InterpreterModel], base: Path, meta: ProgramMeta, cache: PawCache) -> Path | None:
    """The interpreter's image projector, for one that takes images: the one its runtime names, verified in the
    cache, else the one `mmproj*.gguf` beside a base file (llama.cpp's convention); None without."""
    if model.default_projector is None:
        return None
    found = find_cached_projector(model, meta, cache)
    if found is None and base.is_file():
        beside = sorted(base.parent.glob("mmproj*.gguf"))
        found = beside[0] if len(beside) == 1 else None
    return found


def open_bare(backend: type[Backend], model: type[InterpreterModel], base: Path | None, template: str | None, config: PawConfig) -> Opened:
    """Open the bare interpreter `model` (no program) on `backend`: the official base-inference template, or a
    numbered `template` (`{INPUT_0}`, ...); each call's prompt is rendered whole, as the official base mode does."""
    started = time.perf_counter()
    if issubclass(backend, Remote):
        raise ConfigError("a bare interpreter runs locally: open it on Torch or LlamaCpp")
    if template is None:  # the official base templates: version 1's `{INPUT_PLACEHOLDER}`, the vision runtime's `{INPUT_0}`
        base_template = model.base_template
        numbered = NumberedTemplate.single(base_template) if INPUT_PLACEHOLDER in base_template else NumberedTemplate.parse(base_template)
    else:
        numbered = NumberedTemplate.parse(template)
    opener = runtime_opener(backend)
    cache = PawCache(config.cache_dir, config.lock_timeout_s)
    meta = ProgramMeta(interpreter=model.interpreter_id)
    base = _base_weights(base, model, meta, cache, "")
    projector = _projector(model, base, meta, cache)
    runtime = opener(model, ProgramFiles(None, base, None, cache.base_derived_dir(), numbered, projector), config)
    bound_derived(cache, config)
    identity = program_identity(backend, model, [base, projector], config)
    if identity is not None:  # a bare interpreter's template is its program
        identity = hashlib.sha256(f"{identity}\0{numbered.segments!r}".encode()).hexdigest()
    return Opened(model, runtime, meta, base, (time.perf_counter() - started) * 1e3, identity)


def open_reference(
    reference: str | os.PathLike[str] | PreparedProgram,
    backend: type[Backend],
    choose: ModelChoice,
    config: PawConfig,
    base: str | os.PathLike[str] | None,
) -> Opened:
    """Open a program by id, slug or path on `backend`: on a server for `Remote`, else downloading what is missing
    (`base`: your own base weights, then none are downloaded); a `PreparedProgram` opens from its files, asking the
    hub nothing."""
    started = time.perf_counter()
    if isinstance(reference, PreparedProgram):
        if issubclass(backend, Remote):
            raise ConfigError(
                f"{reference.reference}: a prepared program runs from its files; load it on Torch or LlamaCpp (Remote loads by reference)"
            )
        if base is not None:
            raise ConfigError(f"{reference.reference}: a prepared program carries its base weights; give base= to prepare_program instead")
        prepared = reference
    elif issubclass(backend, Remote):
        if base is not None:
            raise ConfigError("base weights are the server's business on Remote: load without base=")
        named = os.fspath(reference)
        runtime = RemoteProgram.open(named, config)
        served = runtime.served
        meta = ProgramMeta(interpreter=served.interpreter, program_id=served.program_id, spec=served.spec)
        try:
            model = choose(meta, named)
        except BaseException:
            runtime.close()
            raise
        return Opened(model, runtime, meta, Path(named), (time.perf_counter() - started) * 1e3)
    else:
        prepared = prepare_reference(os.fspath(reference), choose, config, base)
    return open_files(backend, choose, prepared.bundle, prepared.base, prepared.derived_dir, config, started)


def prepare_reference(
    reference: str, choose: ModelChoice, config: PawConfig, base: str | os.PathLike[str] | None, *, local_paths: bool = True
) -> PreparedProgram:
    """Resolve `reference` and download what is missing, refusing a program `choose` cannot run before its base
    weights are fetched (`base`: your own, then none are; `local_paths=False`: ids and slugs only, never a file). A
    local bundle whose runtime's base cannot be had offline takes one the cache holds for its model type (its own
    `default_gguf`: how a mirror subclass points at private weights)."""

    def chosen(meta: ProgramMeta) -> type[InterpreterModel]:
        return choose(meta, meta.program_id or reference)

    def prepared(given: Path | None) -> PreparedProgram:
        return prepare_program(reference, config, check=chosen, base=given, local_paths=local_paths)

    try:
        return prepared(None if base is None else Path(base))
    except OfflineError:
        if base is not None or not local_paths or parse_reference(reference).kind != "path":
            raise
        meta = read_meta(reference)
        cached = find_cached_base(chosen(meta), meta, PawCache(config.cache_dir, config.lock_timeout_s))
        if cached is None:
            raise
        return prepared(cached)
