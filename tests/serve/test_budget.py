"""The resident-program budget of a server that loads hub programs on request (`--allow-load --max-programs N`): the
least recently used idle program makes room, never one running a call or one named at start; an evicted program
loads again on its next call with the same tokens; loads, evictions and their time are counted."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from pydantic import SecretStr

from pawfn import GPT2, PawConfig, PawFn, ProgramPool, RuntimeOptions, Torch
from pawfn.core.errors import InterpreterMismatchError, NotFoundError
from pawfn.core.protocol import RunResponse
from pawfn.serve.app import create_app
from pawfn.serve.service import LocalPrograms, ProgramBudgetError
from pawfn.serve.settings import ServeSettings
from tests.helpers.hub_server import HubServer
from tests.helpers.programs import TinyProgram
from tests.helpers.tiny_models import write_bundle, zip_bundle

RUNTIME_ID = "tiny-qwen3-f32"
BASE_FILE = "tiny-qwen3.gguf"
IDS = ["a0a0a0a0a0a0a0a0a0a1", "a0a0a0a0a0a0a0a0a0a2", "a0a0a0a0a0a0a0a0a0a3"]
OPTIONS = RuntimeOptions(max_tokens=8)


@pytest.fixture
def hub(qwen3_program: TinyProgram, tmp_path: Path) -> Iterator[tuple[HubServer, PawConfig]]:
    """Three programs (their own prefixes) on one base, served by a real HTTP hub; a config that loads from it."""
    server = HubServer()
    server.serve_runtime(RUNTIME_ID, "Qwen/Qwen3-0.6B", qwen3_program.interpreter.gguf_path.read_bytes(), BASE_FILE)
    for index, program_id in enumerate(IDS):
        meta: dict[str, object] = {"program_id": program_id, "runtime_id": RUNTIME_ID}
        bundle = write_bundle(tmp_path / program_id, qwen3_program.adapter, "Qwen/Qwen3-0.6B", f"Program {index}. " + qwen3_program.template, meta)
        server.serve_program(program_id, zip_bundle(bundle, tmp_path / f"{program_id}.paw").read_bytes())
    config = PawConfig.model_validate({"api_url": server.api_url, "api_key": "k", "cache_dir": tmp_path / "cache", "progress": False})
    yield server, config
    server.close()


def test_the_least_recently_used_idle_program_makes_room(hub: tuple[HubServer, PawConfig]) -> None:
    _, config = hub
    service = LocalPrograms(Torch, config, allow_load=True, max_programs=2)

    async def scenario() -> None:
        first = await service.run(IDS[0], "hello", OPTIONS)
        await service.run(IDS[1], "hello", OPTIONS)
        await service.run(IDS[2], "hello", OPTIONS)  # the budget holds two: IDS[0], used least recently, goes
        assert {program.name for program in await service.programs()} == {IDS[1], IDS[2]}
        again = await service.run(IDS[0], "hello", OPTIONS)  # loaded again from the cache: the same tokens
        assert again.generation.token_ids == first.generation.token_ids
        assert {program.name for program in await service.programs()} == {IDS[2], IDS[0]}
        counters = service.counters()
        assert (counters.program_loads, counters.program_evictions) == (4, 2) and counters.cold_start_s > 0

        # a program running a call stays: IDS[2] streams while IDS[1] loads, so IDS[0] (idle) makes room
        stream = service.stream(IDS[2], "hello", RuntimeOptions(max_tokens=40))
        await anext(stream)
        await service.run(IDS[1], "hello", OPTIONS)
        assert {program.name for program in await service.programs()} == {IDS[2], IDS[1]}
        items = [item async for item in stream]
        assert isinstance(items[-1], RunResponse)
        await service.aclose()

    asyncio.run(scenario())


def test_programs_named_at_start_are_never_unloaded(hub: tuple[HubServer, PawConfig]) -> None:
    _, config = hub
    service = LocalPrograms(Torch, config, allow_load=True, max_programs=1)
    service.load(IDS[0])

    async def scenario() -> None:
        with pytest.raises(ProgramBudgetError, match="at most 1 programs"):
            await service.run(IDS[1], "hello", OPTIONS)
        assert (await service.run(IDS[0], "hello", OPTIONS)).generation.token_ids
        assert {program.name for program in await service.programs()} == {IDS[0]}
        await service.aclose()

    asyncio.run(scenario())


def test_an_operator_loads_and_unloads_programs_over_http(hub: tuple[HubServer, PawConfig]) -> None:
    """`POST /v1/programs/{ref}/load` loads a hub program and keeps it (the budget never replaces it); `/unload`
    frees it (409 while it runs calls, 404 for one not loaded); both need the admin key, not the clients'."""
    _, config = hub
    service = LocalPrograms(Torch, config, allow_load=True, max_programs=2)
    app = create_app(service, ServeSettings(api_key=SecretStr("key"), admin_key=SecretStr("admin")))

    async def scenario() -> None:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://pawfn", headers={"x-api-key": "admin"}) as client:
            for wrong in ("wrong", "key"):
                assert (await client.post(f"/v1/programs/{IDS[0]}/load", headers={"x-api-key": wrong})).status_code == 401
            loaded = await client.post(f"/v1/programs/{IDS[0]}/load")
            assert loaded.status_code == 200 and loaded.json()["name"] == IDS[0]
            for program_id in IDS[1:]:  # each replaces the other: IDS[0] stays
                assert (await client.post(f"/v1/programs/{program_id}/run", json={"input": "hello"})).status_code == 200
            listed = (await client.get("/v1/programs")).json()["programs"]
            assert {program["name"] for program in listed} == {IDS[0], IDS[2]}
            stream = service.stream(IDS[2], "hello", RuntimeOptions(max_tokens=40))
            await anext(stream)
            busy = await client.post(f"/v1/programs/{IDS[2]}/unload")
            assert busy.status_code == 409 and busy.json()["error"] == "program_busy"
            await stream.aclose()
            assert (await client.post(f"/v1/programs/{IDS[0]}/unload")).status_code == 200
            assert (await client.post(f"/v1/programs/{IDS[0]}/unload")).status_code == 404
            assert {program["name"] for program in (await client.get("/v1/programs")).json()["programs"]} == {IDS[2]}
        await service.aclose()

    asyncio.run(scenario())


def test_a_budget_in_bytes_keeps_the_programs_memory_within_it(hub: tuple[HubServer, PawConfig]) -> None:
    """`max_program_bytes` room for two programs' adapters and prefixes: a third replaces the least recently used;
    room for less than one beside a pinned program: the load is refused and its program let go."""
    _, config = hub

    async def scenario() -> None:
        with PawFn.load_any_sync(IDS[0], Torch, config=config) as program:  # one program's adapter and prefix
            one = program.runtime.resident_bytes
        assert one is not None and one > 0

        service = LocalPrograms(Torch, config, allow_load=True, max_program_bytes=one * 5 // 2)
        for program_id in IDS:
            await service.run(program_id, "hello", OPTIONS)
        assert {p.name for p in await service.programs()} == {IDS[1], IDS[2]}
        assert service.counters().program_evictions == 1
        await service.aclose()

        tight = LocalPrograms(Torch, config, allow_load=True, max_program_bytes=one * 3 // 2)
        tight.load(IDS[0])
        with pytest.raises(ProgramBudgetError, match="within"):
            await tight.run(IDS[1], "hello", OPTIONS)
        assert {p.name for p in await tight.programs()} == {IDS[0]}
        await tight.aclose()

    asyncio.run(scenario())


def test_a_ray_replica_keeps_the_same_budget(hub: tuple[HubServer, PawConfig]) -> None:
    """A Ray replica's pool: programs named at start pinned once loaded, the least recently used idle program makes
    room, one running calls never goes, and a program Ray's multiplexing drops is released once idle."""
    pytest.importorskip("ray.serve", reason="the Ray Serve deployment needs the ray extra")
    from pawfn.serve.ray import RayAppArgs, _ProgramReplica  # pyright: ignore[reportPrivateUsage]  # the replica class Ray deploys

    _, config = hub
    replica = _ProgramReplica(RayAppArgs(programs=[f"pinned={IDS[0]}"], allow_load=True, max_programs_per_replica=2, config=config))
    pool = replica._pool  # noqa: SLF001  # pyright: ignore[reportPrivateUsage]  # what the replica holds, seen from the test

    async def scenario() -> None:
        await replica.program("pinned")
        routed = await replica.program(IDS[1])
        await replica.program(IDS[2])  # the budget holds two: IDS[1] (idle) goes, the pinned one stays
        assert {resident.name for resident in pool.resident()} == {IDS[0], IDS[2]}
        async with replica._using(IDS[2]):  # noqa: SLF001  # pyright: ignore[reportPrivateUsage]  # a call running on IDS[2]
            with pytest.raises(ProgramBudgetError):
                await replica.program(IDS[1])
        await replica.program(IDS[1])
        assert {resident.name for resident in pool.resident()} == {IDS[0], IDS[1]}
        await asyncio.to_thread(routed.__del__)  # Ray's LRU dropped IDS[1]: Ray calls __del__ in a worker thread
        for _ in range(50):  # the release runs on this loop
            if len(pool) == 1:
                break
            await asyncio.sleep(0.05)
        assert {resident.name for resident in pool.resident()} == {IDS[0]}
        assert (pool.stats.loads, pool.stats.evictions, pool.stats.releases) == (
            3,
            2,
            1,
        )  # IDS[1] twice and IDS[2]; IDS[1], IDS[2]; Ray dropped IDS[1]
        await pool.aclose()

    asyncio.run(scenario())


def test_a_reference_is_identified_before_anything_is_evicted(hub: tuple[HubServer, PawConfig]) -> None:
    """A full budget: a request for a program the hub does not know answers 404 and evicts nothing; a slug of a
    resident program finds it without a load."""
    server, config = hub
    server.state.slugs["someone/first"] = IDS[0]
    service = LocalPrograms(Torch, config, allow_load=True, max_programs=1)

    async def scenario() -> None:
        await service.run(IDS[0], "hello", OPTIONS)
        with pytest.raises(NotFoundError):
            await service.run("b9b9b9b9b9b9b9b9b9b9", "hello", OPTIONS)
        by_slug = await service.run("someone/first", "hello", OPTIONS)
        assert by_slug.program == IDS[0]
        counters = service.counters()
        assert (counters.program_loads, counters.program_evictions) == (1, 0)
        assert [program.references for program in await service.programs()] == [sorted([IDS[0], "someone/first"])]
        await service.aclose()

    asyncio.run(scenario())


def test_a_cold_program_is_resolved_and_downloaded_once(hub: tuple[HubServer, PawConfig]) -> None:
    """The pool identifies a reference before it evicts anything; the load then opens what that found, asking the
    hub nothing more (it resolved the slug and fetched the runtime manifest twice before)."""
    server, config = hub
    server.state.slugs["someone/first"] = IDS[0]

    async def scenario() -> None:
        async with ProgramPool.any(Torch, config=config, max_programs=1) as pool:
            first = await pool.generate("someone/first", "hello", OPTIONS)
            assert server.state.count(r"/programs/resolve/someone%2Ffirst$") == 1
            assert server.state.count(rf"/programs/{IDS[0]}/download$") == 1
            assert server.state.count(rf"/models/runtimes/{RUNTIME_ID}$") == 1
            await pool.run(IDS[1], "hello", OPTIONS)  # evicts the first
            again = await pool.generate("someone/first", "hello", OPTIONS)  # from the cache: one resolve more, no download
            assert again.token_ids == first.token_ids
            assert server.state.count(r"/programs/resolve/someone%2Ffirst$") == 2
            assert server.state.count(rf"/programs/{IDS[0]}/download$") == 1
            assert pool.stats.loads == 3

    asyncio.run(scenario())


def test_a_pool_refuses_another_interpreters_program_before_its_base_downloads(hub: tuple[HubServer, PawConfig]) -> None:
    """A GPT-2 pool asked for a Qwen3 program: refused once the program's meta is read, its base never fetched."""
    server, config = hub

    async def scenario() -> None:
        async with ProgramPool.of(PawFn[GPT2, Torch], config=config) as pool:
            with pytest.raises(InterpreterMismatchError, match="Qwen/Qwen3-0.6B"):
                await pool.run(IDS[0], "hello", OPTIONS)
            assert len(pool) == 0 and pool.stats.loads == 0
        assert server.state.count(rf"/files/{BASE_FILE}") == 0

    asyncio.run(scenario())


def _series(metrics: str, program: str) -> list[str]:
    return [line for line in metrics.splitlines() if f'program="{program}"' in line and not line.startswith("#")]


def test_a_programs_metric_series_appear_on_load_and_vanish_on_eviction(hub: tuple[HubServer, PawConfig]) -> None:
    _, config = hub
    service = LocalPrograms(Torch, config, allow_load=True, max_programs=2)

    async def scenario() -> None:
        transport = httpx.ASGITransport(app=create_app(service, ServeSettings()))
        async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=120) as client:
            for program_id in IDS[:2]:
                assert (await client.post(f"/v1/programs/{program_id}/run", json={"input": "hello", "options": {"max_tokens": 4}})).status_code == 200
            metrics = (await client.get("/metrics")).text
            for program_id in IDS[:2]:
                names = {line.split("{")[0] for line in _series(metrics, program_id)}
                assert {
                    "pawfn_program_resident",
                    "pawfn_program_calls_total",
                    "pawfn_generated_tokens_total",
                    "pawfn_prompt_tokens_total",
                    "pawfn_program_call_seconds_bucket",
                    "pawfn_program_time_to_first_token_seconds_bucket",
                } <= names, names
            assert f'pawfn_program_calls_total{{program="{IDS[0]}"}} 1.0' in metrics
            stream = await client.post(f"/v1/programs/{IDS[2]}/stream", json={"input": "hello", "options": {"max_tokens": 4}})
            assert "event: done" in stream.text  # IDS[2] came in: IDS[0], used least recently, went
            metrics = (await client.get("/metrics")).text
            assert _series(metrics, IDS[0]) == []  # its series went with it: no more series than resident programs
            assert _series(metrics, IDS[1]) and _series(metrics, IDS[2])
            assert "pawfn_program_evictions_total 1.0" in metrics

        await service.aclose()

    asyncio.run(scenario())
