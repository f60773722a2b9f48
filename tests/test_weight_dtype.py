"""`PawConfig(weight_dtype="float16")`: the base's matrices in float16 on fbgemm's fp16 kernel (CPU, float32
activations). Exact with respect to float16-rounded weights; near-exact against float32, with a measured floor."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch

from pawfn import GPT2, ConfigError, InterpreterModel, LlamaCpp, PawConfig, PawFn, Qwen3_0_6B, RuntimeOptions, Torch
from pawfn.torch.engine import DeviceAdapter, TorchInterpreter
from pawfn.torch.weights import Array, BaseWeights, read_base_weights
from tests.helpers.programs import HAS_LLAMA_CPP, TinyProgram

INPUTS = ["hello", "Urgent: the server is down!", "I love this product", "the lazy dog", "Résumé café 123", "a",
          "what is this?", "numbers 1 2 3"]
FLOORS = {"qwen3": 0.95, "gpt2": 0.85}
"""On the random tiny models (nearly flat predictions): least share of greedy tokens that match float32 before a
call's first difference (measured 1.00 and 0.90)."""
TRAINED_FLOOR = 0.98
"""The same on the trained tiny models, against float32 and against llama.cpp (measured 1.00 for both families)."""


def _model(program: TinyProgram) -> type[InterpreterModel]:
    return Qwen3_0_6B if program.interpreter.family == "qwen3" else GPT2


@pytest.mark.parametrize("family", ["qwen3", "gpt2"])
def test_fp16_kernel_equals_float32_on_rounded_weights(family: str, request: pytest.FixtureRequest) -> None:
    """The packed path computes what the float32 path computes on the same float16 values."""
    program: TinyProgram = request.getfixturevalue(f"{family}_program")
    model = _model(program)
    weights = read_base_weights(program.interpreter.gguf_path, model)

    def rounded() -> Iterator[tuple[str, Array]]:
        for name, array in weights.tensors():
            yield name, array.astype(np.float16).astype(np.float32) if array.ndim == 2 else array

    plain_weights = BaseWeights(weights.source, weights.architecture, weights.family, weights.codec, rounded)
    plain = TorchInterpreter(plain_weights, torch.device("cpu"), torch.float32)
    compact = TorchInterpreter(weights, torch.device("cpu"), torch.float32, weight_dtype="float16")
    assert compact.packed and "output.weight" in compact.packed
    assert compact.tensors["token_embd.weight"].dtype == torch.float16
    no_lora = DeviceAdapter({})
    ids = weights.codec.encode("Urgent: the server is down! Please help.", parse_special=False)
    plain_cache, compact_cache = plain.new_cache(), compact.new_cache()
    expected = plain.forward(ids, 0, plain_cache, no_lora)
    found = compact.forward(ids, 0, compact_cache, no_lora)
    torch.testing.assert_close(found, expected, rtol=1e-4, atol=1e-4)
    for position in range(len(ids), len(ids) + 16):  # greedy decoding follows the same tokens
        token = int(torch.argmax(expected))
        assert token == int(torch.argmax(found))
        expected = plain.forward([token], position, plain_cache, no_lora)
        found = compact.forward([token], position, compact_cache, no_lora)


@pytest.mark.parametrize("family", ["qwen3", "gpt2"])
def test_fp16_weights_agree_with_float32_above_the_floor(family: str, request: pytest.FixtureRequest) -> None:
    program: TinyProgram = request.getfixturevalue(f"{family}_program")
    kind = PawFn.specialize(_model(program), Torch)
    base, options = program.interpreter.gguf_path, RuntimeOptions(max_tokens=32)
    compact_config = PawConfig(weight_dtype="float16")
    with kind.from_path(program.folder, base=base) as exact, kind.from_path(program.folder, base=base, config=compact_config) as compact:
        agreed = total = 0
        for text in INPUTS:
            reference, found = exact.generate(text, options).token_ids, compact.generate(text, options).token_ids
            agreed += next((i for i, (a, b) in enumerate(zip(reference, found, strict=False)) if a != b), len(reference))
            total += len(reference)
    assert agreed / total >= FLOORS[family]


def _agreement(reference: PawFn[InterpreterModel, Torch] | PawFn[InterpreterModel, LlamaCpp], compact: PawFn[InterpreterModel, Torch], max_tokens: int) -> float:
    """Share of `reference`'s greedy tokens that `compact` matches before each call's first difference."""
    options = RuntimeOptions(max_tokens=max_tokens)
    agreed = total = 0
    for text in INPUTS:
        expected, found = reference.generate(text, options).token_ids, compact.generate(text, options).token_ids
        agreed += next((i for i, (a, b) in enumerate(zip(expected, found, strict=False)) if a != b), len(expected))
        total += len(expected)
    return agreed / total


@pytest.mark.parametrize("family", ["qwen3", "gpt2"])
def test_fp16_weights_agree_on_trained_models(family: str, request: pytest.FixtureRequest) -> None:
    """Peaked predictions, as a real model makes: float16 weights keep float32's and llama.cpp's greedy tokens."""
    program: TinyProgram = request.getfixturevalue(f"trained_{family}_program")
    model, base = _model(program), program.interpreter.gguf_path
    config = PawConfig(weight_dtype="float16")
    with (
        PawFn.load_any_sync(str(program.folder), Torch, base=base) as exact,
        PawFn.load_any_sync(str(program.folder), Torch, base=base, config=config) as compact,
    ):
        assert type(compact).model_type() is model
        assert _agreement(exact, compact, 48) >= TRAINED_FLOOR
        if HAS_LLAMA_CPP:
            with PawFn.load_any_sync(str(program.folder), LlamaCpp, base=base) as official:
                assert _agreement(official, compact, 48) >= TRAINED_FLOOR


def test_fp16_weights_need_the_cpu_and_float32(qwen3_program: TinyProgram) -> None:
    with pytest.raises(ConfigError, match="weight_dtype='float16' runs on the CPU with dtype='float32'"):
        PawFn[Qwen3_0_6B, Torch].from_path(
            qwen3_program.folder, base=qwen3_program.interpreter.gguf_path,
            config=PawConfig(weight_dtype="float16", dtype="bfloat16"),
        )
