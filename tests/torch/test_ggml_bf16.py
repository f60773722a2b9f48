"""BF16 matrices under llama.cpp's arithmetic (`pawfn.torch.ggml.floats`): the C kernel against its torch reference
for both of llama.cpp's BF16 dots (AVX-512 BF16's `vdpbf16ps` pairs, and values widened to float32), tinyBLAS and
one-row; the instruction against its lane-by-lane twin (the kernel's path where the CPU or compiler lacks it); and
the inputs rounded to bf16 as ggml rounds them. Against llama.cpp itself: test_ggml_float.py (a BF16 base) and
test_qwen35_images.py (BF16 projectors, bit for bit)."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from pawfn.core.cpuinfo import host_cpu_flags
from pawfn.torch.ggml.c_kernels import native_kernels
from pawfn.torch.ggml.floats import NativeFloatMatrix, float_matrix, ggml_bf16_dots
from pawfn.torch.ggml.library import NativeKernels

BF16 = gguf.GGMLQuantizationType.BF16


def _kernels() -> NativeKernels:
    kernels = native_kernels()
    if kernels is None:
        pytest.skip("the C kernels could not be built here (no C compiler?)")
    return kernels


def _matrix(weights: torch.Tensor, width: int, pairs: bool) -> NativeFloatMatrix:
    raw = weights.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint8).reshape(-1)
    matrix = float_matrix(_kernels(), raw, BF16, weights.shape[0], width, pairs)
    assert matrix is not None
    return matrix


def _values(generator: np.random.Generator, shape: tuple[int, int]) -> torch.Tensor:
    """Normal values over a wide range of magnitudes (products near each other's ulps), some below FLT_MIN."""
    values = generator.standard_normal(shape) * np.exp2(generator.integers(-30, 30, size=shape))
    values[0, :3] = [1e-39, -3e-40, 0.0]  # subnormal floats: `vdpbf16ps` reads them as zero
    return torch.as_tensor(values.astype(np.float32))


@pytest.mark.parametrize(("pairs", "width"), [(True, 16), (False, 16), (False, 8)])
@pytest.mark.parametrize("k", [32, 64, 96, 100, 768])
def test_bf16_products_are_their_torch_reference(pairs: bool, width: int, k: int) -> None:
    """Every path of the C kernel (tinyBLAS from two rows where k is whole steps, else `ggml_vec_dot_bf16`'s
    chains and its tail in double) gives `ggml_bf16_dots`'s bits."""
    generator = np.random.default_rng(k + width)
    weights = _values(generator, (22, k)).to(torch.bfloat16).float()  # 22: a last tile of two outputs
    matrix = _matrix(weights, width, pairs)
    for rows in (1, 3, 9):
        x = _values(generator, (rows, k))
        rounded = x.to(torch.bfloat16).float()
        assert torch.equal(matrix(x), ggml_bf16_dots(rounded, weights, width, pairs, tiled=rows >= 2)), rows
        assert torch.equal(matrix.rows(x), ggml_bf16_dots(rounded, weights, width, pairs, tiled=False)), rows


@pytest.mark.parametrize(("pairs", "width"), [(True, 16), (False, 16), (False, 8)])
def test_a_bias_is_added_as_each_value_is_stored(pairs: bool, width: int) -> None:
    """The tower's products add their bias in the kernel: each value the product's, then the bias added and
    rounded once (ggml_add's rounding), on every store (tiles of four outputs, the two-output edge, one-row dots)."""
    generator = np.random.default_rng(11)
    # values of one magnitude: against `_values`' wide ones most sums would be too large for a bias to show
    weights = torch.as_tensor(generator.standard_normal((22, 96)).astype(np.float32)).to(torch.bfloat16).float()
    matrix = _matrix(weights, width, pairs)
    bias = torch.as_tensor(generator.standard_normal(22).astype(np.float32))
    for rows in (1, 3, 9):
        x = torch.as_tensor(generator.standard_normal((rows, 96)).astype(np.float32))
        assert torch.equal(matrix.biased(x, bias), matrix(x) + bias), rows
        assert not torch.equal(matrix.biased(x, bias), matrix(x)), rows


def test_pairs_and_widened_values_add_apart() -> None:
    """The two dots round differently (else the CPU's choice would not matter): on these values they part."""
    generator = np.random.default_rng(5)
    weights = _values(generator, (16, 256)).to(torch.bfloat16).float()
    x = _values(generator, (4, 256))
    assert not torch.equal(_matrix(weights, 16, True)(x), _matrix(weights, 16, False)(x))


@pytest.mark.skipif(not {"avx512f", "avx512_bf16"} <= host_cpu_flags(), reason="this CPU has no AVX-512 BF16")
def test_the_instruction_gives_its_lane_by_lane_twins_bits() -> None:
    """`vdpbf16ps` (odd product, then even, each an FMA rounded once; DAZ and FTZ) against the C twin that runs
    where the instruction does not, on sizes that take every tile's edge."""
    kernels = _kernels()
    generator = np.random.default_rng(7)
    weights = _values(generator, (37, 192)).to(torch.bfloat16).float()
    matrix = _matrix(weights, 16, True)
    x = _values(generator, (70, 192))
    x[1, :8] = torch.tensor([1e30, -1e30, 3e38, 1e-38, -1e-38, 2.0**-126, -(2.0**-127), 1.0])
    with_instruction = matrix(x)
    try:
        assert not kernels.use_avx512(False)
        without = matrix(x)
    finally:
        kernels.use_avx512(True)
    assert torch.equal(with_instruction, without)


def test_inputs_round_to_nearest_even_bf16() -> None:
    """ggml rounds a BF16 product's float32 inputs to bf16 with `GGML_FP32_TO_BF16` (to nearest, ties to even):
    the product of x is the product of x so rounded, halfway values included."""
    generator = np.random.default_rng(3)
    weights = _values(generator, (8, 64)).to(torch.bfloat16).float()
    matrix = _matrix(weights, 16, "avx512_bf16" in host_cpu_flags())
    x = _values(generator, (2, 64))
    x[0, 8:12] = torch.tensor([1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8, -(1.0 + 2.0**-8), 1.0 + 2.0**-8 + 2.0**-20])  # ties, and not
    bits = x.numpy().view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16).astype(np.uint32).view(np.float32)
    assert torch.equal(matrix(x), matrix(torch.as_tensor(rounded)))
    assert rounded[0, 8] == 1.0 and rounded[0, 9] == 1.0 + 2.0**-6 and rounded[0, 11] == 1.0 + 2.0**-7
