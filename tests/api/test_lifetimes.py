"""Lifetimes: the last program on a base frees it, specializations are one per type pair across threads,
`narrow` gives the precise type or refuses, and a failing llama.cpp load releases every native handle."""

from __future__ import annotations

import gc
import threading
import weakref
from collections.abc import Iterator
from typing import Any

import pytest

from pawfn import (
    GPT2,
    ContextOverflowError,
    InterpreterMismatchError,
    LlamaCpp,
    ModelRegistry,
    PawConfig,
    PawFn,
    ProgramClosedError,
    Qwen3_0_6B,
    Torch,
)
from pawfn.core.errors import AdapterError
from pawfn.llamacpp.context import NativeContext
from tests.helpers.programs import TinyProgram, requires_llama_cpp, torch_program


def test_the_last_program_to_close_frees_its_base(qwen3_program: TinyProgram, qwen3_program_q4: TinyProgram) -> None:
    base = qwen3_program.interpreter.gguf_path
    first = PawFn[Qwen3_0_6B, Torch].load_sync(qwen3_program.folder, base=base)
    second = PawFn[Qwen3_0_6B, Torch].load_sync(qwen3_program_q4.folder, base=base)
    shared = torch_program(first).base
    assert torch_program(second).base is shared and shared.users == 2
    weights = weakref.ref(shared.interpreter.weights.tensors["output_norm.weight"])
    interpreter = weakref.ref(shared.interpreter)
    first_prefix = weakref.ref(torch_program(first).prefix_state.keys[0])
    del shared
    first.close()
    gc.collect()
    assert first_prefix() is None  # a closed program lets go of its prefix's KV, although `first` is still referenced
    assert ModelRegistry.loaded() and weights() is not None  # the second program still runs on it
    assert second.run("hello") == second.run("hello")
    second.close()
    gc.collect()
    assert ModelRegistry.loaded() == []
    assert weights() is None and interpreter() is None  # freed although both handles are still referenced
    with pytest.raises(ProgramClosedError):
        second.run("hello")
    with PawFn[Qwen3_0_6B, Torch].load_sync(qwen3_program.folder, base=base) as again:  # a later load reloads it
        assert again.run("hello") == PawFn[Qwen3_0_6B, Torch].narrow(again).run("hello")
    assert ModelRegistry.load_count() == 2


def test_a_closed_programs_prefix_is_not_kept_by_the_slots_its_calls_used(qwen3_program: TinyProgram, qwen3_program_q4: TinyProgram) -> None:
    """A server evicting programs under load: the base's KV slots that ran an evicted program's calls must not keep its
    prefix's KV alive (33 MB each on Qwen3-0.6B; 8 slots kept ~190 MB of unloaded programs' prefixes)."""
    base = qwen3_program.interpreter.gguf_path
    config = PawConfig(max_model_copies=4)
    first = PawFn[Qwen3_0_6B, Torch].load_sync(qwen3_program.folder, base=base, config=config)
    second = PawFn[Qwen3_0_6B, Torch].load_sync(qwen3_program_q4.folder, base=base, config=config)
    pendings = [first.submit(text) for text in ("hello", "a b c", "numbers 1 2 3", "the end")]  # several slots at once
    assert all(pending.result().text is not None for pending in pendings)
    prefix = weakref.ref(torch_program(first).prefix_state.keys[0])
    del pendings
    first.close()
    gc.collect()
    assert prefix() is None  # the slots its calls ran on (still the base's: `second` runs on it) let it go
    assert second.run("hello") == second.run("hello")
    second.close()


def test_a_failed_open_releases_its_base(qwen3_program: TinyProgram) -> None:
    """A prefix longer than the context fails after the base loaded: the base goes with it."""
    with pytest.raises(ContextOverflowError):
        PawFn[Qwen3_0_6B, Torch].load_sync(qwen3_program.folder, base=qwen3_program.interpreter.gguf_path, config=PawConfig(n_ctx=8))
    assert ModelRegistry.load_count() == 1 and ModelRegistry.loaded() == []


class _RaceQwen(Qwen3_0_6B):
    """A model type no other test specializes, so the threads below race for its first specialization."""


def test_sixteen_threads_get_one_specialization() -> None:
    barrier = threading.Barrier(16)
    classes: list[type[PawFn[Any, Any]]] = []

    def specialize() -> None:
        barrier.wait()
        classes.append(PawFn[_RaceQwen, Torch])

    threads = [threading.Thread(target=specialize) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(classes) == 16 and len(set(classes)) == 1
    assert classes[0] is PawFn[_RaceQwen, Torch] and classes[0].model_type() is _RaceQwen


def test_narrow_gives_the_precise_type_or_refuses(qwen3_program: TinyProgram, gpt2_program: TinyProgram) -> None:
    base = str(qwen3_program.interpreter.gguf_path)
    with PawFn.load_any_sync(str(qwen3_program.folder), Torch, base=base) as loaded:
        assert type(loaded) is PawFn[Qwen3_0_6B, Torch]
        assert PawFn[Qwen3_0_6B, Torch].narrow(loaded) is loaded
        with pytest.raises(InterpreterMismatchError, match=r"load it as PawFn\[Qwen3_0_6B, \.\.\.\] instead"):
            PawFn[GPT2, Torch].narrow(loaded)
        with pytest.raises(TypeError, match=r"runs on Torch as Qwen3_0_6B; load it as PawFn\[Qwen3_0_6B, LlamaCpp\]"):
            PawFn[Qwen3_0_6B, LlamaCpp].narrow(loaded)


@pytest.fixture
def native_spy(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, list[object]]]:
    """Records every llama.cpp model and context made and freed, and every adapter made and freed."""
    import llama_cpp

    seen: dict[str, list[object]] = {"made": [], "closed": [], "adapters": [], "freed": []}

    def spy(name: str, into: str) -> None:
        real = getattr(llama_cpp, name)

        def recorded(*args: Any) -> Any:  # noqa: ANN401 - ctypes handles
            result = real(*args)
            seen[into].append(result if into in ("made", "adapters") else args[0])
            return result

        monkeypatch.setattr(llama_cpp, name, recorded)

    spy("llama_model_load_from_file", "made")
    spy("llama_init_from_model", "made")
    spy("llama_free", "closed")
    spy("llama_model_free", "closed")
    spy("llama_adapter_lora_init", "adapters")
    spy("llama_adapter_lora_free", "freed")
    yield seen


def _all_released(seen: dict[str, list[object]]) -> bool:
    """Every handle made was freed (compared by address: ctypes hands out a new wrapper per call)."""

    def addresses(handles: list[object]) -> list[int]:
        return sorted(handle if isinstance(handle, int) else int(getattr(handle, "value", None) or 0) for handle in handles)

    return addresses(seen["made"]) == addresses(seen["closed"]) and addresses(seen["adapters"]) == addresses(seen["freed"])


@requires_llama_cpp
@pytest.mark.parametrize("failure", ["apply", "eval"])
def test_a_failing_llama_cpp_load_leaves_no_live_handle(
    gpt2_program: TinyProgram, native_spy: dict[str, list[object]], monkeypatch: pytest.MonkeyPatch, failure: str
) -> None:
    import llama_cpp

    if failure == "apply":

        def refuse(*args: object) -> int:
            return 1  # llama.cpp's "could not apply"

        monkeypatch.setattr(llama_cpp, "llama_set_adapters_lora", refuse)
        expected: type[Exception] = AdapterError
    else:

        def failing_eval(self: NativeContext, tokens: object) -> None:
            raise RuntimeError("llama_decode failed")

        monkeypatch.setattr(NativeContext, "eval", failing_eval)
        expected = RuntimeError
    with pytest.raises(expected):
        PawFn[GPT2, LlamaCpp].load_sync(gpt2_program.folder, base=gpt2_program.interpreter.gguf_path)
    assert len(native_spy["made"]) == 2 and _all_released(native_spy)  # the model and its context
    assert len(native_spy["adapters"]) == 1


@requires_llama_cpp
def test_closing_a_llama_cpp_program_releases_its_handles(gpt2_program: TinyProgram, native_spy: dict[str, list[object]]) -> None:
    program = PawFn[GPT2, LlamaCpp].load_sync(gpt2_program.folder, base=gpt2_program.interpreter.gguf_path)
    assert program.run("hello") == program.run("hello")
    assert not _all_released(native_spy)
    program.close()
    assert _all_released(native_spy) and len(native_spy["made"]) == 2


_RSS_SCRIPT = """
import sys
import torch  # its own libraries are not the load's memory
from pawfn import PawConfig, PawFn, Qwen3_0_6B, RuntimeOptions, Torch

def rss_mb():  # the anonymous part: mapped file pages come and go with the page cache under memory pressure
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) / 1024 for line in status if line.startswith("RssAnon"))

before = rss_mb()
config = {"float32": PawConfig(), "numerics": PawConfig(numerics="llamacpp"), "int8": PawConfig(weight_dtype="int8")}[sys.argv[3]]
with PawFn[Qwen3_0_6B, Torch].load_sync(sys.argv[1], base=sys.argv[2], config=config) as program:
    program.generate("hello", RuntimeOptions(max_tokens=4))
    loaded = rss_mb()
print(before, loaded, rss_mb())
"""


@pytest.fixture(scope="module")
def big_qwen3_program(tmp_path_factory: pytest.TempPathFactory) -> TinyProgram:
    """A Qwen3 of ~230 MB of float32 weights (hidden 1536), big enough for its memory to show in RSS."""
    from tests.helpers.programs import make_program
    from tests.helpers.tiny_models import build_interpreter

    root = tmp_path_factory.mktemp("big")
    return make_program(build_interpreter("qwen3", root, width=1536), root, "program")


@pytest.mark.parametrize("mode", ["float32", "numerics", "int8"])
def test_closing_the_last_program_returns_its_memory(big_qwen3_program: TinyProgram, mode: str) -> None:
    """Closing the last program on a base gives back at least 80% of the (anonymous) RSS its load took, in the same process
    (the base and its scheduler held each other, and the load's weights their file, until a garbage collection;
    glibc kept the freed pages until trimmed: nothing came back at close, 65% after a gc.collect() in issue 21's run).
    Every mode runs with one malloc arena, so the measure is what pawfn frees: a thread's arena keeps free space at its
    top that `malloc_trim` does not return, a large share of this small load but not of a real one (int8's pool of
    packing threads: 36-94% came back; float32, loaded on the compute thread: 77% in 4 runs of 6, one to three of its
    18 MB matrices at that arena's top; at Qwen3-0.6B's size with default arenas 91-98%: benchmarks/close_memory.py,
    docs/how-it-runs.md)."""
    import os
    import subprocess
    import sys

    argv = [sys.executable, "-c", _RSS_SCRIPT, str(big_qwen3_program.folder), str(big_qwen3_program.interpreter.gguf_path), mode]
    env = os.environ | {"MALLOC_ARENA_MAX": "1"}
    completed = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=600, env=env)
    before, loaded, closed = map(float, completed.stdout.split())
    assert loaded - before > (200 if mode == "float32" else 50)  # the weights at least: float32 ~230 MB
    assert (loaded - closed) / (loaded - before) >= 0.8, (before, loaded, closed)
    print(f"{mode}: {before:.0f} MB, loaded {loaded:.0f} MB, closed {closed:.0f} MB: {(loaded - closed) / (loaded - before):.0%} back")
