"""`PawConfig(weight_dtype=...)`: the base's matrices compact on fbgemm's kernels (CPU). float16 (float32
activations) is exact with respect to float16-rounded weights and near-exact against float32; int8 (per-row
weights, activations quantized per call) is lossy, held to floors measured on the trained fixtures (and, not yet
met, to llama.cpp's own 8-bit base). Fusing q/k/v and gate/up changes no bit in any mode."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest
import torch

from pawfn import GPT2, ConfigError, InterpreterModel, LlamaCpp, PawConfig, PawFn, Qwen3_0_6B, RuntimeOptions, Torch
from pawfn.formats.adapter import read_lora_adapter
from pawfn.core.options import WeightDType
from pawfn.torch.model import packed as kernels
from pawfn.torch.model.families import Architecture, Family
from pawfn.torch.weights.lora import DeviceAdapter
from pawfn.torch.engine.network import TorchInterpreter
from pawfn.torch.weights.reader import Array, BaseWeights, built, read_base_weights
from tests.helpers.programs import HAS_LLAMA_CPP, TinyProgram, requires_llama_cpp
from tests.helpers.trained import TrainedProgram

INPUTS = ["hello", "Urgent: the server is down!", "I love this product", "the lazy dog", "Résumé café 123", "a", "what is this?", "numbers 1 2 3"]
FLOAT32 = PawConfig(numerics="native")
"""The reference the compact modes are measured against: torch's float32 (the default runs llama.cpp's arithmetic on GGUF bases)."""
FLOORS = {"qwen3": 0.95, "gpt2": 0.85}
"""On the random tiny models (nearly flat predictions): least share of greedy tokens that match float32 before a
call's first difference (measured 1.00 and 0.99)."""
TRAINED_FLOOR = 0.98
"""The same on the trained fixtures (16 inputs, 32 tokens), against float32 and against llama.cpp on the F32 files
(measured 1.00 for both families)."""


def _model(program: TinyProgram) -> type[InterpreterModel]:
    return Qwen3_0_6B if program.interpreter.family == "qwen3" else GPT2


@pytest.mark.parametrize("family", ["qwen3", "gpt2"])
def test_fp16_kernel_equals_float32_on_rounded_weights(family: str, request: pytest.FixtureRequest) -> None:
    """The packed path computes what the float32 path computes on the same float16 values."""
    program: TinyProgram = request.getfixturevalue(f"{family}_program")
    model = _model(program)
    weights = read_base_weights(program.interpreter.gguf_path, model)

    def rounded() -> Iterator[tuple[str, Array]]:  # the matrices; embedding rows are decoded exactly
        for name, array in weights.tensors():
            matrix = array.ndim == 2 and not name.endswith("embd.weight")
            yield name, array.astype(np.float16).astype(np.float32) if matrix else array

    plain_weights = BaseWeights(weights.source, weights.architecture, weights.family, built(weights.codec), rounded, weights.shapes)
    plain = TorchInterpreter.load(plain_weights, torch.device("cpu"), torch.float32)
    assert plain.weights.tied
    output = plain.weights.tensors["token_embd.weight"].to(torch.float16).to(torch.float32)
    plain.weights.matrices["output.weight"] = kernels.plain(output, None)  # tied: the output matrix is rounded too
    compact = TorchInterpreter.load(weights, torch.device("cpu"), torch.float32, weight_dtype="float16")
    assert {type(matrix) for matrix in compact.weights.matrices.values()} == {kernels.Float16Matrix} and "output.weight" in compact.weights.matrices
    assert "token_embd.weight" in compact.weights.rows and "token_embd.weight" not in compact.weights.tensors  # decoded from the file
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
    with (
        kind.load_sync(program.folder, base=base, config=FLOAT32) as exact,
        kind.load_sync(program.folder, base=base, config=compact_config) as compact,
    ):
        agreed = total = 0
        for text in INPUTS:
            reference, found = exact.generate(text, options).token_ids, compact.generate(text, options).token_ids
            agreed += next((i for i, (a, b) in enumerate(zip(reference, found, strict=False)) if a != b), len(reference))
            total += len(reference)
    assert agreed / total >= FLOORS[family]


def _agreement(
    reference: PawFn[InterpreterModel, Torch] | PawFn[InterpreterModel, LlamaCpp],
    compact: PawFn[InterpreterModel, Torch] | PawFn[InterpreterModel, LlamaCpp],
    max_tokens: int,
    inputs: Sequence[str] = INPUTS,
) -> float:
    """Share of `reference`'s greedy tokens that `compact` matches before each call's first difference."""
    options = RuntimeOptions(max_tokens=max_tokens)
    agreed = total = 0
    for text in inputs:
        expected, found = reference.generate(text, options).token_ids, compact.generate(text, options).token_ids
        agreed += next((i for i, (a, b) in enumerate(zip(expected, found, strict=False)) if a != b), len(expected))
        total += len(expected)
    return agreed / total


@pytest.mark.parametrize("family", ["qwen3", "gpt2"])
def test_fp16_weights_agree_on_trained_models(family: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """Peaked predictions, as a real model makes: float16 weights keep float32's and llama.cpp's greedy tokens (on
    the F32 files, so that only the float16 rounding differs)."""
    trained: TrainedProgram = request.getfixturevalue(f"trained_{family}_program")
    base, program = trained.base("f32"), str(trained.program_with_f32_adapter(tmp_path))
    config = PawConfig(weight_dtype="float16")
    with (
        PawFn.load_any_sync(program, Torch, base=base, config=FLOAT32) as exact,
        PawFn.load_any_sync(program, Torch, base=base, config=config) as compact,
    ):
        assert type(compact).model_type() is trained.model
        assert _agreement(exact, compact, 32, trained.inputs) >= TRAINED_FLOOR
        if HAS_LLAMA_CPP:
            exact_cache = PawConfig(llamacpp_kv_dtype="float32")  # llama.cpp's float32 arithmetic throughout
            with PawFn.load_any_sync(program, LlamaCpp, base=base, config=exact_cache) as official:
                assert _agreement(official, compact, 32, trained.inputs) >= TRAINED_FLOOR


def test_fp16_weights_need_the_cpu_and_float32(qwen3_program: TinyProgram) -> None:
    with pytest.raises(ConfigError, match="weight_dtype='float16' runs on the CPU with dtype='float32'"):
        PawFn[Qwen3_0_6B, Torch].load_sync(
            qwen3_program.folder, base=qwen3_program.interpreter.gguf_path, config=PawConfig(weight_dtype="float16", dtype="bfloat16")
        )


INT8_TRAINED_FLOORS = {"qwen3": 0.5, "gpt2": 0.7} if kernels.int8_weight_bits() == 8 else {"qwen3": 0.3, "gpt2": 0.55}
"""Least share of float32's greedy tokens before a call's first difference, int8 weights on the trained fixtures'
16 inputs, 32 tokens each (measured 0.564 and 0.777 on an Intel Xeon; llama.cpp's own Q8_0 base keeps 0.789 and
0.875 there: pawfn's int8 is less faithful than llama.cpp's 8-bit base on peaked models; --numerics llamacpp is the faithful mode).
On CPUs without VNNI the weights are packed at 7 bits (`int8_weight_bits`): 0.338 and 0.607 on an AVX2-only AMD EPYC."""


@pytest.mark.parametrize("family", ["qwen3", "gpt2"])
def test_int8_weights_agree_on_trained_models(family: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """int8 keeps a stated share of float32's tokens (F32 adapter, so that only the 8-bit base differs)."""
    trained: TrainedProgram = request.getfixturevalue(f"trained_{family}_program")
    base, program = trained.base("f32"), str(trained.program_with_f32_adapter(tmp_path))
    with (
        PawFn.load_any_sync(program, Torch, base=base, config=FLOAT32) as exact,
        PawFn.load_any_sync(program, Torch, base=base, config=PawConfig(weight_dtype="int8")) as compact,
    ):
        assert _agreement(exact, compact, 32, trained.inputs) >= INT8_TRAINED_FLOORS[family]


@pytest.mark.xfail(
    strict=True,
    reason=(
        "per-row int8 weights (use --numerics llamacpp for the official tokens): on the trained Qwen3 pawfn's int8 keeps "
        "0.56 of float32's tokens, llama.cpp's Q8_0 0.79"
    ),
)
@requires_llama_cpp
def test_int8_is_as_faithful_as_llama_cpps_q8_0_base(trained_qwen3_program: TrainedProgram, tmp_path: Path) -> None:
    """What the fast mode owes: lose no more of float32's tokens than llama.cpp's own 8-bit base does."""
    trained = trained_qwen3_program
    base, program = trained.base("f32"), str(trained.program_with_f32_adapter(tmp_path))
    with (
        PawFn.load_any_sync(program, Torch, base=base, config=FLOAT32) as exact,
        PawFn.load_any_sync(program, Torch, base=base, config=PawConfig(weight_dtype="int8")) as compact,
        PawFn.load_any_sync(program, LlamaCpp, base=trained.base("q8_0")) as official_q8_0,
    ):
        assert _agreement(exact, compact, 32, trained.inputs) >= _agreement(exact, official_q8_0, 32, trained.inputs) - 0.1


@pytest.mark.parametrize("weight_dtype", [None, "float16", "int8"])
@pytest.mark.parametrize("family", ["qwen3", "gpt2"])
def test_fused_matrices_change_no_bit(
    family: str, weight_dtype: WeightDType | None, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """q/k/v and gate/up multiplied as one matrix (with their LoRA `a` matrices joined) give the separate products' bits."""
    program: TinyProgram = request.getfixturevalue(f"{family}_program")
    model = _model(program)
    weights = read_base_weights(program.interpreter.gguf_path, model)
    adapter = read_lora_adapter(program.adapter, model)
    fused = TorchInterpreter.load(weights, torch.device("cpu"), torch.float32, weight_dtype=weight_dtype)

    def no_groups(self: Family, arch: Architecture) -> list[tuple[str, ...]]:
        return []

    monkeypatch.setattr(type(weights.family), "fused_groups", no_groups)
    separate = TorchInterpreter.load(weights, torch.device("cpu"), torch.float32, weight_dtype=weight_dtype)
    assert bool(fused.weights.groups) == (family == "qwen3") and not separate.weights.groups
    ids = weights.codec.encode("Urgent: the server is down! Please help.", parse_special=False)
    fused_adapter, separate_adapter = fused.attach(adapter), separate.attach(adapter)
    assert bool(fused_adapter.groups) == (family == "qwen3")
    fused_cache, separate_cache = fused.new_cache(), separate.new_cache()
    expected = separate.forward(ids, 0, separate_cache, separate_adapter)
    found = fused.forward(ids, 0, fused_cache, fused_adapter)
    for position in range(len(ids), len(ids) + 8):
        assert torch.equal(found, expected)
        token = int(torch.argmax(expected))
        expected = separate.forward([token], position, separate_cache, separate_adapter)
        found = fused.forward([token], position, fused_cache, fused_adapter)


def test_int8_weights_need_the_cpu_and_float32(qwen3_program: TinyProgram) -> None:
    with pytest.raises(ConfigError, match="weight_dtype='int8' runs on the CPU with dtype='float32'"):
        PawFn[Qwen3_0_6B, Torch].load_sync(
            qwen3_program.folder, base=qwen3_program.interpreter.gguf_path, config=PawConfig(weight_dtype="int8", dtype="bfloat16")
        )


def test_int8_loads_without_torchs_deprecation_warning(qwen3_program: TinyProgram, tmp_path: Path) -> None:
    """torch warns once that quantized tensors are deprecated; pawfn takes that warning, so users never see it."""
    script = (
        "import sys\n"
        "from pawfn import PawConfig, PawFn, Qwen3_0_6B, RuntimeOptions, Torch\n"
        "with PawFn[Qwen3_0_6B, Torch].load_sync(sys.argv[1], base=sys.argv[2], config=PawConfig(weight_dtype='int8')) as p:\n"
        "    p.generate('hi', RuntimeOptions(max_tokens=2))\n"
    )
    environment = {**os.environ, "PAW_CACHE_DIR": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-W", "error::UserWarning", "-c", script, str(qwen3_program.folder), str(qwen3_program.interpreter.gguf_path)],
        capture_output=True,
        text=True,
        check=False,
        env=environment,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "deprecated" not in result.stderr


def test_int8_products_never_saturate() -> None:
    """The worst case for fbgemm's int16 pair sums on CPUs without VNNI: a row's largest activations against its
    largest weights, of one sign. Both the per-call and the per-row product stay within int8's rounding of float32
    (a saturated pair sum would lose most of each output)."""
    torch.manual_seed(0)  # pyright: ignore[reportUnknownMemberType]  # torch leaves `seed` unannotated
    weight = torch.full((16, 256), 0.5)
    weight[:, 1::2] = torch.rand(16, 128) * 0.5
    x = torch.rand(3, 256)
    x[:, ::2] = 1.0  # each pair's larger product at the top of the range
    x[0, 0] = -1.0  # the range's other end, so that 1.0 quantizes to 255
    matrix = kernels.pack("w", kernels.compress("w", weight, "int8"), "int8", None)
    expected = x @ weight.T
    for found in (matrix(x), matrix.rows(x)):
        assert torch.allclose(found, expected, rtol=0.02, atol=0.0), float((found - expected).abs().max())
