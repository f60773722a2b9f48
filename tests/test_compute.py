"""Every torch operation of the Torch backend runs on its one compute thread, whichever thread calls."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from pawfn import PawConfig, PawFn, Qwen3_0_6B, RuntimeOptions, Torch
from pawfn.torch.compute import on_compute_thread, set_threads
from pawfn.torch.engine import DeviceAdapter, KVCache, TorchInterpreter
from tests.helpers.programs import TinyProgram


def test_calls_from_any_thread_run_on_one_thread() -> None:
    def ident(_: int) -> int:
        return on_compute_thread(threading.get_ident)

    compute = on_compute_thread(threading.get_ident)
    with ThreadPoolExecutor(4) as pool:
        found = set(pool.map(ident, range(8)))
    assert found == {compute} and compute != threading.get_ident()


def test_a_call_on_the_compute_thread_runs_directly() -> None:
    def nested() -> int:
        return on_compute_thread(threading.get_ident)  # would wait for itself if it were queued

    assert on_compute_thread(nested) == on_compute_thread(threading.get_ident)


def test_errors_reach_the_caller() -> None:
    def fail() -> None:
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        on_compute_thread(fail)


def test_forward_passes_run_on_the_compute_thread(qwen3_program: TinyProgram, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: set[int] = set()
    forward = TorchInterpreter.forward

    def recorded(
        self: TorchInterpreter, token_ids: list[int], start: int, cache: KVCache, adapter: DeviceAdapter
    ) -> torch.Tensor:
        seen.add(threading.get_ident())
        return forward(self, token_ids, start, cache, adapter)

    monkeypatch.setattr(TorchInterpreter, "forward", recorded)
    with PawFn[Qwen3_0_6B, Torch].from_path(qwen3_program.folder, base=qwen3_program.interpreter.gguf_path) as program:
        options = RuntimeOptions(max_tokens=4)
        expected = program.generate("hello", options).token_ids
        def tokens(text: str) -> tuple[int, ...]:
            return program.generate(text, options).token_ids

        with ThreadPoolExecutor(3) as pool:
            found = list(pool.map(tokens, ["hello"] * 3))
    assert found == [expected] * 3
    assert seen == {on_compute_thread(threading.get_ident)}


@pytest.mark.parametrize("family", ["qwen3", "gpt2"])
def test_one_thread_gives_the_tokens_of_two(family: str, request: pytest.FixtureRequest) -> None:
    """`PawConfig.threads` changes speed, never tokens (float32, greedy)."""
    program: TinyProgram = request.getfixturevalue(f"{family}_program")
    before = on_compute_thread(torch.get_num_threads)
    options = RuntimeOptions(max_tokens=24)
    found: list[list[tuple[int, ...]]] = []
    try:
        for threads in (1, 2):
            config = PawConfig(threads=threads)
            with PawFn.load_any_sync(str(program.folder), Torch, base=program.interpreter.gguf_path, config=config) as loaded:
                assert on_compute_thread(torch.get_num_threads) == threads
                found.append([loaded.generate(text, options).token_ids for text in ("hello", "Urgent: the server is down!")])
    finally:
        set_threads(before)
    assert found[0] == found[1]
