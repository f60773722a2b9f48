"""Pydantic models of the PAW API's requests and responses (unknown fields are kept, never dropped)."""

from __future__ import annotations

import os
import re
from typing import Literal

from typing_extensions import TypedDict, Unpack

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = [
    "BaseModelSource",
    "CompileCancellation",
    "CompileJob",
    "CompilePrecheck",
    "CompileRequest",
    "CompileResult",
    "CompileSettings",
    "CompileStatus",
    "CompilerInfo",
    "ImagePreprocessing",
    "LocalSdk",
    "ProgramInfo",
    "ProgramList",
    "ProgramSummary",
    "ProgramVersion",
    "ProgramVersions",
    "RuntimeManifest",
    "VisionAssets",
    "compile_request",
]

_RUNTIME_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_SHA256 = re.compile(r"^[a-fA-F0-9]{64}$")


class _Response(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)


class CompileRequest(BaseModel):
    """Body of `POST /api/v1/compile` and `/compile/async` (unset fields are not sent)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    spec: str
    public: bool = True
    compiler: str | None = None
    ephemeral: bool | None = None
    name: str | None = None
    tags: list[str] | None = None
    slug: str | None = None


class CompileSettings(TypedDict, total=False):
    """Optional fields of a compile, as keyword arguments (`PawFn.compile_spec(spec, name=..., public=False)`)."""

    name: str | None
    tags: list[str] | None
    public: bool
    slug: str | None
    ephemeral: bool


def compile_request(spec: str, compiler: str | None = None, **settings: Unpack[CompileSettings]) -> CompileRequest:
    """A `CompileRequest`; `ephemeral=False` is left unsent, as the server's default."""
    return CompileRequest(
        spec=spec,
        compiler=compiler,
        name=settings.get("name"),
        tags=settings.get("tags"),
        public=settings.get("public", True),
        slug=settings.get("slug"),
        ephemeral=settings.get("ephemeral") or None,
    )


class CompileResult(_Response):
    """Answer of a blocking compile."""

    program_id: str | None = None
    status: str = "unknown"
    slug: str | None = None
    compiler_snapshot: str | None = None
    compiler_kind: str | None = None
    pseudo_program_strategy: str | None = None
    runtime_id: str | None = None
    runtime_manifest_version: int | None = None
    timings: dict[str, float] | None = None
    error: str | None = None
    version: int | None = None
    version_action: str | None = None
    job_id: str | None = None


class CompilePrecheck(_Response):
    """Answer of `POST /api/v1/compile/precheck`: is it cached, how long is the queue."""

    cached: bool = False
    program_id: str | None = None
    compiler_snapshot: str | None = None
    compiler_kind: str | None = None
    queue_length: int | None = None
    estimated_wait_s: float | None = None


class CompileJob(_Response):
    """Answer of `POST /api/v1/compile/async`."""

    job_id: str
    status: str
    program_id: str | None = None
    compiler_snapshot: str | None = None
    compiler_kind: str | None = None
    queue_position: int | None = None
    estimated_wait_s: float | None = None
    cached: bool = False
    error: str | None = None
    slug: str | None = None
    version: int | None = None


class CompileStatus(_Response):
    """Answer of `GET /api/v1/compile/{job_id}`; status is queued, compiling, ready, failed or cancelled."""

    job_id: str
    status: str
    program_id: str | None = None
    error: str | None = None
    percent: float | None = None
    created_at: str | None = None
    completed_at: str | None = None
    queue_length: int | None = None
    estimated_wait_s: float | None = None
    slug: str | None = None
    version: int | None = None


class CompileCancellation(_Response):
    """Answer of `DELETE /api/v1/compile/{job_id}`."""

    job_id: str
    status: str


class ProgramInfo(_Response):
    """Answer of `GET /api/v1/programs/{id_or_slug}`."""

    id: str
    name: str | None = None
    spec: str | None = None
    interpreter: str | None = None
    public: bool | None = None
    aliases: list[str] = Field(default_factory=list[str])
    user_slug: str | None = None
    author: str | None = None
    tags: list[str] = Field(default_factory=list[str])
    upvotes: int | None = None
    downloads: int | None = None
    created_at: str | None = None
    compiler_snapshot: str | None = None
    hf_url: str | None = None


class ProgramVersion(_Response):
    """One version of a slug."""

    version: int
    program_id: str
    is_main: bool = False


class ProgramVersions(_Response):
    """Answer of `GET /api/v1/programs/{slug}/versions`."""

    slug: str | None = None
    main_version: int | None = None
    versions: list[ProgramVersion] = Field(default_factory=list[ProgramVersion])


class ProgramSummary(_Response):
    """One program in a listing."""

    id: str
    name: str | None = None
    spec: str | None = None
    compiler: str | None = None


class ProgramList(_Response):
    """Answer of `GET /api/v1/programs?mine=true`."""

    programs: list[ProgramSummary] = Field(default_factory=list[ProgramSummary])
    total: int | None = None
    page: int | None = None
    per_page: int | None = None


class CompilerInfo(_Response):
    """One entry of `GET /api/v1/models/compilers` (the API documents no fixed shape)."""

    name: str | None = None


class BaseModelSource(_Response):
    """Where a runtime's base GGUF comes from and how it is verified."""

    provider: str | None = None
    repo: str | None = None
    file: str
    url: str | None = None
    size_bytes: int | None = Field(default=None, gt=0)
    sha256: str | None = None

    @field_validator("file")
    @classmethod
    def _bare_name(cls, value: str) -> str:
        if not value or "/" in value or "\\" in value or value in (".", ".."):
            raise ValueError(f"base model file must be a bare file name, got {value!r}")
        return value

    @field_validator("sha256")
    @classmethod
    def _hex(cls, value: str | None) -> str | None:
        if value is not None and not _SHA256.match(value):
            raise ValueError("sha256 must be 64 hex digits")
        return None if value is None else value.lower()

    def download_url(self) -> str:
        """The URL to fetch the file from (`url`, else the Hugging Face repo, on `HF_ENDPOINT` when set: a mirror, as
        huggingface_hub reads it)."""
        if self.url:
            return self.url
        if self.provider == "huggingface" and self.repo:
            endpoint = os.environ.get("HF_ENDPOINT", "").strip().rstrip("/") or "https://huggingface.co"
            return f"{endpoint}/{self.repo}/resolve/main/{self.file}"
        raise ValueError(f"runtime base model {self.file} has neither a url nor a Hugging Face repo")


class ImagePreprocessing(_Response):
    """How the vision runtime prepares an image (version 1: RGB over white, stored orientation, no colour profile,
    resized by the backend within the image-token bounds)."""

    version: Literal[1] = 1
    image_min_tokens: int = Field(gt=0)
    image_max_tokens: int = Field(gt=0)


class VisionAssets(_Response):
    """The `local_sdk.vision` section of a version-2 manifest: the projector GGUF and the image preprocessing."""

    projector: BaseModelSource
    preprocessing: ImagePreprocessing


class LocalSdk(_Response):
    """The `local_sdk` section of a runtime manifest."""

    supported: bool
    base_model: BaseModelSource | None = None
    n_ctx: int | None = Field(default=None, gt=0)
    vision: VisionAssets | None = Field(default=None, exclude_if=lambda value: value is None)
    """Version 2 (the vision runtime): its projector and preprocessing. Never written as null: the official SDK
    takes a `vision` key, whatever its value, for a vision program."""


class RuntimeManifest(_Response):
    """A runtime manifest (`GET /api/v1/models/runtimes/{id}`, or embedded in meta.json as `runtime`); version 2 is
    the official vision runtime's (numbered templates; its base and projector cached by sha256)."""

    runtime_id: str
    manifest_version: Literal[1, 2] = 1
    display_name: str | None = None
    interpreter: str
    adapter_format: Literal["gguf_lora"] = "gguf_lora"
    local_sdk: LocalSdk

    @model_validator(mode="after")
    def _vision_assets_pinned(self) -> RuntimeManifest:
        """A version-2 runtime run locally names its base and projector by size and sha256 (their cache path is the
        digest)."""
        if self.manifest_version == 2 and self.local_sdk.supported:
            assets = self.assets
            if len(assets) != 2 or any(asset.sha256 is None or asset.size_bytes is None for asset in assets):
                raise ValueError("a version-2 runtime needs local_sdk.base_model and local_sdk.vision.projector with size_bytes and sha256")
        return self

    @property
    def assets(self) -> list[BaseModelSource]:
        """The files a local run needs: the base weights, and a version-2 runtime's projector."""
        local = self.local_sdk
        found = [local.base_model, None if local.vision is None else local.vision.projector]
        return [asset for asset in found if asset is not None]

    @field_validator("runtime_id")
    @classmethod
    def _runtime_id(cls, value: str) -> str:
        if not _RUNTIME_ID.match(value):
            raise ValueError(f"invalid runtime id {value!r}")
        return value

    @field_validator("interpreter")
    @classmethod
    def _interpreter(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("interpreter must be a non-empty string")
        return value
