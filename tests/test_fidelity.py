"""pawfn against the official runtime on the trained fixtures (peaked models, where rounding decides few tokens):
exact float32 on the F32 files gives llama.cpp's every token; on the official files (quantized base, Q4_0 adapter,
f16 KV) each mode keeps at least its measured share (`benchmarks/fidelity.py` prints the whole table)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import pytest

from pawfn import GPT2, InterpreterModel, PawConfig, PawFn, Qwen3_0_6B, RuntimeOptions, Torch
from pawfn.options import WeightDType
from tests.helpers.programs import requires_llama_cpp
from tests.helpers.references import llama_generate_each
from tests.helpers.trained import BaseType, TrainedProgram, differences, load_trained

pytestmark = [requires_llama_cpp, pytest.mark.llamacpp]
MAX_TOKENS = 32
OFFICIAL_BASE: dict[str, BaseType] = {"qwen3": "q6_k", "gpt2": "q8_0"}
Family = Literal["qwen3", "gpt2"]
FLOORS: dict[tuple[str, WeightDType | None], int] = {
    ("qwen3", None): 9, ("qwen3", "float16"): 9, ("qwen3", "int8"): 8,
    ("gpt2", None): 8, ("gpt2", "float16"): 8, ("gpt2", "int8"): 7,
}
"""Least sequences (of 16) equal to the official runtime's, per (family, weight dtype): one below the fewest
measured (`benchmarks/fidelity.py` on an Intel Xeon: qwen3 10, 10, 9 and gpt2 9, 9, 10 with llama.cpp's AVX-512
build; 10, 10, 9 and 11, 11, 8 with an AVX2-only llama.cpp; 10, 10, 9 and 9, 9, 9 with torch's AVX2 kernels), as
other CPUs round differently. The official-numerics work of issue 19 is to raise these to 15 or 16."""


def _model(family: str) -> type[InterpreterModel]:
    return Qwen3_0_6B if family == "qwen3" else GPT2


def _pawfn(fixture: TrainedProgram, program: Path, base: Path, config: PawConfig) -> list[list[int]]:
    with PawFn.specialize(_model(fixture.family), Torch).from_path(program, base=base, config=config) as function:
        return [list(function.generate(text, RuntimeOptions(max_tokens=MAX_TOKENS)).token_ids) for text in fixture.inputs]


@pytest.mark.parametrize("family", ["qwen3", "gpt2"])
def test_float32_gives_llama_cpps_tokens_on_the_f32_files(family: Family, tmp_path: Path) -> None:
    fixture = load_trained(family)
    base = fixture.base("f32")
    expected = llama_generate_each(base, fixture.adapter_f32, fixture.template, fixture.inputs, MAX_TOKENS, n_ctx=2048, kv="f32")
    found = _pawfn(fixture, fixture.program_with_f32_adapter(tmp_path), base, PawConfig())
    assert not differences(fixture.inputs, expected, found)


@pytest.mark.parametrize("weight_dtype", [None, "float16", "int8"], ids=["float32", "float16", "int8"])
@pytest.mark.parametrize("family", ["qwen3", "gpt2"])
def test_modes_keep_their_share_of_the_official_runtimes_tokens(family: Family, weight_dtype: WeightDType | None) -> None:
    fixture = load_trained(family)
    base = fixture.base(OFFICIAL_BASE[family])
    expected = llama_generate_each(base, fixture.adapter_q4_0, fixture.template, fixture.inputs, MAX_TOKENS, n_ctx=2048, kv="f16")
    found = _pawfn(fixture, fixture.program, base, PawConfig(weight_dtype=weight_dtype))
    differing = differences(fixture.inputs, expected, found)
    equal = len(fixture.inputs) - len(differing)
    assert equal >= FLOORS[(family, weight_dtype)], "\n".join([f"{equal} of {len(fixture.inputs)} equal", *differing])
