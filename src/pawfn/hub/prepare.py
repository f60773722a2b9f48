"""From a reference (id, slug, path) to the files a backend needs: bundle, base weights and a folder for derived
files, downloading what is missing (online) or reading the cache (offline). Also the one compile path."""

from __future__ import annotations

import asyncio
import shutil
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..formats.bundle import ProgramMeta, read_meta
from ..core.config import PawConfig
from ..core.errors import BaseModelError, HubConnectionError, HubError, OfflineError, ServerError
from ..core.models import InterpreterModel
from ..core.progress import download_progress
from .cache import PawCache
from .client import PawClient
from .refs import ProgramReference, parse_hub_reference, parse_reference
from .runtimes import resolve_runtime
from .types import BaseModelSource, CompileRequest, CompileResult, RuntimeManifest

__all__ = [
    "PreparedProgram",
    "aprepare_program",
    "compile_program",
    "compile_spec",
    "find_cached_base",
    "find_cached_projector",
    "prepare_program",
    "record_base",
]


@dataclass(frozen=True)
class PreparedProgram:
    """A program ready to load: its bundle path, meta, runtime manifest, base weights file and the folder a
    backend may keep derived files in (None outside the cache)."""

    reference: str
    program_id: str | None
    bundle: Path
    meta: ProgramMeta
    runtime: RuntimeManifest | None
    """None when the caller brought its own base weights or asked for none."""
    base: Path | None
    """None only with `fetch_base=False`."""
    derived_dir: Path | None


_WITHOUT_THE_HUB = (
    "to run without the hub: --base PATH (base=PATH in Python) brings your own base weights, --offline (PAW_OFFLINE=1) "
    "runs what the cache holds (`pawfn cache prepare REF` fills it while online), --api-url URL (PAW_API_URL) names another hub"
)


def _offline_hint(reference: str) -> str:
    return f"run `pawfn cache prepare {reference}` while online to fetch it"


def _resolve_id(reference: ProgramReference, cache: PawCache, client: PawClient, config: PawConfig) -> str:
    if reference.kind == "id":
        return reference.text
    cached = cache.cached_slug(reference.text)
    if cached is not None and (reference.pinned or config.offline):
        return cached  # pinned versions are immutable: no network
    if config.offline:
        raise OfflineError(f"program {reference.text} is not in the cache and offline mode is on; {_offline_hint(reference.text)}")
    try:
        program_id = client.resolve(reference.text)
    except (HubConnectionError, ServerError) as exc:
        if cached is None:
            raise
        # Documented fallback: a slug seen before still loads while the hub is unreachable, with a warning.
        warnings.warn(f"{exc}; using the cached {reference.text} -> {cached}", RuntimeWarning, stacklevel=4)
        return cached
    cache.remember_slug(reference.text, program_id)
    return program_id


def _ensure_program(program_id: str, reference: str, cache: PawCache, client: PawClient, config: PawConfig) -> Path:
    if cache.read_program(program_id) is not None:
        return cache.program_dir(program_id)
    if config.offline:
        problem = cache.program_problem(program_id)
        if problem is not None:
            raise OfflineError(
                f"the cached program {program_id} is damaged ({problem}) and offline mode is on; run once online to "
                f"fetch it again, or delete {cache.program_dir(program_id)}"
            )
        raise OfflineError(f"program {program_id} is not in the cache and offline mode is on; {_offline_hint(reference)}")
    with cache.lock("programs", program_id):  # the official SDK's lock: both SDKs install one at a time
        # None: not installed, or damaged (a fresh install replaces it); another process may have installed it meanwhile
        if cache.read_program(program_id) is None:
            # inside the cache, one folder per program: what a killed run left there is removed here, under the lock
            staging = cache.staging_root / f"download-{program_id}"
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir(parents=True)
            try:
                progress = download_progress(f"program {program_id[:12]}", config.progress)
                archive = client.download_program(program_id, staging / f"{program_id}.paw", progress)
                cache.install_program(program_id, archive, lambda meta: resolve_runtime(meta, cache, client))
            finally:
                shutil.rmtree(staging, ignore_errors=True)
    return cache.program_dir(program_id)


def _ensure_base(runtime: RuntimeManifest, reference: str, cache: PawCache, client: PawClient, config: PawConfig) -> Path:
    """The runtime's base weights in the cache, downloaded if missing; a version-2 runtime's projector too (by
    content address, as the official SDK keeps them, so either SDK then runs offline from the other's files)."""
    source = runtime.local_sdk.base_model
    if not runtime.local_sdk.supported or source is None:
        raise OfflineError(f"runtime {runtime.runtime_id} has no base model for local use")
    if runtime.manifest_version == 1:
        return _ensure_file(source, "base model", runtime, reference, cache, client, config)
    found = [
        _ensure_file(asset, "base model" if asset is source else "projector", runtime, reference, cache, client, config) for asset in runtime.assets
    ]
    return found[0]


def _ensure_file(
    source: BaseModelSource, what: str, runtime: RuntimeManifest, reference: str, cache: PawCache, client: PawClient, config: PawConfig
) -> Path:
    """One of the runtime's files, verified in the cache or downloaded there (under its name for version 1, its
    sha256 for version 2) under the lock the official SDK takes for it."""
    by_content = runtime.manifest_version == 2
    lock = ("vision_assets", str(source.sha256)) if by_content else ("base_models", source.file)
    if source.sha256 is None:  # checked before the cache too: an unpinned file found there was never verified
        raise BaseModelError(
            None,
            f"runtime {runtime.runtime_id} names {what} {source.file} without a sha256, and pawfn uses only files it can verify; "
            "ask the runtime's publisher to pin it, or pass a base you trust with --base PATH (base=PATH in Python)",
        )

    verified = cache.verified_asset if by_content else cache.verified_base_model
    found = cache.cached_asset(source) if by_content else verified(source)
    if found is not None:
        return found
    if config.offline:
        raise OfflineError(
            f"{what} {source.file} (runtime {runtime.runtime_id}) is not in the cache and offline mode is on; "
            f"{_offline_hint(reference)}, or pass a local copy of the base with --base PATH (base=PATH in Python)"
        )
    with cache.lock(*lock):
        found = verified(source)
        if found is None:
            destination = cache.asset_path(source) if by_content else cache.base_model_path(source)
            destination.parent.mkdir(parents=True, exist_ok=True)
            try:
                found = client.download_file(
                    source.download_url(),
                    destination,
                    size_bytes=source.size_bytes,
                    sha256=source.sha256,
                    progress=download_progress(f"{what} {source.file}", config.progress),
                )
            except HubError as exc:
                by_hand = "pass it with --base PATH (base=PATH in Python)" if source is runtime.local_sdk.base_model else f"save it as {destination}"
                raise BaseModelError(
                    None,
                    f"cannot download {what} {source.file} (runtime {runtime.runtime_id}): {exc}; run again to "
                    f"resume, or fetch {source.download_url()} yourself and {by_hand}",
                ) from exc
            verified(source)  # records the hash so the next load skips it
    return found


def record_base(runtime: RuntimeManifest, path: Path, cache: PawCache) -> Path:
    """A local copy of `runtime`'s base weights recorded in the cache where a download would put them (a hard link, or
    a copy, once its sha256 is the pinned one), so later loads find it offline without `--base`."""
    source = runtime.local_sdk.base_model
    if not runtime.local_sdk.supported or source is None:
        raise OfflineError(f"runtime {runtime.runtime_id} has no base model for local use")
    if source.sha256 is None:
        raise BaseModelError(
            path, f"runtime {runtime.runtime_id} pins no sha256 for {source.file}, so no file can be recorded as it; pass it with --base PATH"
        )
    if not path.is_file():
        raise BaseModelError(path, "no such file; give the path of a GGUF file")
    by_content = runtime.manifest_version == 2
    with cache.lock(*(("vision_assets", source.sha256) if by_content else ("base_models", source.file))):
        found = cache.adopt_base_file(path, source, content_addressed=by_content)
    if found is None:
        raise BaseModelError(
            path,
            f"is not the base runtime {runtime.runtime_id} pins ({source.file}, sha256 {source.sha256}), and the cache keeps only "
            f"that file for it; pass this one with --base PATH on each command, or fetch {source.download_url()} and record that",
        )
    return found


def find_cached_base(model: type[InterpreterModel], meta: ProgramMeta, cache: PawCache) -> Path | None:
    """A verified base GGUF in the cache (no network): the one the program's runtime manifest names, else the
    model type's own `default_gguf` (how a mirror subclass points at its weights)."""
    sources: list[BaseModelSource] = []
    try:
        runtime: RuntimeManifest | None = resolve_runtime(meta, cache, None)
    except OfflineError:
        runtime = None  # no manifest in the cache for this runtime: only the model type's default can serve
    named = None if runtime is None else runtime.local_sdk.base_model
    if runtime is not None and named is not None and runtime.manifest_version == 2:
        found = cache.cached_asset(named)
        if found is not None:
            return found
    if named is not None:
        sources.append(named)
    pinned = model.default_gguf
    sources.append(BaseModelSource(file=pinned.file, size_bytes=pinned.size_bytes, sha256=pinned.sha256))
    for source in sources:
        found = cache.verified_base_model(source)
        if found is not None:
            return found
    return None


def find_cached_projector(model: type[InterpreterModel], meta: ProgramMeta, cache: PawCache) -> Path | None:
    """A verified image projector in the cache (no network): the one the program's version-2 runtime names, else the
    model type's own `default_projector`; None for an interpreter without images."""
    sources: list[BaseModelSource] = []
    try:
        vision = resolve_runtime(meta, cache, None).local_sdk.vision
    except OfflineError:
        vision = None
    if vision is not None:
        sources.append(vision.projector)
    pinned = model.default_projector
    if pinned is not None:
        sources.append(BaseModelSource(file=pinned.file, size_bytes=pinned.size_bytes, sha256=pinned.sha256))
    for source in sources:
        found = cache.cached_asset(source)
        if found is not None:
            return found
    return None


def prepare_program(
    reference: str,
    config: PawConfig | None = None,
    *,
    client: PawClient | None = None,
    check: Callable[[ProgramMeta], object] | None = None,
    base: Path | None = None,
    fetch_base: bool = True,
    local_paths: bool = True,
    base_file: Path | None = None,
) -> PreparedProgram:
    """Resolve `reference`, download what is missing (program, runtime manifest, base weights) and return paths.

    `check` sees the program's meta before any base weights are fetched (e.g. to refuse a wrong interpreter);
    with `base` given, or `fetch_base=False`, no base weights are looked up or fetched. `local_paths=False` takes
    only program ids and slugs (a server's clients), never a file; a local bundle's embedded runtime manifest is
    honoured, a hub program's never (its runtime comes from the hub). `base_file`: a local copy of the runtime's base,
    recorded in the cache (`record_base`) instead of downloaded.
    """
    config = config or PawConfig.from_env()
    parsed = parse_reference(reference) if local_paths else parse_hub_reference(reference)
    cache = PawCache(config.cache_dir, config.lock_timeout_s)
    opened: list[PawClient] = []

    def hub() -> PawClient:
        """The caller's client, else one made on first use (a local bundle with its base needs none)."""
        if client is not None:
            return client
        if not opened:
            opened.append(PawClient(config))
        return opened[0]

    try:
        if parsed.kind == "path":
            folder = parsed.path
            meta = read_meta(folder)  # a .paw is extracted once, when the backend opens it
            program_id = meta.program_id
        else:
            program_id = _resolve_id(parsed, cache, hub(), config)
            folder = _ensure_program(program_id, reference, cache, hub(), config)
            meta = read_meta(folder)
        if check is not None:
            check(meta)
        runtime: RuntimeManifest | None = None
        if base is None and fetch_base:
            runtime = resolve_runtime(meta, cache, None if config.offline else hub(), embedded=parsed.kind == "path")
            if base_file is not None:
                base = record_base(runtime, base_file, cache)
                for asset in runtime.assets[1:] if runtime.manifest_version == 2 else []:  # a projector: still the hub's
                    _ensure_file(asset, "projector", runtime, reference, cache, hub(), config)
            else:
                base = _ensure_base(runtime, reference, cache, hub(), config)
    except HubConnectionError as exc:  # the first network failure a new user meets: name the ways around the hub
        raise HubConnectionError(f"{exc}; {_WITHOUT_THE_HUB}", status=exc.status, url=exc.url) from exc
    finally:
        for made in opened:
            made.close()
    return PreparedProgram(
        reference=reference, program_id=program_id, bundle=folder, meta=meta, runtime=runtime, base=base, derived_dir=cache.derived_dir(folder)
    )


async def aprepare_program(reference: str, config: PawConfig | None = None, *, check: Callable[[ProgramMeta], None] | None = None) -> PreparedProgram:
    """`prepare_program` in a worker thread (downloads and hashing never block the event loop)."""
    return await asyncio.to_thread(lambda: prepare_program(reference, config, check=check))


def compile_program(request: CompileRequest, config: PawConfig) -> str:
    """Compile on the hub and return the new program's id (a failure is a `CompileError`)."""
    result = compile_spec(request, config)
    assert result.program_id is not None  # compile() raises CompileError without an id
    return result.program_id


def compile_spec(request: CompileRequest, config: PawConfig) -> CompileResult:
    """The one compile path: compile `request` on the hub and return the server's answer."""
    with PawClient(config) as client:
        return client.compile(request)
