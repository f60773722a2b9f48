"""`PawFnBuilder`: a typestate builder over `PawFn`'s load path, for any backend (`.backend(LlamaCpp)`; Torch by
default); `.slug()`/`.id()` can only `load`, `.spec()` can only `compile`."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace
from typing import Generic

from typing_extensions import TypeVar

from ..core.backends import Backend, Torch
from ..core.config import PawConfig
from ..core.errors import ConfigError
from .function import PawFn
from ..hub.prepare import compile_program
from ..hub.refs import checked_program_id, checked_slug
from ..hub.types import compile_request
from ..core.models import InterpreterModel

__all__ = ["PawFnBuilder", "ProgramLoader", "SpecCompiler"]

B = TypeVar("B", bound=Backend, default=Torch)
OtherB = TypeVar("OtherB", bound=Backend)


@dataclass(frozen=True)
class _Settings:
    config: PawConfig | None = None
    compiler: str | None = None
    ephemeral: bool = False
    public: bool = True
    name: str | None = None
    slug: str | None = None

    def resolved_config(self) -> PawConfig:
        return self.config or PawConfig.from_env()


class ProgramLoader(Generic[B]):
    """A builder that names an existing program; its only terminals are `load()` and `load_sync()`."""

    def __init__(self, reference: str, settings: _Settings, backend: type[B]) -> None:
        self._reference = reference
        self._settings = settings
        self._backend = backend

    def config(self, config: PawConfig) -> ProgramLoader[B]:
        """Use `config` for the download and the load."""
        return ProgramLoader(self._reference, replace(self._settings, config=config), self._backend)

    def load_sync(self) -> PawFn[InterpreterModel, B]:
        """Fetch (or find in the cache) and load the program; its interpreter comes from the bundle
        (`PawFn[Model, Backend].narrow(...)` gives the precise type)."""
        return PawFn.load_any_sync(self._reference, self._backend, config=self._settings.resolved_config())

    async def load(self) -> PawFn[InterpreterModel, B]:
        """`load_sync` in a worker thread."""
        return await asyncio.to_thread(self.load_sync)


class SpecCompiler(Generic[B]):
    """A builder that holds a spec; its only terminals are `compile()` and `compile_sync()`."""

    def __init__(self, spec: str, settings: _Settings, backend: type[B]) -> None:
        self._spec = spec
        self._settings = settings
        self._backend = backend

    def config(self, config: PawConfig) -> SpecCompiler[B]:
        """Use `config` for the compile, the download and the load."""
        return SpecCompiler(self._spec, replace(self._settings, config=config), self._backend)

    def compiler(self, name: str) -> SpecCompiler[B]:
        """Compile with `name` (e.g. ``paw-4b-qwen3-0.6b``); default: the server's choice."""
        return SpecCompiler(self._spec, replace(self._settings, compiler=name), self._backend)

    def ephemeral(self, value: bool = True) -> SpecCompiler[B]:
        """Ask the server not to keep the program."""
        return SpecCompiler(self._spec, replace(self._settings, ephemeral=value), self._backend)

    def public(self, value: bool = True) -> SpecCompiler[B]:
        """Whether the program is listed publicly."""
        return SpecCompiler(self._spec, replace(self._settings, public=value), self._backend)

    def named(self, name: str) -> SpecCompiler[B]:
        """Give the program a display name."""
        return SpecCompiler(self._spec, replace(self._settings, name=name), self._backend)

    def with_slug(self, slug: str) -> SpecCompiler[B]:
        """Publish the program under your `slug` (needs an API key)."""
        return SpecCompiler(self._spec, replace(self._settings, slug=slug), self._backend)

    def compile_sync(self) -> PawFn[InterpreterModel, B]:
        """Compile on the hub, then load the program; its interpreter comes from the bundle."""
        settings = self._settings
        config = settings.resolved_config()
        request = compile_request(
            self._spec, settings.compiler, ephemeral=settings.ephemeral, public=settings.public, name=settings.name, slug=settings.slug
        )
        return PawFn.load_any_sync(compile_program(request, config), self._backend, config=config)

    async def compile(self) -> PawFn[InterpreterModel, B]:
        """`compile_sync` in a worker thread."""
        return await asyncio.to_thread(self.compile_sync)


class PawFnBuilder(Generic[B]):
    """Start with `PawFnBuilder.builder()`; set options (and `.backend(...)`), then name a program (`slug`/`id`) or a
    `spec`."""

    def __init__(self, settings: _Settings, backend: type[B]) -> None:
        self._settings = settings
        self._backend = backend

    @staticmethod
    def builder() -> PawFnBuilder[Torch]:
        """A builder with default settings (configuration from the environment) on the Torch backend."""
        return PawFnBuilder(_Settings(), Torch)

    def backend(self, backend: type[OtherB]) -> PawFnBuilder[OtherB]:
        """Load on `backend` (`Torch`, `LlamaCpp` or `Remote`) instead."""
        return PawFnBuilder(self._settings, backend)

    def config(self, config: PawConfig) -> PawFnBuilder[B]:
        """Use `config` for every request and the load."""
        return PawFnBuilder(replace(self._settings, config=config), self._backend)

    def compiler(self, name: str) -> PawFnBuilder[B]:
        """The compiler a later `.spec()` uses."""
        return PawFnBuilder(replace(self._settings, compiler=name), self._backend)

    def ephemeral(self, value: bool = True) -> PawFnBuilder[B]:
        """Whether a later `.spec()` compile is ephemeral."""
        return PawFnBuilder(replace(self._settings, ephemeral=value), self._backend)

    def slug(self, slug: str) -> ProgramLoader[B]:
        """Name a program by `user/slug`, bare official slug or `user/slug@vN`."""
        return ProgramLoader(checked_slug(slug), self._settings, self._backend)

    def id(self, program_id: str) -> ProgramLoader[B]:
        """Name a program by its hash id."""
        return ProgramLoader(checked_program_id(program_id), self._settings, self._backend)

    def spec(self, spec: str) -> SpecCompiler[B]:
        """Compile this plain-English spec."""
        if not spec.strip():
            raise ConfigError("the spec is empty; describe the function in plain English")
        return SpecCompiler(spec, self._settings, self._backend)
