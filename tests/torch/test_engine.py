"""The forward pass's attention: a call's KV cache holds only its own positions and reads its program's prefix in
place, and attention over prefix and own positions, merged by log-sum-exp, is attention over both."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch

from pawfn import PawConfig, PawFn, Qwen3_0_6B, RuntimeOptions, Torch
from pawfn.torch.model.attention import attention_by_matmul, merge_attention, partial_attention
from pawfn.torch.model.families import Architecture
from tests.helpers.programs import TinyProgram, torch_program

HEAD_DIM = 16


def _arch(n_heads: int = 4, n_kv_heads: int = 2) -> Architecture:
    return Architecture(
        family="qwen3",
        n_layers=1,
        hidden_size=n_heads * HEAD_DIM,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        head_dim=HEAD_DIM,
        ffn_size=8,
        vocab_size=8,
        max_positions=64,
        norm_eps=1e-6,
        rope_theta=10000.0,
    )


def _causal(n_queries: int, n_keys: int, group: int) -> torch.Tensor:
    """The additive mask of `n_queries` last positions over `n_keys`, tiled for the query heads of a KV head."""
    query_at = torch.arange(n_keys - n_queries, n_keys).unsqueeze(1)
    hidden = torch.arange(n_keys).unsqueeze(0) > query_at
    return torch.zeros(hidden.shape).masked_fill_(hidden, -math.inf).repeat(group, 1)


def test_attention_over_two_parts_merged_is_attention_over_both() -> None:
    random = torch.Generator().manual_seed(0)
    arch, n_prefix, n_own = _arch(), 11, 5
    group = arch.n_heads // arch.n_kv_heads
    queries = torch.randn(1, arch.n_kv_heads, group * n_own, HEAD_DIM, generator=random)
    keys, values = torch.randn(2, 1, arch.n_kv_heads, n_prefix + n_own, HEAD_DIM, generator=random)
    mask = _causal(n_own, n_own, group)
    whole_mask = torch.cat([torch.zeros(group * n_own, n_prefix), mask], dim=1)
    expected = torch.nn.functional.scaled_dot_product_attention(queries, keys, values, attn_mask=whole_mask)
    prefix = partial_attention(arch, queries, keys[:, :, :n_prefix], values[:, :, :n_prefix], None)
    own = partial_attention(arch, queries, keys[:, :, n_prefix:], values[:, :, n_prefix:], mask)
    torch.testing.assert_close(merge_attention(*prefix, *own), expected)
    # the part that holds all the mass wins outright; an empty share contributes nothing
    out, lse = own
    torch.testing.assert_close(merge_attention(out, lse, torch.full_like(out, 9.0), lse - 200.0), out)


@pytest.mark.parametrize("masked", [False, True])
def test_attention_by_matmul_agrees_with_the_cpu_kernel(masked: bool) -> None:
    """The path other devices take, checked here against torch's fused CPU kernel."""
    random = torch.Generator().manual_seed(1)
    arch, n_queries, n_keys = _arch(), 6, 9
    group = arch.n_heads // arch.n_kv_heads
    queries = torch.randn(1, arch.n_kv_heads, group * n_queries, HEAD_DIM, generator=random)
    keys, values = torch.randn(2, 1, arch.n_kv_heads, n_keys, HEAD_DIM, generator=random)
    mask = _causal(n_queries, n_keys, group) if masked else None
    expected_out, expected_lse = partial_attention(arch, queries, keys, values, mask)
    out, lse = attention_by_matmul(queries, keys, values, mask, 1.0 / math.sqrt(HEAD_DIM))
    torch.testing.assert_close(out, expected_out)
    torch.testing.assert_close(lse, expected_lse)


@pytest.mark.parametrize("family", ["qwen3", "gpt2"])
def test_a_call_reads_its_programs_prefix_in_place(family: str, request: pytest.FixtureRequest) -> None:
    """A call's cache stores only the positions after the prefix, whose KV every call of the program shares."""
    program: TinyProgram = request.getfixturevalue(f"{family}_program")
    config = PawConfig(max_model_copies=1)
    with PawFn.load_any_sync(str(program.folder), Torch, base=program.interpreter.gguf_path, config=config) as function:
        runtime = torch_program(function)
        prefix = runtime.prefix_state
        assert prefix.length > 0
        keys = [k.clone() for k in prefix.keys]
        generation = function.generate("hello there", RuntimeOptions(max_tokens=4))
        with runtime.base.acquire() as slot:  # the one KV slot, which the call used
            assert slot.cache.prefix is None  # the call's sequence ended and let go of the program's prefix
            own = slot.cache.keys[0][:, : min(generation.prompt_tokens, prefix.length)]
            assert own.shape[1] == min(generation.prompt_tokens, prefix.length)  # the call's positions were stored
            assert not torch.equal(own, prefix.keys[0][:, : own.shape[1]])  # not a copy of the prefix
        assert all(torch.equal(before, after) for before, after in zip(keys, prefix.keys, strict=True))


def test_a_prompt_pass_stops_before_the_next_layer_once_asked(qwen3_program: TinyProgram) -> None:
    """A 1,300-token prompt is passes of 128 tokens (llama.cpp's batches) through two layers: `stop` is asked before
    each layer, and the first true answer ends the pass there (CancelledError), so a cancelled call's prompt ends
    within a layer of one pass."""
    from concurrent.futures import CancelledError

    with PawFn[Qwen3_0_6B, Torch].load_sync(qwen3_program.folder, base=qwen3_program.interpreter.gguf_path, config=PawConfig(n_ctx=2048)) as function:
        runtime = torch_program(function)
        interpreter, adapter = runtime.base.interpreter, runtime.device_adapter
        prompt = function.prompt_token_ids("word " * 650)
        assert len(prompt) > 1024
        asked: list[int] = []

        def stopping_at(k: int) -> Callable[[], bool]:
            def stop() -> bool:
                asked.append(len(asked) + 1)
                return len(asked) == k

            return stop

        for k in (1, 4):  # before the first layer of the first pass; before the second layer of the second pass
            asked.clear()
            cache = interpreter.new_cache()
            cache.begin(None)
            with pytest.raises(CancelledError):
                interpreter.forward(prompt, 0, cache, adapter, stopping_at(k))
            assert len(asked) == k
        asked.clear()
        cache = interpreter.new_cache()
        cache.begin(None)
        interpreter.forward(prompt, 0, cache, adapter, stopping_at(0))
        assert len(asked) == -(-len(prompt) // 128) * 2  # every layer of every pass, never stopped
