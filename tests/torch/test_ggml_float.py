"""F32 and F16 matrices under llama.cpp's arithmetic (`pawfn.torch.ggml.floats`): each product's order against ggml's
one-row dot written out in torch, and the default mode on F32, F16 and BF16 bases, with float and Q4_0 programs, against
llama.cpp in the official configuration (an f16 cache). torch's float32 products missed those tokens: their ulps,
rounded into the f16 cache and into the next quantized product's blocks, moved them."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import numpy.typing as npt
import pytest
import torch

from pawfn import GPT2, InterpreterModel, PawFn, Qwen3_0_6B, RuntimeOptions, Torch
from pawfn.torch.ggml.floats import NativeFloatMatrix, float_matrix, ggml_float_product
from pawfn.torch.ggml.hybrid import ggml_dot_f32
from pawfn.torch.ggml.c_kernels import native_kernels
from pawfn.core.cpuinfo import host_cpu_flags
from tests.helpers.programs import TinyProgram, requires_llama_cpp, torch_program
from tests.helpers.references import llama_generate_each, llama_quantize

WIDTH = 16 if "avx512f" in host_cpu_flags() else 8
"""float32 lanes of the llama.cpp build the tests compare with (built for this CPU by scripts/install.sh)."""
MAX_TOKENS = 24
INPUTS = ["Urgent: the server is down!", "hello", "", "Résumé café ünïcödé 12345\n\nnew line\tand tab", "I love this product, it works great."]


def _matrix(qtype: gguf.GGMLQuantizationType, values: npt.NDArray[np.float32], width: int = WIDTH) -> NativeFloatMatrix:
    kernels = native_kernels()
    if kernels is None:
        pytest.skip("the C kernels could not be built here (no C compiler?)")
    stored = values.astype(np.float32 if qtype == gguf.GGMLQuantizationType.F32 else np.float16)
    matrix = float_matrix(kernels, stored.view(np.uint8).reshape(-1), qtype, values.shape[0], width, bf16_pairs=False)
    assert matrix is not None
    return matrix


@pytest.mark.parametrize("width", [64, 100, 1000])
def test_one_row_products_add_as_ggml_vec_dot_f32(width: int) -> None:
    """One row: four W-lane chains over each 4W values, then the remainder in order (widths not whole steps too)."""
    generator = np.random.default_rng(width)
    weights = generator.standard_normal((24, width)).astype(np.float32)
    x = torch.as_tensor(generator.standard_normal((3, width)).astype(np.float32))
    matrix = _matrix(gguf.GGMLQuantizationType.F32, weights)
    expected = ggml_dot_f32(x[:, None, :], torch.as_tensor(weights)[None, :, :], WIDTH)
    assert torch.equal(matrix.rows(x), expected)


@pytest.mark.parametrize("width", [8, 16])
@pytest.mark.parametrize("qtype", [gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16], ids=["f32", "f16"])
@pytest.mark.parametrize("k", [96, 768])
def test_tiled_float_products_are_their_torch_reference(qtype: gguf.GGMLQuantizationType, k: int, width: int) -> None:
    """tinyBLAS's F32 and F16 dots from two rows (tiles of four weight rows by four rows of x with AVX-512, by two
    with AVX2): each dot the reference's FMA chains of W lanes summed by halves, on rows and outputs that leave partial
    tiles."""
    if width == 16 and "avx512f" not in host_cpu_flags():
        pytest.skip("16-lane kernels need AVX-512")
    generator = np.random.default_rng(k)
    weights = generator.standard_normal((22, k)).astype(np.float32) * np.exp2(generator.integers(-8, 8, size=(22, k))).astype(np.float32)
    matrix = _matrix(qtype, weights, width)
    stored = torch.as_tensor(weights if qtype == gguf.GGMLQuantizationType.F32 else weights.astype(np.float16).astype(np.float32))
    for rows in (2, 9, 70):
        x = torch.as_tensor(generator.standard_normal((rows, k)).astype(np.float32))
        assert torch.equal(matrix(x), ggml_float_product(x, stored, qtype, width, False)), rows


@pytest.mark.parametrize("qtype", [gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16], ids=["f32", "f16"])
def test_a_bias_is_added_after_the_product(qtype: gguf.GGMLQuantizationType) -> None:
    """A bias given to the product is added to each value as ggml_add adds it (rounded after the product)."""
    generator = np.random.default_rng(2)
    matrix = _matrix(qtype, generator.standard_normal((20, 96)).astype(np.float32))
    bias = torch.as_tensor(generator.standard_normal(20).astype(np.float32))
    for rows in (1, 5):
        x = torch.as_tensor(generator.standard_normal((rows, 96)).astype(np.float32))
        assert torch.equal(matrix.biased(x, bias), matrix(x) + bias), rows


def test_f16_weights_round_their_inputs_to_f16() -> None:
    """ggml converts an F16 product's inputs to f16 first: inputs equal after rounding give equal outputs."""
    generator = np.random.default_rng(1)
    weights = generator.standard_normal((16, 128)).astype(np.float32)
    x = torch.as_tensor(generator.standard_normal((4, 128)).astype(np.float32))
    matrix = _matrix(gguf.GGMLQuantizationType.F16, weights)
    assert torch.equal(matrix(x), matrix(x.to(torch.float16).float()))
    assert torch.equal(matrix.rows(x), matrix.rows(x.to(torch.float16).float()))
    reference = x.to(torch.float16).double() @ torch.as_tensor(weights.astype(np.float16)).double().T
    torch.testing.assert_close(matrix(x).double(), reference, rtol=1e-6, atol=1e-5)


def test_accumulating_adds_the_scaled_product() -> None:
    generator = np.random.default_rng(2)
    matrix = _matrix(gguf.GGMLQuantizationType.F32, generator.standard_normal((8, 32)).astype(np.float32))
    x = torch.as_tensor(generator.standard_normal((3, 32)).astype(np.float32))
    y = torch.ones(3, 8)
    matrix.accumulate(y, x, 0.5)
    assert torch.equal(y, torch.ones(3, 8) + matrix(x) * torch.tensor(0.5))


@requires_llama_cpp
@pytest.mark.llamacpp
@pytest.mark.parametrize("family", ["qwen3", "gpt2"])
@pytest.mark.parametrize("base_type", ["F32", "F16", "BF16"])
def test_the_default_gives_llama_cpps_tokens_on_float_bases(family: str, base_type: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """No mode named, an F32, F16 or BF16 base with an F32 and a Q4_0 program: llama.cpp's tokens with an f16 cache
    (BF16 dotted as this CPU's llama.cpp dots it)."""
    programs: list[TinyProgram] = [request.getfixturevalue(f"{family}_program"), request.getfixturevalue(f"{family}_program_q4")]
    tiny = programs[0].interpreter
    base = tiny.gguf_path if base_type == "F32" else llama_quantize(tiny.gguf_path, tmp_path / f"{base_type}.gguf", base_type)
    model: type[InterpreterModel] = Qwen3_0_6B if family == "qwen3" else GPT2
    for program in programs:
        expected = llama_generate_each(base, program.adapter, program.template, INPUTS, MAX_TOKENS, n_ctx=2048, kv="f16")
        with PawFn.specialize(model, Torch).load_sync(program.folder, base=base) as function:
            found = [list(function.generate(text, RuntimeOptions(max_tokens=MAX_TOKENS)).token_ids) for text in INPUTS]
            matrices = torch_program(function).base.interpreter.weights.matrices.values()
            assert all(isinstance(m, NativeFloatMatrix) for m in matrices) or native_kernels() is None
        assert found == expected, program.adapter.name
