"""Gated DeltaNet's delta rule and key/query norm in torch's float32 arithmetic (`TorchArithmetic`): one token as a
recurrence, a prompt by chunks solved as products (~1e-6 relative apart in float32, as transformers' prefill)."""

from __future__ import annotations

import math
from typing import cast

import torch

__all__ = ["CHUNK", "by_chunks", "by_tokens", "delta_rule", "l2_normalized"]


def l2_normalized(x: torch.Tensor, eps: float) -> torch.Tensor:
    """`x / sqrt(sum(x^2) + eps)` over the last dimension (llama.cpp's Gated DeltaNet key and query norm)."""
    return x * torch.rsqrt(x.pow(2).sum(dim=-1, keepdim=True) + eps)


def delta_rule(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, decay: torch.Tensor, memory: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The outputs [T, heads, value] scaled by 1/sqrt(key size), and the memory after the last token."""
    recurrence = by_tokens if q.shape[0] == 1 else by_chunks
    outputs, memory = recurrence(q, k, v, beta, decay, memory)
    return outputs * (1.0 / math.sqrt(q.shape[-1])), memory


CHUNK = 64
"""Tokens the chunked delta rule solves at once."""


def by_tokens(
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


def by_chunks(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, decay: torch.Tensor, memory: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """`by_tokens` for `CHUNK` tokens at a time. Within a chunk starting from memory S0, with G the running sum of
    the log decay, token s's update is u_s = beta_s (v_s - e^G_s S0^T k_s - sum_{r<s} e^(G_s - G_r) (k_s.k_r) u_r): a
    unit lower-triangular system for all u at once; then out_t = e^G_t S0^T q_t + sum_{s<=t} e^(G_t - G_s) (q_t.k_s)
    u_s and the memory after the chunk is e^G_C S0 + sum_s e^(G_C - G_s) k_s u_s^T. Every factor e^(G_t - G_s) with
    s <= t is at most 1, so nothing overflows."""
    outputs: list[torch.Tensor] = []
    for start in range(0, q.shape[0], CHUNK):
        qc, kc, vc = (x[start : start + CHUNK].transpose(0, 1) for x in (q, k, v))  # [heads, c, size]
        betas = beta[start : start + CHUNK].T.unsqueeze(2)  # [heads, c, 1]
        running = torch.cumsum(decay[start : start + CHUNK].T, dim=1)  # [heads, c]
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
