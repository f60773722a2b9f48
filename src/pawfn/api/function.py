"""`PawFn[M, B]`: a compiled PAW program, typed by its interpreter model and its backend."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar, Generic, TypeVar, cast

from typing_extensions import Self, TypeForm, Unpack

from ..core.backends import Backend
from ..formats.bundle import ProgramMeta
from ..core.config import PawConfig
from ..hub.prepare import PreparedProgram, compile_program
from ..hub.refs import checked_slug
from ..hub.types import CompileSettings, compile_request
from ..core.models import InterpreterModel
from ..core.options import RuntimeOptions
from ..formats.outputs import OutputType
from ..core.results import Generation
from ..calls.runtime import ProgramRuntime
from ..calls.caller import Caller, program_caller
from ..calls.pending import TextStream
from .handle import ProgramHandle
from .opening import Opened, expect_model, known_interpreter, open_bare, open_reference
from .specialized import Specializations
from .typed import TypedFn

__all__ = ["PawFn"]

M = TypeVar("M", bound=InterpreterModel)
B = TypeVar("B", bound=Backend)
OtherM = TypeVar("OtherM", bound=InterpreterModel)
OtherB = TypeVar("OtherB", bound=Backend)
T = TypeVar("T")

_SPECIALIZATIONS = Specializations()


class PawFn(ProgramHandle[Generation, str], Generic[M, B]):
    """A loaded program; `PawFn[Qwen3_0_6B, Torch]` keeps its type arguments at run time.

    Load one with `PawFn[Model, Backend].load_sync(reference)` (an id, a slug or a path; `load` is its async twin) and
    call `run` (or `arun`); every call method takes `options`; `evaluate` scores it on cases. Every load goes through
    `opening`, every compile through `compile_program`, every call through one `Caller` (shared with `TypedFn`)."""

    _model_type: ClassVar[type[InterpreterModel] | None] = None
    _backend_type: ClassVar[type[Backend] | None] = None

    def __class_getitem__(cls, params: object) -> Any:  # noqa: ANN401 - typing's own hook returns Any
        """`PawFn[M, B]` with concrete classes returns a cached subclass that carries M and B (one per pair)."""
        generic_alias = cast(object, super().__class_getitem__(params))  # type: ignore[misc]  # Generic's own hook
        specialized = _SPECIALIZATIONS.of(PawFn, params)
        return generic_alias if specialized is None else specialized

    @staticmethod
    def specialize(model: type[OtherM], backend: type[OtherB]) -> type[PawFn[OtherM, OtherB]]:
        """`PawFn[model, backend]` for types chosen at run time (e.g. read from a bundle)."""
        specialized: type[PawFn[OtherM, OtherB]] = PawFn.__class_getitem__((model, backend))
        return specialized

    def __init__(self, runtime: ProgramRuntime, meta: ProgramMeta, source: Path, config: PawConfig, load_ms: float, identity: str | None = None):
        """Internal: use `PawFn[Model, Backend].load_sync(...)` or `.load(...)`."""
        self._runtime = runtime
        self._calls = program_caller(runtime, self.model_type(), self.backend_type().name, meta, source, config, identity)
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
        expect_model(model)(program.meta, str(program.program_id or program.source))
        if isinstance(program, cls):
            return program
        raise TypeError(
            f"{type(program).__name__} is not a {cls.__name__}: it runs on {program.backend_type().__name__} as "
            f"{program.model_type().__name__}; load it as PawFn[{model.__name__}, {backend.__name__}] instead"
        )

    @classmethod
    def _opened(cls, opened: Opened, config: PawConfig) -> Self:
        return cls(opened.runtime, opened.meta, opened.source, config, opened.load_ms, opened.identity)

    @classmethod
    def bare(cls, *, base: str | os.PathLike[str] | None = None, template: str | None = None, config: PawConfig | None = None) -> Self:
        """The interpreter without a program: the official base template, or a numbered one (call it by `Positional`)."""
        config = config or PawConfig.from_env()
        return cls._opened(open_bare(cls.backend_type(), cls.model_type(), None if base is None else Path(base), template, config), config)

    @classmethod
    def load_sync(
        cls, reference: str | os.PathLike[str] | PreparedProgram, *, base: str | os.PathLike[str] | None = None, config: PawConfig | None = None
    ) -> Self:
        """Load a program by id, slug or path (a `.paw` or bundle folder): download what is missing, or use the cache
        (offline too); `base` brings your own base weights (a GGUF file or HF folder; then none are downloaded, and a
        local bundle makes no request). On `Remote`, the server's program. A `PreparedProgram` (`prepare_program`)
        opens from its files without a request."""
        config = config or PawConfig.from_env()
        return cls._opened(open_reference(reference, cls.backend_type(), expect_model(cls.model_type()), config, base), config)

    @classmethod
    async def load(
        cls, reference: str | os.PathLike[str] | PreparedProgram, *, base: str | os.PathLike[str] | None = None, config: PawConfig | None = None
    ) -> Self:
        """`load_sync` in a worker thread: downloads, hashing and weight loading never block the event loop."""
        return await asyncio.to_thread(lambda: cls.load_sync(reference, base=base, config=config))

    @staticmethod
    def load_any_sync(
        reference: str | PreparedProgram, backend: type[OtherB], *, base: str | os.PathLike[str] | None = None, config: PawConfig | None = None
    ) -> PawFn[InterpreterModel, OtherB]:
        """Load a program with the interpreter model its bundle names (`Qwen3_0_6B`, `GPT2`); narrow the result
        with `PawFn[Model, Backend].narrow(...)` for the precise type."""
        config = config or PawConfig.from_env()
        opened = open_reference(reference, backend, known_interpreter, config, base)
        return PawFn.specialize(opened.model, backend)._opened(opened, config)

    @staticmethod
    async def load_any(
        reference: str | PreparedProgram, backend: type[OtherB], *, base: str | os.PathLike[str] | None = None, config: PawConfig | None = None
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
    def compile_spec_sync(
        cls, spec: str, compiler: str | None = None, *, config: PawConfig | None = None, **settings: Unpack[CompileSettings]
    ) -> Self:
        """Compile `spec` on the hub (`compiler` None: the server's default) and load the program."""
        cls.model_type()
        config = config or PawConfig.from_env()
        request = compile_request(spec, compiler, **settings)
        return cls.load_sync(compile_program(request, config), config=config)

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

    @property
    def calls(self) -> Caller:
        """The one implementation of this program's calls (`TypedFn` and `Positional` run on it; advanced use)."""
        return self._calls

    def _result(self, generation: Generation) -> Generation:
        return generation

    def prompt_token_ids(self, input: str, options: RuntimeOptions | None = None) -> list[int]:  # noqa: A002
        """Token ids of `input` + the template's suffix, as a call evaluates them after the cached prefix."""
        return self._calls.encode(input, options)

    def returning(self, output: TypeForm[T]) -> TypedFn[T]:
        """This program returning `output`, decoded under its grammar (`GrammarError` now if the type has none)."""
        return TypedFn(self, OutputType(output))

    def value_of(self, generation: Generation) -> str:
        """A call's value: its text (a typed program parses it)."""
        return generation.text

    def run_with(self, input: str, options: RuntimeOptions) -> str:  # noqa: A002
        """`run` with `options` (paw-rs's name for it)."""
        return self.run(input, options)

    async def astream(self, input: str, options: RuntimeOptions | None = None) -> TextStream:  # noqa: A002
        """Start a call and follow its text as it is generated: `async for piece in stream` (pieces unstripped), then
        `await stream.generation()`; leaving `async with stream` early cancels the call."""
        return self._calls.stream(input, options)

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
