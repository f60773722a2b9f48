"""The torch kernels for Q6_K and Q8_0 give gguf's numpy values bit for bit; other types are left to gguf."""

from __future__ import annotations

import gguf
import numpy as np
import numpy.typing as npt
import pytest
import torch

from pawfn.torch.ggml.dequant import RowTable, dequantize


def _blocks(qtype: gguf.GGMLQuantizationType, n_blocks: int, scale_at: slice) -> np.ndarray:
    """Random blocks whose f16 scales are finite (random bytes there could be NaN or infinity)."""
    rng = np.random.default_rng(int(qtype))
    block_bytes = gguf.GGML_QUANT_SIZES[qtype][1]
    blocks = rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint8)
    scales = (rng.standard_normal(n_blocks) * 0.01).astype(np.float16)
    blocks[:, scale_at] = scales.view(np.uint8).reshape(n_blocks, 2)
    return blocks


@pytest.mark.parametrize(("qtype", "scale_at"), [(gguf.GGMLQuantizationType.Q6_K, slice(208, 210)), (gguf.GGMLQuantizationType.Q8_0, slice(0, 2))])
def test_torch_kernels_match_gguf_bit_for_bit(qtype: gguf.GGMLQuantizationType, scale_at: slice) -> None:
    block_size = gguf.GGML_QUANT_SIZES[qtype][0]
    rows, blocks_per_row = 12, 4
    blocks = _blocks(qtype, rows * blocks_per_row, scale_at)
    shape = (rows, blocks_per_row * block_size)
    expected = gguf.quants.dequantize(blocks.reshape(rows, -1), qtype).reshape(shape)
    found = dequantize(blocks.reshape(-1), qtype, shape)
    assert found is not None and found.dtype == np.float32 and found.flags.writeable
    np.testing.assert_array_equal(found, expected)


def test_other_types_are_left_to_gguf() -> None:
    assert dequantize(np.zeros(18, dtype=np.uint8), gguf.GGMLQuantizationType.Q4_0, (1, 32)) is None


@pytest.mark.parametrize(
    ("qtype", "scale_at"),
    [
        (gguf.GGMLQuantizationType.Q6_K, slice(208, 210)),
        (gguf.GGMLQuantizationType.Q8_0, slice(0, 2)),
        (gguf.GGMLQuantizationType.F16, None),
        (gguf.GGMLQuantizationType.F32, None),
    ],
)
def test_row_table_decodes_the_rows_the_full_dequantization_gives(qtype: gguf.GGMLQuantizationType, scale_at: slice | None) -> None:
    rows, cols = 12, 512
    if scale_at is None:
        dtype = np.float16 if qtype == gguf.GGMLQuantizationType.F16 else np.float32
        values = np.random.default_rng(3).standard_normal((rows, cols)).astype(dtype)
        raw = values.view(np.uint8).reshape(-1)
        expected: npt.NDArray[np.float32] | None = values.astype(np.float32)
    else:
        raw = _blocks(qtype, rows * cols // gguf.GGML_QUANT_SIZES[qtype][0], scale_at).reshape(-1)
        expected = dequantize(raw, qtype, (rows, cols))
    table = RowTable.of(raw, qtype, (rows, cols))
    assert table is not None and expected is not None
    ids = torch.tensor([7, 0, 7, 11])
    np.testing.assert_array_equal(table(ids).numpy(), expected[[7, 0, 7, 11]])
    assert table(torch.tensor([], dtype=torch.long)).shape == (0, cols)


def test_row_table_leaves_other_types_alone() -> None:
    assert RowTable.of(np.zeros(18, dtype=np.uint8), gguf.GGMLQuantizationType.Q4_0, (1, 32)) is None
