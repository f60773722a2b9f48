"""Base weights from HF folders and GGUF files: hyperparameters from the files, clear errors otherwise."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from pawfn import GPT2, BaseModelError, Qwen3_0_6B, TokenizerError
from pawfn.torch.weights.reader import read_base_weights
from tests.helpers.tiny_models import TinyInterpreter


def _copy(tiny: TinyInterpreter, target: Path) -> Path:
    shutil.copytree(tiny.hf_dir, target)
    return target


def test_gguf_and_hf_agree_on_the_architecture(qwen3: TinyInterpreter, gpt2: TinyInterpreter) -> None:
    for tiny, model in ((qwen3, Qwen3_0_6B), (gpt2, GPT2)):
        from_gguf = read_base_weights(tiny.gguf_path, model).architecture
        from_hf = read_base_weights(tiny.hf_dir, model).architecture
        assert from_gguf.norm_eps == pytest.approx(from_hf.norm_eps, rel=1e-6)  # GGUF keeps it as float32
        assert dataclasses.replace(from_gguf, norm_eps=from_hf.norm_eps) == from_hf
    qwen = read_base_weights(qwen3.gguf_path, Qwen3_0_6B).architecture
    assert (qwen.head_dim, qwen.n_kv_heads, qwen.rope_theta) == (32, 2, 1000000.0)  # key_length honoured


def test_hf_tensors_are_renamed_and_transposed(gpt2: TinyInterpreter) -> None:
    from_gguf = dict(read_base_weights(gpt2.gguf_path, GPT2).tensors())
    from_hf = dict(read_base_weights(gpt2.hf_dir, GPT2).tensors())
    assert set(from_hf) == set(from_gguf)
    for name, array in from_gguf.items():
        assert (from_hf[name] == array).all(), name


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"hidden_size": "wide"}, "config.json is invalid: hidden_size: Input should be a valid integer"),
        ({"num_hidden_layers": None}, "num_hidden_layers"),
        ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1.0}}, "rope type 'yarn' is not supported"),
        ({"model_type": "llama"}, "model_type is 'llama', but Qwen3_0_6B needs 'qwen3'"),
    ],
)
def test_bad_hf_config(qwen3: TinyInterpreter, tmp_path: Path, change: dict[str, object], message: str) -> None:
    folder = _copy(qwen3, tmp_path / "hf")
    config = json.loads((folder / "config.json").read_text())
    config |= change
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(BaseModelError, match=message):
        read_base_weights(folder, Qwen3_0_6B)


def test_gpt2_activation_is_checked(gpt2: TinyInterpreter, tmp_path: Path) -> None:
    folder = _copy(gpt2, tmp_path / "hf")
    config = json.loads((folder / "config.json").read_text()) | {"activation_function": "relu"}
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(BaseModelError, match="activation 'relu' is not supported"):
        read_base_weights(folder, GPT2)


@pytest.mark.parametrize(
    ("missing", "error", "message"),
    [
        ("config.json", BaseModelError, "config.json is missing"),
        ("model.safetensors", BaseModelError, r"no \*.safetensors weights"),
        ("tokenizer.json", TokenizerError, "tokenizer.json is missing"),
    ],
)
def test_incomplete_hf_folder(qwen3: TinyInterpreter, tmp_path: Path, missing: str, error: type[Exception], message: str) -> None:
    folder = _copy(qwen3, tmp_path / "hf")
    (folder / missing).unlink()
    with pytest.raises(error, match=message):
        read_base_weights(folder, Qwen3_0_6B)


def test_not_gguf(tmp_path: Path) -> None:
    path = tmp_path / "weights.bin"
    path.write_bytes(b"PK\x03\x04 not gguf")
    with pytest.raises(BaseModelError, match="not a GGUF file"):
        read_base_weights(path, Qwen3_0_6B)
