"""Base weights of an interpreter: hyperparameters, tensors (GGUF names) and tokenizer, from GGUF or HF."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, ValidationError

from .errors import BaseModelError, describe_validation_error
from .ggufio import GGUFFile, GGUFFormatError
from .models import InterpreterModel, ModelFamily
from .tokenizer import TextCodec

__all__ = ["Architecture", "BaseWeights", "read_base_weights"]

Array = npt.NDArray[np.float32]


@dataclass(frozen=True)
class Architecture:
    """Hyperparameters of one interpreter checkpoint, read from its files (never from library defaults)."""

    family: ModelFamily
    vocab_size: int
    hidden_size: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn_size: int
    norm_eps: float
    rope_theta: float
    max_positions: int
    """Positions the checkpoint was trained for (GPT-2 cannot exceed it: learned position table)."""


@dataclass
class BaseWeights:
    """Everything a backend needs to build the interpreter; `tensors` yields (GGUF name, float32 `[out, in]`)."""

    source: Path
    architecture: Architecture
    codec: TextCodec
    tensors: Callable[[], Iterator[tuple[str, Array]]]


def read_base_weights(source: Path, model: type[InterpreterModel]) -> BaseWeights:
    """Open a GGUF file or a Hugging Face folder (config.json + safetensors + tokenizer.json) for `model`."""
    if source.is_dir():
        return _read_hf_folder(source, model)
    if not source.is_file():
        raise BaseModelError(source, "base weights not found: pass a GGUF file or a Hugging Face model folder")
    with source.open("rb") as handle:
        magic = handle.read(4)
    if magic != b"GGUF":
        raise BaseModelError(source, "not a GGUF file (bad magic); pass a GGUF file or a Hugging Face model folder")
    return _read_gguf(source, model)


def _read_gguf(path: Path, model: type[InterpreterModel]) -> BaseWeights:
    try:
        file = GGUFFile(path)
        arch_name = file.string("general.architecture")
        if arch_name != model.gguf_architecture:
            raise BaseModelError(
                path, f"GGUF architecture is {arch_name!r}, but {model.__name__} needs {model.gguf_architecture!r}"
            )
        if file.string("general.type") == "adapter":
            raise BaseModelError(path, "this GGUF is a LoRA adapter, not base weights")
        key = f"{arch_name}."

        def required(name: str) -> int:
            value = file.integer(key + name)
            if value is None or value <= 0:
                raise BaseModelError(path, f"GGUF metadata {key + name} is missing or not positive")
            return value

        if not file.has_tensor("token_embd.weight"):
            raise BaseModelError(path, "GGUF has no token_embd.weight tensor")
        vocab_size = file.tensor_shape("token_embd.weight")[0]
        hidden = required("embedding_length")
        n_heads = required("attention.head_count")
        if model.family == "qwen3":
            eps = file.number(key + "attention.layer_norm_rms_epsilon")
        else:
            eps = file.number(key + "attention.layer_norm_epsilon")
        if eps is None:
            raise BaseModelError(path, f"GGUF metadata for the normalization epsilon of {arch_name} is missing")
        architecture = Architecture(
            family=model.family,
            vocab_size=vocab_size,
            hidden_size=hidden,
            n_layers=required("block_count"),
            n_heads=n_heads,
            n_kv_heads=file.integer(key + "attention.head_count_kv") or n_heads,
            head_dim=file.integer(key + "attention.key_length") or hidden // n_heads,
            ffn_size=required("feed_forward_length"),
            norm_eps=eps,
            rope_theta=(file.number(key + "rope.freq_base") or 10000.0) if model.family == "qwen3" else 0.0,
            max_positions=required("context_length"),
        )
        value_length = file.integer(key + "attention.value_length")
        if value_length is not None and value_length != architecture.head_dim:
            raise BaseModelError(path, "attention.value_length differs from attention.key_length; not supported")
    except GGUFFormatError as exc:
        raise BaseModelError(path, str(exc)) from exc
    codec = TextCodec.from_gguf(file)

    def tensors() -> Iterator[tuple[str, Array]]:
        for name in file.tensor_names():
            try:
                yield name, file.read_f32(name)
            except GGUFFormatError as exc:
                raise BaseModelError(path, str(exc)) from exc

    return BaseWeights(source=path, architecture=architecture, codec=codec, tensors=tensors)


_QWEN3_BLOCK = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
_QWEN3_TOP = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
_GPT2_BLOCK = {
    "ln_1.weight": "attn_norm.weight",
    "ln_1.bias": "attn_norm.bias",
    "attn.c_attn.weight": "attn_qkv.weight",
    "attn.c_attn.bias": "attn_qkv.bias",
    "attn.c_proj.weight": "attn_output.weight",
    "attn.c_proj.bias": "attn_output.bias",
    "ln_2.weight": "ffn_norm.weight",
    "ln_2.bias": "ffn_norm.bias",
    "mlp.c_fc.weight": "ffn_up.weight",
    "mlp.c_fc.bias": "ffn_up.bias",
    "mlp.c_proj.weight": "ffn_down.weight",
    "mlp.c_proj.bias": "ffn_down.bias",
}
_GPT2_TOP = {
    "wte.weight": "token_embd.weight",
    "wpe.weight": "position_embd.weight",
    "ln_f.weight": "output_norm.weight",
    "ln_f.bias": "output_norm.bias",
    "lm_head.weight": "output.weight",
}
_QWEN3_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
_GPT2_LAYER = re.compile(r"^h\.(\d+)\.(.+)$")
_GPT2_SKIPPED = re.compile(r"^h\.\d+\.attn\.(bias|masked_bias)$")


def _gguf_name(hf_name: str, family: ModelFamily) -> str | None:
    """GGUF name of a HF checkpoint tensor; None for buffers pawfn does not need."""
    if family == "qwen3":
        top, block, layer = _QWEN3_TOP, _QWEN3_BLOCK, _QWEN3_LAYER
    else:
        hf_name = hf_name.removeprefix("transformer.")
        if _GPT2_SKIPPED.match(hf_name):
            return None
        top, block, layer = _GPT2_TOP, _GPT2_BLOCK, _GPT2_LAYER
    if hf_name in top:
        return top[hf_name]
    match = layer.match(hf_name)
    if match and match.group(2) in block:
        return f"blk.{match.group(1)}.{block[match.group(2)]}"
    return ""


class _RopeParameters(BaseModel):
    model_config = ConfigDict(extra="allow")

    rope_type: str | None = None
    type: str | None = None
    rope_theta: float | None = None


class _HFConfig(BaseModel):
    """The part of a `config.json` every checkpoint has."""

    model_config = ConfigDict(extra="allow")

    model_type: str | None = None


class _Qwen3HFConfig(BaseModel):
    """`config.json` of a Qwen3 checkpoint; defaults are transformers' Qwen3Config defaults."""

    model_config = ConfigDict(extra="allow")

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_parameters: _RopeParameters | None = None
    rope_scaling: _RopeParameters | None = None
    max_position_embeddings: int


class _GPT2HFConfig(BaseModel):
    """`config.json` of a GPT-2 checkpoint; defaults are transformers' GPT2Config defaults."""

    model_config = ConfigDict(extra="allow")

    vocab_size: int
    n_embd: int
    n_layer: int
    n_head: int
    n_positions: int
    n_inner: int | None = None
    layer_norm_epsilon: float = 1e-5
    activation_function: str = "gelu_new"


_ConfigT = TypeVar("_ConfigT", bound=BaseModel)


def _parse_config(kind: type[_ConfigT], raw: bytes, path: Path) -> _ConfigT:
    try:
        return kind.model_validate_json(raw)
    except ValidationError as exc:
        raise BaseModelError(path, f"config.json is invalid: {describe_validation_error(exc)}") from exc


def _hf_architecture(model: type[InterpreterModel], raw: bytes, path: Path) -> Architecture:
    if model.family == "qwen3":
        qwen = _parse_config(_Qwen3HFConfig, raw, path)
        rope_theta = qwen.rope_theta
        rope = qwen.rope_parameters or qwen.rope_scaling
        if rope is not None:
            rope_type = rope.rope_type or rope.type or "default"
            if rope_type != "default":
                raise BaseModelError(path, f"rope type {rope_type!r} is not supported; pawfn runs plain RoPE")
            rope_theta = rope.rope_theta or rope_theta
        head_dim = qwen.head_dim or qwen.hidden_size // qwen.num_attention_heads
        return Architecture(
            family="qwen3",
            vocab_size=qwen.vocab_size,
            hidden_size=qwen.hidden_size,
            n_layers=qwen.num_hidden_layers,
            n_heads=qwen.num_attention_heads,
            n_kv_heads=qwen.num_key_value_heads or qwen.num_attention_heads,
            head_dim=head_dim,
            ffn_size=qwen.intermediate_size,
            norm_eps=qwen.rms_norm_eps,
            rope_theta=rope_theta,
            max_positions=qwen.max_position_embeddings,
        )
    gpt2 = _parse_config(_GPT2HFConfig, raw, path)
    if gpt2.activation_function not in ("gelu_new", "gelu_pytorch_tanh"):
        raise BaseModelError(path, f"activation {gpt2.activation_function!r} is not supported; GPT-2 uses gelu_new")
    return Architecture(
        family="gpt2",
        vocab_size=gpt2.vocab_size,
        hidden_size=gpt2.n_embd,
        n_layers=gpt2.n_layer,
        n_heads=gpt2.n_head,
        n_kv_heads=gpt2.n_head,
        head_dim=gpt2.n_embd // gpt2.n_head,
        ffn_size=gpt2.n_inner or 4 * gpt2.n_embd,
        norm_eps=gpt2.layer_norm_epsilon,
        rope_theta=0.0,
        max_positions=gpt2.n_positions,
    )


def _read_hf_folder(folder: Path, model: type[InterpreterModel]) -> BaseWeights:
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise BaseModelError(folder, "config.json is missing; a Hugging Face model folder needs it")
    try:
        raw = config_path.read_bytes()
    except OSError as exc:
        raise BaseModelError(config_path, f"cannot read config.json: {exc}") from exc
    model_type = _parse_config(_HFConfig, raw, config_path).model_type
    if model_type != model.hf_model_type:
        raise BaseModelError(
            config_path, f"model_type is {model_type!r}, but {model.__name__} needs {model.hf_model_type!r}"
        )
    architecture = _hf_architecture(model, raw, config_path)
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise BaseModelError(folder, "no *.safetensors weights in the folder")
    codec = TextCodec.from_hf_folder(folder, model)
    conv1d = {f"{module}.weight" for module in model.conv1d_modules}

    def tensors() -> Iterator[tuple[str, Array]]:
        from safetensors import safe_open

        for file in files:
            with safe_open(str(file), framework="pt") as handle:
                for hf_name in handle.keys():
                    name = _gguf_name(hf_name, model.family)
                    if name is None:
                        continue
                    if not name:
                        raise BaseModelError(file, f"unexpected tensor {hf_name!r} for {model.__name__}")
                    array = handle.get_tensor(hf_name).float().numpy()
                    if name.split(".", 2)[-1] in conv1d:
                        array = np.ascontiguousarray(array.T)  # Conv1D stores [in, out]
                    yield name, array

    return BaseWeights(source=folder, architecture=architecture, codec=codec, tensors=tensors)
