"""The HTTP API on Ray Serve (the `ray` extra): one ingress deployment runs the same FastAPI app as `pawfn serve`,
and a replica deployment holds the programs.

Each replica holds one base per (model, device) and up to `max_programs_per_replica` programs on it, loaded on
their first request. Requests carry their program as Ray Serve's multiplexed model id, so Ray routes them to
replicas that already hold that program; replicas autoscale on their ongoing requests. A replica that dies while
holding a call is retried once on another; then the call fails with `replica_failed` (503).

Locally: `pawfn serve --ray --program REF`. On a cluster: `serve run pawfn.serve.ray:app_builder programs=REF`
(or the same import path in a Serve config file).
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import aclosing
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar, cast

import ray.exceptions
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from ray import serve
from ray.serve import Application
from ray.serve.handle import DeploymentHandle

from ..core.backends import Backend, LlamaCpp, Torch
from ..core.config import PawConfig
from ..core.errors import ConfigError, PawError, describe_validation_error
from ..api.function import PawFn
from ..core.models import InterpreterModel
from ..core.options import RuntimeOptions
from ..core.protocol import RunBatchResponse, RunResponse, ServedProgram, StreamPiece
from ..calls.runtime import CallInput
from .app import ApiError, api_error, create_app
from .service import ServiceCounters, check_loadable, program_info, run_call, run_calls, split_alias, stream_call, tokenize_call
from .settings import ServeSettings

__all__ = ["RayAppArgs", "RayPrograms", "app_builder", "ray_app", "replica_scaling"]

_T = TypeVar("_T")
logger = logging.getLogger("pawfn.serve")
_BACKENDS: dict[str, type[Backend]] = {Torch.name: Torch, LlamaCpp.name: LlamaCpp}
_REPLICA_FAILURES = (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError)
_ATTEMPTS = 2
"""A call whose replica dies is sent once more (Ray routes it to a live replica), then reported."""


class RayAppArgs(BaseModel):
    """What `app_builder` takes (`serve run pawfn.serve.ray:app_builder programs=a,b replicas=2`)."""

    model_config = ConfigDict(extra="forbid")

    programs: list[str] = Field(default_factory=list[str])
    """References served by name from the start (ids, slugs, paths that exist on every node); `NAME=REF` serves REF
    as NAME too."""
    allow_load: bool = False
    """Also load hub programs (ids, slugs) on their first request."""
    backend: str = Torch.name
    base: str | None = None
    replicas: int = Field(default=1, ge=1)
    """Replicas at start (the fewest, when autoscaling)."""
    max_replicas: int | None = Field(default=None, ge=1)
    """Autoscale between `replicas` and this many on ongoing requests per replica; None: fixed."""
    target_ongoing_requests: float = Field(default=4.0, gt=0)
    replica_cpus: float = Field(default=1.0, gt=0)
    """CPUs Ray reserves for each replica (Ray also sets its OMP_NUM_THREADS, so torch's threads, to this)."""
    max_programs_per_replica: int = Field(default=8, ge=1)
    config: PawConfig = Field(default_factory=PawConfig.from_env)
    settings: ServeSettings = Field(default_factory=ServeSettings)

    @field_validator("programs", mode="before")
    @classmethod
    def _comma_separated(cls, value: object) -> object:
        """`serve run ... programs=a,b` gives one string."""
        return [part for part in value.split(",") if part] if isinstance(value, str) else value


class _Refused(BaseModel):
    """An error a replica answers with (so the ingress re-raises it as the same response, not a Ray traceback)."""

    status: int
    code: str
    message: str


class _HeldProgram:
    """A program as Ray's multiplexing holds it: evicted programs are closed (Ray calls `__del__`)."""

    def __init__(self, program: PawFn[InterpreterModel, Backend], name: str, reference: str) -> None:
        self.program = program
        self.name = name
        self.reference = reference

    def __del__(self) -> None:
        self.program.close()


class _ProgramReplica:
    """One replica: its programs, loaded on first request and kept by Ray's multiplexing (LRU)."""

    def __init__(self, args: RayAppArgs) -> None:
        self._args = args
        self._backend = _BACKENDS[args.backend]
        self._started = dict(_named(given) for given in args.programs)
        """Every name a program given at start answers to -> the reference it loads from."""

    async def _load(self, name: str) -> _HeldProgram:
        reference = self._started.get(name, name)
        if name not in self._started:
            check_loadable(reference, self._args.allow_load, self._started)
        base = None if self._args.base is None else Path(self._args.base)
        program = await PawFn.load_any(reference, self._backend, base=base, config=self._args.config)
        return _HeldProgram(program, program.program_id or reference, name)

    async def program(self, reference: str) -> _HeldProgram:
        """The program `reference`, loaded if need be (`ray_app` wraps this in Ray's multiplexing)."""
        return await self._load(reference)

    async def _program(self) -> _HeldProgram:
        return await self.program(serve.get_multiplexed_model_id())

    async def _answer(self, work: Callable[[_HeldProgram], Awaitable[_T]]) -> _T | _Refused:
        try:
            return await work(await self._program())
        except PawError as exc:
            refused = api_error(exc)
            return _Refused(status=refused.status, code=refused.code, message=refused.message)

    async def info(self) -> ServedProgram | _Refused:
        async def work(held: _HeldProgram) -> ServedProgram:
            info = program_info(held.name, [held.reference, held.name], held.program)
            return info.model_copy(update={"replica": serve.get_replica_context().replica_id.to_full_id_str()})

        return await self._answer(work)

    async def run(self, text: CallInput, options: RuntimeOptions) -> RunResponse | _Refused:
        return await self._answer(lambda held: run_call(held.program, held.name, text, options))

    async def run_batch(self, texts: list[str], options: RuntimeOptions) -> RunBatchResponse | _Refused:
        return await self._answer(lambda held: run_calls(held.program, held.name, texts, options))

    async def tokenize(self, text: CallInput, options: RuntimeOptions) -> list[int] | _Refused:
        async def work(held: _HeldProgram) -> list[int]:
            return tokenize_call(held.program, text, options)

        return await self._answer(work)

    async def stream(self, text: CallInput, options: RuntimeOptions) -> AsyncGenerator[StreamPiece | RunResponse | _Refused, None]:
        try:
            held = await self._program()
            async with aclosing(stream_call(held.program, held.name, text, options)) as items:
                async for item in items:
                    yield item
        except PawError as exc:
            refused = api_error(exc)
            yield _Refused(status=refused.status, code=refused.code, message=refused.message)


def _named(given: str) -> tuple[str, str]:
    alias, reference = split_alias(given)
    return alias or reference, reference


def _unwrapped(result: _T | _Refused) -> _T:
    if isinstance(result, _Refused):
        raise ApiError(result.status, result.code, result.message)
    return result


class RayPrograms:
    """`ProgramService` over the replica deployment's handle: each call names its program as the multiplexed
    model id, so it goes to a replica that holds the program when there is one."""

    def __init__(self, replicas: DeploymentHandle[Any], references: Sequence[str]) -> None:  # Any: Ray's handle type
        self._replicas = replicas
        self._references = list(references)
        self._routes: dict[str, str] | None = None
        """A served program's id -> the name it was given at start (what the replicas load it by)."""
        self._learning = asyncio.Lock()
        self._retries = 0

    def _for(self, reference: str, method: str, *, stream: bool = False) -> Any:  # noqa: ANN401 - Ray's handles are untyped
        return getattr(self._replicas.options(multiplexed_model_id=reference, stream=stream), method)

    async def _route(self, reference: str) -> str:
        """The name the replicas know `reference` by: programs given at start also answer to their ids."""
        if reference in self._references:
            return reference
        async with self._learning:
            if self._routes is None:
                infos = [await self._ask(name, "info") for name in self._references]
                self._routes = {}
                for name, info in zip(self._references, infos, strict=True):
                    if info.program_id:  # a program named twice at start answers its id under the first name
                        self._routes.setdefault(info.program_id, name)
        return self._routes.get(reference, reference)

    async def _call(self, reference: str, method: str, *arguments: object) -> Any:  # noqa: ANN401 - Ray's handles are untyped
        return await self._ask(await self._route(reference), method, *arguments)

    async def _ask(self, name: str, method: str, *arguments: object) -> Any:  # noqa: ANN401 - Ray's handles are untyped
        for attempt in range(_ATTEMPTS):
            try:
                return _unwrapped(await self._for(name, method).remote(*arguments))
            except _REPLICA_FAILURES as exc:
                self._retries += attempt + 1 < _ATTEMPTS
                logger.warning("the replica holding %s died during a call (%s)", name, type(exc).__name__)
                if attempt + 1 == _ATTEMPTS:
                    raise ApiError(
                        503,
                        "replica_failed",
                        f"the replica holding {name} died during the call and so did the retry ({type(exc).__name__}); retry the request",
                        {"Retry-After": "1"},
                    ) from exc
        raise AssertionError("unreachable")

    async def programs(self) -> list[ServedProgram]:
        found: dict[str, ServedProgram] = {}
        for reference in self._references:
            info = await self.info(reference)
            known = found.get(info.name)
            references = sorted(set(info.references) | set(known.references if known else []) | {reference})
            found[info.name] = info.model_copy(update={"references": references})
        return list(found.values())

    async def info(self, reference: str) -> ServedProgram:
        info = await self._call(reference, "info")
        assert isinstance(info, ServedProgram)
        return info

    async def load_program(self, reference: str) -> ServedProgram:
        raise ConfigError("loading and unloading programs by request is for `pawfn serve` without --ray: Ray Serve loads them on demand")

    async def unload_program(self, reference: str) -> ServedProgram:
        raise ConfigError("loading and unloading programs by request is for `pawfn serve` without --ray: Ray Serve loads them on demand")

    async def run(self, reference: str, text: CallInput, options: RuntimeOptions) -> RunResponse:
        result = await self._call(reference, "run", text, options)
        assert isinstance(result, RunResponse)
        return result

    async def run_batch(self, reference: str, texts: Sequence[str], options: RuntimeOptions) -> RunBatchResponse:
        result = await self._call(reference, "run_batch", list(texts), options)
        assert isinstance(result, RunBatchResponse)
        return result

    async def stream(self, reference: str, text: CallInput, options: RuntimeOptions) -> AsyncGenerator[StreamPiece | RunResponse, None]:
        items = self._for(await self._route(reference), "stream", stream=True).remote(text, options)
        async for item in items:
            if isinstance(item, _Refused):
                _unwrapped(item)
            assert isinstance(item, (StreamPiece, RunResponse))
            yield item

    async def tokenize(self, reference: str, text: CallInput, options: RuntimeOptions) -> list[int]:
        result = await self._call(reference, "tokenize", text, options)
        return cast(list[int], result)  # cast: a replica's tokenize answers list[int] (a refusal was raised above)

    def served_count(self) -> int:
        return len(self._references)  # the programs named at start (asking the replicas would load them)

    def counters(self) -> ServiceCounters:
        # decode steps are each replica's own (Ray's metrics cover the replicas); retries are the ingress's
        return ServiceCounters(replica_retries=self._retries)

    async def aclose(self) -> None:
        """Replicas belong to Ray: nothing to close here."""


class _Ingress:
    """The HTTP entry: builds the app over the replicas' handle on its replica (Ray calls the builder)."""

    def __init__(self, replicas: DeploymentHandle[Any], args: RayAppArgs) -> None:  # Any: Ray's handle type
        self._service = RayPrograms(replicas, [_named(given)[0] for given in args.programs])
        self._settings = args.settings

    def __serve_build_asgi_app__(self) -> Any:  # noqa: ANN401 - Ray's hook
        return create_app(self._service, self._settings)


def replica_scaling(args: RayAppArgs) -> dict[str, Any]:  # Any: Ray's deployment options
    """The replica deployment's scaling options: a fixed count, or Ray's autoscaling on ongoing requests per replica
    between `replicas` and `max_replicas`."""
    if args.max_replicas is None or args.max_replicas <= args.replicas:
        return {"num_replicas": args.replicas}
    return {
        "autoscaling_config": {
            "min_replicas": args.replicas,
            "max_replicas": args.max_replicas,
            "target_ongoing_requests": args.target_ongoing_requests,
        }
    }


def ray_app(args: RayAppArgs) -> Application:
    """The Serve application: the ingress in front of the program replicas (`serve.run(ray_app(args))`)."""
    if args.backend not in _BACKENDS:
        raise ConfigError(f"backend {args.backend!r}: use one of {sorted(_BACKENDS)}")

    class PawfnReplica(_ProgramReplica):
        @serve.multiplexed(max_num_models_per_replica=args.max_programs_per_replica)
        async def program(self, reference: str) -> _HeldProgram:
            return await self._load(reference)

    replicas = serve.deployment(
        name="pawfn-programs",
        max_ongoing_requests=args.config.max_model_copies * 4,
        ray_actor_options={"num_cpus": args.replica_cpus},
        **replica_scaling(args),
    )(PawfnReplica)
    ingress = serve.deployment(  # it parses HTTP and awaits the replicas: no CPU of its own reserved
        name="pawfn-ingress", max_ongoing_requests=args.settings.max_queue, ray_actor_options={"num_cpus": 0}
    )(serve.ingress()(_Ingress))
    return ingress.bind(replicas.bind(args), args)


def app_builder(args: dict[str, Any]) -> Application:  # Any: Ray hands over the config file's args as parsed
    """Ray Serve's application-builder hook: `serve run pawfn.serve.ray:app_builder programs=a,b replicas=2`, or
    `import_path: pawfn.serve.ray:app_builder` with `args:` in a Serve config file (validated as `RayAppArgs`)."""
    try:
        return ray_app(RayAppArgs.model_validate(args))
    except ValidationError as exc:
        raise ConfigError(f"pawfn's Ray application: {describe_validation_error(exc)}") from exc
