"""pawfn against the official runtime on the trained fixtures (peaked models, where rounding decides few tokens):
with no setting named, the official files (quantized base, Q4_0 adapter, f16 KV) and the F32 files give the official
runtime's every token, and float32 on the F32 files llama.cpp's with an f32 cache; torch's own arithmetic on the official files keeps
at least its measured share per mode (`benchmarks/fidelity.py` prints the whole table)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pawfn import LlamaCpp, PawConfig, PawFn, RuntimeOptions
from pawfn.core.options import WeightDType
from tests.helpers.programs import requires_llama_cpp
from tests.helpers.trained import MAX_TOKENS, OFFICIAL_BASE, Family, differences, llama_tokens, load_trained, pawfn_tokens

pytestmark = [requires_llama_cpp, pytest.mark.llamacpp]
FLOORS: dict[tuple[str, WeightDType | None], int] = {
    ("qwen3", None): 9,
    ("qwen3", "float16"): 9,
    ("qwen3", "int8"): 8,
    ("gpt2", None): 8,
    ("gpt2", "float16"): 8,
    ("gpt2", "int8"): 6,
}
"""Least sequences (of 16) equal to the official runtime's, per (family, weight dtype): one below the fewest
measured (`benchmarks/fidelity.py` on an Intel Xeon: qwen3 10, 10, 9 and gpt2 9, 9, 10 with llama.cpp's AVX-512
build; 10, 10, 9 and 11, 11, 8 with an AVX2-only llama.cpp; 10, 10, 9 and 9, 9, 9 with torch's AVX2 kernels; int8
9 and 7 on an AVX2-only AMD EPYC without VNNI, whose int8 weights are packed at 7 bits), as other CPUs round
differently. `numerics="llamacpp"` (tests/torch/test_llamacpp_numerics.py) keeps all 16 of both."""


@pytest.mark.parametrize("family", ["qwen3", "gpt2"])
def test_the_default_gives_the_official_runtimes_tokens(family: Family) -> None:
    """No mode named (`numerics="auto"`): llama.cpp's arithmetic on the quantized base, all 16 sequences."""
    fixture = load_trained(family)
    expected = llama_tokens(fixture, OFFICIAL_BASE[family], fixture.adapter_q4_0)
    found = pawfn_tokens(fixture, fixture.program, OFFICIAL_BASE[family], PawConfig())
    assert not differences(fixture.inputs, expected, found)


@pytest.mark.parametrize("family", ["qwen3", "gpt2"])
def test_the_llamacpp_backend_with_no_setting_is_the_official_runtime(family: Family) -> None:
    """`--backend llamacpp` with nothing named: the official SDK's configuration (f16 KV cache), so its tokens."""
    fixture = load_trained(family)
    expected = llama_tokens(fixture, OFFICIAL_BASE[family], fixture.adapter_q4_0)
    with PawFn.specialize(fixture.model, LlamaCpp).load_sync(fixture.program, base=fixture.base(OFFICIAL_BASE[family])) as function:
        found = [list(function.generate(text, RuntimeOptions(max_tokens=MAX_TOKENS)).token_ids) for text in fixture.inputs]
    assert not differences(fixture.inputs, expected, found)


@pytest.mark.parametrize("family", ["qwen3", "gpt2"])
def test_the_default_gives_the_official_runtimes_tokens_on_the_f32_files(family: Family, tmp_path: Path) -> None:
    """No mode named on the F32 base, with the F32 and with the Q4_0 adapter: llama.cpp's arithmetic (an f16 cache, a
    quantized adapter's inputs quantized as llama.cpp does), so the official runtime's tokens on these files."""
    fixture = load_trained(family)
    for program, adapter in ((fixture.program_with_f32_adapter(tmp_path), fixture.adapter_f32), (fixture.program, fixture.adapter_q4_0)):
        expected = llama_tokens(fixture, "f32", adapter)
        found = pawfn_tokens(fixture, program, "f32", PawConfig())
        assert not differences(fixture.inputs, expected, found), adapter.name


@pytest.mark.parametrize("family", ["qwen3", "gpt2"])
def test_float32_gives_llama_cpps_tokens_on_the_f32_files(family: Family, tmp_path: Path) -> None:
    """Torch's float32 (`native`) on the F32 files: llama.cpp's arithmetic there with its KV cache in f32."""
    fixture = load_trained(family)
    expected = llama_tokens(fixture, "f32", fixture.adapter_f32, kv="f32")
    found = pawfn_tokens(fixture, fixture.program_with_f32_adapter(tmp_path), "f32", PawConfig(numerics="native"))
    assert not differences(fixture.inputs, expected, found)


@pytest.mark.parametrize("weight_dtype", [None, "float16", "int8"], ids=["float32", "float16", "int8"])
@pytest.mark.parametrize("family", ["qwen3", "gpt2"])
def test_modes_keep_their_share_of_the_official_runtimes_tokens(family: Family, weight_dtype: WeightDType | None) -> None:
    fixture = load_trained(family)
    expected = llama_tokens(fixture, OFFICIAL_BASE[family], fixture.adapter_q4_0)
    found = pawfn_tokens(fixture, fixture.program, OFFICIAL_BASE[family], PawConfig(weight_dtype=weight_dtype, numerics="native"))
    differing = differences(fixture.inputs, expected, found)
    equal = len(fixture.inputs) - len(differing)
    assert equal >= FLOORS[(family, weight_dtype)], "\n".join([f"{equal} of {len(fixture.inputs)} equal", *differing])
