"""Runtime manifests: which base weights a program runs on, resolved like the official SDK."""

from __future__ import annotations

import contextlib

from ..bundle import ProgramMeta
from ..errors import HubError, NotFoundError, OfflineError
from ..models import builtin_models, model_for_interpreter
from .cache import PawCache
from .client import PawClient
from .types import BaseModelSource, LocalSdk, RuntimeManifest

__all__ = ["builtin_runtime", "canonical", "resolve_runtime"]


def builtin_runtime(runtime_id: str) -> RuntimeManifest | None:
    """The pinned manifest of an official runtime (`qwen3-0.6b-q6_k`, `gpt2-q8_0`)."""
    for model in builtin_models():
        if model.runtime_id == runtime_id:
            pinned = model.default_gguf
            return RuntimeManifest(
                runtime_id=model.runtime_id,
                interpreter=model.interpreter_id,
                display_name=f"{model.__name__} ({runtime_id})",
                local_sdk=LocalSdk(
                    supported=True,
                    n_ctx=model.default_n_ctx,
                    base_model=BaseModelSource(
                        provider="huggingface", repo=pinned.repo, file=pinned.file, url=pinned.url, size_bytes=pinned.size_bytes, sha256=pinned.sha256
                    ),
                ),
            )
    return None


def canonical(manifest: RuntimeManifest) -> RuntimeManifest:
    """For an official runtime id, the pinned integrity fields win: a server cannot weaken them."""
    pinned = builtin_runtime(manifest.runtime_id)
    if pinned is None:
        return manifest
    served = manifest.local_sdk.base_model
    expected = pinned.local_sdk.base_model
    assert expected is not None
    if manifest.interpreter != pinned.interpreter or (served is not None and served.file != expected.file):
        raise HubError(f"runtime {manifest.runtime_id}: the manifest contradicts the pinned official runtime")
    for field in ("size_bytes", "sha256"):
        value = None if served is None else getattr(served, field)
        if value is not None and value != getattr(expected, field):
            raise HubError(f"runtime {manifest.runtime_id}: {field} differs from the pinned official value")
    return pinned


def resolve_runtime(meta: ProgramMeta, cache: PawCache, client: PawClient | None) -> RuntimeManifest:
    """The program's manifest: embedded in meta.json, then cached, then fetched (online), then built in.

    Online, a failed fetch is reported as it is, except a 404 (the server does not know the runtime), which
    falls back to the built-in manifest of an official runtime.
    """
    runtime_id = meta.runtime_id
    embedded = (meta.model_extra or {}).get("runtime")
    if isinstance(embedded, dict) and embedded:
        with contextlib.suppress(ValueError):
            manifest = canonical(RuntimeManifest.model_validate(embedded))
            if manifest.interpreter == meta.interpreter and runtime_id in (None, manifest.runtime_id):
                return manifest
    if runtime_id is not None:
        cached = cache.read_runtime(runtime_id)
        if cached is not None:
            return canonical(cached)
        if client is not None and not client.config.offline:
            with contextlib.suppress(NotFoundError):
                fetched = canonical(client.runtime_manifest(runtime_id))
                cache.save_runtime(fetched)
                return fetched
        builtin = builtin_runtime(runtime_id)
        if builtin is not None:
            return builtin
    model = model_for_interpreter(meta.interpreter)
    if model is not None and (runtime_id is None or runtime_id == model.runtime_id):
        builtin = builtin_runtime(model.runtime_id)
        assert builtin is not None
        return builtin
    raise OfflineError(
        f"no runtime manifest for runtime {runtime_id!r} (interpreter {meta.interpreter!r}) in the cache; "
        "run once online (`pawfn cache prepare REF`) to fetch it"
    )
