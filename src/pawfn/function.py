"""`PawFn[M, B]`: a compiled PAW program, typed by its interpreter model and its backend."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar, Generic, TypeVar, cast

from typing_extensions import Self

from .backends import Backend, ProgramRuntime
from .bundle import ProgramMeta, open_bundle
from .errors import BaseModelError, ConfigError, InterpreterMismatchError, PawError, ProgramClosedError
from .generation import Generation
from .models import InterpreterModel
from .config import PawConfig
from .options import RuntimeOptions

__all__ = ["PawFn", "cached_base_path"]

M = TypeVar("M", bound=InterpreterModel)
B = TypeVar("B", bound=Backend)
OtherM = TypeVar("OtherM", bound=InterpreterModel)
OtherB = TypeVar("OtherB", bound=Backend)

_DEFAULT_OPTIONS = RuntimeOptions()


def _checked_input(value: object) -> str:
    """The input text; a non-str is refused at run time too, for callers without a type checker."""
    if not isinstance(value, str):
        raise TypeError(f"input must be str, not {type(value).__name__}")
    return value


def _checked_options(value: object) -> RuntimeOptions:
    if value is None:
        return _DEFAULT_OPTIONS
    if not isinstance(value, RuntimeOptions):
        raise TypeError(f"options must be RuntimeOptions, not {type(value).__name__}")
    return value


def cached_base_path(model: type[InterpreterModel], meta: ProgramMeta, cache_dir: Path) -> Path | None:
    """A verified base GGUF in the shared cache (no network): the one the program's runtime manifest names,
    else the model type's own `default_gguf` (how a mirror subclass points at its weights)."""
    from .hub.cache import PawCache
    from .hub.runtimes import resolve_runtime
    from .hub.types import BaseModelSource

    cache = PawCache(cache_dir)
    sources: list[BaseModelSource] = []
    try:
        named = resolve_runtime(meta, cache, None).local_sdk.base_model
        sources += [] if named is None else [named]
    except PawError:
        pass
    pinned = model.default_gguf
    sources.append(BaseModelSource(file=pinned.file, size_bytes=pinned.size_bytes, sha256=pinned.sha256))
    for source in sources:
        found = cache.verified_base_model(source)
        if found is not None:
            return found
    return None


class PawFn(Generic[M, B]):
    """A loaded program; `PawFn[Qwen3_0_6B, Torch]` keeps its type arguments at run time.

    Load one with `PawFn[Model, Backend].from_path(...)`; call `run` (or `arun`) with plain text.
    """

    _model_type: ClassVar[type[InterpreterModel] | None] = None
    _backend_type: ClassVar[type[Backend] | None] = None
    _specializations: ClassVar[dict[tuple[type[InterpreterModel], type[Backend]], type[PawFn[Any, Any]]]] = {}

    def __class_getitem__(cls, params: object) -> Any:  # noqa: ANN401 - typing's own hook returns Any
        """`PawFn[M, B]` with concrete classes returns a cached subclass that carries M and B."""
        generic_alias = cast(object, super().__class_getitem__(params))  # type: ignore[misc]  # Generic's own hook
        arguments = cast("tuple[object, ...]", params if isinstance(params, tuple) else (params,))  # cast: checked below
        if len(arguments) != 2:
            return generic_alias
        model, backend = arguments
        if not (isinstance(model, type) and isinstance(backend, type)):
            return generic_alias  # type variables and forward references stay typing aliases
        if not issubclass(model, InterpreterModel):
            raise TypeError(f"PawFn's first type argument must be an InterpreterModel subclass, not {model!r}")
        if not issubclass(backend, Backend):
            raise TypeError(f"PawFn's second type argument must be a Backend subclass, not {backend!r}")
        key = (model, backend)
        specialized = PawFn._specializations.get(key)
        if specialized is None:
            name = f"PawFn[{model.__name__}, {backend.__name__}]"
            namespace = {"_model_type": model, "_backend_type": backend, "__module__": cls.__module__}
            specialized = type(name, (PawFn,), namespace)
            specialized.__qualname__ = name
            PawFn._specializations[key] = specialized
        return specialized

    @staticmethod
    def specialize(model: type[OtherM], backend: type[OtherB]) -> type[PawFn[OtherM, OtherB]]:
        """`PawFn[model, backend]` for types chosen at run time (e.g. read from a bundle)."""
        specialized: type[PawFn[OtherM, OtherB]] = PawFn.__class_getitem__((model, backend))
        return specialized

    def __init__(self, runtime: ProgramRuntime, meta: ProgramMeta, source: Path, config: PawConfig, load_ms: float):
        """Internal: use `PawFn[Model, Backend].from_path(...)`."""
        self._runtime = runtime
        self._meta = meta
        self._source = source
        self._config = config
        self._load_ms = load_ms
        self._closed = False

    @classmethod
    def model_type(cls) -> type[InterpreterModel]:
        """The interpreter-model type argument (M)."""
        if cls._model_type is None:
            raise TypeError("PawFn needs its type arguments: use PawFn[Qwen3_0_6B, Torch] (or GPT2)")
        return cls._model_type

    @classmethod
    def backend_type(cls) -> type[Backend]:
        """The backend type argument (B)."""
        if cls._backend_type is None:
            raise TypeError("PawFn needs its type arguments: use PawFn[Qwen3_0_6B, Torch] (or GPT2)")
        return cls._backend_type

    @classmethod
    def from_path(
        cls, path: str | os.PathLike[str], *, base: str | os.PathLike[str] | None = None, config: PawConfig | None = None
    ) -> Self:
        """Load a `.paw` zip or bundle folder on base weights `base` (a GGUF file or a HF model folder)."""
        model = cls.model_type()
        backend = cls.backend_type()
        config = config or PawConfig.from_env()
        started = time.perf_counter()
        with open_bundle(Path(path)) as bundle:
            if not model.accepts(bundle.meta.interpreter):
                raise InterpreterMismatchError(
                    bundle.name, bundle.meta.interpreter, model.interpreter_id, model.__name__
                )
            base_path = Path(base) if base is not None else cached_base_path(model, bundle.meta, config.cache_dir)
            if base_path is None:
                raise BaseModelError(
                    None,
                    f"no base weights for {model.__name__} in the cache: pass base=PATH, a GGUF file such as "
                    f"{model.default_gguf.file} ({model.default_gguf.url}) or a Hugging Face folder of "
                    f"{model.default_hf_repo}, or load by reference with load_sync (it downloads what is missing)",
                )
            runtime = backend.open_program(model, bundle, base_path, config)
        return cls(runtime, bundle.meta, Path(path), config, (time.perf_counter() - started) * 1e3)

    @classmethod
    def _check_meta(cls, meta: ProgramMeta) -> None:
        model = cls.model_type()
        if not model.accepts(meta.interpreter):
            raise InterpreterMismatchError(meta.program_id or "?", meta.interpreter, model.interpreter_id, model.__name__)

    @classmethod
    def load_sync(cls, reference: str, *, config: PawConfig | None = None) -> Self:
        """Load a program by id, slug or path: download what is missing, or use the cache (offline too)."""
        from .hub.loader import prepare_program

        cls.model_type()
        config = config or PawConfig.from_env()
        prepared = prepare_program(reference, config, check=cls._check_meta)
        return cls.from_path(prepared.bundle, base=prepared.base, config=config)

    @classmethod
    async def load(cls, reference: str, *, config: PawConfig | None = None) -> Self:
        """`load_sync` in a worker thread: downloads, hashing and weight loading never block the event loop."""
        return await asyncio.to_thread(lambda: cls.load_sync(reference, config=config))

    @classmethod
    def load_slug_sync(cls, slug: str, *, config: PawConfig | None = None) -> Self:
        """Load `user/slug`, a bare official slug or a pinned `user/slug@vN` (served from the cache)."""
        from .hub.refs import parse_reference

        if parse_reference(slug).kind != "slug":
            raise ConfigError(f"{slug!r} is not a slug; use load_id for ids and from_path for local bundles")
        return cls.load_sync(slug, config=config)

    @classmethod
    async def load_slug(cls, slug: str, *, config: PawConfig | None = None) -> Self:
        """Async `load_slug_sync`."""
        return await asyncio.to_thread(lambda: cls.load_slug_sync(slug, config=config))

    @classmethod
    def load_id_sync(cls, program_id: str, *, config: PawConfig | None = None) -> Self:
        """Load a program by its hash id."""
        from .hub.refs import is_program_id

        if not is_program_id(program_id):
            raise ConfigError(f"{program_id!r} is not a program id (16-64 lowercase hex digits)")
        return cls.load_sync(program_id, config=config)

    @classmethod
    async def load_id(cls, program_id: str, *, config: PawConfig | None = None) -> Self:
        """Async `load_id_sync`."""
        return await asyncio.to_thread(lambda: cls.load_id_sync(program_id, config=config))

    @classmethod
    def compile_spec_sync(
        cls,
        spec: str,
        compiler: str | None = None,
        *,
        config: PawConfig | None = None,
        name: str | None = None,
        tags: list[str] | None = None,
        public: bool = True,
        slug: str | None = None,
        ephemeral: bool = False,
    ) -> Self:
        """Compile `spec` on the hub (`compiler` None: the server's default) and load the program."""
        from .hub.client import PawClient
        from .hub.types import CompileRequest

        cls.model_type()
        config = config or PawConfig.from_env()
        request = CompileRequest(
            spec=spec, compiler=compiler, name=name, tags=tags, public=public, slug=slug, ephemeral=ephemeral or None
        )
        with PawClient(config) as client:
            result = client.compile(request)
        assert result.program_id is not None  # compile() raises CompileError otherwise
        return cls.load_id_sync(result.program_id, config=config)

    @classmethod
    async def compile_spec(
        cls,
        spec: str,
        compiler: str | None = None,
        *,
        config: PawConfig | None = None,
        name: str | None = None,
        tags: list[str] | None = None,
        public: bool = True,
        slug: str | None = None,
        ephemeral: bool = False,
    ) -> Self:
        """Async `compile_spec_sync`."""
        return await asyncio.to_thread(
            lambda: cls.compile_spec_sync(
                spec, compiler, config=config, name=name, tags=tags, public=public, slug=slug, ephemeral=ephemeral
            )
        )

    @property
    def interpreter(self) -> str:
        """The interpreter the program was compiled for (from meta.json)."""
        return self._meta.interpreter

    @property
    def spec(self) -> str | None:
        """The plain-English spec the program was compiled from, if the bundle records it."""
        return self._meta.spec

    @property
    def program_id(self) -> str | None:
        """The program's hub id, if the bundle records it."""
        return self._meta.program_id

    @property
    def meta(self) -> ProgramMeta:
        """The program's `meta.json`."""
        return self._meta

    @property
    def config(self) -> PawConfig:
        """The configuration the program was loaded with."""
        return self._config

    @property
    def n_ctx(self) -> int:
        """Context window in tokens (prefix + input + output)."""
        return self._runtime.n_ctx

    @property
    def prefix_tokens(self) -> int:
        """Length of the program's cached prompt prefix in tokens."""
        return self._runtime.prefix_tokens

    @property
    def load_ms(self) -> float:
        """Time the load took, in milliseconds (base weights included when this load read them)."""
        return self._load_ms

    @property
    def runtime(self) -> ProgramRuntime:
        """The backend's handle on the program (advanced use)."""
        return self._runtime

    @property
    def closed(self) -> bool:
        """Whether `close()` was called."""
        return self._closed

    def generate(self, input: str, options: RuntimeOptions | None = None) -> Generation:  # noqa: A002
        """Run the program and return text, token ids and timings."""
        text, checked = _checked_input(input), _checked_options(options)
        if self._closed:
            raise ProgramClosedError("this program was closed; load it again to run it")
        return self._runtime.generate(text, checked)

    def prompt_token_ids(self, input: str, options: RuntimeOptions | None = None) -> list[int]:  # noqa: A002
        """Token ids of `input` + the template's suffix, as a call evaluates them after the cached prefix."""
        return self._runtime.encode_prompt(_checked_input(input), _checked_options(options))

    def run(self, input: str) -> str:  # noqa: A002
        """Run the program greedily on `input` and return its output text."""
        return self.generate(input).text

    def run_with(self, input: str, options: RuntimeOptions) -> str:  # noqa: A002
        """Run the program with explicit `options` and return its output text."""
        return self.generate(input, options).text

    async def arun(self, input: str, options: RuntimeOptions | None = None) -> str:  # noqa: A002
        """`run` in a worker thread, so the event loop never blocks."""
        generation = await asyncio.to_thread(self.generate, input, options)
        return generation.text

    def close(self) -> None:
        """Free the program's adapter and prefix cache; the shared base stays for other programs."""
        if not self._closed:
            self._closed = True
            self._runtime.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"n_ctx={self.n_ctx}"
        return f"<{type(self).__name__} {self.program_id or self._source} {state}>"
