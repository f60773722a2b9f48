"""Continuous batching on a shared base: calls from batches, threads, tasks and several programs share decode steps
and each gets exactly the tokens it gets alone, whatever runs beside it."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Generator
from concurrent.futures import CancelledError, ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from unittest.mock import patch

import pytest
import torch

import pawfn
from pawfn import ContextOverflowError, InterpreterModel, PawConfig, PawFn, RuntimeOptions, Torch
from pawfn.core.options import WeightDType
from pawfn.core.results import Generation
from pawfn.torch.engine.network import StepRow
from pawfn.torch.engine.scheduler import Scheduler
from tests.helpers.programs import TinyProgram, torch_program

# different lengths, so rows start at different positions
INPUTS = ["hello", "Urgent: the server is down! Customers wait and wait.", "a", "numbers 1 2 3", "x y", "the end is near"]
# different limits, so rows leave the batch at different steps
LIMITS = [3, 11, 1, 7, 5, 9]


def _load(program: TinyProgram, **config: object) -> PawFn[InterpreterModel, Torch]:
    return PawFn.load_any_sync(str(program.folder), Torch, base=program.interpreter.gguf_path, config=PawConfig.model_validate(config))


def _scheduler(function: PawFn[InterpreterModel, Torch]) -> Scheduler:
    return torch_program(function).base.scheduler


@contextmanager
def _counting(function: PawFn[InterpreterModel, Torch]) -> Generator[Callable[[], tuple[int, int]], None, None]:
    """(steps, rows stepped) taken inside the block."""
    scheduler = _scheduler(function)
    steps, rows = scheduler.steps, scheduler.rows_stepped
    yield lambda: (scheduler.steps - steps, scheduler.rows_stepped - rows)


def _alone(calls: list[tuple[PawFn[InterpreterModel, Torch], str, RuntimeOptions]]) -> list[Generation]:
    return [function.generate(text, options) for function, text, options in calls]


@pytest.mark.parametrize("family", ["qwen3", "gpt2"])
@pytest.mark.parametrize("weight_dtype", [None, "float16", "int8"])
def test_a_batch_gives_each_input_its_tokens_alone(family: str, weight_dtype: WeightDType | None, request: pytest.FixtureRequest) -> None:
    program: TinyProgram = request.getfixturevalue(f"{family}_program")
    with _load(program, weight_dtype=weight_dtype) as function:
        for options in (RuntimeOptions(max_tokens=12), RuntimeOptions(max_tokens=8, temperature=0.9, seed=3)):
            alone = [function.generate(text, options) for text in INPUTS]
            with _counting(function) as counts:
                batch = function.generate_batch(INPUTS, options)
            steps, rows = counts()
            assert [g.token_ids for g in batch] == [g.token_ids for g in alone]
            assert [g.stop_reason for g in batch] == [g.stop_reason for g in alone]
            assert rows > steps  # rows really shared steps


@pytest.mark.parametrize("family", ["qwen3", "gpt2"])
def test_calls_of_two_programs_on_one_base_share_steps(family: str, request: pytest.FixtureRequest) -> None:
    f32_program: TinyProgram = request.getfixturevalue(f"{family}_program")
    q4_program: TinyProgram = request.getfixturevalue(f"{family}_program_q4")
    with _load(f32_program) as first, _load(q4_program) as second:
        assert _scheduler(first) is _scheduler(second)  # one base, one scheduler
        calls = [
            (first if i % 2 else second, text, RuntimeOptions(max_tokens=limit)) for i, (text, limit) in enumerate(zip(INPUTS, LIMITS, strict=True))
        ]
        alone = _alone(calls)
        assert alone[0].token_ids != _alone([(first, INPUTS[0], RuntimeOptions(max_tokens=3))])[0].token_ids
        with _counting(first) as counts:
            pending = [function.submit(text, options) for function, text, options in calls]
            found = [p.result() for p in pending]
        assert [g.token_ids for g in found] == [g.token_ids for g in alone]
        assert counts()[1] > counts()[0]
        options = RuntimeOptions(max_tokens=6)
        pairs = [(first, INPUTS[0]), (second, INPUTS[1]), (first, INPUTS[2]), (second, INPUTS[0])]
        assert pawfn.run_many(pairs, options) == [function.generate(text, options).text for function, text in pairs]


@pytest.mark.parametrize("family", ["qwen3", "gpt2"])
def test_threads_calling_run_at_once_get_their_tokens_alone(family: str, request: pytest.FixtureRequest) -> None:
    program: TinyProgram = request.getfixturevalue(f"{family}_program")
    with _load(program) as function:
        calls = [(function, INPUTS[i % len(INPUTS)], RuntimeOptions(max_tokens=LIMITS[i % len(LIMITS)])) for i in range(12)]
        alone = _alone(calls)
        barrier = threading.Barrier(len(calls))

        def call(index: int) -> Generation:
            _, text, options = calls[index]
            barrier.wait()
            return function.generate(text, options)

        with _counting(function) as counts, ThreadPoolExecutor(len(calls)) as pool:
            found = list(pool.map(call, range(len(calls))))
        assert [g.token_ids for g in found] == [g.token_ids for g in alone]
        steps, rows = counts()
        assert rows > steps


def test_asyncio_tasks_share_steps_and_a_cancelled_task_leaves(qwen3_program: TinyProgram) -> None:
    with _load(qwen3_program, n_ctx=512) as function:
        options = RuntimeOptions(max_tokens=10)
        expected = [function.run_with(text, options) for text in INPUTS]
        scheduler = _scheduler(function)

        async def main() -> list[str]:
            long_call = asyncio.create_task(function.arun(INPUTS[1], RuntimeOptions(max_tokens=400)))
            while scheduler.steps == 0 or not scheduler.running:  # the long call is decoding
                await asyncio.sleep(0.001)
            texts = asyncio.gather(*(function.arun(text, options) for text in INPUTS))
            long_call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await long_call
            return await texts

        before = scheduler.steps
        assert asyncio.run(main()) == expected
        assert scheduler.steps - before < 400  # the cancelled call did not decode to its end
        assert scheduler.running == 0


def test_a_cancelled_future_stops_a_running_call(qwen3_program: TinyProgram) -> None:
    with _load(qwen3_program, n_ctx=512) as function:
        scheduler = _scheduler(function)
        pending = function.submit(INPUTS[0], RuntimeOptions(max_tokens=400))
        while scheduler.steps == 0:
            threading.Event().wait(0.001)
        assert pending.cancel() is False  # already running: it leaves at the next step instead
        with pytest.raises(CancelledError):
            pending.result()
        assert scheduler.steps < 400  # it left at once, not at its end
        assert function.run_with(INPUTS[0], RuntimeOptions(max_tokens=3))  # the base keeps serving


def test_an_overflowing_row_fails_that_call_only(qwen3_program: TinyProgram) -> None:
    with _load(qwen3_program, n_ctx=64) as function:
        options = RuntimeOptions(max_tokens=4)
        texts = ["hello", "word " * 200, "a"]
        pending = [function.submit(text, options) for text in texts]
        with pytest.raises(ContextOverflowError):
            pending[1].result()
        assert [pending[0].result().text, pending[2].result().text] == [function.run_with(t, options) for t in ("hello", "a")]
        with pytest.raises(ContextOverflowError):  # a batch raises the failing input's error once all have ended
            function.run_batch(texts, options)


def test_rows_per_pass_and_copies_bound_the_batch(qwen3_program: TinyProgram) -> None:
    with ExitStack() as stack:
        function = stack.enter_context(_load(qwen3_program, max_model_copies=3, max_batch_rows=2))
        options = RuntimeOptions(max_tokens=6)
        alone = [function.generate(text, options).token_ids for text in INPUTS]
        with _counting(function) as counts:
            found = [g.token_ids for g in function.generate_batch(INPUTS, options)]
        assert found == alone
        assert torch_program(function).base.n_slots <= 3
        steps, rows = counts()
        assert rows <= 2 * steps and rows > steps


def test_close_waits_for_its_own_calls_only(qwen3_program: TinyProgram, qwen3_program_q4: TinyProgram) -> None:
    with _load(qwen3_program, n_ctx=512) as keeper:
        closing = _load(qwen3_program_q4, n_ctx=512)
        options = RuntimeOptions(max_tokens=8)
        mine = closing.submit(INPUTS[0], options)
        other = keeper.submit(INPUTS[1], RuntimeOptions(max_tokens=200))
        closing.close()  # returns once its own call has ended, while the other program's call still runs
        assert mine.done() and not other.done()
        assert other.result().token_ids == keeper.generate(INPUTS[1], RuntimeOptions(max_tokens=200)).token_ids


def test_submit_returns_before_the_call_runs_and_the_call_takes_no_thread(qwen3_program: TinyProgram) -> None:
    """`submit` queues the call and returns; the scheduler's iterations run on the compute thread, so no thread is
    made for a call or a base (the scheduler had one before the plan/runner split)."""
    with _load(qwen3_program) as function:
        function.generate("hello", RuntimeOptions(max_tokens=2))  # the compute thread exists now
        before = {thread.ident for thread in threading.enumerate()}
        deciders: list[int] = []
        pending = function.runtime.submit("hello", RuntimeOptions(max_tokens=300), lambda token: deciders.append(threading.get_ident()))
        assert not pending.done()
        during = {thread.ident for thread in threading.enumerate()}
        pending.result(timeout=120)
        names = {thread.ident: thread.name for thread in threading.enumerate()}
    assert during <= before, "a thread was started for the call"
    assert len(set(deciders)) == 1 and names[deciders[0]].startswith("pawfn-compute")


def test_a_failing_token_listener_fails_its_call_only(qwen3_program: TinyProgram) -> None:
    with _load(qwen3_program) as function:
        options = RuntimeOptions(max_tokens=6)
        alone = function.generate("hello", options).token_ids

        def broken(token: int) -> None:
            raise ValueError("the listener broke")

        failing = function.runtime.submit("a", options, broken)
        fine = function.submit("hello", options)
        with pytest.raises(ValueError, match="the listener broke"):
            failing.result(timeout=120)
        assert fine.result(timeout=120).token_ids == alone
        assert function.generate("hello", options).token_ids == alone  # the scheduler goes on


def test_row_exact_and_batched_programs_on_one_base_keep_their_choice(qwen3_program: TinyProgram, qwen3_program_q4: TinyProgram) -> None:
    """Two programs on one base, one row-exact and one batched (`batch_invariant`): each decode pass holds the rows
    of one kind only, so neither program's choice is overridden by the other's, and the row-exact calls get their
    tokens alone."""
    with _load(qwen3_program, numerics="native", batch_invariant=True) as exact, _load(qwen3_program_q4, batch_invariant=False) as batched:
        assert _scheduler(exact) is _scheduler(batched)
        interpreter = torch_program(exact).base.interpreter
        kinds = {id(torch_program(exact).device_adapter): True, id(torch_program(batched).device_adapter): False}
        passes: list[tuple[set[bool], bool]] = []
        stepped = interpreter.step

        def recording(rows: list[StepRow], batch_invariant: bool = True) -> torch.Tensor:
            passes.append(({kinds[id(row.adapter)] for row in rows}, batch_invariant))
            return stepped(rows, batch_invariant)

        calls = [
            (exact if i % 2 else batched, text, RuntimeOptions(max_tokens=limit)) for i, (text, limit) in enumerate(zip(INPUTS, LIMITS, strict=True))
        ]
        alone = _alone(calls)
        with patch.object(interpreter, "step", recording):
            pending = [function.submit(text, options) for function, text, options in calls]
            found = [p.result() for p in pending]
        assert [g.token_ids for (function, _, _), g in zip(calls, found, strict=True) if function is exact] == [
            g.token_ids for (function, _, _), g in zip(calls, alone, strict=True) if function is exact
        ]
        assert any(flag for _, flag in passes) and not all(flag for _, flag in passes)
        assert all(kinds_in_pass == {flag} for kinds_in_pass, flag in passes)
