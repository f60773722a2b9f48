"""PawFn[M, B]: real type arguments, loading, running, threads, async, the prefix cache and the registry."""

from __future__ import annotations

import asyncio
import threading
import typing
from collections.abc import Callable, Iterator
from concurrent.futures import CancelledError, ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import pytest
import torch

from pawfn import (
    GPT2,
    Backend,
    ArityError,
    BaseModelError,
    ContextOverflowError,
    InterpreterMismatchError,
    InterpreterModel,
    LlamaCpp,
    ModelRegistry,
    OfflineError,
    OptionError,
    PawConfig,
    PawFn,
    Positional,
    ProgramClosedError,
    Qwen3_0_6B,
    RuntimeOptions,
    Torch,
)
from pawfn.core.models import WeightFile
from pawfn.calls.pending import PendingGeneration
from pawfn.torch.model.kvcache import KVCache, PrefixState
from pawfn.torch.weights.lora import DeviceAdapter
from pawfn.torch.engine.network import StepRow, TorchInterpreter
from tests.helpers.programs import TinyProgram, requires_llama_cpp, torch_program
from tests.helpers.tiny_models import TinyInterpreter

GREEDY_24 = RuntimeOptions(max_tokens=24)
INPUTS = ["Urgent: the server is down!", "hello", "I love this product", "", "the lazy dog"]


@pytest.fixture
def qwen(qwen3_program: TinyProgram) -> Iterator[PawFn[Qwen3_0_6B, Torch]]:
    # A random model never says EOS: a small window keeps runs without max_tokens short.
    config = PawConfig(n_ctx=160)
    with PawFn[Qwen3_0_6B, Torch].load_sync(qwen3_program.folder, base=qwen3_program.interpreter.gguf_path, config=config) as f:
        yield f


def test_type_arguments_are_kept_at_run_time(qwen: PawFn[Qwen3_0_6B, Torch]) -> None:
    specialized = PawFn[Qwen3_0_6B, Torch]
    assert specialized is PawFn[Qwen3_0_6B, Torch]
    assert issubclass(specialized, PawFn)
    assert specialized.model_type() is Qwen3_0_6B and specialized.backend_type() is Torch
    assert PawFn[GPT2, Torch].model_type() is GPT2
    assert type(qwen) is specialized
    assert specialized.__name__ == "PawFn[Qwen3_0_6B, Torch]"


AnyModel = TypeVar("AnyModel", bound=InterpreterModel)


def _generic_user(program: PawFn[AnyModel, Torch]) -> AnyModel | None:
    return None


def test_type_variables_stay_typing_aliases() -> None:
    """Annotations with type variables still evaluate (to typing aliases, not specializations)."""
    alias = typing.get_type_hints(_generic_user)["program"]
    assert typing.get_origin(alias) is PawFn
    assert typing.get_args(alias) == (AnyModel, Torch)
    assert not isinstance(alias, type)


def test_type_arguments_are_checked() -> None:
    with pytest.raises(TypeError, match="first type argument must be an InterpreterModel subclass"):
        PawFn[int, Torch]  # type: ignore[type-var]  # the point of the test
    with pytest.raises(TypeError, match="second type argument must be a Backend subclass"):
        PawFn[Qwen3_0_6B, str]  # type: ignore[type-var]  # the point of the test


def test_unparameterized_load_is_refused(qwen3_program: TinyProgram) -> None:
    with pytest.raises(TypeError, match=r"use PawFn\[Qwen3_0_6B, Torch\]"):
        PawFn.load_sync(qwen3_program.folder, base=qwen3_program.interpreter.gguf_path)


def test_markers_are_not_instantiated() -> None:
    with pytest.raises(TypeError, match="type marker"):
        Qwen3_0_6B()
    with pytest.raises(TypeError, match="type marker"):
        Torch()


def test_interpreter_mismatch_is_refused_before_weights_load(gpt2_program: TinyProgram, tmp_path: Path) -> None:
    with pytest.raises(InterpreterMismatchError, match="compiled for interpreter 'gpt2'.*loaded as Qwen3_0_6B") as info:
        PawFn[Qwen3_0_6B, Torch].load_sync(gpt2_program.folder, base=tmp_path / "never-read.gguf")
    assert info.value.found == "gpt2" and info.value.expected == "Qwen/Qwen3-0.6B"
    assert ModelRegistry.load_count() == 0


def test_run_variants_agree(qwen: PawFn[Qwen3_0_6B, Torch]) -> None:
    generation = qwen.generate(INPUTS[0])
    assert qwen.run(INPUTS[0]) == generation.text
    assert qwen.run_with(INPUTS[0], RuntimeOptions()) == generation.text
    assert asyncio.run(qwen.arun(INPUTS[0])) == generation.text
    assert asyncio.run(qwen.agenerate(INPUTS[0])).token_ids == generation.token_ids
    assert qwen.run_with(INPUTS[0], GREEDY_24) == qwen.generate(INPUTS[0], GREEDY_24).text == qwen.run(INPUTS[0], GREEDY_24)
    assert generation.text == generation.text.strip()


def test_properties(qwen: PawFn[Qwen3_0_6B, Torch], qwen3_program: TinyProgram) -> None:
    assert qwen.interpreter == "Qwen/Qwen3-0.6B"
    assert qwen.spec == "tiny test program"
    assert qwen.program_id == "0123456789abcdef0123"
    assert qwen.n_ctx == 160
    assert qwen.prefix_tokens == len(qwen3_program.interpreter.tokenizer().encode(qwen3_program.template.split("{")[0]).ids)
    assert "0123456789abcdef0123" in repr(qwen)


def test_arun_decodes_off_the_event_loop(qwen: PawFn[Qwen3_0_6B, Torch], monkeypatch: pytest.MonkeyPatch) -> None:
    threads: list[int] = []
    original = TorchInterpreter.step

    def spy(self: TorchInterpreter, rows: list[StepRow], batch_invariant: bool = True) -> torch.Tensor:
        threads.append(threading.get_ident())
        return original(self, rows, batch_invariant)

    monkeypatch.setattr(TorchInterpreter, "step", spy)

    async def main() -> tuple[str, int]:
        ticks = 0
        done = asyncio.Event()

        async def ticker() -> None:
            nonlocal ticks
            while not done.is_set():
                ticks += 1
                await asyncio.sleep(0.001)

        task = asyncio.create_task(ticker())
        text = await qwen.arun(INPUTS[0], RuntimeOptions(max_tokens=64))
        done.set()
        await task
        return text, ticks

    text, ticks = asyncio.run(main())
    assert threads and threads[0] != threading.get_ident()
    assert ticks > 1  # the loop kept turning while the program ran
    assert text == qwen.run_with(INPUTS[0], RuntimeOptions(max_tokens=64))


@pytest.mark.parametrize("copies", [1, 2])
def test_concurrent_runs_match_sequential_ones(qwen3_program: TinyProgram, copies: int) -> None:
    config = PawConfig(max_model_copies=copies)
    base = qwen3_program.interpreter.gguf_path
    with PawFn[Qwen3_0_6B, Torch].load_sync(qwen3_program.folder, base=base, config=config) as function:
        expected = {text: function.generate(text, GREEDY_24).token_ids for text in INPUTS}

        def run(text: str) -> tuple[str, tuple[int, ...]]:
            return text, function.generate(text, GREEDY_24).token_ids

        with ThreadPoolExecutor(max_workers=4) as pool:
            results = list(pool.map(run, INPUTS * 4))
        shared = torch_program(function).base
    assert all(tokens == expected[text] for text, tokens in results)
    assert 1 <= shared.n_slots <= copies


def test_two_programs_share_one_base_and_keep_their_own_state(qwen3_program: TinyProgram, qwen3_program_q4: TinyProgram) -> None:
    base = qwen3_program.interpreter.gguf_path
    alone_a = PawFn[Qwen3_0_6B, Torch].load_sync(qwen3_program.folder, base=base)
    expected_a = [alone_a.generate(t, GREEDY_24).token_ids for t in INPUTS]
    alone_a.close()
    ModelRegistry.clear()
    alone_b = PawFn[Qwen3_0_6B, Torch].load_sync(qwen3_program_q4.folder, base=base)
    expected_b = [alone_b.generate(t, GREEDY_24).token_ids for t in INPUTS]
    alone_b.close()
    ModelRegistry.clear()

    first = PawFn[Qwen3_0_6B, Torch].load_sync(qwen3_program.folder, base=base)
    second = PawFn[Qwen3_0_6B, Torch].load_sync(qwen3_program_q4.folder, base=base)
    assert ModelRegistry.load_count() == 1
    assert torch_program(first).base is torch_program(second).base
    for index, text in enumerate(INPUTS):  # interleaved: no KV or adapter state leaks between programs
        assert second.generate(text, GREEDY_24).token_ids == expected_b[index]
        assert first.generate(text, GREEDY_24).token_ids == expected_a[index]
    assert expected_a != expected_b


def test_registry_keys(qwen3_program: TinyProgram) -> None:
    tiny = qwen3_program.interpreter
    a = PawFn[Qwen3_0_6B, Torch].load_sync(qwen3_program.folder, base=tiny.gguf_path)
    b = PawFn[Qwen3_0_6B, Torch].load_sync(qwen3_program.archive, base=tiny.gguf_path)
    assert ModelRegistry.load_count() == 1
    c = PawFn[Qwen3_0_6B, Torch].load_sync(qwen3_program.folder, base=tiny.gguf_path, config=PawConfig(dtype="bfloat16"))
    d = PawFn[Qwen3_0_6B, Torch].load_sync(qwen3_program.folder, base=tiny.hf_dir)
    assert ModelRegistry.load_count() == 3
    assert {key.dtype for key in ModelRegistry.loaded()} == {"float32", "bfloat16"}
    assert a.run_with("hello", GREEDY_24) == b.run_with("hello", GREEDY_24) == d.run_with("hello", GREEDY_24)
    assert isinstance(c.run_with("hello", GREEDY_24), str)


def test_one_base_whatever_name_a_program_gives_its_arithmetic(qwen3_program: TinyProgram) -> None:
    """`auto` resolves to llama.cpp's arithmetic on this GGUF base: a program naming `auto` and one naming `llamacpp`
    share one base (in either order); `native` is another arithmetic, so another base."""
    base = qwen3_program.interpreter.gguf_path
    auto = PawFn[Qwen3_0_6B, Torch].load_sync(qwen3_program.folder, base=base, config=PawConfig(numerics="auto"))
    named = PawFn[Qwen3_0_6B, Torch].load_sync(qwen3_program.folder, base=base, config=PawConfig(numerics="llamacpp"))
    assert torch_program(auto).numerics == torch_program(named).numerics == "llamacpp"
    assert ModelRegistry.load_count() == 1 and torch_program(auto).base is torch_program(named).base
    assert [key.numerics for key in ModelRegistry.loaded()] == ["llamacpp"]
    assert auto.run_with("hello", GREEDY_24) == named.run_with("hello", GREEDY_24)
    auto.close()
    named.close()
    ModelRegistry.clear()
    named = PawFn[Qwen3_0_6B, Torch].load_sync(qwen3_program.folder, base=base, config=PawConfig(numerics="llamacpp"))
    auto = PawFn[Qwen3_0_6B, Torch].load_sync(qwen3_program.folder, base=base, config=PawConfig(numerics="auto"))
    assert ModelRegistry.load_count() == 1 and torch_program(auto).base is torch_program(named).base
    native = PawFn[Qwen3_0_6B, Torch].load_sync(qwen3_program.folder, base=base, config=PawConfig(numerics="native"))
    assert ModelRegistry.load_count() == 2 and torch_program(native).numerics == "native"


def test_a_mirror_model_is_its_own_type(qwen3_program: TinyProgram, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Subclassing a built-in model points at private weights; its default base is found in the PAW cache."""

    class MirrorQwen(Qwen3_0_6B):
        default_gguf = WeightFile(repo="me/mirror", file="mirror.gguf")

    cache = tmp_path / "paw-cache"
    (cache / "base_models").mkdir(parents=True)
    (cache / "base_models" / "mirror.gguf").write_bytes(qwen3_program.interpreter.gguf_path.read_bytes())
    monkeypatch.setenv("PAW_CACHE_DIR", str(cache))
    with (
        PawFn[MirrorQwen, Torch].load_sync(qwen3_program.folder, config=PawConfig.from_env(offline=True)) as mirror,
        PawFn[Qwen3_0_6B, Torch].load_sync(qwen3_program.folder, base=qwen3_program.interpreter.gguf_path) as plain,
    ):
        assert type(mirror).model_type() is MirrorQwen
        assert mirror.run_with("hello", GREEDY_24) == plain.run_with("hello", GREEDY_24)
        assert {key.model for key in ModelRegistry.loaded()} == {MirrorQwen, Qwen3_0_6B}


def test_missing_default_base_says_what_to_pass(qwen3_program: TinyProgram, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PAW_CACHE_DIR", str(tmp_path))
    with pytest.raises(OfflineError, match=r"qwen3-0.6b-q6_k.gguf .* is not in the cache .* \(base=PATH in Python\)"):
        PawFn[Qwen3_0_6B, Torch].load_sync(qwen3_program.folder, config=PawConfig.from_env(offline=True))


def test_wrong_base_is_refused(qwen3_program: TinyProgram, gpt2: TinyInterpreter) -> None:
    with pytest.raises(BaseModelError, match="GGUF architecture is 'gpt2', but Qwen3_0_6B needs 'qwen3'"):
        PawFn[Qwen3_0_6B, Torch].load_sync(qwen3_program.folder, base=gpt2.gguf_path)
    with pytest.raises(BaseModelError, match="model_type is 'gpt2', but Qwen3_0_6B needs 'qwen3'"):
        PawFn[Qwen3_0_6B, Torch].load_sync(qwen3_program.folder, base=gpt2.hf_dir)
    with pytest.raises(BaseModelError, match="this GGUF is a LoRA adapter"):
        PawFn[Qwen3_0_6B, Torch].load_sync(qwen3_program.folder, base=qwen3_program.adapter)


def test_unavailable_device_is_a_clear_error(qwen3_program: TinyProgram) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(BaseModelError, match="torch sees no CUDA device; use device='cpu'"):
        PawFn[Qwen3_0_6B, Torch].load_sync(qwen3_program.folder, base=qwen3_program.interpreter.gguf_path, config=PawConfig(device="cuda"))


def test_prefix_is_evaluated_once_and_reused(qwen3_program: TinyProgram, monkeypatch: pytest.MonkeyPatch) -> None:
    prefills: list[int] = []
    forwards: list[tuple[int, int]] = []
    original_prefill = TorchInterpreter.prefill_prefix
    original_forward = TorchInterpreter.forward

    def count_prefill(self: TorchInterpreter, ids: list[int], adapter: DeviceAdapter, cache: KVCache) -> PrefixState:
        prefills.append(len(ids))
        return original_prefill(self, ids, adapter, cache)

    def record_forward(
        self: TorchInterpreter, ids: list[int], start: int, cache: KVCache, adapter: DeviceAdapter, stop: Callable[[], bool] = lambda: False
    ) -> torch.Tensor:
        forwards.append((len(ids), start))
        return original_forward(self, ids, start, cache, adapter, stop)

    original_step = TorchInterpreter.step

    def record_step(self: TorchInterpreter, rows: list[StepRow], batch_invariant: bool = True) -> torch.Tensor:
        forwards.extend((1, row.position) for row in rows)
        return original_step(self, rows, batch_invariant)

    monkeypatch.setattr(TorchInterpreter, "prefill_prefix", count_prefill)
    monkeypatch.setattr(TorchInterpreter, "forward", record_forward)
    monkeypatch.setattr(TorchInterpreter, "step", record_step)
    function = PawFn[Qwen3_0_6B, Torch].load_sync(qwen3_program.folder, base=qwen3_program.interpreter.gguf_path)
    n_prefix = function.prefix_tokens
    forwards.clear()
    first = function.generate(INPUTS[0], RuntimeOptions(max_tokens=4))
    second = function.generate(INPUTS[0], RuntimeOptions(max_tokens=4))
    assert prefills == [n_prefix]
    assert first.token_ids == second.token_ids
    # Each call evaluates only input + suffix at position n_prefix, then one token per decode step.
    prompt = (first.prompt_tokens, n_prefix)
    assert (
        forwards
        == [prompt, (1, n_prefix + first.prompt_tokens), (1, n_prefix + first.prompt_tokens + 1), (1, n_prefix + first.prompt_tokens + 2)] * 2
    )


def test_cached_prefix_gives_the_same_tokens_as_a_full_evaluation(qwen: PawFn[Qwen3_0_6B, Torch]) -> None:
    runtime = torch_program(qwen)
    interpreter = runtime.base.interpreter
    for text in INPUTS:
        ids = list(runtime.prefix_state.token_ids) + qwen.prompt_token_ids(text)
        cache = interpreter.new_cache()
        logits = interpreter.forward(ids, 0, cache, runtime.device_adapter)
        expected: list[int] = []
        for _ in range(12):
            token = int(torch.argmax(logits).item())
            if token == interpreter.weights.codec.eos_id:
                break
            expected.append(token)
            logits = interpreter.forward([token], len(ids), cache, runtime.device_adapter)
            ids.append(token)
        assert list(qwen.generate(text, RuntimeOptions(max_tokens=12)).token_ids) == expected


def test_close_frees_the_adapter(qwen3_program: TinyProgram) -> None:
    with PawFn[Qwen3_0_6B, Torch].load_sync(qwen3_program.folder, base=qwen3_program.interpreter.gguf_path) as function:
        runtime = torch_program(function)
        assert runtime.device_adapter.pairs
    assert function.closed
    assert runtime.device_adapter.pairs == {}
    with pytest.raises(ProgramClosedError, match="closed"):
        function.run("hello")
    function.close()  # idempotent


def test_bad_arguments(qwen: PawFn[Qwen3_0_6B, Torch]) -> None:
    with pytest.raises(TypeError, match="input must be str, not int"):
        qwen.run(42)  # type: ignore[arg-type]  # the point of the test
    with pytest.raises(TypeError, match="options must be RuntimeOptions, not dict"):
        qwen.generate("x", {"max_tokens": 3})  # type: ignore[arg-type]  # the point of the test


def test_max_tokens(qwen: PawFn[Qwen3_0_6B, Torch]) -> None:
    assert qwen.generate("hello", RuntimeOptions(max_tokens=0)).token_ids == ()
    assert qwen.run_with("hello", RuntimeOptions(max_tokens=0)) == ""
    five = qwen.generate("hello", RuntimeOptions(max_tokens=5))
    assert len(five.token_ids) == 5 and five.stop_reason == "max_tokens"


@pytest.mark.parametrize("backend", [Torch, pytest.param(LlamaCpp, marks=requires_llama_cpp)], ids=["torch", "llamacpp"])
def test_a_stop_sequence_ends_the_call_and_cuts_the_text_before_it(qwen3_program: TinyProgram, backend: type[Backend]) -> None:
    with PawFn.specialize(Qwen3_0_6B, backend).load_sync(qwen3_program.archive, base=qwen3_program.interpreter.gguf_path) as program:
        free = program.generate("hello world", RuntimeOptions(max_tokens=24))
        whole = program.runtime.decode_tokens(free.token_ids)
        middle = len(whole) // 2
        stop = whole[middle : middle + 3].strip() or whole[middle]  # characters a late token spells
        first = whole.find(stop)
        stopped = program.generate("hello world", RuntimeOptions(max_tokens=24, stop=("never here", stop)))
        assert stopped.stop_reason == "stop"
        assert stopped.text == whole[:first].strip()
        assert free.token_ids[: len(stopped.token_ids)] == stopped.token_ids  # the same tokens, up to the stop's last
        spelled = program.runtime.decode_tokens(stopped.token_ids)
        assert stop in spelled and stop not in program.runtime.decode_tokens(stopped.token_ids[:-1])
        unmet = program.generate("hello world", RuntimeOptions(max_tokens=24, stop=("never here",)))
        assert unmet == free.model_copy(update={"timings": unmet.timings})


def test_stop_sequences_are_bounded() -> None:
    with pytest.raises(OptionError, match="stop"):
        RuntimeOptions(stop=("a", "b", "c", "d", "e"))
    with pytest.raises(OptionError, match="stop"):
        RuntimeOptions(stop=("",))


def test_context_overflow(qwen3_program: TinyProgram) -> None:
    config = PawConfig(n_ctx=64)
    with PawFn[Qwen3_0_6B, Torch].load_sync(qwen3_program.folder, base=qwen3_program.interpreter.gguf_path, config=config) as f:
        with pytest.raises(ContextOverflowError, match=r"context window=64; shorten the input or raise n_ctx") as info:
            f.run("word " * 100)
        assert info.value.n_ctx == 64 and info.value.prefix_tokens == f.prefix_tokens
    with pytest.raises(ContextOverflowError):
        PawFn[Qwen3_0_6B, Torch].load_sync(qwen3_program.folder, base=qwen3_program.interpreter.gguf_path, config=PawConfig(n_ctx=8))


def test_gpt2_context_is_capped_by_its_position_table(gpt2_program: TinyProgram) -> None:
    with PawFn[GPT2, Torch].load_sync(gpt2_program.folder, base=gpt2_program.interpreter.gguf_path) as function:
        assert function.n_ctx == 256  # the tiny GPT-2 has 256 positions; n_ctx asked 2048


def test_sampling_is_seeded(qwen: PawFn[Qwen3_0_6B, Torch]) -> None:
    hot = RuntimeOptions(max_tokens=16, temperature=1.5, seed=7)
    assert qwen.generate("hello", hot).token_ids == qwen.generate("hello", hot).token_ids
    runs = {qwen.generate("hello", hot.model_copy(update={"seed": seed})).token_ids for seed in range(6)}
    assert len(runs) > 1
    narrow = RuntimeOptions(max_tokens=16, temperature=1.5, top_p=1e-6, seed=3)
    assert qwen.generate("hello", narrow).token_ids == qwen.generate("hello", RuntimeOptions(max_tokens=16)).token_ids


@pytest.mark.parametrize("backend", [Torch, pytest.param(LlamaCpp, marks=requires_llama_cpp)], ids=["torch", "llamacpp"])
def test_astream_gives_the_text_as_generated_then_the_same_generation(qwen3_program: TinyProgram, backend: type[Backend]) -> None:
    options = RuntimeOptions(max_tokens=12)
    with PawFn.specialize(Qwen3_0_6B, backend).load_sync(qwen3_program.archive, base=qwen3_program.interpreter.gguf_path) as program:
        expected = program.generate("hello world", options)

        async def follow() -> tuple[list[str], tuple[int, ...]]:
            async with await program.astream("hello world", options) as stream:
                pieces = [piece async for piece in stream]
                return pieces, (await stream.generation()).token_ids

        async def leave_early() -> None:
            async with await program.astream("hello world", RuntimeOptions(max_tokens=40)) as stream:
                async for _ in stream:
                    break
            with pytest.raises(asyncio.CancelledError):
                await stream.generation()

        pieces, token_ids = asyncio.run(follow())
        assert token_ids == expected.token_ids
        assert "".join(pieces) == program.runtime.decode_tokens(expected.token_ids) and len(pieces) > 1
        asyncio.run(leave_early())
        assert program.generate("hello world", options).token_ids == expected.token_ids  # nothing left behind


def _open(program: TinyProgram) -> PawFn[Qwen3_0_6B, Torch]:
    return PawFn[Qwen3_0_6B, Torch].load_sync(program.archive, base=program.interpreter.gguf_path)


def _long_calls(program: PawFn[Qwen3_0_6B, Torch]) -> list[PendingGeneration]:
    """Two calls to the end of the context (~2,000 tokens each), the first one decoding when this returns."""
    pendings = [program.submit("hello"), program.submit("Urgent: the server is down!")]
    while not (pendings[0].running() or pendings[0].done()):
        threading.Event().wait(0.001)
    return pendings


def test_cancel_all_stops_running_and_queued_calls(qwen3_program: TinyProgram) -> None:
    with _open(qwen3_program) as program:
        expected = program.generate("hello", RuntimeOptions(max_tokens=6)).token_ids
        pendings = _long_calls(program)
        program.cancel_all()
        for pending in pendings:
            with pytest.raises(CancelledError):
                pending.result(timeout=120)
        assert program.generate("hello", RuntimeOptions(max_tokens=6)).token_ids == expected  # nothing left behind


def test_an_interrupt_leaving_the_with_block_cancels_the_calls(qwen3_program: TinyProgram) -> None:
    """Ctrl-C in the block: closing does not wait for ~2,000-token calls nobody will read; an ordinary error does."""
    pendings: list[PendingGeneration] = []
    with pytest.raises(KeyboardInterrupt), _open(qwen3_program) as program:
        pendings = _long_calls(program)
        raise KeyboardInterrupt
    for pending in pendings:
        with pytest.raises(CancelledError):
            pending.result(timeout=0)
    waited: list[PendingGeneration] = []
    with pytest.raises(ValueError, match="the caller's own"), _open(qwen3_program) as program:
        waited.append(program.submit("hello", RuntimeOptions(max_tokens=40)))
        raise ValueError("the caller's own")
    assert len(waited[0].result(timeout=0).token_ids) == 40


def test_every_way_to_call_checks_the_arguments_once(qwen3_program: TinyProgram) -> None:
    """`PawFn`, `TypedFn` and `Positional` share one call implementation: a wrong count, a wrong kind and a closed
    program are refused the same way by each, before any work."""
    program = PawFn[Qwen3_0_6B, Torch].load_sync(qwen3_program.folder, base=qwen3_program.interpreter.gguf_path)
    typed = program.returning(bool)
    with pytest.raises(ArityError, match="takes 1 positional argument"):
        Positional[str, str](program).run("a", "b")
    with pytest.raises(TypeError, match="input must be str"):
        typed.run(3)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # the run-time check
    with pytest.raises(TypeError, match="must be str or pawfn.Image"):
        Positional[int](program).run(3)
    program.close()
    for call in (lambda: program.run("x"), lambda: typed.run("x"), lambda: Positional[str](program).run("x"), lambda: program.run_batch(["x"])):
        with pytest.raises(ProgramClosedError):
            call()
