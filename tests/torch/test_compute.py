"""Every torch operation of the Torch backend runs on its one compute thread, whichever thread calls."""

from __future__ import annotations

from collections.abc import Callable

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from pawfn import PawConfig, PawFn, Qwen3_0_6B, RuntimeOptions, Torch
from pawfn.torch.engine.compute import FreeCores, on_compute_thread, set_threads, sharing_cores
from pawfn.torch.model.kvcache import KVCache
from pawfn.torch.weights.lora import DeviceAdapter
from pawfn.torch.engine.network import TorchInterpreter
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
        self: TorchInterpreter, token_ids: list[int], start: int, cache: KVCache, adapter: DeviceAdapter, stop: Callable[[], bool] = lambda: False
    ) -> torch.Tensor:
        seen.add(threading.get_ident())
        return forward(self, token_ids, start, cache, adapter, stop)

    monkeypatch.setattr(TorchInterpreter, "forward", recorded)
    with PawFn[Qwen3_0_6B, Torch].load_sync(qwen3_program.folder, base=qwen3_program.interpreter.gguf_path) as program:
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


class _Machine:
    """A /proc/stat of some CPUs (user, nice, system, idle, iowait, irq, softirq, steal in ticks of 1/100 s) and
    the clocks `FreeCores` reads."""

    def __init__(self, path: Path, cpus: int = 2) -> None:
        self.path, self.now, self.own = path, 0.0, 0.0
        self.ticks = {n: [0] * 8 for n in range(cpus)}
        self.write()

    def write(self) -> None:
        lines = ["cpu " + " ".join(str(sum(t[i] for t in self.ticks.values())) for i in range(8))]
        lines += [f"cpu{n} " + " ".join(map(str, t)) + " 0 0" for n, t in self.ticks.items()]
        self.path.write_text("\n".join(lines) + "\nintr 1 2 3\n")

    def run(self, seconds: float, busy: dict[int, float], own_s: float) -> None:
        """`seconds` pass; CPU n is busy `busy[n]` of them (user time), this process's share `own_s` in all."""
        self.now += seconds
        self.own += own_s
        for cpu, ticks in self.ticks.items():
            ticks[0] += round(100 * busy.get(cpu, 0.0))
            ticks[3] += round(100 * (seconds - busy.get(cpu, 0.0)))
        self.write()


def test_free_cores_leave_out_what_other_processes_hold(tmp_path: Path) -> None:
    machine = _Machine(tmp_path / "stat")
    cores = FreeCores(2, interval_s=0.2, stat=machine.path, cpus={0, 1}, clock=lambda: machine.now, own_cpu_s=lambda: machine.own)
    assert cores.threads() == 2  # nothing measured yet
    machine.run(0.5, {0: 0.5, 1: 0.5}, own_s=1.0)  # pawfn alone on both
    assert cores.threads() == 2
    machine.run(0.5, {0: 0.5, 1: 0.5}, own_s=0.5)  # another process holds a core
    assert cores.threads() == 1
    machine.run(0.1, {0: 0.1, 1: 0.1}, own_s=0.1)
    assert cores.threads() == 1  # not measured again within the interval
    machine.run(0.5, {0: 0.5, 1: 0.5}, own_s=1.0)  # it left
    assert cores.threads() == 2


def test_free_cores_count_only_the_cpus_this_process_may_use(tmp_path: Path) -> None:
    """Another process busy on a CPU outside the affinity mask is not in the way."""
    machine = _Machine(tmp_path / "stat", cpus=3)
    cores = FreeCores(2, stat=machine.path, cpus={0, 1}, clock=lambda: machine.now, own_cpu_s=lambda: machine.own)
    cores.threads()
    machine.run(0.5, {0: 0.5, 1: 0.5, 2: 0.5}, own_s=1.0)
    assert cores.threads() == 2
    machine.run(0.5, {0: 0.5, 1: 0.5, 2: 0.5}, own_s=0.5)  # and one inside it is
    assert cores.threads() == 1


def test_without_proc_stat_every_core_stays(tmp_path: Path) -> None:
    cores = FreeCores(2, stat=tmp_path / "missing")
    assert cores.threads() == 2 and cores.threads() == 2


def test_a_cpu_program_shares_the_cores_unless_threads_are_set(qwen3_program: TinyProgram) -> None:
    """PawConfig.threads None: the thread count follows the idle cores; a number fixes it."""
    base = qwen3_program.interpreter.gguf_path
    try:
        with PawFn[Qwen3_0_6B, Torch].load_sync(qwen3_program.archive, base=base) as program:
            assert sharing_cores()
            program.generate("hello", RuntimeOptions(max_tokens=3))
        with PawFn[Qwen3_0_6B, Torch].load_sync(qwen3_program.archive, base=base, config=PawConfig(threads=1)):
            assert not sharing_cores() and on_compute_thread(torch.get_num_threads) == 1
    finally:
        set_threads(torch.get_num_threads())
