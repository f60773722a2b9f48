"""Runtime manifests: which base weights a program runs on, resolved like the official SDK."""

from __future__ import annotations

import contextlib

from ..formats.bundle import ProgramMeta
from ..core.errors import HubError, NotFoundError, OfflineError
from ..core.models import WeightFile, builtin_models, model_for_interpreter
from .cache import PawCache
from .client import PawClient
from .types import BaseModelSource, LocalSdk, RuntimeManifest

__all__ = ["builtin_runtime", "canonical", "resolve_runtime"]


def _source(pinned: WeightFile) -> BaseModelSource:
    return BaseModelSource(
        provider="huggingface", repo=pinned.repo, file=pinned.file, url=pinned.url, size_bytes=pinned.size_bytes, sha256=pinned.sha256
    )


def builtin_runtime(runtime_id: str) -> RuntimeManifest | None:
    """The pinned manifest of an official runtime (`qwen3-0.6b-q6_k`, `gpt2-q8_0`; `qwen3.5-0.8b-q8_0`, version 2:
    the vision runtime's, field for field as the official SDK pins it)."""
    for model in builtin_models():
        if model.runtime_id != runtime_id:
            continue
        projector, image_tokens = model.default_projector, model.image_tokens
        if projector is None or image_tokens is None:
            return RuntimeManifest(
                runtime_id=model.runtime_id,
                interpreter=model.interpreter_id,
                display_name=f"{model.__name__} ({runtime_id})",
                local_sdk=LocalSdk(supported=True, n_ctx=model.default_n_ctx, base_model=_source(model.default_gguf)),
            )
        preprocessing = {
            "version": 1,
            "color_mode": "RGB",
            "alpha": "composite_white",
            "orientation": "stored",
            "color_profile": "ignore",
            "resize": "backend",
            "image_min_tokens": image_tokens[0],
            "image_max_tokens": image_tokens[1],
        }
        return RuntimeManifest.model_validate(
            {
                "runtime_id": model.runtime_id,
                "manifest_version": 2,
                "interpreter": model.interpreter_id,
                "adapter_format": "gguf_lora",
                "input": {"format": "content_parts", "types": ["text", "image"]},
                "prompt_template": {"format": "rendered_text", "placeholder": "{INPUT_N}"},
                "program_assets": {"adapter_filename": "adapter.gguf"},
                "base_inference": {"contract_version": 1, "format": "rendered_text", "placeholder": "{INPUT_N}", "template": model.base_template},
                "local_sdk": {
                    "supported": True,
                    "n_ctx": model.default_n_ctx,
                    "base_model": _source(model.default_gguf).model_dump(mode="json"),
                    "vision": {"projector": _source(projector).model_dump(mode="json"), "preprocessing": preprocessing},
                },
                "js_sdk": {"supported": False},
            }
        )
    return None


def canonical(manifest: RuntimeManifest) -> RuntimeManifest:
    """For an official runtime id, the pinned integrity fields win: a server cannot weaken them."""
    pinned = builtin_runtime(manifest.runtime_id)
    if pinned is None:
        return manifest
    if manifest.interpreter != pinned.interpreter or manifest.manifest_version != pinned.manifest_version:
        raise HubError(f"runtime {manifest.runtime_id}: the manifest contradicts the pinned official runtime")
    served_vision, pinned_vision = manifest.local_sdk.vision, pinned.local_sdk.vision
    pairs = [
        (manifest.local_sdk.base_model, pinned.local_sdk.base_model),
        (None if served_vision is None else served_vision.projector, None if pinned_vision is None else pinned_vision.projector),
    ]
    for served, expected in pairs:
        if served is None or expected is None:
            continue
        if served.file != expected.file:
            raise HubError(f"runtime {manifest.runtime_id}: the manifest contradicts the pinned official runtime")
        for field in ("size_bytes", "sha256"):
            value = getattr(served, field)
            if value is not None and value != getattr(expected, field):
                raise HubError(f"runtime {manifest.runtime_id}: {field} of {served.file} differs from the pinned official value")
    return pinned


def resolve_runtime(meta: ProgramMeta, cache: PawCache, client: PawClient | None, *, embedded: bool = False) -> RuntimeManifest:
    """The program's manifest: embedded in meta.json (only with `embedded`: a bundle the user named as a local file;
    a hub program's meta names the hub's runtime, whose manifest comes from the hub), then cached, then fetched
    (online), then built in. An official runtime id always gets its pinned manifest.

    Online, a failed fetch is reported as it is, except a 404 (the server does not know the runtime), which
    falls back to the built-in manifest of an official runtime.
    """
    runtime_id = meta.runtime_id
    inside = (meta.model_extra or {}).get("runtime") if embedded else None
    if isinstance(inside, dict) and inside:
        with contextlib.suppress(ValueError):
            manifest = canonical(RuntimeManifest.model_validate(inside))
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
