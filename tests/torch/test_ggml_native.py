"""The C kernels of `numerics="llamacpp"` against the torch emulation they stand in for, bit for bit, on random
inputs and through the engine (the emulation is itself checked against llama.cpp's traced tensors and tokens in
test_llamacpp_numerics.py, where both implementations run); and how the kernels are built, cached and done without."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import gguf
import numpy as np
import numpy.typing as npt
import pytest
import torch
from gguf.quants import quantize

from pawfn import ModelRegistry, PawConfig, PawFn, Qwen3_0_6B, Torch
from pawfn.formats.adapter import read_lora_adapter
from pawfn.torch.engine import network
from pawfn.torch.ggml import build as ggml_build
from pawfn.torch.model.arithmetic import LlamaCppArithmetic, NativeLlamaCppArithmetic, llamacpp_arithmetic
from pawfn.torch.model.arithmetic import llamacpp as llamacpp_numerics
from pawfn.torch.ggml.native_blocks import NativeBlockMatrix, join_blocks, native_block_matrix
from pawfn.torch.ggml.blocks import block_matrix, quantize_q8_0, quantize_q8_k
from pawfn.torch.ggml.float_ops import (
    ggml_attention,
    ggml_expf,
    ggml_layer_norm,
    ggml_rms_norm,
    ggml_rope,
    ggml_rope_table,
    ggml_silu_mul,
    native_rope_table_for,
)
from pawfn.torch.ggml.c_kernels import (
    NativeKernels,
    native_attention,
    native_attention_step,
    native_expf,
    native_kernels,
    native_layer_norm,
    native_rms_norm,
    native_rope,
)
from pawfn.torch.ggml.activations import native_swiglu
from pawfn.core.cpuinfo import host_cpu_flags
from pawfn.torch.weights.reader import read_base_weights
from tests.helpers.trained import load_trained

Q6_K, Q4_0, Q8_0 = gguf.GGMLQuantizationType.Q6_K, gguf.GGMLQuantizationType.Q4_0, gguf.GGMLQuantizationType.Q8_0
WIDTHS = pytest.mark.parametrize(
    "width",
    [
        pytest.param(
            16,
            id="avx512",
            marks=pytest.mark.skipif("avx512f" not in host_cpu_flags(), reason="no AVX-512 here: 16-lane kernels are illegal instructions"),
        ),
        pytest.param(8, id="avx2"),
    ],
)
"""ggml's lane counts: 16 (AVX-512, where the CPU has it) and 8 (AVX2, everywhere)."""


@pytest.fixture(autouse=True)
def kernels() -> NativeKernels:
    """The C kernels (built on first use, into the first test's private cache), or every test here skipped."""
    built = native_kernels()
    if built is None:
        pytest.skip("the C kernels could not be built here (no C compiler?)")
    return built


def _kernels() -> NativeKernels:
    built = native_kernels()
    assert built is not None
    return built


def _raw(qtype: gguf.GGMLQuantizationType, out: int, width: int, seed: int) -> npt.NDArray[np.uint8]:
    """A matrix's bytes: random Q6_K blocks (every code, sub-scale and sign) with a small f16 scale, or random weights
    quantized by the gguf package."""
    rng = np.random.default_rng(seed)
    if qtype == Q6_K:
        blocks = rng.integers(0, 256, size=(out, width // 256, 210), dtype=np.uint8)
        blocks[:, :, 208:210] = np.frombuffer(np.float16(0.002).tobytes(), dtype=np.uint8)
        return blocks.reshape(out, -1)
    raw: npt.NDArray[np.uint8] = quantize(rng.standard_normal((out, width), dtype=np.float32) * 0.05, qtype)
    return raw


def _rows(n: int, width: int, seed: int) -> torch.Tensor:
    x = torch.randn(n, width, generator=torch.Generator().manual_seed(seed)) * 3
    x[0, :7] = torch.tensor([0.0, -0.0, 1e-30, -5.5, 5.5, 2.5, -2.5])  # zeros, a tiny value, ties after scaling
    return x


@pytest.mark.parametrize("qtype", [Q6_K, Q4_0, Q8_0], ids=["q6_k", "q4_0", "q8_0"])
@pytest.mark.parametrize("base_layer", [False, True], ids=["adapter", "base"])
@pytest.mark.parametrize("n", [1, 3, 8, 21, 33])
def test_block_products_equal_the_emulation(
    qtype: gguf.GGMLQuantizationType, base_layer: bool, n: int, monkeypatch: pytest.MonkeyPatch, kernels: NativeKernels
) -> None:
    """Every kernel: one-row lanes, tiled (from the codes, AVX-512 VNNI and AVX2; AMX tiles where the CPU has AMX, with
    row counts around its tiles of 16 and pairs of 32), repacked Q4_0 bases."""
    out = 48  # a multiple of 16, as AMX's tiles need
    raw = _raw(qtype, out, 512, seed=n)
    emulated = block_matrix(raw, qtype, out, base_layer)
    assert emulated is not None
    candidates: list[NativeBlockMatrix] = []
    for amx in (False, True) if kernels.amx else (False,):
        monkeypatch.setattr(kernels, "amx", amx)
        native = native_block_matrix(kernels, raw, qtype, out, base_layer)
        assert isinstance(native, NativeBlockMatrix)
        assert native.amx == (amx and qtype == Q6_K and base_layer)
        candidates.append(native)
    x = _rows(n, 512, seed=n)
    for avx512 in (True, False):  # where the CPU has AVX-512, its one-row kernels and the AVX2 ones
        kernels.use_avx512(avx512)
        try:
            for candidate in candidates:
                assert torch.equal(candidate(x), emulated(x))
                assert torch.equal(candidate.rows(x), emulated.rows(x))
        finally:
            kernels.use_avx512(True)


def test_amx_tiles_are_only_used_for_whole_tiles_of_outputs(monkeypatch: pytest.MonkeyPatch, kernels: NativeKernels) -> None:
    """Outputs not a multiple of 16 take the tiled kernel from the codes even where the CPU has AMX."""
    monkeypatch.setattr(kernels, "amx", True)
    matrix = native_block_matrix(kernels, _raw(Q6_K, 40, 256, seed=3), Q6_K, 40, True)
    assert isinstance(matrix, NativeBlockMatrix) and not matrix.amx


@pytest.mark.parametrize("qtype", [Q4_0, Q8_0], ids=["q4_0", "q8_0"])
@pytest.mark.parametrize("out", [48, 20])
@pytest.mark.parametrize("n", [1, 21])
def test_one_block_products_equal_the_emulation(qtype: gguf.GGMLQuantizationType, out: int, n: int) -> None:
    """A LoRA b half (in = 32): eight outputs at a time where `out` allows, then as a side path into a slice."""
    raw = _raw(qtype, out, 32, seed=out + n)
    emulated, native = block_matrix(raw, qtype, out), native_block_matrix(_kernels(), raw, qtype, out)
    assert emulated is not None and isinstance(native, NativeBlockMatrix)
    x = _rows(n, 32, seed=n)
    assert torch.equal(native(x), emulated(x)) and torch.equal(native.rows(x), emulated.rows(x))
    expected = torch.randn(n, 3 * out)
    found = expected.clone()
    emulated.accumulate_rows(expected[:, out : 2 * out], x, -1.75)
    native.accumulate_rows(found[:, out : 2 * out], x, -1.75)
    assert torch.equal(found, expected)


@pytest.mark.parametrize("qtype", [Q6_K, Q4_0], ids=["q6_k", "q4_0"])
@pytest.mark.parametrize("by_rows", [True, False])
@pytest.mark.parametrize(("n", "out"), [(9, 24), (40, 26)])
def test_side_paths_accumulate_as_the_emulation(qtype: gguf.GGMLQuantizationType, by_rows: bool, n: int, out: int) -> None:
    """`y += product * scale` in C, into a column slice of a wider output (a joined group's member); outputs in fours
    and left over, rows in sixteens and left over."""
    raw = _raw(qtype, out, 256, seed=5)
    emulated, native = block_matrix(raw, qtype, out), native_block_matrix(_kernels(), raw, qtype, out)
    assert emulated is not None and isinstance(native, NativeBlockMatrix)
    x = _rows(n, 256, seed=6)
    expected, found = torch.randn(n, 3 * out), torch.zeros(n, 3 * out)
    found.copy_(expected)
    if by_rows:
        emulated.accumulate_rows(expected[:, out : 2 * out], x, 0.37)
        native.accumulate_rows(found[:, out : 2 * out], x, 0.37)
    else:
        emulated.accumulate(expected[:, out : 2 * out], x, 0.37)
        native.accumulate(found[:, out : 2 * out], x, 0.37)
    assert torch.equal(found, expected)
    assert torch.equal(native(x), emulated(x))


@pytest.mark.parametrize("qtype", [Q4_0, Q8_0], ids=["q4_0", "q8_0"])
@pytest.mark.parametrize("width", [1024, 1312, 3072])
@pytest.mark.parametrize("n", [21, 34, 40])
def test_wide_products_with_rows_in_lanes_equal_the_emulation(qtype: gguf.GGMLQuantizationType, width: int, n: int) -> None:
    """A LoRA a half over a wide input (32, 41 or 96 blocks: the lanes kernel takes its blocks in chunks, the last one
    part or whole), 21, 34 or 40 rows: groups of sixteen, then 5, 2 or 8 rows that the one-row kernel takes (up to 8
    over 32 blocks, up to 4 over more) or a part padded to sixteen, as a product and accumulated."""
    raw = _raw(qtype, 24, width, seed=width)
    emulated, native = block_matrix(raw, qtype, 24), native_block_matrix(_kernels(), raw, qtype, 24)
    assert emulated is not None and isinstance(native, NativeBlockMatrix)
    x = _rows(n, width, seed=width)
    assert torch.equal(native(x), emulated(x))
    expected = torch.randn(n, 24)
    found = expected.clone()
    emulated.accumulate(expected, x, 0.5)
    native.accumulate(found, x, 0.5)
    assert torch.equal(found, expected)


def test_activation_quantization_equals_the_emulation() -> None:
    x = _rows(5, 1024, seed=1)
    x[1, :256] = 0.0  # a block of zeros
    x[2, 10], x[2, 20] = 50.0, -50.0  # two values of the largest magnitude: the first one decides the sign
    codes = torch.empty(5, 1024, dtype=torch.int8)
    scales, sums = torch.empty(5, 4), torch.empty(5, 4, 16, dtype=torch.int16)
    _kernels().quantize_q8_k(x.data_ptr(), 5, 1024, codes.data_ptr(), scales.data_ptr(), sums.data_ptr())
    expected_codes, expected_scales, expected_sums = quantize_q8_k(x)
    assert torch.equal(codes.float().reshape(5, 4, 256), expected_codes)
    assert torch.equal(scales, expected_scales) and torch.equal(sums.float(), expected_sums)
    scales = torch.empty(5, 32)
    _kernels().quantize_q8_0(x.data_ptr(), 5, 1024, codes.data_ptr(), scales.data_ptr())
    expected_codes, expected_scales = quantize_q8_0(x)
    assert torch.equal(codes.float().reshape(5, 32, 32), expected_codes) and torch.equal(scales, expected_scales)


@WIDTHS
@pytest.mark.parametrize(("n", "prefix", "own"), [(1, 0, 5), (1, 37, 20), (7, 30, 7), (12, 0, 12), (3, 300, 50), (45, 70, 50)])
def test_attention_equals_the_emulation(width: int, n: int, prefix: int, own: int) -> None:
    """Decode steps (one row) and prompts (tinyBLAS), with and without a program's prefix read in place."""
    generator = torch.Generator().manual_seed(n + prefix)
    q = torch.randn(n, 4, 64, generator=generator) * 2
    prefix_keys, prefix_values = (torch.randn(2, prefix, 64, generator=generator).half() for _ in range(2))
    cache_keys, cache_values = (torch.randn(2, own + 9, 64, generator=generator).half() for _ in range(2))
    keys, values = cache_keys[:, :own], cache_values[:, :own]  # views of a longer cache, as the engine's are
    expected = ggml_attention(q, torch.cat([prefix_keys, keys], 1), torch.cat([prefix_values, values], 1), width)
    shared = (prefix_keys, prefix_values) if prefix else None
    assert torch.equal(native_attention(_kernels(), q, shared, keys, values, width), expected)


@WIDTHS
@pytest.mark.parametrize(("dim", "prefix", "own"), [(128, 303, 85), (128, 0, 1), (128, 64, 0), (256, 57, 71), (64, 1, 127)])
def test_one_row_attention_on_wide_heads_equals_the_emulation(width: int, dim: int, prefix: int, own: int) -> None:
    """A decode step on Qwen3's (128) and Qwen3.5's (256) head sizes: positions eight at a time (lengths off every
    multiple of 8 and 4W), the value product's lanes as chains, from the prefix and the own cache alike."""
    generator = torch.Generator().manual_seed(dim + prefix + own)
    q = torch.randn(1, 8, dim, generator=generator) * 3
    # keys near each head pair's query: scores ~50 within a few units of each other, so most probabilities are
    # neither 0 nor 1 and a score's last bit shows in some of them
    near = q[0].reshape(2, 4, dim)[:, 0, None] * 0.5
    prefix_keys, cache_keys = ((near + torch.randn(2, length, dim, generator=generator) * 0.5).half() for length in (prefix, own + 9))
    prefix_values, cache_values = (torch.randn(2, length, dim, generator=generator).half() for length in (prefix, own + 9))
    keys, values = cache_keys[:, :own], cache_values[:, :own]
    expected = ggml_attention(q, torch.cat([prefix_keys, keys], 1), torch.cat([prefix_values, values], 1), width)
    shared = (prefix_keys, prefix_values) if prefix else None
    assert torch.equal(native_attention(_kernels(), q, shared, keys, values, width), expected)


@WIDTHS
@pytest.mark.parametrize("dim", [64, 128, 256])
def test_a_decode_steps_rows_attend_in_one_call_each_as_alone(width: int, dim: int) -> None:
    """One call for a step's rows: rows of two programs (their prefixes converted once per run of rows that share
    one, here not all adjacent), a row with no prefix; each row's output that of the row alone, bit for bit."""
    generator = torch.Generator().manual_seed(dim + width)
    q = torch.randn(5, 8, dim, generator=generator) * 3
    near = q[0].reshape(2, 4, dim)[:, 0, None] * 0.5  # scores close together, as in the one-row test above

    def cache(length: int) -> tuple[torch.Tensor, torch.Tensor]:
        return (near + torch.randn(2, length, dim, generator=generator) * 0.5).half(), torch.randn(2, length, dim, generator=generator).half()

    first, second = cache(303), cache(128)  # one prefix a whole number of 4W lanes long, one not
    rows = [(first, 85), (first, 1), (second, 70), (None, 9), (first, 3)]
    # each row's new key and value (column views of products, rows 4 * dim and 3 * dim apart), stored by the kernel
    # at the row's last position
    k = torch.randn(5, 4 * dim, generator=generator)[:, : 2 * dim].view(5, 2, dim)
    v = torch.randn(5, 3 * dim, generator=generator)[:, dim:].view(5, 2, dim)
    buffers = [cache(own + 9) for _, own in rows]  # room past each row's positions, as a reserved cache has
    table = torch.tensor(
        [
            [*(p.data_ptr() for p in (prefix or buffer)), 0 if prefix is None else prefix[0].shape[1], (prefix or buffer)[0].stride(0)]
            + [buffer[0].data_ptr(), buffer[1].data_ptr(), own, buffer[0].stride(0)]
            for (prefix, own), buffer in zip(rows, buffers, strict=True)
        ],
        dtype=torch.int64,
    )
    positions = sum((0 if prefix is None else prefix[0].shape[1]) + own for prefix, own in rows)
    out = native_attention_step(_kernels(), q, k, v, table, positions, width)
    for i, ((prefix, own), (keys, values)) in enumerate(zip(rows, buffers, strict=True)):
        assert torch.equal(keys[:, own - 1], k[i].half()) and torch.equal(values[:, own - 1], v[i].half()), f"row {i} stored"
        own_keys, own_values = keys[:, :own], values[:, :own]
        whole = (own_keys, own_values) if prefix is None else (torch.cat([prefix[0], own_keys], 1), torch.cat([prefix[1], own_values], 1))
        assert torch.equal(out[i : i + 1], ggml_attention(q[i : i + 1], *whole, width)), f"row {i}"


@WIDTHS
def test_elementwise_steps_equal_the_emulation(width: int) -> None:
    """ggml_v_expf over its whole range (far ends, infinities, NaN), rms_norm, rope and swiglu."""
    generator = torch.Generator().manual_seed(width)
    x = torch.cat(
        [
            torch.randn(100_000, generator=generator) * 40,
            torch.tensor([-float("inf"), float("inf"), 0.0, -0.0, -200.0, -100.0, -88.0, -87.5, 88.0, 89.0, -103.0, -126.5]),
        ]
    )
    assert torch.equal(native_expf(_kernels(), x, width), ggml_expf(x, width))
    gate, up = torch.randn(21, 3072, generator=generator) * 6, torch.randn(21, 3072, generator=generator)
    assert torch.equal(native_swiglu(_kernels(), gate, up, width), ggml_silu_mul(gate, up, width))
    hidden, weight = torch.randn(21, 8, 128, generator=generator) * 3, torch.randn(128, generator=generator)
    assert torch.equal(native_rms_norm(_kernels(), hidden, weight, 1e-6), ggml_rms_norm(hidden, weight, 1e-6))
    # read in place: heads of a product's columns, rows of a column slice (n not a multiple of 8), 37 rows in two
    # threads' parts (groups of eight and a rest); and swiglu's halves of one product
    product = torch.randn(37, 8 * 128 + 1007, generator=generator) * 3
    heads, columns, wide_weight = product[:, 3 : 3 + 8 * 128].view(37, 8, 128), product[:, 1030:2029], torch.randn(999, generator=generator)
    assert torch.equal(native_rms_norm(_kernels(), heads, weight, 1e-6), ggml_rms_norm(heads.contiguous(), weight, 1e-6))
    assert torch.equal(native_rms_norm(_kernels(), columns, wide_weight, 1e-6), ggml_rms_norm(columns.contiguous(), wide_weight, 1e-6))
    gate_up = torch.randn(37, 2 * 2999 + 2, generator=generator) * 6
    gate, up = gate_up[:, :2999], gate_up[:, 2999:5998]
    assert torch.equal(native_swiglu(_kernels(), gate, up, width), ggml_silu_mul(gate.contiguous(), up.contiguous(), width))
    cos, sin = ggml_rope_table(torch.arange(300, 321), 128, 1e6)
    assert torch.equal(native_rope(_kernels(), hidden, cos, sin), ggml_rope(hidden, cos, sin))
    bias = torch.randn(999, generator=generator)  # a row not a whole number of W lanes
    assert torch.equal(
        native_layer_norm(_kernels(), columns, wide_weight, bias, 1e-6, width), ggml_layer_norm(columns.contiguous(), wide_weight, bias, 1e-6, width)
    )
    positions = torch.cat([torch.arange(0, 40), torch.arange(4000, 4100, 7), torch.tensor([32767, 131071])])
    for dim, base in ((128, 1e6), (64, 10000.0), (256, 1e7)):  # the tables in C: the same angles, the same libm
        in_c, emulated = native_rope_table_for(_kernels(), positions, dim, base), ggml_rope_table(positions, dim, base)
        assert torch.equal(in_c[0], emulated[0]) and torch.equal(in_c[1], emulated[1])


def test_joined_matrices_equal_their_parts_side_by_side() -> None:
    """Base layers (split weights, or AMX tiles where the CPU has AMX): products and one-row products."""
    parts = [native_block_matrix(_kernels(), _raw(Q6_K, out, 512, seed=out), Q6_K, out, True) for out in (16, 48, 32)]
    natives = [p for p in parts if isinstance(p, NativeBlockMatrix)]
    joined = join_blocks(natives)
    assert joined is not None and joined.out_features == 96 and joined.amx == _kernels().amx
    for n in (1, 12, 40):
        x = _rows(n, 512, seed=n)
        assert torch.equal(joined(x), torch.cat([p(x) for p in natives], dim=1))
        assert torch.equal(joined.rows(x), torch.cat([p.rows(x) for p in natives], dim=1))
    other = native_block_matrix(_kernels(), _raw(Q4_0, 8, 512, seed=1), Q4_0, 8)
    assert isinstance(other, NativeBlockMatrix) and join_blocks([natives[0], other]) is None


def test_the_engine_computes_the_same_logits_on_both(monkeypatch: pytest.MonkeyPatch, kernels: NativeKernels) -> None:
    """A prompt (tiled products, joined groups) then decode steps (one-row kernels), from the trained Qwen3 on its
    Q6_K base with its Q4_0 program: the C kernels' logits equal the emulation's."""
    fixture = load_trained("qwen3")
    runs: list[list[torch.Tensor]] = []
    for choice in (kernels, None):
        monkeypatch.setattr(llamacpp_numerics, "native_kernels", lambda choice=choice: choice)
        weights = read_base_weights(fixture.base("q6_k"), fixture.model)
        interpreter = network.TorchInterpreter.load(weights, torch.device("cpu"), torch.float32, numerics="llamacpp")
        assert isinstance(interpreter.arithmetic, NativeLlamaCppArithmetic) == (choice is not None)
        adapter = interpreter.attach(read_lora_adapter(fixture.adapter_q4_0, fixture.model))
        cache = interpreter.new_cache()
        cache.begin(interpreter.prefill_prefix(list(range(40, 70)), adapter, cache))
        logits = [interpreter.forward(list(range(100, 125)), 30, cache, adapter)]
        for step in range(3):
            logits.append(interpreter.step([network.StepRow(200 + step, 55 + step, cache, adapter)])[0])
        runs.append(logits)
    for native, emulated in zip(*runs, strict=True):
        assert torch.equal(native, emulated)


def _no_compilers() -> list[str]:
    return []


def test_without_a_compiler_the_mode_warns_once_and_runs_on_the_emulation(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PAW_CACHE_DIR", str(tmp_path))  # none built there yet (the module's fixture built some elsewhere)
    monkeypatch.delenv("PAW_KERNELS_DIR", raising=False)  # the kernels in that cache, not the session's shared folder
    monkeypatch.setattr(ggml_build, "_compilers", _no_compilers)
    native_kernels.cache_clear()
    try:
        with pytest.warns(RuntimeWarning, match="no C compiler found"):
            assert native_kernels() is None
        assert type(llamacpp_arithmetic(8, flash=False, bf16_pairs=False)) is LlamaCppArithmetic
    finally:
        native_kernels.cache_clear()


def _on_a_terminal(setting: bool | None) -> bool:
    return True


def test_the_kernels_are_built_once_into_the_cache(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """Built once, saying so: one status line on a terminal (with how long), one log record; then reused silently."""
    monkeypatch.setenv("PAW_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("PAW_KERNELS_DIR", raising=False)  # the kernels in that cache, not the session's shared folder
    monkeypatch.setattr(ggml_build, "progress_enabled", _on_a_terminal)
    native_kernels.cache_clear()
    try:
        with caplog.at_level("INFO", logger="pawfn"):
            assert native_kernels() is not None
        built = list((tmp_path / ".pawfn-derived" / "kernels").glob("ggml-*.so"))
        assert len(built) == 1
        status = capsys.readouterr().err
        assert re.fullmatch(r"pawfn: compiling llama\.cpp's arithmetic \(C kernels\).*\.\.\. done in [0-9.]+ s \(.*\.so\)\n", status), status
        assert [r.getMessage() for r in caplog.records if "compiling" in r.getMessage()][0].endswith(f"({built[0]})")
        native_kernels.cache_clear()
        monkeypatch.setattr(ggml_build, "_compilers", _no_compilers)  # a second process finds them built
        assert native_kernels() is not None
        assert capsys.readouterr().err == ""
    finally:
        native_kernels.cache_clear()


def _built_by(script: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> NativeKernels | None:
    """The kernels as a compiler wrapper builds them: the shell `script` (`{compiler}` the system's cc) as the only
    compiler, into a fresh cache. The caller clears `native_kernels`'s cache after."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler")
    wrapper = tmp_path / "wrapped-cc"
    wrapper.write_text("#!/bin/sh\n" + script.replace("{compiler}", compiler) + "\n")
    wrapper.chmod(0o755)
    monkeypatch.setenv("PAW_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("PAW_KERNELS_DIR", raising=False)  # the kernels in that cache, not the session's shared folder
    monkeypatch.setattr(ggml_build, "_compilers", lambda: [str(wrapper)])
    native_kernels.cache_clear()
    return native_kernels()


def test_a_compiler_without_amx_or_avx512_builds_the_avx2_kernels(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A compiler that fails on the AMX/AVX-512 code (an older one): the kernels built without it, the same results,
    and a warning that says so and why."""
    script = 'case "$*" in *-DPAW_BASELINE*) exec {compiler} "$@";; esac\necho "no amx" >&2; exit 1'
    try:
        with caplog.at_level("WARNING", logger="pawfn"):
            built = _built_by(script, monkeypatch, tmp_path)
        assert built is not None and not built.amx and not built.avx512 and built.instructions == "AVX2"
        [warning] = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        assert "without the AVX-512 VNNI and AMX kernels" in warning and "OpenMP" not in warning and "no amx" in warning
        raw = _raw(Q6_K, 48, 512, seed=2)
        emulated, native = block_matrix(raw, Q6_K, 48, True), native_block_matrix(built, raw, Q6_K, 48, True)
        assert emulated is not None and isinstance(native, NativeBlockMatrix) and native.kernels is built
        x = _rows(21, 512, seed=2)
        assert torch.equal(native(x), emulated(x)) and torch.equal(native.rows(x), emulated.rows(x))
    finally:
        native_kernels.cache_clear()


def test_a_compiler_without_openmp_builds_single_threaded_kernels(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A compiler with no OpenMP runtime (clang without libomp): the kernels built without it, every part on one
    thread, the same results (a prompt's products and attention, which would otherwise split across threads)."""
    script = 'case "$*" in *-fopenmp*) echo "no omp.h" >&2; exit 1;; esac\nexec {compiler} "$@"'
    try:
        with caplog.at_level("WARNING", logger="pawfn"):
            built = _built_by(script, monkeypatch, tmp_path)
        assert built is not None
        [warning] = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        assert "without OpenMP" in warning and "AVX-512" not in warning and "no omp.h" in warning
        for qtype in (Q6_K, Q4_0):
            raw = _raw(qtype, 48, 1024, seed=3)
            emulated, native = block_matrix(raw, qtype, 48, qtype == Q6_K), native_block_matrix(built, raw, qtype, 48, qtype == Q6_K)
            assert emulated is not None and isinstance(native, NativeBlockMatrix) and native.kernels is built
            x = _rows(79, 1024, seed=3)
            assert torch.equal(native(x), emulated(x)) and torch.equal(native.rows(x[:8]), emulated.rows(x[:8]))
        generator = torch.Generator().manual_seed(5)
        q = torch.randn(40, 4, 64, generator=generator)
        keys, values = (torch.randn(2, 100, 64, generator=generator).half() for _ in range(2))
        width = 16 if "avx512f" in host_cpu_flags() else 8
        assert torch.equal(native_attention(built, q, None, keys, values, width), ggml_attention(q, keys, values, width))
    finally:
        native_kernels.cache_clear()


@pytest.mark.parametrize("variant", [["-fopenmp"], ["-fopenmp", "-DPAW_BASELINE"]], ids=["whole", "baseline"])
def test_the_kernels_compile_without_a_warning(variant: list[str], tmp_path: Path) -> None:
    """The source compiles with -Wall -Werror, whole and without the AVX-512/AMX code (a user's build leaves those
    flags out, so a newer compiler's new warning never costs the fast kernels)."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler")
    command = ggml_build.compile_command(compiler, [*ggml_build.STRICT_FLAGS, *variant], tmp_path / "k.so")
    result = subprocess.run(command, capture_output=True, text=True, check=False, timeout=300)
    assert result.returncode == 0, result.stderr


def test_the_kernels_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PAW_NATIVE_KERNELS", "0")
    native_kernels.cache_clear()
    try:
        assert native_kernels() is None
    finally:
        native_kernels.cache_clear()


def test_reports_say_which_implementation_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """`pawfn bench`'s engine line: the C kernels, or the emulation where they could not be built."""
    fixture = load_trained("qwen3")
    config = PawConfig(numerics="llamacpp")
    with PawFn[Qwen3_0_6B, Torch].load_sync(fixture.program, base=fixture.base("q6_k"), config=config) as function:
        expected = ", ".join(name for flag, name in (("amx_int8", "AMX"), ("avx512_vnni", "AVX-512 VNNI")) if flag in host_cpu_flags())
        assert function.runtime.engine == f"llama.cpp numerics on C kernels ({expected or 'AVX2'}), {_lanes()} float32 lanes"
    monkeypatch.setattr(llamacpp_numerics, "native_kernels", lambda: None)
    ModelRegistry.clear()
    with PawFn[Qwen3_0_6B, Torch].load_sync(fixture.program, base=fixture.base("q6_k"), config=config) as function:
        assert function.runtime.engine is not None and "torch emulation" in function.runtime.engine
    with PawFn[Qwen3_0_6B, Torch].load_sync(fixture.program, base=fixture.base("f32"), config=PawConfig(numerics="native")) as function:
        assert function.runtime.engine == "torch numerics (float32) on cpu"


def _lanes() -> int:
    return 16 if "avx512f" in host_cpu_flags() else 8
