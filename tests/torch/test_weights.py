"""Base weights from HF folders and GGUF files: hyperparameters from the files, clear errors otherwise."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from pawfn import GPT2, BaseModelError, Qwen3_0_6B, TokenizerError
from pawfn.torch.weights.reader import read_base_weights
from tests.helpers.programs import requires_llama_cpp
from tests.helpers.references import llama_quantize
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


_PEAK_SCRIPT = """
import os, sys
from pathlib import Path
import torch
from pawfn import Qwen3_0_6B
from pawfn.torch.engine.network import TorchInterpreter
from pawfn.torch.weights.reader import read_base_weights
def status(key):
    line = next(line for line in open("/proc/self/status") if line.startswith(key + ":"))
    return int(line.split()[1]) * 1024
warm = read_base_weights(Path(sys.argv[2]), Qwen3_0_6B)  # the runtime's one-time costs (torch's first ops) first
TorchInterpreter.load(warm, torch.device("cpu"), torch.float32, None, "native")
open("/proc/self/clear_refs", "w").write("5")  # the peak from here on (ru_maxrss would hold the parent's, from fork)
before = status("VmRSS")
weights = read_base_weights(Path(sys.argv[1]), Qwen3_0_6B)
interpreter = TorchInterpreter.load(weights, torch.device("cpu"), torch.float32, None, "native")
print(status("VmHWM") - before)
"""


def test_a_bf16_hf_folder_loads_with_a_peak_near_its_float32_size(qwen3: TinyInterpreter, tmp_path: Path) -> None:
    """A 40M-parameter bf16 folder (80 MB on disk, 160 MB in float32): loading adds at most 1.25x its float32 size to
    the process at its peak (read tensor by tensor into memory of their own: 1.12x here; through safetensors' map of
    the whole file its pages stayed too: 1.72x, and a 4.0 GB peak for a 0.6B folder, now 2.6 GB)."""
    import subprocess
    import sys

    import torch
    from safetensors.torch import save_file
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=8000,
        hidden_size=512,
        intermediate_size=1536,
        num_hidden_layers=12,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=64,
        max_position_embeddings=512,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)  # pyright: ignore[reportUnknownMemberType]  # torch leaves `seed` unannotated
    model = Qwen3ForCausalLM(config)
    folder = tmp_path / "bf16"
    config.save_pretrained(str(folder))  # pyright: ignore[reportUnknownMemberType]  # transformers' **kwargs
    state = {name: tensor.to(torch.bfloat16) for name, tensor in model.state_dict().items() if name != "lm_head.weight"}  # tied
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    float32_bytes = sum(tensor.numel() for tensor in state.values()) * 4
    del model, state
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(qwen3.hf_dir / name, folder / name)
    result = subprocess.run(
        [sys.executable, "-c", _PEAK_SCRIPT, str(folder), str(qwen3.hf_dir)], capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, result.stderr[-2000:]
    added = int(result.stdout.split()[-1])
    assert float32_bytes > 150e6 and added <= 1.25 * float32_bytes, (added / 1e6, float32_bytes / 1e6)


@requires_llama_cpp
def test_a_fused_group_is_joined_before_the_next_layer_is_read(qwen35: TinyInterpreter, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Block matrices that read one input (llama.cpp's arithmetic on a Q8_0 base) are joined as soon as their group is
    complete, while the file is still being read: joined after the whole file, every layer's parts stayed beside
    their joined copies (+140 MB of load peak on a Qwen3.5-0.8B-shaped base)."""
    import torch

    from pawfn import Qwen3_5_0_8B
    from pawfn.torch.engine.network import TorchInterpreter
    from pawfn.torch.ggml.c_kernels import native_kernels
    from pawfn.torch.weights import loading

    if native_kernels() is None:
        pytest.skip("no C compiler here: the torch emulation's block matrices are never joined")
    base = llama_quantize(qwen35.gguf_path, tmp_path / "q8_0.gguf", "Q8_0")
    joined: list[tuple[tuple[str, ...], set[str]]] = []  # each group, and the matrices loaded when it was joined
    join_group = loading._join_group  # pyright: ignore[reportPrivateUsage]  # the step under test

    def spy(loaded: loading.DeviceWeights, group: tuple[str, ...]) -> None:
        new = group not in loaded.groups
        join_group(loaded, group)
        if new and group in loaded.groups:
            joined.append((group, set(loaded.matrices)))

    monkeypatch.setattr(loading, "_join_group", spy)
    interpreter = TorchInterpreter.load(read_base_weights(base, Qwen3_5_0_8B), torch.device("cpu"), torch.float32, numerics="llamacpp")
    assert sorted(group for group, _ in joined) == sorted(interpreter.weights.groups)  # each joined once
    assert {len(group) for group, _ in joined} >= {2, 3}  # gate/up and full attention's q, k, v at least
    for group, loaded_then in joined:
        layer = int(group[0].split(".")[1])
        assert not any(name.startswith(f"blk.{layer + 1}.") for name in loaded_then), group
