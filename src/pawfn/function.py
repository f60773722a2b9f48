"""`PawFn[M, B]`: a compiled PAW program, typed by its interpreter model and its backend."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar, Generic, TypeVar, cast

from typing_extensions import Self, Unpack

from .backends import Backend, LlamaCpp, Remote, Torch
from .bundle import ProgramMeta, open_bundle
from .config import PawConfig
from .errors import BaseModelError, ConfigError, InterpreterMismatchError, ProgramClosedError
from .hub.cache import PawCache
from .hub.prepare import compile_program, find_cached_base, prepare_program
from .hub.refs import checked_program_id, checked_slug
from .hub.types import CompileSettings, compile_request
from .llamacpp import LlamaCppProgram
from .remote import RemoteProgram
from .models import InterpreterModel, model_for_interpreter
from .options import RuntimeOptions
from .results import Generation
from .runtime import ProgramFiles, ProgramRuntime, RuntimeOpener
from .calls import PendingGeneration, TextStream, gather_in_order, results_in_order

__all__ = ["PawFn", "runtime_opener"]

M = TypeVar("M", bound=InterpreterModel)
B = TypeVar("B", bound=Backend)
OtherM = TypeVar("OtherM", bound=InterpreterModel)
OtherB = TypeVar("OtherB", bound=Backend)

_DEFAULT_OPTIONS = RuntimeOptions()


def _torch_opener() -> RuntimeOpener:
    from .torch import TorchProgram  # torch comes with the first Torch load, not with `import pawfn`

    return TorchProgram.open


_OPENERS: Mapping[type[Backend], Callable[[], RuntimeOpener]] = {Torch: _torch_opener, LlamaCpp: lambda: LlamaCppProgram.open}
"""Each backend's opener, imported when first asked for (a Remote-only client never imports torch)."""


def runtime_opener(backend: type[Backend]) -> RuntimeOpener:
    """How programs open on `backend` (a subclass of a built-in backend opens like it)."""
    for kind in backend.__mro__:
        opener = _OPENERS.get(cast("type[Backend]", kind))  # cast: MRO entries are classes
        if opener is not None:
            return opener()
    if issubclass(backend, Remote):
        raise ConfigError(
            f"{backend.__name__} runs programs on a server, not from files: load them by reference (load_sync, load) with PawConfig.server_url set"
        )
    raise ConfigError(f"backend {backend.__name__} has no implementation; use Torch or LlamaCpp (or a subclass)")


def _checked_input(value: object) -> str:
    """The input text; a non-str is refused at run time too, for callers without a type checker."""
    if not isinstance(value, str):
        raise TypeError(f"input must be str, not {type(value).__name__}")
    return value


def _checked_inputs(inputs: Sequence[str]) -> list[str]:
    """A batch's inputs, every one checked before the first call runs."""
    if isinstance(inputs, str):
        raise TypeError("inputs must be a sequence of strings, not one string; pass [text] for one input")
    return [_checked_input(item) for item in inputs]


def _checked_options(value: object) -> RuntimeOptions:
    if value is None:
        return _DEFAULT_OPTIONS
    if not isinstance(value, RuntimeOptions):
        raise TypeError(f"options must be RuntimeOptions, not {type(value).__name__}")
    return value


def _mismatch(program: str, meta: ProgramMeta, model: type[InterpreterModel]) -> InterpreterMismatchError:
    suggestion = model_for_interpreter(meta.interpreter)
    return InterpreterMismatchError(
        program, meta.interpreter, model.interpreter_id, model.__name__, None if suggestion is None else suggestion.__name__
    )


def _open_on_server(reference: str, base: str | os.PathLike[str] | None, config: PawConfig) -> RemoteProgram:
    if base is not None:
        raise ConfigError("base weights are the server's business on Remote: load without base=")
    return RemoteProgram.open(reference, config)


def _known_interpreter(meta: ProgramMeta) -> type[InterpreterModel]:
    model = model_for_interpreter(meta.interpreter)
    if model is None:
        raise ConfigError(f"program {meta.program_id} needs interpreter {meta.interpreter!r}, which pawfn does not know")
    return model


class PawFn(Generic[M, B]):
    """A loaded program; `PawFn[Qwen3_0_6B, Torch]` keeps its type arguments at run time.

    Load one with `PawFn[Model, Backend].from_path(...)` or `.load_sync(reference)`; call `run` (or `arun`).
    Every load goes through `_open`, every download through `prepare_program`, every compile through
    `compile_program`; the builder and the CLI call these classmethods.
    """

    _model_type: ClassVar[type[InterpreterModel] | None] = None
    _backend_type: ClassVar[type[Backend] | None] = None
    _specializations: ClassVar[dict[tuple[type[InterpreterModel], type[Backend]], type[PawFn[Any, Any]]]] = {}
    _specializations_lock: ClassVar[threading.Lock] = threading.Lock()

    def __class_getitem__(cls, params: object) -> Any:  # noqa: ANN401 - typing's own hook returns Any
        """`PawFn[M, B]` with concrete classes returns a cached subclass that carries M and B (one per pair,
        across threads)."""
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
        with PawFn._specializations_lock:
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
        """Internal: use `PawFn[Model, Backend].from_path(...)` or `.load_sync(...)`."""
        self._runtime = runtime
        self._meta = meta
        self._source = source
        self._config = config
        self._load_ms = load_ms

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
    def narrow(cls, program: PawFn[OtherM, OtherB]) -> Self:
        """`program` typed as this specialization, e.g. `PawFn[Qwen3_0_6B, Torch].narrow(builder_result)`;
        a program of another interpreter raises `InterpreterMismatchError`, of another backend `TypeError`."""
        model, backend = cls.model_type(), cls.backend_type()
        if not model.accepts(program.interpreter):
            raise _mismatch(str(program.program_id or program.source), program.meta, model)
        if isinstance(program, cls):
            return program
        raise TypeError(
            f"{type(program).__name__} is not a {cls.__name__}: it runs on {program.backend_type().__name__} as "
            f"{program.model_type().__name__}; load it as PawFn[{model.__name__}, {backend.__name__}] instead"
        )

    @classmethod
    def _open(cls, bundle: Path, base: Path | None, derived_dir: Path | None, config: PawConfig) -> Self:
        """The one load path: check the interpreter, find the base, open the program on the backend."""
        model = cls.model_type()
        opener = runtime_opener(cls.backend_type())
        started = time.perf_counter()
        cache = PawCache(config.cache_dir, config.lock_timeout_s)
        with open_bundle(bundle, cache.staging_dir()) as opened:
            cls._check_meta(opened.meta, opened.name)
            base = base or find_cached_base(model, opened.meta, cache)
            if base is None:
                raise BaseModelError(
                    None,
                    f"no base weights for {model.__name__} in the cache: pass base=PATH (CLI: --base PATH), a GGUF file "
                    f"such as {model.default_gguf.file} ({model.default_gguf.url}) or a Hugging Face folder of "
                    f"{model.default_hf_repo}, or load by reference with load_sync (it downloads what is missing)",
                )
            files = ProgramFiles(opened, base, derived_dir, cache.base_derived_dir())
            runtime = opener(model, files, config)
        return cls(runtime, opened.meta, bundle, config, (time.perf_counter() - started) * 1e3)

    @classmethod
    def from_path(cls, path: str | os.PathLike[str], *, base: str | os.PathLike[str] | None = None, config: PawConfig | None = None) -> Self:
        """Load a `.paw` zip or bundle folder on base weights `base` (a GGUF file or a HF model folder); without
        `base`, a verified base already in the shared cache. Makes no network request."""
        config = config or PawConfig.from_env()
        bundle = Path(path)
        derived_dir = PawCache(config.cache_dir).derived_dir(bundle)
        return cls._open(bundle, None if base is None else Path(base), derived_dir, config)

    @classmethod
    def _check_meta(cls, meta: ProgramMeta, name: str | None = None) -> None:
        """Refuse a program compiled for another interpreter than M, before any weights load."""
        model = cls.model_type()
        if not model.accepts(meta.interpreter):
            raise _mismatch(name or meta.program_id or "?", meta, model)

    @classmethod
    def load_sync(cls, reference: str, *, base: str | os.PathLike[str] | None = None, config: PawConfig | None = None) -> Self:
        """Load a program by id, slug or path: download what is missing, or use the cache (offline too);
        `base` brings your own base weights (then none are downloaded)."""
        cls.model_type()
        config = config or PawConfig.from_env()
        if issubclass(cls.backend_type(), Remote):
            return cls._connect(reference, base, config)
        prepared = prepare_program(reference, config, check=cls._check_meta, base=None if base is None else Path(base))
        return cls._open(prepared.bundle, prepared.base, prepared.derived_dir, config)

    @classmethod
    def _connect(cls, reference: str, base: str | os.PathLike[str] | None, config: PawConfig) -> Self:
        """The load path of `Remote`: the server's program info, checked against M before any run."""
        started = time.perf_counter()
        return cls._on_server(_open_on_server(reference, base, config), reference, config, started)

    @classmethod
    def _on_server(cls, runtime: RemoteProgram, reference: str, config: PawConfig, started: float) -> Self:
        served = runtime.served
        meta = ProgramMeta(interpreter=served.interpreter, program_id=served.program_id, spec=served.spec)
        try:
            cls._check_meta(meta, reference)
        except BaseException:
            runtime.close()
            raise
        return cls(runtime, meta, Path(reference), config, (time.perf_counter() - started) * 1e3)

    @classmethod
    async def load(cls, reference: str, *, base: str | os.PathLike[str] | None = None, config: PawConfig | None = None) -> Self:
        """`load_sync` in a worker thread: downloads, hashing and weight loading never block the event loop."""
        return await asyncio.to_thread(lambda: cls.load_sync(reference, base=base, config=config))

    @staticmethod
    def load_any_sync(
        reference: str, backend: type[OtherB], *, base: str | os.PathLike[str] | None = None, config: PawConfig | None = None
    ) -> PawFn[InterpreterModel, OtherB]:
        """Load a program with the interpreter model its bundle names (`Qwen3_0_6B`, `GPT2`); narrow the result
        with `PawFn[Model, Backend].narrow(...)` for the precise type."""
        config = config or PawConfig.from_env()
        on_server = issubclass(backend, Remote)  # a flag, not a narrowing: the result keeps the type OtherB
        if on_server:
            started = time.perf_counter()
            runtime = _open_on_server(reference, base, config)
            model = model_for_interpreter(runtime.served.interpreter)
            if model is None:
                runtime.close()
                raise ConfigError(f"the server's program {reference} needs interpreter {runtime.served.interpreter!r}, which pawfn does not know")
            return PawFn.specialize(model, backend)._on_server(runtime, reference, config, started)
        prepared = prepare_program(reference, config, check=_known_interpreter, base=None if base is None else Path(base))
        model = _known_interpreter(prepared.meta)
        return PawFn.specialize(model, backend)._open(prepared.bundle, prepared.base, prepared.derived_dir, config)

    @staticmethod
    async def load_any(
        reference: str, backend: type[OtherB], *, base: str | os.PathLike[str] | None = None, config: PawConfig | None = None
    ) -> PawFn[InterpreterModel, OtherB]:
        """`load_any_sync` in a worker thread."""
        return await asyncio.to_thread(lambda: PawFn.load_any_sync(reference, backend, base=base, config=config))

    @classmethod
    def load_slug_sync(cls, slug: str, *, config: PawConfig | None = None) -> Self:
        """Load `user/slug`, a bare official slug or a pinned `user/slug@vN` (served from the cache)."""
        return cls.load_sync(checked_slug(slug), config=config)

    @classmethod
    async def load_slug(cls, slug: str, *, config: PawConfig | None = None) -> Self:
        """Async `load_slug_sync`."""
        return await asyncio.to_thread(lambda: cls.load_slug_sync(slug, config=config))

    @classmethod
    def load_id_sync(cls, program_id: str, *, config: PawConfig | None = None) -> Self:
        """Load a program by its hash id."""
        return cls.load_sync(checked_program_id(program_id), config=config)

    @classmethod
    async def load_id(cls, program_id: str, *, config: PawConfig | None = None) -> Self:
        """Async `load_id_sync`."""
        return await asyncio.to_thread(lambda: cls.load_id_sync(program_id, config=config))

    @classmethod
    def compile_spec_sync(
        cls, spec: str, compiler: str | None = None, *, config: PawConfig | None = None, **settings: Unpack[CompileSettings]
    ) -> Self:
        """Compile `spec` on the hub (`compiler` None: the server's default) and load the program."""
        cls.model_type()
        config = config or PawConfig.from_env()
        request = compile_request(spec, compiler, **settings)
        return cls.load_id_sync(compile_program(request, config), config=config)

    @classmethod
    async def compile_spec(
        cls, spec: str, compiler: str | None = None, *, config: PawConfig | None = None, **settings: Unpack[CompileSettings]
    ) -> Self:
        """Async `compile_spec_sync`."""
        return await asyncio.to_thread(lambda: cls.compile_spec_sync(spec, compiler, config=config, **settings))

    @property
    def source(self) -> Path:
        """Where the program's bundle was loaded from (on `Remote`: the reference the server was asked for)."""
        return self._source

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
        return self._runtime.closed

    def generate(self, input: str, options: RuntimeOptions | None = None) -> Generation:  # noqa: A002
        """Run the program and return text, token ids and timings."""
        return self._runtime.generate(*self._checked_call(input, options))

    def prompt_token_ids(self, input: str, options: RuntimeOptions | None = None) -> list[int]:  # noqa: A002
        """Token ids of `input` + the template's suffix, as a call evaluates them after the cached prefix."""
        return self._runtime.encode_prompt(_checked_input(input), _checked_options(options))

    def run(self, input: str) -> str:  # noqa: A002
        """Run the program greedily on `input` and return its output text."""
        return self.generate(input).text

    def run_with(self, input: str, options: RuntimeOptions) -> str:  # noqa: A002
        """Run the program with explicit `options` and return its output text."""
        return self.generate(input, options).text

    def submit(self, input: str, options: RuntimeOptions | None = None) -> PendingGeneration:  # noqa: A002
        """Start a call and return a future of its `Generation`, at once on every backend: Torch queues it on its
        base's scheduler (calls in flight are decoded together, each with the tokens it gets alone), llama.cpp on the
        program's own worker (its calls run in turn), Remote sends it. `cancel()` stops a call that is still decoding."""
        return self._runtime.submit(*self._checked_call(input, options))

    def _checked_call(self, input: str, options: RuntimeOptions | None) -> tuple[str, RuntimeOptions]:  # noqa: A002
        """The input and options checked, and the program open (before tokenizing: a closed program says so
        whatever the input)."""
        text, checked = _checked_input(input), _checked_options(options)
        self._check_open()
        return text, checked

    def _check_open(self) -> None:
        if self._runtime.closed:
            raise ProgramClosedError()

    async def agenerate(self, input: str, options: RuntimeOptions | None = None) -> Generation:  # noqa: A002
        """`generate` without blocking the event loop; cancelling the task stops the call at its next token."""
        return await asyncio.wrap_future(await self.asubmit(input, options))

    async def arun(self, input: str, options: RuntimeOptions | None = None) -> str:  # noqa: A002
        """`run` without blocking the event loop; cancelling the task stops the call at its next token."""
        return (await self.agenerate(input, options)).text

    async def asubmit(self, input: str, options: RuntimeOptions | None = None) -> PendingGeneration:  # noqa: A002
        """`submit` for the event loop (it returns at once on every backend)."""
        return self._runtime.submit(*self._checked_call(input, options))

    async def astream(self, input: str, options: RuntimeOptions | None = None) -> TextStream:  # noqa: A002
        """Start a call and follow its text as it is generated: `async for piece in stream` (pieces unstripped), then
        `await stream.generation()`; leaving `async with stream` early cancels the call."""
        text, checked = self._checked_call(input, options)
        stream = TextStream(self._runtime.decode_tokens)
        stream.follow(self._runtime.submit_streaming(text, checked, stream))
        return stream

    def generate_batch(self, inputs: Sequence[str], options: RuntimeOptions | None = None) -> list[Generation]:
        """`generate` for each of `inputs`, results in input order, each exactly what the input gives alone. The
        Torch backend decodes them together (up to `PawConfig.max_batch_rows` rows per pass); llama.cpp one by
        one. If calls fail, the first failing input's error is raised once every call has ended."""
        return results_in_order(self._runtime.submit_batch(*self._checked_batch(inputs, options)))

    def _checked_batch(self, inputs: Sequence[str], options: RuntimeOptions | None) -> tuple[list[str], RuntimeOptions]:
        texts, checked = _checked_inputs(inputs), _checked_options(options)
        self._check_open()
        return texts, checked

    def run_batch(self, inputs: Sequence[str], options: RuntimeOptions | None = None) -> list[str]:
        """The output texts of `generate_batch`."""
        return [generation.text for generation in self.generate_batch(inputs, options)]

    async def arun_batch(self, inputs: Sequence[str], options: RuntimeOptions | None = None) -> list[str]:
        """`run_batch` without blocking the event loop; cancelling the task stops its calls."""
        pendings = self._runtime.submit_batch(*self._checked_batch(inputs, options))
        return [generation.text for generation in await gather_in_order(pendings)]

    def close(self) -> None:
        """Wait for running calls, then free the program's adapter and prefix; the shared base is freed with the
        last program on it. Closing twice is harmless."""
        self._runtime.close()

    def cancel_all(self) -> None:
        """Cancel every call of this program that has not ended, from any thread: queued calls never start, running
        ones stop at their next token; their waiters get `concurrent.futures.CancelledError`."""
        self._runtime.cancel_all()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None) -> None:
        """`close`; left by an interrupt (Ctrl-C's KeyboardInterrupt, SystemExit), the program's calls are cancelled
        first, so closing does not wait for work nobody will read."""
        if exc_type is not None and not issubclass(exc_type, Exception):
            self.cancel_all()
        self.close()

    async def aclose(self) -> None:
        """`close` without blocking the event loop (it waits for the program's running calls in a worker thread)."""
        await asyncio.to_thread(self.close)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None) -> None:
        """`aclose`; left by a cancellation or an interrupt, the program's calls are cancelled first."""
        if exc_type is not None and not issubclass(exc_type, Exception):
            self.cancel_all()
        await self.aclose()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"n_ctx={self.n_ctx}"
        return f"<{type(self).__name__} {self.program_id or self._source} {state}>"
