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
from contextlib import AsyncExitStack, aclosing, asynccontextmanager
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar, cast

import ray.exceptions
from pydantic import BaseModel, ValidationError
from ray import serve
from ray.serve import Application
from ray.serve import metrics as ray_metrics
from ray.serve.handle import DeploymentHandle

from ..core.backends import Backend, LlamaCpp, Torch
from ..core.config import PawConfig
from ..core.errors import ConfigError, PawError, describe_validation_error
from ..api.function import PawFn
from ..api.pool import PoolStats, ProgramPool
from ..core.models import InterpreterModel
from ..core.options import RuntimeOptions
from ..core.protocol import RunBatchResponse, RunResponse, ServedProgram, StreamPiece
from ..calls.runtime import CallInput
from .app import create_app
from .errors import ApiError, api_error
from .service import (
    LoadFailures,
    ServiceCounters,
    check_loadable,
    held_for_request,
    program_info,
    run_call,
    run_calls,
    split_alias,
    stream_call,
    tokenize_call,
)
from .ray_args import RayAppArgs, replica_scaling

__all__ = ["RayAppArgs", "RayPrograms", "app_builder", "ray_app", "replica_scaling"]

_T = TypeVar("_T")
logger = logging.getLogger("pawfn.serve")
_BACKENDS: dict[str, type[Backend]] = {Torch.name: Torch, LlamaCpp.name: LlamaCpp}
_REPLICA_FAILURES = (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError)
_ATTEMPTS = 2
"""A call whose replica dies is sent once more (Ray routes it to a live replica), then reported."""


class _PoolMetrics:
    """A replica's pool totals as Ray's metrics (exported by Ray's own Prometheus endpoint, tagged by replica)."""

    def __init__(self) -> None:
        self.loads = ray_metrics.Counter("pawfn_program_loads", description="Programs loaded on a request, first or again after an eviction.")
        self.evictions = ray_metrics.Counter("pawfn_program_evictions", description="Programs unloaded to stay within the budget.")
        self.cold_start_s = ray_metrics.Counter("pawfn_program_cold_start_seconds", description="Seconds those loads took.")


class _Refused(BaseModel):
    """An error a replica answers with (so the ingress re-raises it as the same response, not a Ray traceback)."""

    status: int
    code: str
    message: str


class _Routed:
    """A program as Ray's multiplexing holds it: a name in the replica's `ProgramPool`. Ray calls `__del__` when its
    LRU drops the name, and the pool then releases the program if it is idle and not pinned (a program running calls
    stays until the pool's own budget lets it go)."""

    def __init__(self, name: str, pool: ProgramPool[InterpreterModel, Backend], loop: asyncio.AbstractEventLoop) -> None:
        self.name = name
        self._pool = pool
        self._loop = loop
        self._released = False

    def __del__(self) -> None:  # sync: Ray runs it in a worker thread, and the garbage collector may run it too
        if self._released:
            return
        self._released = True
        try:
            asyncio.run_coroutine_threadsafe(self._pool.release(self.name), self._loop)
        except RuntimeError:  # the replica's loop is closed: the replica is going, and its programs with it
            pass


class _ProgramReplica:
    """One replica: its programs in a `ProgramPool` (loaded on first request, within `max_programs_per_replica` and
    `max_program_bytes_per_replica`; those named at start are pinned once loaded), routed by Ray's multiplexing."""

    def __init__(self, args: RayAppArgs) -> None:
        self._args = args
        self._backend = _BACKENDS[args.backend]
        self._started = dict(_named(given) for given in args.programs)
        """Every name a program given at start answers to -> the reference it loads from."""
        self._base = None if args.base is None else Path(args.base)
        self._pool = ProgramPool.any(
            self._backend,
            base=self._base,
            config=args.config,
            references=self._started,
            local_paths=False,
            max_programs=args.max_programs_per_replica,
            max_bytes=args.max_program_bytes_per_replica,
            wait_s=args.settings.program_wait_s,
        )
        self._starting = asyncio.Lock()
        self._failures = LoadFailures(args.settings.failed_load_retry_s)
        self._reported = PoolStats(loads=0, evictions=0, releases=0, cold_start_s=0.0)
        self._metrics = _PoolMetrics()

    def _load(self, name: str) -> Awaitable[PawFn[InterpreterModel, Backend]]:
        return PawFn.load_any(self._started.get(name, name), self._backend, base=self._base, config=self._args.config)

    async def program(self, name: str) -> _Routed:
        """The program `name`, loaded into the pool if need be (`ray_app` wraps this in Ray's multiplexing)."""
        async with self._using(name):
            return _Routed(name, self._pool, asyncio.get_running_loop())

    @asynccontextmanager
    async def _using(self, name: str) -> AsyncGenerator[tuple[PawFn[InterpreterModel, Backend], str], None]:
        """The program `name` and its served name, held while the block runs its calls."""
        try:
            if name not in self._pool:
                if name in self._started:
                    await self._start(name)
                else:
                    check_loadable(name, self._args.allow_load, self._started)
            async with AsyncExitStack() as held:
                program = await held_for_request(held, self._pool, name, self._failures)
                yield program, self._pool.describe(name).name
        finally:
            self._report()

    async def _start(self, name: str) -> None:
        """A program named at start joins the pool on its first request, pinned and outside the budget (as
        `pawfn serve --program` loads them before serving)."""
        async with self._starting:
            if name not in self._pool:
                self._pool.add(name, await self._load(name))

    def _report(self) -> None:
        """The pool's new loads, evictions and cold-start seconds to Ray's metrics (per replica)."""
        stats, reported = self._pool.stats, self._reported
        for counter, delta in (
            (self._metrics.loads, stats.loads - reported.loads),
            (self._metrics.evictions, stats.evictions - reported.evictions),
            (self._metrics.cold_start_s, stats.cold_start_s - reported.cold_start_s),
        ):
            if delta > 0:
                counter.inc(delta)
        self._reported = stats

    async def _answer(self, work: Callable[[PawFn[InterpreterModel, Backend], str], Awaitable[_T]]) -> _T | _Refused:
        try:
            async with self._using(serve.get_multiplexed_model_id()) as (program, name):
                await self._program()  # held first: Ray's multiplexing records it without a window to evict it in
                return await work(program, name)
        except PawError as exc:
            return _refused(exc)

    async def _program(self) -> _Routed:
        """Ray's view: the request's program is in this replica's multiplexed LRU (loaded there if it was not)."""
        return await self.program(serve.get_multiplexed_model_id())

    async def info(self) -> ServedProgram | _Refused:
        async def work(program: PawFn[InterpreterModel, Backend], name: str) -> ServedProgram:
            info = program_info(name, self._pool.describe(serve.get_multiplexed_model_id()).references, program)
            return info.model_copy(update={"replica": serve.get_replica_context().replica_id.to_full_id_str()})

        return await self._answer(work)

    async def run(self, text: CallInput, options: RuntimeOptions) -> RunResponse | _Refused:
        return await self._answer(lambda program, name: run_call(program, name, text, options))

    async def run_batch(self, texts: list[str], options: RuntimeOptions) -> RunBatchResponse | _Refused:
        return await self._answer(lambda program, name: run_calls(program, name, texts, options))

    async def tokenize(self, text: CallInput, options: RuntimeOptions) -> list[int] | _Refused:
        async def work(program: PawFn[InterpreterModel, Backend], name: str) -> list[int]:
            return tokenize_call(program, text, options)

        return await self._answer(work)

    async def stream(self, text: CallInput, options: RuntimeOptions) -> AsyncGenerator[StreamPiece | RunResponse | _Refused, None]:
        try:
            async with self._using(serve.get_multiplexed_model_id()) as (program, name), aclosing(stream_call(program, name, text, options)) as items:
                await self._program()
                async for item in items:
                    yield item
        except PawError as exc:
            yield _refused(exc)


def _refused(exc: PawError) -> _Refused:
    """The answer an error becomes, its detail logged here on the replica (the ingress sends only the message)."""
    refused = api_error(exc)
    if refused.detail is not None:
        logger.error("a call on this replica answered %d %s: %s", refused.status, refused.code, refused.detail)
    return _Refused(status=refused.status, code=refused.code, message=refused.message)


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


REQUESTS_PER_COPY = 4
"""A replica's requests in flight per run its base can hold: the calls running plus those queued behind them, so the
base's scheduler always has the next call at hand."""


def replica_ongoing_requests(config: PawConfig) -> int:
    """Ray's `max_ongoing_requests` for a replica: `PawConfig.max_model_copies` (the runs one base holds at once)
    times `REQUESTS_PER_COPY`; past it, Ray queues requests at its router."""
    return config.max_model_copies * REQUESTS_PER_COPY


def ray_app(args: RayAppArgs) -> Application:
    """The Serve application: the ingress in front of the program replicas (`serve.run(ray_app(args))`)."""
    if args.backend not in _BACKENDS:
        raise ConfigError(f"backend {args.backend!r}: use one of {sorted(_BACKENDS)}")

    class PawfnReplica(_ProgramReplica):
        @serve.multiplexed(max_num_models_per_replica=args.max_programs_per_replica)
        async def program(self, name: str) -> _Routed:
            return await super().program(name)

    replicas = serve.deployment(
        name="pawfn-programs",
        max_ongoing_requests=replica_ongoing_requests(args.config),
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
