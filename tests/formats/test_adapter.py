"""GGUF LoRA adapters: tensor types, alpha and scale, validation against the interpreter."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from tests.helpers.bounded import run_cli
from tests.helpers.programs import TinyProgram
from pawfn import GPT2, AdapterError, PawConfig, PawFn, Qwen3_0_6B, Torch
from pawfn.formats.adapter import read_lora_adapter
from tests.helpers.tiny_models import TinyInterpreter, dequantized, random_lora, write_adapter_gguf, write_bundle

Q = gguf.GGMLQuantizationType


@pytest.mark.parametrize("qtype", [Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0])
def test_reads_tensor_types(qwen3: TinyInterpreter, tmp_path: Path, qtype: Q) -> None:
    pairs = random_lora(qwen3)
    path = tmp_path / "adapter.gguf"
    write_adapter_gguf(path, "qwen3", pairs, alpha=16.0, qtype=qtype)
    adapter = read_lora_adapter(path, Qwen3_0_6B)
    expected = dequantized(pairs, qtype) if qtype != Q.BF16 else pairs
    assert set(adapter.pairs) == set(pairs)
    assert adapter.tensor_types == {qtype.name}
    for target, (a, b) in expected.items():
        got = adapter.pairs[target]
        tolerance = 1e-2 if qtype == Q.BF16 else 0.0  # bf16 keeps 8 bits of mantissa
        np.testing.assert_allclose(got.a, a, rtol=tolerance, atol=tolerance)
        np.testing.assert_allclose(got.b, b, rtol=tolerance, atol=tolerance)
        assert got.a.dtype == np.float32


def test_q4_0_is_lossy_but_close(qwen3: TinyInterpreter, tmp_path: Path) -> None:
    pairs = random_lora(qwen3)
    path = tmp_path / "adapter.gguf"
    write_adapter_gguf(path, "qwen3", pairs, qtype=Q.Q4_0)
    adapter = read_lora_adapter(path, Qwen3_0_6B)
    target = next(iter(pairs))
    error = np.abs(adapter.pairs[target].a - pairs[target][0]).max()
    assert 0.0 < error < 0.2


def test_scale_is_alpha_over_rank(qwen3: TinyInterpreter, tmp_path: Path) -> None:
    path = tmp_path / "adapter.gguf"
    write_adapter_gguf(path, "qwen3", random_lora(qwen3, rank=32), alpha=48.0)
    adapter = read_lora_adapter(path, Qwen3_0_6B)
    assert adapter.alpha == 48.0 and adapter.rank == 32
    assert {pair.scale for pair in adapter.pairs.values()} == {48.0 / 32}


@pytest.mark.parametrize("alpha", [None, 0.0])
def test_missing_or_zero_alpha_means_scale_one(qwen3: TinyInterpreter, tmp_path: Path, alpha: float | None) -> None:
    """llama.cpp applies a LoRA without alpha at scale 1 (paw-rs's fallback of 16 is a bug)."""
    path = tmp_path / "adapter.gguf"
    write_adapter_gguf(path, "qwen3", random_lora(qwen3), alpha=alpha)
    assert {pair.scale for pair in read_lora_adapter(path, Qwen3_0_6B).pairs.values()} == {1.0}


def test_wrong_architecture(qwen3: TinyInterpreter, tmp_path: Path) -> None:
    path = tmp_path / "adapter.gguf"
    write_adapter_gguf(path, "qwen3", random_lora(qwen3))
    with pytest.raises(AdapterError, match="adapter is for architecture 'qwen3', but GPT2 needs 'gpt2'"):
        read_lora_adapter(path, GPT2)


def test_a_bundle_that_contradicts_itself_is_named_so_on_the_cli(qwen3: TinyInterpreter, gpt2: TinyInterpreter, tmp_path: Path) -> None:
    """meta.json says gpt2, adapter.gguf fits Qwen3: the one line says which file says what and the fix, not a model
    type to choose (a CLI user never chooses one)."""
    adapter = tmp_path / "adapter-source.gguf"
    write_adapter_gguf(adapter, "qwen3", random_lora(qwen3))
    bundle = write_bundle(tmp_path / "bundle", adapter, "gpt2", "Input: {INPUT_PLACEHOLDER}\nOutput:")
    run = run_cli("run", "--program", str(bundle), "--base", str(gpt2.gguf_path), "--input", "hi", "--max-tokens", "2")
    run.assert_one_line_error(1, "the program contradicts itself", "meta.json names interpreter 'gpt2'", "adapter.gguf was made for a 'qwen3' model")
    assert "recompile the program or download it again" in run.stderr


def test_not_an_adapter(qwen3: TinyInterpreter, tmp_path: Path) -> None:
    path = tmp_path / "adapter.gguf"
    write_adapter_gguf(path, "qwen3", random_lora(qwen3), general_type="model")
    with pytest.raises(AdapterError, match="general.type is 'model'"):
        read_lora_adapter(path, Qwen3_0_6B)


def test_missing_half(qwen3: TinyInterpreter, tmp_path: Path) -> None:
    pairs = random_lora(qwen3)
    target = next(iter(pairs))
    a = pairs[target][0]
    path = tmp_path / "adapter.gguf"
    rest = {name: pair for name, pair in pairs.items() if name != target}
    write_adapter_gguf(path, "qwen3", rest, extra_tensors={f"{target}.lora_a": a})
    with pytest.raises(AdapterError, match=f"{target} has no lora_b tensor"):
        read_lora_adapter(path, Qwen3_0_6B)


def test_unknown_module(qwen3: TinyInterpreter, tmp_path: Path) -> None:
    path = tmp_path / "adapter.gguf"
    extra = np.zeros((32, 64), dtype=np.float32)
    write_adapter_gguf(path, "qwen3", random_lora(qwen3), extra_tensors={"blk.0.attn_qkv.weight.lora_a": extra})
    with pytest.raises(AdapterError, match="unknown module 'attn_qkv' for Qwen3_0_6B"):
        read_lora_adapter(path, Qwen3_0_6B)


def test_unexpected_tensor(qwen3: TinyInterpreter, tmp_path: Path) -> None:
    path = tmp_path / "adapter.gguf"
    extra = np.zeros((32, 64), dtype=np.float32)
    write_adapter_gguf(path, "qwen3", random_lora(qwen3), extra_tensors={"token_embd.weight": extra})
    with pytest.raises(AdapterError, match="unexpected tensor 'token_embd.weight'"):
        read_lora_adapter(path, Qwen3_0_6B)


def test_rank_mismatch(qwen3: TinyInterpreter, tmp_path: Path) -> None:
    pairs = random_lora(qwen3)
    target = next(iter(pairs))
    a, b = pairs[target]
    pairs[target] = (a[:16], b)
    path = tmp_path / "adapter.gguf"
    write_adapter_gguf(path, "qwen3", pairs)
    with pytest.raises(AdapterError, match="do not share a rank"):
        read_lora_adapter(path, Qwen3_0_6B)


def test_empty_adapter(tmp_path: Path) -> None:
    path = tmp_path / "adapter.gguf"
    write_adapter_gguf(path, "qwen3", {}, extra_tensors={})
    with pytest.raises(AdapterError, match="holds no LoRA tensors"):
        read_lora_adapter(path, Qwen3_0_6B)


def test_not_gguf(tmp_path: Path) -> None:
    path = tmp_path / "adapter.gguf"
    path.write_bytes(b"GGUF" + bytes(4000))
    with pytest.raises(AdapterError, match="not a readable GGUF file"):
        read_lora_adapter(path, Qwen3_0_6B)


def test_shape_that_does_not_fit_the_base(qwen3_program: TinyProgram, tmp_path: Path) -> None:
    """An adapter for a larger model is refused when it meets the base, naming the weight."""
    pairs = dict(qwen3_program.pairs)
    target = "blk.0.attn_q.weight"
    a, b = pairs[target]
    pairs[target] = (np.zeros((a.shape[0], 96), dtype=np.float32), b)
    path = tmp_path / "adapter.gguf"
    write_adapter_gguf(path, "qwen3", pairs)
    bundle = write_bundle(tmp_path / "bundle", path, "Qwen/Qwen3-0.6B", qwen3_program.template)
    with pytest.raises(AdapterError, match=r"blk.0.attn_q.weight: .* do not fit the base weight \[128, 64\]"):
        PawFn[Qwen3_0_6B, Torch].load_sync(bundle, base=qwen3_program.interpreter.gguf_path, config=PawConfig())


def test_adapter_layer_beyond_the_base(qwen3_program: TinyProgram, tmp_path: Path) -> None:
    pairs = dict(qwen3_program.pairs)
    pairs["blk.7.attn_q.weight"] = pairs["blk.0.attn_q.weight"]
    path = tmp_path / "adapter.gguf"
    write_adapter_gguf(path, "qwen3", pairs)
    bundle = write_bundle(tmp_path / "bundle", path, "Qwen/Qwen3-0.6B", qwen3_program.template)
    with pytest.raises(AdapterError, match="adapts blk.7.attn_q.weight, which the base model does not have"):
        PawFn[Qwen3_0_6B, Torch].load_sync(bundle, base=qwen3_program.interpreter.gguf_path)


@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q8_0])
@pytest.mark.parametrize("scale", [np.float16(np.nan), np.float16(np.inf)])
def test_a_non_finite_block_scale_is_refused_without_dequantizing(qwen3: TinyInterpreter, tmp_path: Path, qtype: Q, scale: np.float16) -> None:
    path = tmp_path / "adapter.gguf"
    pairs = random_lora(qwen3)
    write_adapter_gguf(path, "qwen3", pairs, qtype=qtype)
    target = sorted(pairs)[-1]
    tensor = next(t for t in gguf.GGUFReader(path).tensors if t.name == f"{target}.lora_b")
    data = bytearray(path.read_bytes())
    block = gguf.GGML_QUANT_SIZES[qtype][1]
    offset = tensor.data_offset + 3 * block  # the fourth block's float16 scale
    data[offset : offset + 2] = scale.tobytes()
    path.write_bytes(bytes(data))
    with pytest.raises(AdapterError, match=rf"{target}\.lora_b holds non-finite values"):
        read_lora_adapter(path, Qwen3_0_6B)


def test_quantized_halves_are_dequantized_only_when_used(qwen3: TinyInterpreter, tmp_path: Path) -> None:
    path = tmp_path / "adapter.gguf"
    pairs = random_lora(qwen3)
    write_adapter_gguf(path, "qwen3", pairs, qtype=Q.Q4_0)
    adapter = read_lora_adapter(path, Qwen3_0_6B)
    pair = adapter.pairs[sorted(pairs)[0]]
    assert "values" not in vars(pair.a_half) and pair.quantized  # what llama.cpp's arithmetic multiplies as stored
    np.testing.assert_array_equal(pair.a, dequantized(pairs, Q.Q4_0)[sorted(pairs)[0]][0])
    assert "values" in vars(pair.a_half) and adapter.rank == pair.rank == pair.a.shape[0]
