"""Qwen3 for the Torch backend: GGUF and HF hyperparameters, the HF -> GGUF name map, shapes and the block.

Follows llama.cpp's qwen3 graph: RMS norms, q/k norms, NEOX RoPE, GQA attention, SwiGLU feed-forward.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import NamedTuple

import torch
from pydantic import BaseModel, ConfigDict

from ....core.errors import BaseModelError
from .base import Architecture, Family, Ops, parse_hf_config

__all__ = ["Qwen3Family"]

_BLOCK = {
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
_TOP = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight", "lm_head.weight": "output.weight"}
_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")


class _RopeParameters(BaseModel):
    model_config = ConfigDict(extra="allow")

    rope_type: str | None = None
    type: str | None = None
    rope_theta: float | None = None


class _HFConfig(BaseModel):
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


class _LayerNames(NamedTuple):
    """The GGUF names one block reads, built once per layer index rather than per token."""

    attn_norm: str
    qkv: tuple[str, str, str]
    q_norm: str
    k_norm: str
    attn_output: str
    ffn_norm: str
    gate_up: tuple[str, str]
    ffn_down: str


@functools.cache
def _names(layer: int) -> _LayerNames:
    block = f"blk.{layer}."
    return _LayerNames(
        attn_norm=block + "attn_norm.weight",
        qkv=(block + "attn_q.weight", block + "attn_k.weight", block + "attn_v.weight"),
        q_norm=block + "attn_q_norm.weight",
        k_norm=block + "attn_k_norm.weight",
        attn_output=block + "attn_output.weight",
        ffn_norm=block + "ffn_norm.weight",
        gate_up=(block + "ffn_gate.weight", block + "ffn_up.weight"),
        ffn_down=block + "ffn_down.weight",
    )


class Qwen3Family(Family):
    """Qwen3 (Qwen3-0.6B and its mirrors)."""

    name = "qwen3"
    norm_eps_key = "attention.layer_norm_rms_epsilon"
    rotary = True
    hf_top = _TOP
    hf_block = _BLOCK
    hf_layer = _LAYER

    def architecture_from_hf(self, raw_config: bytes, path: Path) -> Architecture:
        config = parse_hf_config(_HFConfig, raw_config, path)
        rope_theta = config.rope_theta
        rope = config.rope_parameters or config.rope_scaling
        if rope is not None:
            rope_type = rope.rope_type or rope.type or "default"
            if rope_type != "default":
                raise BaseModelError(path, f"rope type {rope_type!r} is not supported; pawfn runs plain RoPE")
            rope_theta = rope.rope_theta or rope_theta
        return Architecture(
            family=self.name,
            vocab_size=config.vocab_size,
            hidden_size=config.hidden_size,
            n_layers=config.num_hidden_layers,
            n_heads=config.num_attention_heads,
            n_kv_heads=config.num_key_value_heads or config.num_attention_heads,
            head_dim=config.head_dim or config.hidden_size // config.num_attention_heads,
            ffn_size=config.intermediate_size,
            norm_eps=config.rms_norm_eps,
            rope_theta=rope_theta,
            max_positions=config.max_position_embeddings,
        )

    def expected_shapes(self, arch: Architecture) -> dict[str, tuple[int, ...]]:
        hidden, q_size, kv_size = arch.hidden_size, arch.n_heads * arch.head_dim, arch.n_kv_heads * arch.head_dim
        shapes: dict[str, tuple[int, ...]] = {"token_embd.weight": (arch.vocab_size, hidden), "output_norm.weight": (hidden,)}
        for i in range(arch.n_layers):
            block = f"blk.{i}."
            shapes |= {
                block + "attn_norm.weight": (hidden,),
                block + "attn_q.weight": (q_size, hidden),
                block + "attn_k.weight": (kv_size, hidden),
                block + "attn_v.weight": (kv_size, hidden),
                block + "attn_output.weight": (hidden, q_size),
                block + "attn_q_norm.weight": (arch.head_dim,),
                block + "attn_k_norm.weight": (arch.head_dim,),
                block + "ffn_norm.weight": (hidden,),
                block + "ffn_gate.weight": (arch.ffn_size, hidden),
                block + "ffn_up.weight": (arch.ffn_size, hidden),
                block + "ffn_down.weight": (hidden, arch.ffn_size),
            }
        return shapes

    def rope_frequencies(self, arch: Architecture) -> torch.Tensor:
        half = arch.head_dim // 2
        exponents = torch.arange(0, half, dtype=torch.float64) * 2.0 / arch.head_dim
        return (1.0 / (arch.rope_theta**exponents)).to(torch.float32)

    def fused_groups(self, arch: Architecture) -> list[tuple[str, ...]]:
        return [group for layer in range(arch.n_layers) for group in (_names(layer).qkv, _names(layer).gate_up)]

    def embed(self, ops: Ops, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return ops.embedding(ids, "token_embd.weight")

    def block(self, ops: Ops, layer: int, hidden: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        arch, names, n = ops.architecture, _names(layer), hidden.shape[0]
        q, k, v = ops.linears(ops.rms_norm(hidden, names.attn_norm), names.qkv)
        q = ops.rope(ops.rms_norm(q.view(n, arch.n_heads, arch.head_dim), names.q_norm), positions)
        k = ops.rope(ops.rms_norm(k.view(n, arch.n_kv_heads, arch.head_dim), names.k_norm), positions)
        v = v.view(n, arch.n_kv_heads, arch.head_dim)
        attended = ops.linear(ops.attention(q, k, v, layer), names.attn_output)
        hidden = ops.output_rows(layer, hidden) + ops.output_rows(layer, attended)
        gate, up = ops.linears(ops.rms_norm(hidden, names.ffn_norm), names.gate_up)
        return hidden + ops.linear(ops.swiglu(gate, up), names.ffn_down)

    def final_norm(self, ops: Ops, hidden: torch.Tensor) -> torch.Tensor:
        return ops.rms_norm(hidden, "output_norm.weight")
