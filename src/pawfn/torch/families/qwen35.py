"""Qwen3.5 for the Torch backend: a hybrid of Gated DeltaNet layers and gated full attention, read from its GGUF.

Follows llama.cpp's qwen35 graph: three recurrent layers to one attention layer (the GGUF says which), RMS norms
(stored as 1 + w by the converter), a causal convolution and a delta-rule state per recurrent layer, attention whose
query carries a sigmoid gate, rotary embeddings on the leading `rope.dimension_count` dimensions (text positions:
every M-RoPE section sees the same position, so it is plain NEOX RoPE), SwiGLU feed-forward.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from pathlib import Path
from types import MappingProxyType
from typing import NamedTuple, cast

import torch
import torch.nn.functional as F

from ...errors import BaseModelError
from ...ggufio import GGUFFile
from ..ggml_hybrid import ggml_gated_delta_net, ggml_l2_norm, ggml_sigmoid, ggml_silu, ggml_softplus, ggml_ssm_conv
from ..ggml_native import NativeKernels
from .base import Architecture, Family, LinearAttention, Ops, required_int

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


@functools.cache
def _names(layer: int) -> _LayerNames:
    block = f"blk.{layer}."
    return _LayerNames(
        attn_norm=block + "attn_norm.weight",
        post_norm=block + "post_attention_norm.weight",
        gate_up=(block + "ffn_gate.weight", block + "ffn_up.weight"),
        ffn_down=block + "ffn_down.weight",
        attn_q=block + "attn_q.weight",
        attn_k=block + "attn_k.weight",
        attn_v=block + "attn_v.weight",
        q_norm=block + "attn_q_norm.weight",
        k_norm=block + "attn_k_norm.weight",
        attn_output=block + "attn_output.weight",
        qkv=block + "attn_qkv.weight",
        z=block + "attn_gate.weight",
        beta=block + "ssm_beta.weight",
        alpha=block + "ssm_alpha.weight",
        conv=block + "ssm_conv1d.weight",
        dt_bias=block + "ssm_dt.bias",
        decay=block + "ssm_a",
        ssm_norm=block + "ssm_norm.weight",
        ssm_out=block + "ssm_out.weight",
    )


def _l2_normalized(x: torch.Tensor, eps: float) -> torch.Tensor:
    """`x / sqrt(sum(x^2) + eps)` over the last dimension (llama.cpp's Gated DeltaNet key and query norm)."""
    return x * torch.rsqrt(x.pow(2).sum(dim=-1, keepdim=True) + eps)


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
        return [_names(layer).gate_up for layer in range(arch.n_layers)]

    def embed(self, ops: Ops, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return ops.embedding(ids, "token_embd.weight")

    def block(self, ops: Ops, layer: int, hidden: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        names = _names(layer)
        normed = ops.rms_norm(hidden, names.attn_norm)
        if ops.architecture.attends(layer):
            mixed = self._attention(ops, layer, normed, positions)
        else:
            mixed = self._delta_net(ops, layer, normed)
        hidden = hidden + mixed
        gate, up = ops.linears(ops.rms_norm(hidden, names.post_norm), names.gate_up)
        return hidden + ops.linear(ops.swiglu(gate, up), names.ffn_down)

    def final_norm(self, ops: Ops, hidden: torch.Tensor) -> torch.Tensor:
        return ops.rms_norm(hidden, "output_norm.weight")

    def _attention(self, ops: Ops, layer: int, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Full attention whose output each head gates by sigmoid(gate); the query projection holds, per head, the
        query then the gate."""
        arch, names, n = ops.architecture, _names(layer), x.shape[0]
        query_gate = ops.linear(x, names.attn_q).view(n, arch.n_heads, 2, arch.head_dim)
        q = self._rope(ops, ops.rms_norm(query_gate[:, :, 0], names.q_norm), positions)
        k = self._rope(ops, ops.rms_norm(ops.linear(x, names.attn_k).view(n, arch.n_kv_heads, arch.head_dim), names.k_norm), positions)
        v = ops.linear(x, names.attn_v).view(n, arch.n_kv_heads, arch.head_dim)
        gate = query_gate[:, :, 1].reshape(n, -1)
        attended = ops.attention(q, k, v, layer) * (torch.sigmoid(gate) if ops.llamacpp_width is None else ggml_sigmoid(gate, ops.llamacpp_kernels))
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
        arch, names, n, width, kernels = ops.architecture, _names(layer), x.shape[0], ops.llamacpp_width, ops.llamacpp_kernels
        linear = arch.linear
        assert linear is not None  # a recurrent layer exists only with its hyperparameters
        biased = ops.linear(x, names.alpha).float() + ops.tensor(names.dt_bias).float()
        decay = (F.softplus(biased) if width is None else ggml_softplus(biased, kernels)) * ops.tensor(names.decay).float()
        beta = ops.linear(x, names.beta).float()
        beta = torch.sigmoid(beta) if width is None else ggml_sigmoid(beta, kernels)
        inputs = torch.cat((ops.linear(x, names.qkv).float(), beta, decay), dim=-1)
        kernel, eps = ops.tensor(names.conv).float(), arch.norm_eps

        def update(rows: torch.Tensor, state: tuple[torch.Tensor, ...] | None) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
            return _delta_rule(linear, kernel, eps, rows, state, width, kernels)

        out = ops.recurrent(layer, inputs, update).to(x.dtype).view(n, linear.n_value_heads, linear.head_dim)
        z = ops.linear(x, names.z).view(n, linear.n_value_heads, linear.head_dim)
        gated = ops.rms_norm(out, names.ssm_norm) * (F.silu(z) if width is None else ggml_silu(z, width, kernels))
        return ops.linear(gated.reshape(n, -1), names.ssm_out)


def _delta_rule(
    linear: LinearAttention,
    kernel: torch.Tensor,
    eps: float,
    rows: torch.Tensor,
    state: tuple[torch.Tensor, ...] | None,
    width: int | None,
    kernels: NativeKernels | None,
) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """One sequence's rows through a Gated DeltaNet layer's convolution and delta rule. `rows` [T, channels + 2 *
    value heads]: the q, k, v projections, beta and the log decay. The state: the convolution's last `conv_kernel -
    1` inputs [channels, K - 1] and each value head's matrix [heads, key, value]. Returns the outputs [T, value heads
    * head_dim] and the new state. One token is stepped as llama.cpp's CPU kernel steps it; several go by chunks of
    `_CHUNK` (the same recurrence solved as products, ~1e-6 relative apart in float32, as transformers' prefill).
    `width`: llama.cpp's arithmetic for its kernels of that many float32 lanes (`numerics="llamacpp"`), on its C
    `kernels` where given."""
    n, channels, heads, size = rows.shape[0], linear.conv_channels, linear.n_value_heads, linear.head_dim
    if state is None:
        state = tuple(rows.new_zeros(shape) for shape in linear.state_shapes)
    window, memory = state
    mixed, beta, decay = torch.split(rows, [channels, heads, heads], dim=-1)
    window = torch.cat((window, mixed.T), dim=1)  # [channels, K - 1 + T]
    if width is None:
        convolved = F.silu((window.unfold(1, linear.conv_kernel, 1) * kernel.unsqueeze(1)).sum(dim=-1).T)  # [T, channels]
    else:
        convolved = ggml_silu(ggml_ssm_conv(window, kernel, kernels), width, kernels)
    key_width = linear.n_key_heads * size
    q, k, v = torch.split(convolved, [key_width, key_width, heads * size], dim=-1)
    repeats = heads // linear.n_key_heads  # value head h reads key head h % n_key_heads (the converter's tiled order)
    normed = _l2_normalized if width is None else ggml_l2_norm
    q = normed(q.reshape(n, linear.n_key_heads, size), eps).repeat(1, repeats, 1)
    k = normed(k.reshape(n, linear.n_key_heads, size), eps).repeat(1, repeats, 1)
    v = v.reshape(n, heads, size)
    if width is not None:
        outputs, memory = ggml_gated_delta_net(q, k, v, decay, beta, memory, width, kernels)
        return outputs.reshape(n, heads * size), (window[:, n:].clone(), memory)
    recurrence = _by_tokens if n == 1 else _by_chunks
    outputs, memory = recurrence(q, k, v, beta, decay, memory)
    return (outputs * (1.0 / math.sqrt(size))).reshape(n, heads * size), (window[:, n:].clone(), memory)


_CHUNK = 64
"""Tokens the chunked delta rule solves at once."""


def _by_tokens(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, decay: torch.Tensor, memory: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The delta rule token by token: per head, S = g S; u = beta (v - S^T k); S += k u^T; out = S^T q (unscaled).
    q, k [T, heads, key], v [T, heads, value], beta and the log decay [T, heads], the memory [heads, key, value]."""
    n, heads, size = v.shape
    gates, betas = torch.exp(decay).reshape(n, heads, 1, 1).contiguous(), beta.unsqueeze(2).contiguous()
    keys, columns, queries, v = k.unsqueeze(2), k.unsqueeze(3), q.unsqueeze(2), v.contiguous()
    outputs = torch.empty((n, heads, 1, size), dtype=v.dtype, device=v.device)
    recalled = torch.empty((heads, 1, size), dtype=v.dtype, device=v.device)
    memory = memory.clone()  # the state given (a prefix's) is never changed
    for t in range(n):  # views and products into buffers: einsum's parsing and a new state a token cost more
        memory.mul_(gates[t])
        torch.bmm(keys[t], memory, out=recalled)
        delta = (v[t] - recalled.squeeze(1)).mul_(betas[t])
        memory.baddbmm_(columns[t], delta.unsqueeze(1))  # += k (outer) delta
        torch.bmm(queries[t], memory, out=outputs[t])
    return outputs.squeeze(2), memory


def _by_chunks(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, decay: torch.Tensor, memory: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """`_by_tokens` for `_CHUNK` tokens at a time. Within a chunk starting from memory S0, with G the running sum of
    the log decay, token s's update is u_s = beta_s (v_s - e^G_s S0^T k_s - sum_{r<s} e^(G_s - G_r) (k_s.k_r) u_r): a
    unit lower-triangular system for all u at once; then out_t = e^G_t S0^T q_t + sum_{s<=t} e^(G_t - G_s) (q_t.k_s)
    u_s and the memory after the chunk is e^G_C S0 + sum_s e^(G_C - G_s) k_s u_s^T. Every factor e^(G_t - G_s) with
    s <= t is at most 1, so nothing overflows."""
    outputs: list[torch.Tensor] = []
    for start in range(0, q.shape[0], _CHUNK):
        qc, kc, vc = (x[start : start + _CHUNK].transpose(0, 1) for x in (q, k, v))  # [heads, c, size]
        betas = beta[start : start + _CHUNK].T.unsqueeze(2)  # [heads, c, 1]
        running = torch.cumsum(decay[start : start + _CHUNK].T, dim=1)  # [heads, c]
        c = running.shape[1]
        later = torch.ones((c, c), dtype=torch.bool, device=q.device).tril()  # t >= s
        ratios = torch.exp((running.unsqueeze(2) - running.unsqueeze(1)).masked_fill(~later, -math.inf))  # [heads, t, s]
        scales = torch.exp(running).unsqueeze(2)  # [heads, c, 1]
        system = (betas * ratios * torch.bmm(kc, kc.transpose(1, 2))).tril(-1) + torch.eye(c, dtype=q.dtype, device=q.device)
        targets = betas * (vc - scales * torch.bmm(kc, memory))
        solved = torch.linalg.solve_triangular(system, targets, upper=False, unitriangular=True)  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]  # torch.linalg is untyped
        updates = cast("torch.Tensor", solved)  # cast: torch.linalg's stubs leave the result untyped
        attended = torch.bmm(qc, kc.transpose(1, 2)) * ratios
        outputs.append((scales * torch.bmm(qc, memory) + torch.bmm(attended, updates)).transpose(0, 1))
        memory = scales[:, -1:] * memory + torch.bmm((kc * ratios[:, -1].unsqueeze(2)).transpose(1, 2), updates)
    return torch.cat(outputs), memory
