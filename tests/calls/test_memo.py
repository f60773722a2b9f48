"""The result cache: deterministic calls answered from memory with the very `Generation` the first one computed; sampled
calls, other programs, other options and `bypassing_result_cache()` computed; bounded in bytes, least recently used out."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import BaseModel

from pawfn import PawConfig, PawFn, Qwen3_0_6B, RuntimeOptions, Torch
from pawfn.calls.memo import ResultCache, bypassing_result_cache, entry_bytes, result_cache_for
from pawfn.core.results import Generation, Timings
from tests.helpers.programs import TinyProgram

CACHED = PawConfig(result_cache_bytes=1 << 20)


def _load(program: TinyProgram, config: PawConfig = CACHED) -> PawFn[Qwen3_0_6B, Torch]:
    return PawFn[Qwen3_0_6B, Torch].load_sync(program.archive, base=program.interpreter.gguf_path, config=config)


def test_a_repeated_greedy_call_is_the_generation_the_first_computed(qwen3_program: TinyProgram, qwen3_program_q4: TinyProgram) -> None:
    cache = result_cache_for(CACHED.result_cache_bytes)
    assert cache is not None
    cache.clear()
    options = RuntimeOptions(max_tokens=12)
    with _load(qwen3_program) as program, _load(qwen3_program_q4) as other:
        first = program.generate("hello world", options)
        before = cache.stats()
        again = program.generate("hello world", options)
        assert again == first  # its timings too: nothing was computed again
        assert (cache.stats().hits, cache.stats().misses) == (before.hits + 1, before.misses)
        assert program.generate("hello world", RuntimeOptions(max_tokens=11)).timings != first.timings  # other options: computed
        assert other.generate("hello world", options).token_ids != first.token_ids  # another program: its own answer
        with bypassing_result_cache():
            fresh = program.generate("hello world", options)
        assert fresh.token_ids == first.token_ids and fresh.timings != first.timings

        async def streamed() -> tuple[list[str], Generation]:
            async with await program.astream("hello world", options) as stream:
                return [piece async for piece in stream], await stream.generation()

        pieces, generation = asyncio.run(streamed())
        assert generation == first and "".join(pieces) == program.runtime.decode_tokens(first.token_ids)
        batch = program.generate_batch(["hello world", "a b c", "hello world"], options)
        assert batch[0] == first and batch[2] == first
        with _load(qwen3_program, PawConfig()) as uncached:
            assert [g.token_ids for g in batch] == [g.token_ids for g in uncached.generate_batch(["hello world", "a b c", "hello world"], options)]
            assert uncached.generate("hello world", options).timings != uncached.generate("hello world", options).timings  # off by default


def test_sampled_calls_are_cached_only_when_seeded(qwen3_program: TinyProgram) -> None:
    with _load(qwen3_program) as program:
        hot = RuntimeOptions(max_tokens=10, temperature=1.2)
        assert program.generate("x", hot).timings != program.generate("x", hot).timings
        seeded = hot.model_copy(update={"seed": 4})
        assert program.generate("x", seeded) == program.generate("x", seeded)


class Label(BaseModel):
    urgent: bool


def test_a_typed_call_gets_the_same_value_from_the_cache(qwen3_program: TinyProgram) -> None:
    with _load(qwen3_program) as program:
        typed = program.returning(Label)
        options = RuntimeOptions(max_tokens=200)
        assert typed.run("Server down!", options) == typed.run("Server down!", options)
        assert typed.generate("Server down!", options) == typed.generate("Server down!", options)


def _generation(text: str, tokens: int) -> Generation:
    timings = Timings(tokenize_ms=0, prompt_ms=0, generate_ms=0, total_ms=0)
    return Generation(text=text, token_ids=tuple(range(tokens)), prefix_tokens=0, prompt_tokens=1, stop_reason="eos", timings=timings)


def test_the_cache_keeps_within_its_bytes_least_recently_used_out_first() -> None:
    one = _generation("a" * 100, 10)
    size = entry_bytes(("p", "s0", "{}"), one)
    cache = ResultCache(3 * size)
    keys = [("p", f"s{n}", "{}") for n in range(4)]
    for key in keys[:3]:
        cache.put(key, one)
    assert cache.get(keys[0]) is one  # now the most recently used
    cache.put(keys[3], one)
    assert cache.get(keys[1]) is None and cache.get(keys[0]) is one and cache.get(keys[3]) is one
    stats = cache.stats()
    assert (stats.entries, stats.bytes, stats.evictions, stats.hits, stats.misses) == (3, 3 * size, 1, 3, 1)
    cache.put(("p", "big", "{}"), _generation("b" * 10 * size, 1))  # larger than the whole cache: not stored
    assert cache.stats().entries == 3
    assert ResultCache.key("p", "x", RuntimeOptions(temperature=0.5)) is None  # sampled, unseeded: never cached
    assert ResultCache.key("p", "x", RuntimeOptions(temperature=0.5, seed=1)) is not None


def test_the_size_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PAW_RESULT_CACHE_BYTES", "4096")
    assert PawConfig.from_env().result_cache_bytes == 4096
    assert result_cache_for(0) is None and result_cache_for(4096) is result_cache_for(4096)
