"""The arithmetic as one object (`pawfn.torch.model.arithmetic`): what each mode decides, and no other module of the Torch
backend asking which mode runs (the passes and the families call the object)."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
import torch

from pawfn import PawConfig, PawFn, Qwen3_0_6B, Torch
from pawfn.core.options import ResolvedNumerics
from pawfn.torch.ggml.c_kernels import native_kernels
from pawfn.torch.model.arithmetic import Arithmetic, LlamaCppArithmetic, TorchArithmetic, llamacpp_arithmetic
from tests.helpers.programs import TinyProgram, torch_program

TORCH_BACKEND = Path(__file__).resolve().parents[2] / "src" / "pawfn" / "torch"
STRATEGY = TORCH_BACKEND / "model" / "arithmetic"
MODE_TEST = re.compile(
    r"""numerics\s*[!=]=|[!=]=\s*"(llamacpp|native)"|kernels\s+is\b|kernels\s*:\s*NativeKernels\s*\|\s*None|by_rows"""
    r"""|singledispatch|isinstance\([^)]*Arithmetic\b|\.kind\s*[!=]=\s*"(plain|float16|int8)"|ggml_kernels|llamacpp_width|\._llamacpp\b"""
)
"""A comparison with a numerics mode's name, a test of whether the C kernels built (or an optional kernels argument),
a product told per call whether its rows are exact, a dispatch on the arithmetic's type, a test of a torch matrix's
kind: only the strategy's package (`model/arithmetic/`) decides these; the loaders ask it how to keep each matrix."""


def test_no_module_but_the_arithmetic_asks_which_mode_runs() -> None:
    found: list[str] = []
    for source in sorted(TORCH_BACKEND.rglob("*.py")):
        if source.is_relative_to(STRATEGY):
            continue
        for number, line in enumerate(source.read_text().splitlines(), 1):
            if MODE_TEST.search(line):
                found.append(f"{source.relative_to(TORCH_BACKEND)}:{number}: {line.strip()}")
    assert not found, "\n".join(found)


def test_each_arithmetic_states_what_differs() -> None:
    torch_way, llamacpp_way = TorchArithmetic(), LlamaCppArithmetic(16, flash=True, bf16_pairs=False)
    assert torch_way.kv_dtype(torch.bfloat16) == torch.bfloat16 and llamacpp_way.kv_dtype(torch.float32) == torch.float16
    assert not torch_way.row_exact and llamacpp_way.row_exact
    assert torch_way.prefix_granule == 1 and llamacpp_way.prefix_granule == 128
    assert LlamaCppArithmetic(8, flash=False, bf16_pairs=False).prefix_granule == 1
    assert torch_way.prefix_tag == "" and llamacpp_way.prefix_tag == "+llamacpp-numerics-16-lanes"
    assert llamacpp_way.describe("float32", "cpu") == "llama.cpp numerics on torch emulation (no C kernels built), 16 float32 lanes"


def test_the_two_arithmetics_differ_where_llama_cpp_rounds_otherwise() -> None:
    """llama.cpp's rms norm and silu are its own roundings, not torch's (the reason both exist)."""
    generator = torch.Generator().manual_seed(0)
    x, weight = torch.randn(64, 1024, generator=generator), torch.randn(1024, generator=generator)
    llamacpp_way = llamacpp_arithmetic(16, flash=False, bf16_pairs=False)
    torch_way = TorchArithmetic()
    torch.testing.assert_close(llamacpp_way.rms_norm(x, weight, 1e-6), torch_way.rms_norm(x, weight, 1e-6), rtol=1e-5, atol=1e-5)
    assert not torch.equal(llamacpp_way.rms_norm(x, weight, 1e-6), torch_way.rms_norm(x, weight, 1e-6))
    torch.testing.assert_close(llamacpp_way.silu(x), torch_way.silu(x), rtol=1e-5, atol=1e-6)


def test_a_loaded_base_runs_the_arithmetic_its_numerics_name(qwen3_program: TinyProgram) -> None:
    base = qwen3_program.interpreter.gguf_path
    cases: list[tuple[ResolvedNumerics, type[Arithmetic]]] = [("native", TorchArithmetic), ("llamacpp", LlamaCppArithmetic)]
    for numerics, kind in cases:
        with PawFn[Qwen3_0_6B, Torch].load_sync(qwen3_program.folder, base=base, config=PawConfig(numerics=numerics)) as function:
            interpreter = torch_program(function).base.interpreter
            assert isinstance(interpreter.arithmetic, kind) and interpreter.arithmetic.numerics == numerics


def test_without_the_c_kernels_the_tower_is_torchs_and_the_log_says_so(caplog: pytest.LogCaptureFixture) -> None:
    """mtmd's arithmetic in torch takes minutes an image: the emulation's base gives its tower torch's float32, and
    says why in the log; on the C kernels it is mtmd's."""
    from pawfn.torch.model.arithmetic.tower import NativeMtmdTower, TowerArithmetic

    with caplog.at_level(logging.WARNING, logger="pawfn"):
        assert type(LlamaCppArithmetic(16, flash=False, bf16_pairs=False).tower()) is TowerArithmetic
    assert "the C kernels did not build" in caplog.text and "C compiler" in caplog.text
    native = llamacpp_arithmetic(16, flash=False, bf16_pairs=False)
    assert type(native.tower()) is (TowerArithmetic if native_kernels() is None else NativeMtmdTower)
    assert type(TorchArithmetic().tower()) is TowerArithmetic
