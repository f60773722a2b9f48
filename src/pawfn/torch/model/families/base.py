"""What a model family is to the Torch backend: hyperparameters, weight names and shapes, and its block.

A family module (`qwen3.py`, `gpt2.py`) holds everything about one architecture; the engine calls it through
`Family` and gives it the shared operations (`Ops`: adapted linear, attention, norms) it needs.
"""

from __future__ import annotations

import math
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Protocol, TypeVar

import torch
from pydantic import BaseModel, ValidationError

from ....core.errors import BaseModelError, describe_validation_error
from ....formats.ggufio import GGUFFile


__all__ = ["Architecture", "Family", "LinearAttention", "Ops", "RecurrentUpdate", "check_architecture", "parse_hf_config", "required_int"]


@dataclass(frozen=True)
class LinearAttention:
    """A hybrid model's Gated DeltaNet layers: which layers, their short convolution and their recurrent heads."""

    layers: frozenset[int]
    """The recurrent layers (the others attend over a KV cache)."""
    conv_kernel: int
    """Width of the causal convolution over the q, k, v channels (tokens)."""
    n_key_heads: int
    n_value_heads: int
    head_dim: int
    """Size of a key and of a value head (equal: the state of a head is head_dim x head_dim)."""

    @property
    def conv_channels(self) -> int:
        """Channels of the convolution: queries, keys and values."""
        return (2 * self.n_key_heads + self.n_value_heads) * self.head_dim

    @property
    def state_shapes(self) -> tuple[tuple[int, int], tuple[int, int, int]]:
        """A sequence's state in one layer: the convolution's last inputs [channels, kernel - 1] and each value
        head's memory [value heads, head_dim (keys), head_dim (values)]."""
        return (self.conv_channels, self.conv_kernel - 1), (self.n_value_heads, self.head_dim, self.head_dim)


@dataclass(frozen=True)
class Architecture:
    """Hyperparameters of one interpreter checkpoint, read from its files (never from library defaults)."""

    family: str
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
    rope_dims: int = 0
    """Leading dimensions of a head that rotate (0: all of them)."""
    linear: LinearAttention | None = None
    """Recurrent layers of a hybrid model (None: every layer attends)."""
    rope_sections: tuple[int, ...] = ()
    """Interleaved M-RoPE: pairs of rotated dimensions per position section (time, row, column, extra); () for
    plain RoPE, where every token has one position."""

    def pair_sections(self, n_pairs: int) -> list[int]:
        """The position section (0 time, 1 row, 2 column, 3 extra) each of `n_pairs` rotated pairs turns with, as
        llama.cpp's interleaved M-RoPE (GGML_ROPE_TYPE_IMROPE) assigns them."""
        t, h, w = (self.rope_sections + (0, 0, 0))[:3]
        total = sum(self.rope_sections) or 1

        def section(pair: int) -> int:
            sector = pair % total
            if sector % 3 == 1 and sector < 3 * h:
                return 1
            if sector % 3 == 2 and sector < 3 * w:
                return 2
            if sector % 3 == 0 and sector < 3 * t:
                return 0
            return 3

        return [section(pair) for pair in range(n_pairs)]

    def attends(self, layer: int) -> bool:
        """Whether `layer` attends over a KV cache (else it is recurrent and keeps a state)."""
        return self.linear is None or layer not in self.linear.layers


def check_architecture(arch: Architecture, source: Path, n_tensors: int) -> None:
    """Refuse hyperparameters no checkpoint of `n_tensors` tensors can have, before anything is built per layer or
    head: sizes must be positive, a layer needs tensors of its own, the epsilon and RoPE base finite and positive."""
    sizes = {
        "vocabulary size": arch.vocab_size,
        "hidden size": arch.hidden_size,
        "layer count": arch.n_layers,
        "head count": arch.n_heads,
        "KV head count": arch.n_kv_heads,
        "head size": arch.head_dim,
        "feed-forward size": arch.ffn_size,
        "context length": arch.max_positions,
    }
    for what, value in sizes.items():
        if value < 1:
            raise BaseModelError(source, f"the {what} is {value}; the model's metadata is damaged")
    if arch.n_layers > n_tensors:
        raise BaseModelError(source, f"the metadata claims {arch.n_layers} layers, but the file holds {n_tensors} tensors")
    if not (math.isfinite(arch.norm_eps) and arch.norm_eps > 0):
        raise BaseModelError(source, f"the normalization epsilon is {arch.norm_eps}; it must be a positive finite number")
    if arch.rope_theta != 0.0 and not (math.isfinite(arch.rope_theta) and arch.rope_theta > 0):  # 0: no RoPE
        raise BaseModelError(source, f"the RoPE base is {arch.rope_theta}; it must be a positive finite number")


RecurrentUpdate = Callable[[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...] | None], tuple[torch.Tensor, tuple[torch.Tensor, ...]]]
"""A recurrent layer's work on one sequence's rows: (its inputs, each [T, ...], its state or None at the start) ->
(its outputs [T, ...], its new state). It never changes the state it is given (a program's prefix shares it)."""


class FamilyArithmetic(Protocol):
    """What a family computes beyond `Ops` through the pass's arithmetic (`pawfn.torch.model.arithmetic` implements it
    for torch's and llama.cpp's): Qwen3.5's activations, key norm, short convolution and delta rule."""

    def sigmoid(self, x: torch.Tensor) -> torch.Tensor: ...

    def softplus(self, x: torch.Tensor) -> torch.Tensor: ...

    def silu(self, x: torch.Tensor) -> torch.Tensor: ...

    def l2_norm(self, x: torch.Tensor, eps: float) -> torch.Tensor:
        """`x / sqrt(sum(x^2) + eps)` over the last axis."""
        ...

    def convolve(self, window: torch.Tensor, rows: torch.Tensor, kernel: torch.Tensor) -> torch.Tensor:
        """silu of the causal short convolution of the window by time, `window` [K - 1, channels] then `rows` [T,
        channels], by `kernel` [channels, K]: [T, channels]."""
        ...

    def delta_rule(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, decay: torch.Tensor, memory: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The gated delta rule over T tokens: outputs [T, heads, value] and the memory after them."""
        ...


class Ops(Protocol):
    """The engine's operations a family's forward pass is written with."""

    architecture: Architecture

    @property
    def arithmetic(self) -> FamilyArithmetic:
        """The arithmetic the pass runs: what a family computes beyond these operations goes through it."""
        ...

    def tensor(self, name: str) -> torch.Tensor:
        """Base tensor `name` as loaded (a vector or a table the pass reads rather than multiplies)."""
        ...

    def embedding(self, ids: torch.Tensor, name: str) -> torch.Tensor:
        """Rows `ids` of base matrix `name` (GGUF naming), in the compute dtype."""
        ...

    def linear(self, x: torch.Tensor, name: str) -> torch.Tensor:
        """`x @ W.T (+ its bias)` plus the program's LoRA side path of `name`, if any."""
        ...

    def linears(self, x: torch.Tensor, names: tuple[str, ...]) -> list[torch.Tensor]:
        """`linear(x, name)` for each of `names` (one product when they were fused, `Family.fused_groups`)."""
        ...

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int) -> torch.Tensor:
        """Causal attention over the KV cache; q: [T, H, D], k, v: [T, KV, D]; returns [T, H * D]."""
        ...

    def recurrent(self, layer: int, inputs: tuple[torch.Tensor, ...], update: RecurrentUpdate) -> torch.Tensor:
        """`update` over each sequence's rows of `inputs` (each [T, ...]) with that sequence's state of `layer`, which
        it then replaces; the outputs in row order."""
        ...

    def output_rows(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        """`x` [T, ...] kept to the rows whose outputs the pass needs from `layer`'s attention output on (llama.cpp
        keeps only the last row in the last layer; all rows otherwise)."""
        ...

    def swiglu(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        """`silu(gate) * up`."""
        ...

    def gelu(self, x: torch.Tensor) -> torch.Tensor:
        """GELU, tanh approximation."""
        ...

    def rms_norm(self, x: torch.Tensor, weight: str) -> torch.Tensor:
        """RMS normalization with base tensor `weight`."""
        ...

    def rope(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """NEOX-style rotary embedding of x: [T, heads, D] at `positions` [T] (`Family.rope_frequencies`)."""
        ...

    def layer_norm(self, x: torch.Tensor, prefix: str) -> torch.Tensor:
        """Layer normalization with `prefix.weight` and `prefix.bias`."""
        ...


_ConfigT = TypeVar("_ConfigT", bound=BaseModel)


def parse_hf_config(kind: type[_ConfigT], raw: bytes, path: Path) -> _ConfigT:
    """`config.json` as `kind`, or a `BaseModelError` naming the invalid fields."""
    try:
        return kind.model_validate_json(raw)
    except ValidationError as exc:
        raise BaseModelError(path, f"config.json is invalid: {describe_validation_error(exc)}") from exc


def required_int(file: GGUFFile, key: str) -> int:
    """A positive integer from GGUF metadata, or a `BaseModelError` naming the key."""
    value = file.integer(key)
    if value is None or value <= 0:
        raise BaseModelError(file.path, f"GGUF metadata {key} is missing or not positive")
    return value


class Family(ABC):
    """One architecture: how to read it and how to run it."""

    name: ClassVar[str]
    """`InterpreterModel.family` of the models that use it."""

    norm_eps_key: ClassVar[str]
    """GGUF metadata key (after ``<arch>.``) of the normalization epsilon."""
    rotary: ClassVar[bool] = False
    """Whether positions are rotary (RoPE, with `rope.freq_base`) rather than a learned table."""

    def architecture_from_gguf(self, file: GGUFFile, vocab_size: int) -> Architecture:
        """Hyperparameters from the GGUF metadata (keys prefixed by the family's `general.architecture`)."""
        key = f"{file.string('general.architecture') or self.name}."
        hidden = required_int(file, key + "embedding_length")
        n_heads = required_int(file, key + "attention.head_count")
        eps = file.number(key + self.norm_eps_key)
        if eps is None:
            raise BaseModelError(file.path, f"GGUF metadata {key}{self.norm_eps_key} is missing")
        return Architecture(
            family=self.name,
            vocab_size=vocab_size,
            hidden_size=hidden,
            n_layers=required_int(file, key + "block_count"),
            n_heads=n_heads,
            n_kv_heads=file.integer(key + "attention.head_count_kv") or n_heads,
            head_dim=file.integer(key + "attention.key_length") or hidden // n_heads,
            ffn_size=required_int(file, key + "feed_forward_length"),
            norm_eps=eps,
            rope_theta=(file.number(key + "rope.freq_base") or 10000.0) if self.rotary else 0.0,
            max_positions=required_int(file, key + "context_length"),
        )

    @abstractmethod
    def architecture_from_hf(self, raw_config: bytes, path: Path) -> Architecture:
        """Hyperparameters from a Hugging Face `config.json`."""

    hf_top: ClassVar[Mapping[str, str]]
    """HF tensor name -> GGUF name, outside the blocks."""
    hf_block: ClassVar[Mapping[str, str]]
    """HF tensor name inside block N (after the layer prefix) -> GGUF name after ``blk.N.``."""
    hf_layer: ClassVar[re.Pattern[str]]
    """Splits a HF block tensor name into (layer number, name inside the block)."""
    hf_skipped: ClassVar[re.Pattern[str] | None] = None
    """HF buffers pawfn does not need (e.g. GPT-2's attention masks)."""
    hf_prefix: ClassVar[str] = ""
    """A prefix some HF checkpoints put before every name (e.g. ``transformer.``)."""

    def gguf_name(self, hf_name: str) -> str | None:
        """GGUF name of a HF checkpoint tensor; None for buffers pawfn skips, "" for a tensor it does not know."""
        hf_name = hf_name.removeprefix(self.hf_prefix)
        if self.hf_skipped is not None and self.hf_skipped.match(hf_name):
            return None
        if hf_name in self.hf_top:
            return self.hf_top[hf_name]
        match = self.hf_layer.match(hf_name)
        if match and match.group(2) in self.hf_block:
            return f"blk.{match.group(1)}.{self.hf_block[match.group(2)]}"
        return ""

    @abstractmethod
    def expected_shapes(self, arch: Architecture) -> dict[str, tuple[int, ...]]:
        """Every base tensor the forward pass reads, with its shape (`output.weight` may be tied)."""

    llamacpp_numerics: ClassVar[bool] = True
    """Whether `numerics="llamacpp"` (llama.cpp's CPU arithmetic, emulated) covers the family's operations."""
    llamacpp_flash_attention: ClassVar[bool] = False
    """Whether the official runtime runs the family with flash attention, in batches of 128 on a fresh
    context per call (its vision runtime); `numerics="llamacpp"` then follows it, each call from the program's head
    cut to whole batches."""

    def is_table(self, name: str) -> bool:
        """Whether 2-D tensor `name` is read as values (e.g. a convolution's kernel) rather than multiplied."""
        return False

    def rope_frequencies(self, arch: Architecture) -> torch.Tensor | None:
        """Inverse RoPE frequencies [head_dim / 2] in float32, or None without rotary embeddings."""
        return None

    def fused_groups(self, arch: Architecture) -> list[tuple[str, ...]]:
        """Matrices that read the same input (e.g. q, k, v), multiplied as one: the block asks for them together
        with `Ops.linears`."""
        return []

    @abstractmethod
    def embed(self, ops: Ops, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Hidden states [T, hidden] of token `ids` at `positions`."""

    @abstractmethod
    def block(self, ops: Ops, layer: int, hidden: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """One transformer block over `hidden` [T, hidden]."""

    @abstractmethod
    def final_norm(self, ops: Ops, hidden: torch.Tensor) -> torch.Tensor:
        """The normalization before the output projection."""
