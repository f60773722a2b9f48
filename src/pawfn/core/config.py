"""`PawConfig`: everything a load needs, from the official SDK's environment and config file or per call."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, ValidationInfo, field_validator

from .errors import ConfigError, OptionError, OptionProblem, allowed_values
from .jsonio import read_json_object
from .options import Device, DType, Numerics, OptionsModel, WeightDType

__all__ = ["DEFAULT_API_URL", "EngineSettings", "HubSettings", "PawConfig", "RemoteSettings", "config_file_path", "default_cache_dir"]

DEFAULT_API_URL = "https://programasweights.com"
_TRUTHY = frozenset({"1", "true", "yes", "on"})
_FALSY = frozenset({"0", "false", "no", "off"})
_ENV_VARIABLES = {
    "api_url": "PAW_API_URL",
    "api_key": "PAW_API_KEY",
    "offline": "PAW_OFFLINE",
    "n_ctx": "PAW_N_CTX",
    "max_model_copies": "PAW_MAX_MODEL_COPIES",
    "max_batch_rows": "PAW_MAX_BATCH_ROWS",
    "threads": "PAW_THREADS",
    "device": "PAW_DEVICE",
    "dtype": "PAW_DTYPE",
    "weight_dtype": "PAW_WEIGHT_DTYPE",
    "lock_timeout_s": "PAW_LOCK_TIMEOUT_S",
    "derived_cache_max_bytes": "PAW_DERIVED_CACHE_MAX_BYTES",
    "server_url": "PAW_SERVER_URL",
    "server_api_key": "PAW_SERVER_API_KEY",
    "llamacpp_repack": "PAW_LLAMACPP_REPACK",
    "llamacpp_kv_dtype": "PAW_LLAMACPP_KV_DTYPE",
    "batch_invariant": "PAW_BATCH_INVARIANT",
    "numerics": "PAW_NUMERICS",
    "run_timeout_s": "PAW_RUN_TIMEOUT_S",
    "call_log": "PAW_CALL_LOG",
    "call_log_max_bytes": "PAW_CALL_LOG_MAX_BYTES",
    "call_log_redact": "PAW_CALL_LOG_REDACT",
    "result_cache_bytes": "PAW_RESULT_CACHE_BYTES",
}


def config_file_path() -> Path:
    """The official SDK's config file (`~/.config/programasweights/config.json`; `PAW_CONFIG_FILE` overrides)."""
    override = os.environ.get("PAW_CONFIG_FILE")
    return Path(override) if override else Path.home() / ".config" / "programasweights" / "config.json"


def default_cache_dir() -> Path:
    """The cache shared with the official SDK: `PAW_CACHE_DIR`, else `~/.cache/programasweights`."""
    override = os.environ.get("PAW_CACHE_DIR")
    return Path(override) if override else Path.home() / ".cache" / "programasweights"


DEFAULT_LOCK_TIMEOUT_S = 600.0
"""`PawConfig.lock_timeout_s`'s default, in seconds."""
DEFAULT_DERIVED_CACHE_MAX_BYTES = 8 << 30
"""`PawConfig.derived_cache_max_bytes`'s default: 8 GiB (a few converted bases and hundreds of stored prefixes)."""


def _http_url(value: str, name: str) -> str:
    if not re.match(r"^https?://[^/\s]+", value):
        raise ValueError(f"{name} must be an http(s) URL")
    return value.rstrip("/")


class HubSettings(OptionsModel):
    """Where programs come from: the PAW API, its requests and downloads, and the cache shared with the official SDK
    (what `PawClient` and `AsyncPawClient` read)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    api_url: str = DEFAULT_API_URL
    """Root of the PAW API (the client adds `/api/v1/...`)."""
    api_key: SecretStr | None = None
    """`X-API-Key` for the PAW API; never sent to another origin."""
    cache_dir: Path = Field(default_factory=default_cache_dir)
    """Cache root shared with the official SDK."""
    offline: bool = False
    """Make no network request at all; a missing file is an `OfflineError`."""
    timeout_s: float = Field(default=30.0, gt=0)
    """Timeout of one API request (connect, read, write), in seconds."""
    compile_timeout_s: float = Field(default=2400.0, gt=0)
    """Read timeout of a blocking compile request, in seconds."""
    download_timeout_s: float = Field(default=300.0, gt=0)
    """Read timeout between chunks of a download, in seconds."""
    max_retries: int = Field(default=3, ge=0)
    """Retries after a connection error, 429 or 5xx (exponential backoff with jitter)."""
    max_wait_s: float = Field(default=300.0, ge=0)
    """Longest total wait for a program that the server is still generating (202), in seconds."""
    lock_timeout_s: float = Field(default=DEFAULT_LOCK_TIMEOUT_S, gt=0)
    """Longest wait for a cache entry another process is installing or downloading (its lock), in seconds;
    then a `CacheLockError`. The wait is logged (``pawfn`` logger) when it starts."""
    derived_cache_max_bytes: int = Field(default=DEFAULT_DERIVED_CACHE_MAX_BYTES, ge=0)
    """Most bytes of the files pawfn derives in the cache (stored prefixes, converted bases, compiled kernels): after
    each load the least recently used go first (`pawfn cache prune`); they are rebuilt when needed. Programs and
    base models are never removed by it."""

    @field_validator("api_url")
    @classmethod
    def _api_url(cls, value: str, info: ValidationInfo) -> str:
        return _http_url(value, str(info.field_name))

    def key_value(self) -> str | None:
        """The API key in clear, for the one header that carries it."""
        return None if self.api_key is None else self.api_key.get_secret_value()


class EngineSettings(OptionsModel):
    """How programs run in this process, on the Torch or LlamaCpp backend (what a backend's opener reads)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    device: Device = "cpu"
    """Torch device: ``cpu``, ``cuda``, ``cuda:N`` (N < 16) or ``mps``."""
    dtype: DType = "float32"
    """Torch backend: compute dtype of the base weights, adapters and KV cache (LlamaCpp runs the GGUF's own types;
    its cache: `llamacpp_kv_dtype`)."""
    weight_dtype: WeightDType | None = None
    """Keep the base's matrices (projections, output) compact on the Torch backend's CPU (with dtype float32):
    ``float16`` runs fbgemm's fp16 kernel with float32 activations (near-exact); ``int8`` runs fbgemm's int8
    kernel, per-row weights and activations quantized per row (lossy: on peaked models less faithful than a Q8_0
    base on llama.cpp). Both run torch's arithmetic, not llama.cpp's. Converted once, then read from the shared cache;
    LoRA, norms and KV stay float32. None (the default) keeps `dtype`. See docs/performance.md."""
    numerics: Numerics = "auto"
    """Torch backend: ``native`` runs torch's arithmetic on the base's weights dequantized to `dtype` (exact
    float32 math, as transformers + peft); ``llamacpp`` runs the arithmetic of llama.cpp's CPU backend as the
    official SDK configures it on the GGUF's own types (Q6_K/Q8_0/Q4_0 blocks with their inputs quantized, F32 and
    F16 in ggml's order, an f16 KV cache): the official runtime's tokens (CPU, dtype float32, no `weight_dtype`).
    ``auto`` (the default): ``llamacpp`` for a GGUF base on a CPU where it runs; ``native`` for Hugging Face
    folders, GPUs and the other dtypes (logged once where a GGUF base falls back). `Generation.numerics` says which
    ran. See docs/performance.md's fidelity table."""
    n_ctx: int = Field(default=2048, gt=0)
    """Context window in tokens (prefix + input + output); capped by the architecture's position limit."""
    max_model_copies: int = Field(default=8, ge=1)
    """Most calls running at once on one base (threads, tasks and batch rows alike), the one meaning on every backend:
    Torch keeps one KV cache (a "copy") per running call, made only when that many overlap, and decodes them together;
    Remote sends at most this many of a program's calls at once (the server batches them); LlamaCpp runs a program's
    calls in turn and needs no bound; a Ray replica takes 4x this many requests (`serve.ray.replica_ongoing_requests`:
    those running and those queued behind them)."""
    max_batch_rows: int = Field(default=8, ge=1)
    """Most rows in one forward pass of a decode step (Torch): concurrent runs on one base are decoded together,
    up to this many per pass."""
    batch_invariant: bool | None = None
    """Torch: concurrent calls decoded together each get exactly the tokens they get alone (every decode step's
    products, rotary tables and attention computed per row). None (auto): on for the CPU, where it costs little;
    off for CUDA and MPS, where per-row loops cost a kernel launch each: a step then runs one product per matrix
    and one fused attention, and a call's tokens may depend on what runs beside it (agreement measured in
    docs/performance.md). `numerics="llamacpp"` is always row-exact."""
    threads: int | None = Field(default=None, ge=1)
    """CPU threads: None lets the Torch backend follow the cores other processes leave idle (up to torch's count)
    and gives llama.cpp the official runtime's counts; a number sets it at load (torch, process-wide) or per context
    (llama.cpp: both its thread counts). On small VMs one thread can beat two (see docs/performance.md)."""
    llamacpp_kv_dtype: DType | None = None
    """LlamaCpp backend: the KV cache's type; None (the default) is the official runtime's, llama-cpp-python's f16.
    (`dtype` is the Torch backend's and does not change llama.cpp.)"""
    llamacpp_repack: bool | None = None
    """LlamaCpp backend: let llama.cpp repack weights into its extra CPU buffer types (its ``--repack``). None
    (auto) repacks except where both the CPU and the llama.cpp build have AMX, whose kernels segfault on quantized
    weights (llama.cpp issue #20824)."""
    progress: bool | None = None
    """Progress bars on downloads and while base weights load: None shows them only on a terminal."""
    call_log: Path | None = None
    """A JSON Lines file that gets one record per call (input, output, options, numerics, token counts, timings,
    request id); None (the default) logs nothing. Created 0600: it holds your users' inputs. See docs/call-log.md."""
    call_log_max_bytes: int = Field(default=64 << 20, ge=4096)
    """The call log's size, in bytes, past which it is moved to `<file>.1` (64 MiB)."""
    call_log_backups: int = Field(default=3, ge=0, le=100)
    """Rotated call logs kept (`<file>.1` ... `<file>.N`)."""
    call_log_redact: str | None = None
    """`module:function` that sees each `CallRecord` before it is written and returns it (changed) or None to drop it."""
    result_cache_bytes: int = Field(default=0, ge=0)
    """A result cache for deterministic calls (greedy, or seeded), in bytes: a call repeated with the same input and
    options on the same program gets the `Generation` the first one computed, from memory; least recently used out
    first; programs loaded with the same size share one. 0 (the default): every call is computed. Local backends."""


class RemoteSettings(OptionsModel):
    """Where `Remote` programs run: a pawfn server, its key and how long a call may take there."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    server_url: str | None = None
    """Root of a `pawfn serve` or Ray Serve server, where the `Remote` backend runs programs."""
    server_api_key: SecretStr | None = None
    """The key that server requires (`--api-key-env` there), sent as `X-API-Key` to its origin only."""
    run_timeout_s: float | None = Field(default=None, gt=0)
    """The most seconds one call on a server (`Remote`) may take; None follows the call's budget: 60 s plus 1 s
    for each token it may generate (its `max_tokens`, else the program's context), times its inputs. A call that
    times out is a `CallTimeoutError`, never sent again (a single call's connection closes, which stops it there)."""

    @field_validator("server_url")
    @classmethod
    def _server_url(cls, value: str | None, info: ValidationInfo) -> str | None:
        return None if value is None else _http_url(value, str(info.field_name))

    def server_key_value(self) -> str | None:
        """The server's key in clear, for the one header that carries it."""
        return None if self.server_api_key is None else self.server_api_key.get_secret_value()


class PawConfig(RemoteSettings, EngineSettings, HubSettings):  # this order lists the hub's fields first
    """Where programs come from and how they run: every setting of the three groups, flat (`PawConfig(device="cpu",
    offline=True)`), so one object serves a load from end to end; `PawConfig.from_env()` reads the official
    variables. Each layer takes only its group: a backend an `EngineSettings`, the hub clients a `HubSettings`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    @classmethod
    def from_env(cls, **overrides: object) -> PawConfig:
        """Read `PAW_API_URL`, `PAW_API_KEY`, `PAW_CACHE_DIR`, `PAW_OFFLINE`, `PAW_N_CTX`, `PAW_DEVICE`,
        `PAW_DTYPE`, `PAW_MAX_MODEL_COPIES`, `PAW_THREADS`, `PAW_LOCK_TIMEOUT_S`, `PAW_DERIVED_CACHE_MAX_BYTES`, `PAW_SERVER_URL`,
        `PAW_SERVER_API_KEY`, `PAW_LLAMACPP_REPACK`, `PAW_BATCH_INVARIANT` and the official config file; keyword
        arguments win."""
        return cls.from_sources(overrides)

    @classmethod
    def from_sources(cls, overrides: Mapping[str, object], labels: Mapping[str, str] | None = None) -> PawConfig:
        """`from_env` whose errors name each value's origin: the variable it came from, else its label in
        `labels` (e.g. ``{"dtype": "--dtype"}``), else the field name."""
        values: dict[str, object] = {}
        origins: dict[str, str] = {}
        stored = _read_config_file()
        if "api_url" in stored:
            values["api_url"], origins["api_url"] = stored["api_url"], f"api_url in {config_file_path()}"
        if "api_key" in stored:
            values["api_key"] = SecretStr(stored["api_key"])
        env = os.environ
        for name, key in _ENV_VARIABLES.items():
            if env.get(key):
                values[name], origins[name] = env[key], key
        for name in ("n_ctx", "max_model_copies", "max_batch_rows", "threads", "call_log_max_bytes", "result_cache_bytes"):
            raw = values.get(name)
            if isinstance(raw, str):
                try:
                    values[name] = int(raw)
                except ValueError:
                    field = cls.model_fields[name]
                    problem = OptionProblem.outside(name, raw, allowed_values(field.annotation, field.metadata))
                    raise OptionError([problem], origins) from None
        if isinstance(values.get("offline"), str):
            values["offline"] = str(values["offline"]).strip().lower() in _TRUTHY
        for name in ("llamacpp_repack", "batch_invariant"):
            if isinstance(values.get(name), str):
                values[name] = _auto_or_bool(name, str(values[name]), origins)
        values.setdefault("cache_dir", default_cache_dir())
        values.update(overrides)  # pydantic turns str into SecretStr and Path
        origins.update({name: (labels or {}).get(name, name) for name in overrides})
        checked: dict[str, Any] = values  # Any: the constructor validates each value against its field
        try:
            return cls(**checked)
        except OptionError as exc:
            raise exc.labeled(origins) from None

    def with_options(self, **changes: object) -> PawConfig:
        """A copy with `changes` applied and validated."""
        checked: dict[str, Any] = self.model_dump() | changes  # Any: the constructor validates them
        return type(self)(**checked)


def _auto_or_bool(name: str, raw: str, origins: Mapping[str, str]) -> bool | None:
    word = raw.strip().lower()
    if word == "auto":
        return None
    if word in _TRUTHY:
        return True
    if word in _FALSY:
        return False
    raise OptionError([OptionProblem.outside(name, raw, "auto, 1 or 0")], origins)


class _StoredConfig(BaseModel):
    model_config = ConfigDict(extra="allow")

    api_key: str | None = None
    api_url: str | None = None


def _read_config_file() -> dict[str, str]:
    path = config_file_path()
    if not path.is_file():
        return {}
    try:
        stored = _StoredConfig.model_validate_json(path.read_bytes())
    except (OSError, ValidationError) as exc:
        raise ConfigError(f"{path}: cannot read the PAW config file ({exc}); fix or delete it") from exc
    return {k: v for k, v in (("api_key", stored.api_key), ("api_url", stored.api_url)) if v}


def save_api_key(key: str) -> Path:
    """Store `key` in the official config file (mode 0600, written atomically); returns the path."""
    path = config_file_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    current = read_json_object(path) or {}
    current["api_key"] = key
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        json.dump(current, handle, indent=2)
        handle.write("\n")
    os.replace(temporary, path)
    os.chmod(path, 0o600)
    return path
