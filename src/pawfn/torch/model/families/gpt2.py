"""GPT-2 for the Torch backend: GGUF and HF hyperparameters, the HF -> GGUF name map, shapes and the block.

Follows llama.cpp's gpt2 graph: learned positions, pre-LayerNorm, fused QKV, tanh-approximated GELU. HF
checkpoints store these projections as Conv1D (`[in, out]`); the weight reader transposes them.
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

__all__ = ["GPT2Family"]

_BLOCK = {
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
_TOP = {
    "wte.weight": "token_embd.weight",
    "wpe.weight": "position_embd.weight",
    "ln_f.weight": "output_norm.weight",
    "ln_f.bias": "output_norm.bias",
    "lm_head.weight": "output.weight",
}
_LAYER = re.compile(r"^h\.(\d+)\.(.+)$")
_SKIPPED = re.compile(r"^h\.\d+\.attn\.(bias|masked_bias)$")


class _HFConfig(BaseModel):
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


class _LayerNames(NamedTuple):
    """The GGUF names one block reads, built once per layer index rather than per token."""

    attn_norm: str
    attn_qkv: str
    attn_output: str
    ffn_norm: str
    ffn_up: str
    ffn_down: str


@functools.cache
def _names(layer: int) -> _LayerNames:
    block = f"blk.{layer}."
    return _LayerNames(
        attn_norm=block + "attn_norm",
        attn_qkv=block + "attn_qkv.weight",
        attn_output=block + "attn_output.weight",
        ffn_norm=block + "ffn_norm",
        ffn_up=block + "ffn_up.weight",
        ffn_down=block + "ffn_down.weight",
    )


class GPT2Family(Family):
    """GPT-2 (124M and its mirrors)."""

    name = "gpt2"
    norm_eps_key = "attention.layer_norm_epsilon"
    hf_top = _TOP
    hf_block = _BLOCK
    hf_layer = _LAYER
    hf_skipped = _SKIPPED
    hf_prefix = "transformer."

    def architecture_from_hf(self, raw_config: bytes, path: Path) -> Architecture:
        config = parse_hf_config(_HFConfig, raw_config, path)
        if config.activation_function not in ("gelu_new", "gelu_pytorch_tanh"):
            raise BaseModelError(path, f"activation {config.activation_function!r} is not supported; GPT-2 uses gelu_new")
        return Architecture(
            family=self.name,
            vocab_size=config.vocab_size,
            hidden_size=config.n_embd,
            n_layers=config.n_layer,
            n_heads=config.n_head,
            n_kv_heads=config.n_head,
            head_dim=config.n_embd // config.n_head,
            ffn_size=config.n_inner or 4 * config.n_embd,
            norm_eps=config.layer_norm_epsilon,
            rope_theta=0.0,
            max_positions=config.n_positions,
        )

    def expected_shapes(self, arch: Architecture) -> dict[str, tuple[int, ...]]:
        hidden, ffn = arch.hidden_size, arch.ffn_size
        shapes: dict[str, tuple[int, ...]] = {
            "token_embd.weight": (arch.vocab_size, hidden),
            "position_embd.weight": (arch.max_positions, hidden),
            "output_norm.weight": (hidden,),
            "output_norm.bias": (hidden,),
        }
        for i in range(arch.n_layers):
            block = f"blk.{i}."
            shapes |= {
                block + "attn_norm.weight": (hidden,),
                block + "attn_norm.bias": (hidden,),
                block + "ffn_norm.weight": (hidden,),
                block + "ffn_norm.bias": (hidden,),
                block + "attn_qkv.weight": (3 * hidden, hidden),
                block + "attn_qkv.bias": (3 * hidden,),
                block + "attn_output.weight": (hidden, hidden),
                block + "attn_output.bias": (hidden,),
                block + "ffn_up.weight": (ffn, hidden),
                block + "ffn_up.bias": (ffn,),
                block + "ffn_down.weight": (hidden, ffn),
                block + "ffn_down.bias": (hidden,),
            }
        return shapes

    def embed(self, ops: Ops, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return ops.embedding(ids, "token_embd.weight") + ops.embedding(positions, "position_embd.weight")

    def block(self, ops: Ops, layer: int, hidden: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        arch, names, n = ops.architecture, _names(layer), hidden.shape[0]
        qkv = ops.linear(ops.layer_norm(hidden, names.attn_norm), names.attn_qkv)
        q, k, v = (part.view(n, arch.n_heads, arch.head_dim) for part in qkv.chunk(3, dim=-1))
        attended = ops.attention(q, k, v, layer)
        projected = ops.linear(attended, names.attn_output)
        hidden = ops.output_rows(layer, hidden) + ops.output_rows(layer, projected)
        normed = ops.layer_norm(hidden, names.ffn_norm)
        up = ops.gelu(ops.linear(normed, names.ffn_up))
        return hidden + ops.linear(up, names.ffn_down)

    def final_norm(self, ops: Ops, hidden: torch.Tensor) -> torch.Tensor:
        return ops.layer_norm(hidden, "output_norm")
