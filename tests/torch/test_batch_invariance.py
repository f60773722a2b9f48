"""`PawConfig.batch_invariant`: on (the CPU's default) every call decoded in a shared step gets exactly its tokens
alone; off (CUDA's and MPS's default) a step runs one product per matrix and one fused attention over all rows, and
its tokens are measured here against the row-exact ones on the trained models (the figure is printed: run with
`-s`), both paths on this CPU."""

from __future__ import annotations

import pytest
import torch

from pawfn import ConfigError, InterpreterModel, PawConfig, PawFn, RuntimeOptions, Torch
from pawfn.core.options import WeightDType
from pawfn.torch.engine.network import StepRow, TorchInterpreter
from tests.helpers.programs import TinyProgram, torch_program
from tests.helpers.trained import MAX_TOKENS, OFFICIAL_BASE, Family, first_difference, load_trained

AGREEMENT_FLOOR = 0.75
"""Fewest sequences (of the 16 trained inputs) the batched path must share whole with the row-exact one: greedy
decoding on peaked models flips only where two logits are within the batch's rounding of each other."""


@pytest.mark.parametrize("weight_dtype", [None, "int8"])
@pytest.mark.parametrize("family", ["qwen3", "gpt2"])
def test_batched_steps_agree_with_row_exact_steps_on_trained_models(family: Family, weight_dtype: WeightDType | None) -> None:
    fixture = load_trained(family)
    options = RuntimeOptions(max_tokens=MAX_TOKENS)
    found: dict[bool, list[list[int]]] = {}
    for invariant in (True, False):
        config = PawConfig(batch_invariant=invariant, weight_dtype=weight_dtype, max_batch_rows=8, numerics="native")  # torch's, both ways
        with PawFn.specialize(fixture.model, Torch).load_sync(fixture.program, base=fixture.base(OFFICIAL_BASE[family]), config=config) as function:
            scheduler = torch_program(function).base.scheduler
            steps, rows = scheduler.steps, scheduler.rows_stepped
            found[invariant] = [list(generation.token_ids) for generation in function.generate_batch(list(fixture.inputs), options)]
            assert scheduler.rows_stepped - rows > 4 * (scheduler.steps - steps)  # the rows really shared steps
    alone_tokens = found[True]
    same = sum(a == b for a, b in zip(alone_tokens, found[False], strict=True))
    firsts = [first_difference(a, b) for a, b in zip(alone_tokens, found[False], strict=True)]
    print(
        f"\nbatch_invariant=False vs True, {family} ({OFFICIAL_BASE[family]} base, weight_dtype={weight_dtype}): "
        f"{same}/{len(alone_tokens)} sequences of {MAX_TOKENS} greedy tokens identical; first differences at steps "
        f"{sorted(step for step in firsts if step is not None)}"
    )
    assert same >= AGREEMENT_FLOOR * len(alone_tokens)


def test_row_exact_steps_give_each_call_its_tokens_alone(qwen3_program: TinyProgram) -> None:
    """The default on the CPU, stated: the batch equals the calls made one by one (tests/torch/test_scheduler.py checks
    every mode); with it off the same batch still runs, row by row in one fused pass."""
    inputs = ["hello", "Urgent: the server is down!", "a", "numbers 1 2 3"]
    options = RuntimeOptions(max_tokens=6)
    for invariant in (None, False):
        config = PawConfig(batch_invariant=invariant)
        with PawFn.load_any_sync(str(qwen3_program.folder), Torch, base=qwen3_program.interpreter.gguf_path, config=config) as function:
            assert torch_program(function).batch_invariant is (invariant is None)
            alone = [function.generate(text, options).token_ids for text in inputs]
            batch = [generation.token_ids for generation in function.generate_batch(inputs, options)]
            assert all(len(tokens) == 6 for tokens in batch)
            if invariant is None:
                assert batch == alone


def test_llamacpp_numerics_refuse_batched_steps(qwen3_program: TinyProgram) -> None:
    with pytest.raises(ConfigError, match="numerics='llamacpp' computes every row as llama.cpp does alone"):
        PawFn.load_any_sync(
            str(qwen3_program.folder), Torch, base=qwen3_program.interpreter.gguf_path, config=PawConfig(numerics="llamacpp", batch_invariant=False)
        )


def test_the_setting_reads_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    for raw, expected in (("auto", None), ("1", True), ("off", False)):
        monkeypatch.setenv("PAW_BATCH_INVARIANT", raw)
        assert PawConfig.from_env().batch_invariant is expected
    monkeypatch.setenv("PAW_BATCH_INVARIANT", "sometimes")
    with pytest.raises(ConfigError, match="invalid PAW_BATCH_INVARIANT='sometimes': expected auto, 1 or 0"):
        PawConfig.from_env()


@pytest.mark.parametrize("family", ["qwen3", "gpt2"])
def test_a_batched_step_computes_the_row_exact_logits_up_to_rounding(
    family: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every decode step of a batch (rows of two programs, so two prefixes, at different positions) run both ways:
    the fused attention's padding and mask and the batched products give the row-exact logits to float32 rounding."""
    first: TinyProgram = request.getfixturevalue(f"{family}_program")
    second: TinyProgram = request.getfixturevalue(f"{family}_program_q4")
    original = TorchInterpreter.step
    gaps: list[float] = []

    def both(self: TorchInterpreter, rows: list[StepRow], batch_invariant: bool = True) -> torch.Tensor:
        batched = original(self, rows, False)
        exact = original(self, rows, True)  # stored last: the cache keeps the row-exact keys and values
        gaps.append(float((batched - exact).abs().max() / exact.abs().max()))
        return exact

    monkeypatch.setattr(TorchInterpreter, "step", both)
    options = RuntimeOptions(max_tokens=8)
    inputs = ["hello", "Urgent: the server is down! Customers wait.", "a", "numbers 1 2 3"]
    with _load(first) as one, _load(second) as other:
        pending = [function.submit(text, options) for text in inputs for function in (one, other)]
        assert sum(len(p.result().token_ids) for p in pending) > 16  # no call failed, and they decoded
    assert len(gaps) >= 7 and max(gaps) < 1e-4, gaps


def _load(program: TinyProgram) -> PawFn[InterpreterModel, Torch]:
    return PawFn.load_any_sync(str(program.folder), Torch, base=program.interpreter.gguf_path)
