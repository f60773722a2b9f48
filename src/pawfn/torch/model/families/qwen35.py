"""Qwen3.5 for the Torch backend: a hybrid of Gated DeltaNet layers and gated full attention, read from its GGUF.

Follows llama.cpp's qwen35 graph: three recurrent layers to one attention layer (the GGUF says which), RMS norms
(stored as 1 + w by the converter), a causal convolution and a delta-rule state per recurrent layer, attention whose
query carries a sigmoid gate, rotary embeddings on the leading `rope.dimension_count` dimensions (text positions:
every M-RoPE section sees the same position, so it is plain NEOX RoPE), SwiGLU feed-forward.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from pathlib import Path
from types import MappingProxyType
from typing import NamedTuple

import torch

from ....core.errors import BaseModelError
from ....formats.ggufio import GGUFFile
from .base import Architecture, Family, FamilyArithmetic, LinearAttention, Ops, required_int

__all__ = ["Qwen35Family"]


class _LayerNames(NamedTuple):
    """The GGUF names one block reads, built once per layer index rather than per token."""

    attn_norm: str
    post_norm: str
    gate_up: tuple[str, str]
    ffn_down: str
    # full attention
    attn_q: str
    attn_k: str
    attn_v: str
    q_norm: str
    k_norm: str
    attn_output: str
    # Gated DeltaNet
    qkv: str
    z: str
    beta: str
    alpha: str
    conv: str
    dt_bias: str
    decay: str
    ssm_norm: str
    ssm_out: str
    # the matrices that read one input, multiplied as one product (`Family.fused_groups`)
    attention_inputs: tuple[str, str, str]
    delta_inputs: tuple[str, str, str, str]


@functools.cache
def _names(layer: int) -> _LayerNames:
    block = f"blk.{layer}."
    q, k, v = block + "attn_q.weight", block + "attn_k.weight", block + "attn_v.weight"
    qkv, z, beta, alpha = block + "attn_qkv.weight", block + "attn_gate.weight", block + "ssm_beta.weight", block + "ssm_alpha.weight"
    return _LayerNames(
        attn_norm=block + "attn_norm.weight",
        post_norm=block + "post_attention_norm.weight",
        gate_up=(block + "ffn_gate.weight", block + "ffn_up.weight"),
        ffn_down=block + "ffn_down.weight",
        attn_q=q,
        attn_k=k,
        attn_v=v,
        q_norm=block + "attn_q_norm.weight",
        k_norm=block + "attn_k_norm.weight",
        attn_output=block + "attn_output.weight",
        qkv=qkv,
        z=z,
        beta=beta,
        alpha=alpha,
        conv=block + "ssm_conv1d.weight",
        dt_bias=block + "ssm_dt.bias",
        decay=block + "ssm_a",
        ssm_norm=block + "ssm_norm.weight",
        ssm_out=block + "ssm_out.weight",
        attention_inputs=(q, k, v),
        delta_inputs=(qkv, z, alpha, beta),
    )


class Qwen35Family(Family):
    """Qwen3.5 dense (Qwen3.5-0.8B and its mirrors), text layers."""

    name = "qwen35"
    norm_eps_key = "attention.layer_norm_rms_epsilon"
    rotary = True
    llamacpp_flash_attention = True
    hf_top = MappingProxyType({})  # pawfn reads Qwen3.5 from its GGUF only (architecture_from_hf says so)
    hf_block = MappingProxyType({})
    hf_layer = re.compile(r"(?!)")

    def architecture_from_gguf(self, file: GGUFFile, vocab_size: int) -> Architecture:
        arch = super().architecture_from_gguf(file, vocab_size)
        key = f"{file.string('general.architecture') or self.name}."
        # blocks for multi-token prediction follow the trunk's and are not run (llama.cpp's n_layer() leaves them out)
        predictors = file.integer(key + "nextn_predict_layers") or 0
        if not 0 <= predictors < arch.n_layers:
            raise BaseModelError(file.path, f"nextn_predict_layers is {predictors} of {arch.n_layers} blocks; the metadata is damaged")
        arch = dataclasses.replace(arch, n_layers=arch.n_layers - predictors)
        head_dim = required_int(file, key + "ssm.state_size")
        n_value_heads = required_int(file, key + "ssm.time_step_rank")
        inner = required_int(file, key + "ssm.inner_size")
        if inner != n_value_heads * head_dim:
            raise BaseModelError(
                file.path,
                f"the recurrent layers' value heads ({n_value_heads} x {inner // n_value_heads}) differ in size from their key heads ({head_dim})",
            )
        recurrent = file.booleans(key + "attention.recurrent_layers")
        if recurrent is None:
            interval = file.integer(key + "full_attention_interval") or 4
            layers = frozenset(i for i in range(arch.n_layers) if (i + 1) % interval)
        else:
            layers = frozenset(i for i, flag in enumerate(recurrent[: arch.n_layers]) if flag)
        linear = LinearAttention(
            layers=layers,
            conv_kernel=required_int(file, key + "ssm.conv_kernel"),
            n_key_heads=required_int(file, key + "ssm.group_count"),
            n_value_heads=n_value_heads,
            head_dim=head_dim,
        )
        if linear.n_value_heads % linear.n_key_heads:
            raise BaseModelError(file.path, f"{linear.n_value_heads} value heads do not share {linear.n_key_heads} key heads evenly")
        rope_dims = file.integer(key + "rope.dimension_count") or arch.head_dim
        if not 0 < rope_dims <= arch.head_dim or rope_dims % 2:
            raise BaseModelError(file.path, f"rope.dimension_count is {rope_dims}; it must be even and at most the head size {arch.head_dim}")
        sections = tuple(file.integers(key + "rope.dimension_sections") or ())
        if sections and (len(sections) != 4 or min(sections) < 0 or sum(sections) > rope_dims // 2):
            raise BaseModelError(file.path, f"rope.dimension_sections is {list(sections)}; it must be 4 counts of at most {rope_dims // 2} pairs")
        return dataclasses.replace(arch, rope_dims=rope_dims, linear=linear, rope_sections=sections)

    def architecture_from_hf(self, raw_config: bytes, path: Path) -> Architecture:
        raise BaseModelError(
            path, "pawfn reads Qwen3.5 from its GGUF file (the official runtime's base), not from Hugging Face safetensors; pass the GGUF"
        )

    def is_table(self, name: str) -> bool:
        return name.endswith(".ssm_conv1d.weight")

    def expected_shapes(self, arch: Architecture) -> dict[str, tuple[int, ...]]:
        hidden, head = arch.hidden_size, arch.head_dim
        shapes: dict[str, tuple[int, ...]] = {"token_embd.weight": (arch.vocab_size, hidden), "output_norm.weight": (hidden,)}
        for i in range(arch.n_layers):
            names = _names(i)
            shapes |= {
                names.attn_norm: (hidden,),
                names.post_norm: (hidden,),
                names.gate_up[0]: (arch.ffn_size, hidden),
                names.gate_up[1]: (arch.ffn_size, hidden),
                names.ffn_down: (hidden, arch.ffn_size),
            }
            linear = arch.linear
            if linear is None or arch.attends(i):
                shapes |= {
                    names.attn_q: (2 * arch.n_heads * head, hidden),
                    names.attn_k: (arch.n_kv_heads * head, hidden),
                    names.attn_v: (arch.n_kv_heads * head, hidden),
                    names.q_norm: (head,),
                    names.k_norm: (head,),
                    names.attn_output: (hidden, arch.n_heads * head),
                }
                continue
            values = linear.n_value_heads * linear.head_dim
            shapes |= {
                names.qkv: (linear.conv_channels, hidden),
                names.z: (values, hidden),
                names.beta: (linear.n_value_heads, hidden),
                names.alpha: (linear.n_value_heads, hidden),
                names.conv: (linear.conv_channels, linear.conv_kernel),
                names.dt_bias: (linear.n_value_heads,),
                names.decay: (linear.n_value_heads,),
                names.ssm_norm: (linear.head_dim,),
                names.ssm_out: (hidden, values),
            }
        return shapes

    def rope_frequencies(self, arch: Architecture) -> torch.Tensor:
        rotated = arch.rope_dims or arch.head_dim
        exponents = torch.arange(0, rotated // 2, dtype=torch.float64) * 2.0 / rotated
        return (1.0 / (arch.rope_theta**exponents)).to(torch.float32)

    def fused_groups(self, arch: Architecture) -> list[tuple[str, ...]]:
        # each layer's groups of one kind (attention or Gated DeltaNet): the loader keeps those the base has in full
        names = [_names(layer) for layer in range(arch.n_layers)]
        return [group for n in names for group in (n.gate_up, n.attention_inputs, n.delta_inputs)]

    def embed(self, ops: Ops, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return ops.embedding(ids, "token_embd.weight")

    def block(self, ops: Ops, layer: int, hidden: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        names = _names(layer)
        normed = ops.rms_norm(hidden, names.attn_norm)
        if ops.architecture.attends(layer):
            mixed = self._attention(ops, layer, normed, positions)
        else:
            mixed = self._delta_net(ops, layer, normed)
        hidden = _residual(ops.output_rows(layer, mixed), ops.output_rows(layer, hidden))  # llama.cpp's graph drops rows here
        gate, up = ops.linears(ops.rms_norm(hidden, names.post_norm), names.gate_up)
        return _residual(ops.linear(ops.swiglu(gate, up), names.ffn_down), hidden)

    def final_norm(self, ops: Ops, hidden: torch.Tensor) -> torch.Tensor:
        return ops.rms_norm(hidden, "output_norm.weight")

    def _attention(self, ops: Ops, layer: int, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Full attention whose output each head gates by sigmoid(gate); the query projection holds, per head, the
        query then the gate."""
        arch, names, n = ops.architecture, _names(layer), x.shape[0]
        query_gate, keys, values = ops.linears(x, names.attention_inputs)
        query_gate = query_gate.view(n, arch.n_heads, 2, arch.head_dim)
        q = self._rope(ops, ops.rms_norm(query_gate[:, :, 0], names.q_norm), positions)
        k = self._rope(ops, ops.rms_norm(keys.view(n, arch.n_kv_heads, arch.head_dim), names.k_norm), positions)
        v = values.view(n, arch.n_kv_heads, arch.head_dim)
        gate = query_gate[:, :, 1].reshape(n, -1)
        attended = ops.attention(q, k, v, layer) * ops.arithmetic.sigmoid(gate)
        return ops.linear(attended, names.attn_output)

    def _rope(self, ops: Ops, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Rotary embedding of the leading `rope_dims` of each head; the rest pass through."""
        rotated = ops.architecture.rope_dims
        if rotated == x.shape[-1]:
            return ops.rope(x, positions)
        return torch.cat((ops.rope(x[..., :rotated].contiguous(), positions), x[..., rotated:]), dim=-1)

    def _delta_net(self, ops: Ops, layer: int, x: torch.Tensor) -> torch.Tensor:
        """A Gated DeltaNet layer: projections for every row, then each sequence's convolution and recurrence
        (`Ops.recurrent`) in float32, as llama.cpp keeps its states, then the gated norm and output projection."""
        arch, names, n, arithmetic = ops.architecture, _names(layer), x.shape[0], ops.arithmetic
        linear = arch.linear
        assert linear is not None  # a recurrent layer exists only with its hyperparameters
        mixed, z, alpha, beta = ops.linears(x, names.delta_inputs)
        decay = arithmetic.softplus(alpha.float() + ops.tensor(names.dt_bias).float()) * ops.tensor(names.decay).float()
        # the projection's columns as they lie: a joined copy of them cost ~5 ms of a 256x256 image call
        inputs = (mixed.float(), arithmetic.sigmoid(beta.float()), decay)
        kernel, eps = ops.tensor(names.conv).float(), arch.norm_eps

        def update(rows: tuple[torch.Tensor, ...], state: tuple[torch.Tensor, ...] | None) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
            return _delta_rule(arithmetic, linear, kernel, eps, rows, state)

        out = ops.recurrent(layer, inputs, update).to(x.dtype).view(n, linear.n_value_heads, linear.head_dim)
        gated = ops.rms_norm(out, names.ssm_norm) * arithmetic.silu(z.view(n, linear.n_value_heads, linear.head_dim))
        return ops.linear(gated.reshape(n, -1), names.ssm_out)


def _delta_rule(
    arithmetic: FamilyArithmetic,
    linear: LinearAttention,
    kernel: torch.Tensor,
    eps: float,
    rows: tuple[torch.Tensor, ...],
    state: tuple[torch.Tensor, ...] | None,
) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """One sequence's rows through a Gated DeltaNet layer's convolution and delta rule, in `arithmetic`. `rows`: the
    q, k, v projections [T, channels], beta and the log decay [T, value heads]. The state: the convolution's last
    `conv_kernel - 1` inputs [channels, K - 1] and each value head's matrix [heads, key, value]. Returns the outputs
    [T, value heads * head_dim] and the new state."""
    mixed, beta, decay = rows
    n, heads, size = mixed.shape[0], linear.n_value_heads, linear.head_dim
    if state is None:
        state = tuple(mixed.new_zeros(shape) for shape in linear.state_shapes)
    window, memory = state
    # the window by time then the rows as the projection left them (joined, they were a copy of every row)
    convolved = arithmetic.convolve(window.T, mixed, kernel)  # [T, channels]
    key_width = linear.n_key_heads * size
    q, k, v = torch.split(convolved, [key_width, key_width, heads * size], dim=-1)
    repeats = heads // linear.n_key_heads  # value head h reads key head h % n_key_heads (the converter's tiled order)
    q = _tiled(arithmetic.l2_norm(q.reshape(n, linear.n_key_heads, size), eps), repeats)
    k = _tiled(arithmetic.l2_norm(k.reshape(n, linear.n_key_heads, size), eps), repeats)
    outputs, memory = arithmetic.delta_rule(q, k, v.reshape(n, heads, size), beta, decay, memory)
    kept = window.shape[1]  # the next window: the last K - 1 inputs by time
    last = mixed[n - kept :] if n >= kept else torch.cat((window.T[n:], mixed))
    return outputs.reshape(n, heads * size), (last.T.contiguous(), memory)


def _residual(fresh: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
    """`kept + fresh` written into `fresh`, a product's own new tensor (addition commutes: the same bits without a new
    buffer), where that is torch's result type; else a new sum."""
    return fresh.add_(kept) if torch.promote_types(fresh.dtype, kept.dtype) == fresh.dtype else kept + fresh


def _tiled(heads: torch.Tensor, repeats: int) -> torch.Tensor:
    """[T, heads, size] with its heads repeated `repeats` times in turn; itself where once (Qwen3.5-0.8B: 16 key
    and 16 value heads), not a copy."""
    return heads if repeats == 1 else heads.repeat(1, repeats, 1)
