"""`ggml_hybrid` (llama.cpp's arithmetic for Qwen3.5's own ops) against llama.cpp itself: each op on the inputs
llama.cpp gave it for one call of a Q4_0 program on a Q8_0 base, run as the official vision runtime runs it (traced
with `scripts/llamacpp_trace.py --whole --threads 2`), its outputs compared bit for bit."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from pawfn.torch.ggml.float_ops import ggml_rms_norm, ggml_rope, ggml_rope_table
from pawfn.torch.ggml.hybrid import ggml_flash_attention, ggml_gated_delta_net, ggml_image_attention, ggml_l2_norm, ggml_mrope_table, ggml_ssm_conv
from pawfn.torch.ggml.c_kernels import NativeKernels, native_gated_delta_net, native_kernels, native_rope
from pawfn.torch.ggml.hybrid import ggml_silu, native_flash_attention, native_image_attention, native_l2_norm, native_silu, native_ssm_conv_for
from pawfn.torch.model.arithmetic import LlamaCppArithmetic, NativeLlamaCppArithmetic
from pawfn.core.cpuinfo import host_cpu_flags
from tests.helpers.programs import TinyProgram, requires_llama_cpp

pytestmark = [requires_llama_cpp, pytest.mark.llamacpp]

REPOSITORY = Path(__file__).resolve().parents[2]
WIDTH = 16 if "avx512f" in host_cpu_flags() else 8
"""float32 lanes of the llama.cpp build the tests compare with (built for this CPU by scripts/install.sh)."""
TEXT = "The quick brown fox jumps over the lazy dog while the cat sleeps. " * 12
"""A prompt of 442 tokens: three batches of 128 rows (tiled attention), one of 58 (row by row), and decode steps over
512 cache cells (split between the threads)."""
STEPS = 2
IMPLEMENTATIONS = ["torch", "c"]
"""The torch emulation (the fallback) and the C kernels."""


class Trace:
    """The float32 tensors llama.cpp computed, by evaluation (0: the prompt, all its batches; 1, 2: decode steps)."""

    def __init__(self, path: Path) -> None:
        arrays = np.load(path)
        self._tensors = [(key.split("/", 1)[0], key.split(" ", 1)[1], arrays[key]) for key in arrays.files]

    def all(self, evaluation: int, name: str) -> list[torch.Tensor]:
        """Every tensor named `name` in `evaluation`, in graph order (one per batch, or more where a name repeats)."""
        return [torch.tensor(np.asarray(array)) for at, found, array in self._tensors if at == str(evaluation) and found == name]

    def first(self, evaluation: int, name: str) -> torch.Tensor:
        return self.all(evaluation, name)[0]


@pytest.fixture(scope="module")
def trace(qwen35_q8_0: Path, qwen35_program_q4: TinyProgram, tmp_path_factory: pytest.TempPathFactory) -> Trace:
    out = tmp_path_factory.mktemp("trace") / "qwen35.npz"
    command = [sys.executable, str(REPOSITORY / "scripts" / "llamacpp_trace.py"), "--program", str(qwen35_program_q4.folder)]
    command += ["--base", str(qwen35_q8_0), "--input", TEXT, "--out", str(out), "--whole", "--threads", "2", "--steps", str(STEPS)]
    subprocess.run(command, check=True, capture_output=True)
    return Trace(out)


@pytest.fixture(scope="module")
def vectors(qwen35_q8_0: Path) -> dict[str, torch.Tensor]:
    reader = gguf.GGUFReader(qwen35_q8_0)
    return {t.name: torch.tensor(np.asarray(t.data)) for t in reader.tensors if t.tensor_type == gguf.GGMLQuantizationType.F32}


def _bit_exact(found: torch.Tensor, expected: torch.Tensor) -> None:
    found, expected = found.reshape(-1), expected.reshape(-1)
    assert found.shape == expected.shape
    different = int((found != expected).sum())
    assert different == 0, f"{different} of {found.numel()} values differ; largest difference {float((found - expected).abs().max())}"


def _kernels(implementation: str) -> NativeKernels | None:
    """The C kernels for "c" (the test skipped where none build), None (the torch emulation) for "torch"."""
    if implementation == "torch":
        return None
    kernels = native_kernels()
    if kernels is None:
        pytest.skip("the C kernels could not be built here (no C compiler?)")
    return kernels


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("evaluation", [0, 1], ids=["prompt", "decode"])
@pytest.mark.parametrize("layer", [0, 2])
def test_the_gated_delta_net_layers_ops_equal_llama_cpps(
    trace: Trace, vectors: dict[str, torch.Tensor], evaluation: int, layer: int, implementation: str
) -> None:
    """Convolution, SiLU, the key/query norm, softplus and sigmoid, the fused delta rule (outputs and state) and the
    gated norm, on the torch emulation and the C kernels, on the prompt's first batch and on a decode step (which
    continues the stored state)."""
    kernels = _kernels(implementation)
    ops = LlamaCppArithmetic(WIDTH, flash=True, bf16_pairs=False) if kernels is None else NativeLlamaCppArithmetic(WIDTH, True, False, kernels)
    conv_input = trace.first(evaluation, f"conv_input-{layer}")[0, 0]
    channels = conv_input.shape[0]
    conv_kernel = vectors[f"blk.{layer}.ssm_conv1d.weight"].reshape(channels, -1)
    by_time, kept = conv_input.T, conv_kernel.shape[1] - 1
    window, rows = by_time[:kept], by_time[kept:]
    raw = ggml_ssm_conv(conv_input, conv_kernel, WIDTH) if kernels is None else native_ssm_conv_for(kernels, window, rows, conv_kernel, WIDTH)
    _bit_exact(raw, trace.first(evaluation, f"conv_output_raw-{layer}"))
    _bit_exact(ops.silu(raw), trace.first(evaluation, f"conv_output_silu-{layer}"))
    _bit_exact(ops.convolve(window, rows, conv_kernel), trace.first(evaluation, f"conv_output_silu-{layer}"))
    q = ops.l2_norm(trace.first(evaluation, f"q_conv-{layer}")[0], 1e-6)
    _bit_exact(q, trace.first(evaluation, f"q_conv_predelta-{layer}"))
    biased = trace.first(evaluation, f"alpha-{layer}")[0, 0] + vectors[f"blk.{layer}.ssm_dt.bias"]
    gate = ops.softplus(biased) * vectors[f"blk.{layer}.ssm_a"]
    _bit_exact(gate, trace.first(evaluation, f"gate-{layer}"))
    beta = ops.sigmoid(trace.first(evaluation, f"beta-{layer}")[0, :, :, 0])
    _bit_exact(beta, trace.first(evaluation, f"beta_sigmoid-{layer}"))
    k = trace.first(evaluation, f"k_conv_predelta-{layer}")[0]
    v = trace.first(evaluation, f"v_conv_predelta-{layer}")[0]
    repeats = v.shape[1] // k.shape[1]
    state = trace.first(evaluation, f"state_predelta-{layer}")[0].transpose(1, 2)  # ggml keeps it [value, key]
    q, k = q.repeat(1, repeats, 1), k.repeat(1, repeats, 1)
    out, new_state = ops.delta_rule(q, k, v, beta, gate, state)
    expected = trace.first(evaluation, f"attn_output-{layer}")[0]
    _bit_exact(out, expected)
    _bit_exact(new_state.transpose(1, 2), trace.first(evaluation, f"new_state-{layer}")[0])
    z = trace.first(evaluation, f"z-{layer}")[0, 0].reshape(expected.shape)
    gated = ggml_rms_norm(expected, vectors[f"blk.{layer}.ssm_norm.weight"], 1e-6) * ops.silu(z)
    _bit_exact(gated, trace.first(evaluation, f"final_output-{layer}"))


def test_partial_multi_section_rope_equals_llama_cpps(trace: Trace) -> None:
    """The attention layer's query: a quarter of each head turned (interleaved M-RoPE, text positions), the rest kept."""
    normed, roped = trace.first(0, "Qcur_normed-3")[0], trace.all(0, "Qcur-3")[0][0]
    rotated = 8
    positions = torch.arange(normed.shape[0])
    cos, sin = ggml_mrope_table(positions.unsqueeze(1).expand(-1, 4), rotated, 1e6, [0, 1, 2, 0])
    assert torch.equal(cos, ggml_rope_table(positions, rotated, 1e6)[0])  # text: every section at the same position
    _bit_exact(torch.cat((ggml_rope(normed[..., :rotated].contiguous(), cos, sin), normed[..., rotated:]), dim=-1), roped)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_flash_attention_on_the_f16_cache_equals_llama_cpps(trace: Trace, implementation: str) -> None:
    """Each batch of the prompt (tiled from 64 rows, row by row under), then decode steps split over 2 threads."""
    kernels = _kernels(implementation)
    keys: list[torch.Tensor] = []
    values: list[torch.Tensor] = []
    kernels_seen: set[str] = set()
    for evaluation in range(1 + STEPS):
        # names repeat: the product [1, 1, T, 64], then the roped heads [1, T, 2, 32] (K) or [1, T, 4, 32] (Q)
        keys += [k[0] for k in trace.all(evaluation, "Kcur-3") if k.shape[2:] == (2, 32)]
        values += [v[0, 0].reshape(-1, 2, 32) for v in trace.all(evaluation, "Vcur-3") if v.shape[2:] != (2, 32)]
        queries = [q[0] for q in trace.all(evaluation, "Qcur-3") if q.shape[2:] == (4, 32)]
        outputs = trace.all(evaluation, "attn_pregate-3")
        cache_k = torch.cat(keys).transpose(0, 1).half().contiguous()
        cache_v = torch.cat(values).transpose(0, 1).half().contiguous()
        first = cache_k.shape[1] - sum(q.shape[0] for q in queries)
        for query, expected in zip(queries, outputs, strict=True):
            rows = query.shape[0]
            stop = first + rows
            cells = max(256, -(-stop // 256) * 256)
            kernels_seen.add("tiled" if rows >= 64 else "split" if rows == 1 and cells >= 512 else "one row")
            args = (query, cache_k[:, :stop], cache_v[:, :stop], rows, cells, 2, WIDTH)
            _bit_exact(ggml_flash_attention(*args) if kernels is None else native_flash_attention(kernels, *args), expected)
            if kernels is not None:  # AVX-512's four rows at a time and the row-by-row loops alike
                kernels.use_avx512(False)
                try:
                    _bit_exact(native_flash_attention(kernels, *args), expected)
                finally:
                    kernels.use_avx512(True)
            first = stop
    assert kernels_seen == {"tiled", "split", "one row"}


@pytest.mark.parametrize("width", [8, 16])
def test_the_c_delta_rule_equals_the_torch_one_on_whole_vectors(width: int) -> None:
    """The tiny model's heads (16 values) take only the dots' leftover loop; Qwen3.5-0.8B's (128) take the 4
    accumulators of lanes: the C kernels and the torch emulation agree there too, for both vector widths."""
    kernels = _kernels("c")
    assert kernels is not None
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn((5, 3, 128), generator=generator) for _ in range(3))
    g, beta = -torch.rand((5, 3), generator=generator), torch.rand((5, 3), generator=generator)
    state = torch.randn((3, 128, 128), generator=generator) * 0.1
    given = state.clone()
    out, new_state = ggml_gated_delta_net(q, k, v, g, beta, state, width)
    native_out, native_state = native_gated_delta_net(kernels, q, k, v, g, beta, state, width)
    _bit_exact(native_out, out)
    _bit_exact(native_state, new_state)
    assert torch.equal(state, given)  # a prefix's state is shared: the kernel updates a copy
    # the values read where the convolution left them, beside other columns
    wider = torch.cat((torch.randn((5, 7), generator=generator), v.reshape(5, -1), torch.randn((5, 3), generator=generator)), dim=1)
    in_place = wider[:, 7 : 7 + 3 * 128].view(5, 3, 128)
    assert not in_place.is_contiguous()
    _bit_exact(native_gated_delta_net(kernels, q, k, in_place, g, beta, state, width)[0], out)


@pytest.mark.parametrize("width", [8, 16])
@pytest.mark.parametrize("channels", [16, 37])
def test_the_c_convolution_equals_the_torch_one_across_channel_lanes(width: int, channels: int) -> None:
    """The C convolution runs the channels in vector lanes over the window by time: whole vectors and a tail give the
    emulation's bits (rounded then added taps for 8 lanes, fused for 16)."""
    kernels = _kernels("c")
    assert kernels is not None
    generator = torch.Generator().manual_seed(1)
    window, kernel = torch.randn((channels, 3 + 29), generator=generator), torch.randn((channels, 4), generator=generator)
    by_time = window.T
    _bit_exact(native_ssm_conv_for(kernels, by_time[:3], by_time[3:], kernel, width), ggml_ssm_conv(window, kernel, width))
    # Qwen3.5's SiLU after it, in the same pass: each output row as ggml_silu computes it
    expected = ggml_silu(ggml_ssm_conv(window, kernel, width), width)
    _bit_exact(native_ssm_conv_for(kernels, by_time[:3], by_time[3:], kernel, width, silu=True), expected)
    # the rows read where a wider product left them (Qwen3.5's q, k, v columns beside its gate)
    wider = torch.cat((by_time[3:], torch.randn((29, 5), generator=generator)), dim=1)
    _bit_exact(native_ssm_conv_for(kernels, by_time[:3], wider[:, :channels], kernel, width, silu=True), expected)


@pytest.mark.parametrize("width", [8, 16])
@pytest.mark.parametrize("shape", [(7, 48), (3, 5, 37), (2, 9)], ids=["whole", "tail", "short"])
def test_the_c_silu_and_key_norm_equal_the_torch_ones(width: int, shape: tuple[int, ...]) -> None:
    """SiLU in one C pass (whole vectors by `ggml_v_expf`, a row's tail by the C library's expf) and the key/query norm
    on the C rms_norm give the emulation's bits, over magnitudes where expf under- and overflows."""
    kernels = _kernels("c")
    assert kernels is not None
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(shape, generator=generator) * torch.exp2(torch.randint(-6, 8, shape, generator=generator).float())
    x.view(-1)[:4] = torch.tensor([0.0, -0.0, 120.0, -120.0])
    _bit_exact(native_silu(kernels, x, width), ggml_silu(x, width))
    _bit_exact(native_l2_norm(kernels, x, 1e-6), ggml_l2_norm(x, 1e-6))


def test_the_c_rotation_reads_heads_in_place_and_writes_attentions_f16_keys() -> None:
    """NeoX rotation of heads cut from a wider product's columns (the tower's q and k in its qkv) gives the bits of
    the same values made contiguous first, and its f16 form by head is that result cast to f16 by head (as ggml
    casts attention's keys)."""
    kernels = _kernels("c")
    assert kernels is not None
    generator = torch.Generator().manual_seed(5)
    qkv = torch.randn((9, 3, 4, 32), generator=generator) * 4.0
    k = qkv.unbind(dim=1)[1]
    assert not k.is_contiguous()
    cos, sin = torch.randn((9, 1, 16), generator=generator), torch.randn((9, 1, 16), generator=generator)
    expected = ggml_rope(k.contiguous(), cos, sin)
    _bit_exact(native_rope(kernels, k, cos, sin), expected)
    keys = native_rope(kernels, k, cos, sin, f16_by_head=True)
    assert keys.dtype == torch.float16 and keys.is_contiguous()
    assert torch.equal(keys.view(torch.int16), expected.transpose(0, 1).half().contiguous().view(torch.int16))


@pytest.mark.parametrize("width", [8, 16])
def test_the_c_silu_reads_a_wider_products_columns_in_place(width: int) -> None:
    """SiLU of heads cut from a wider product's columns (Qwen3.5's gate z beside its q, k, v): the rows read at their
    stride give the bits of the same values made contiguous first."""
    kernels = _kernels("c")
    assert kernels is not None
    generator = torch.Generator().manual_seed(4)
    product = torch.randn((9, 3 + 4 * 37 + 11), generator=generator) * 8.0
    heads = product[:, 3 : 3 + 4 * 37].view(9, 4, 37)
    assert not heads.is_contiguous()
    _bit_exact(native_silu(kernels, heads, width), ggml_silu(heads.contiguous(), width))


@pytest.mark.parametrize("patches,dim", [(70, 64), (150, 48)])
@pytest.mark.parametrize("spread", [1.0, 40.0], ids=["near", "underflowing"])
def test_the_c_image_attention_equals_the_torch_one_tile_by_tile(spread: float, patches: int, dim: int) -> None:
    """The tower's tiled attention (whole tiles of 64 cells and a partial one) on the C kernels gives the emulation's
    bits: with AVX-512 sixteen rows a register in blocks of up to 64 (70 patches: one block; 150: 64, 64 and 16) and
    the last rows four at a time, row by row without; also where most weights leave expf's range (queries `spread`
    times larger)."""
    kernels = _kernels("c")
    assert kernels is not None
    generator = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn((patches, 2, dim), generator=generator) for _ in range(3))
    q = q * spread
    for width in (8, 16):
        expected = ggml_image_attention(q, k, v, width)
        _bit_exact(native_image_attention(kernels, q, k, v, width), expected)
        kernels.use_avx512(False)
        try:
            _bit_exact(native_image_attention(kernels, q, k, v, width), expected)
        finally:
            kernels.use_avx512(True)
