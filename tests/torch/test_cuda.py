"""On a CUDA machine, the Torch backend gives the CPU's greedy tokens (skipped where torch sees no GPU)."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.programs import TinyProgram
from pawfn import GPT2, InterpreterModel, PawConfig, PawFn, Qwen3_0_6B, RuntimeOptions, Torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device")
INPUTS = ["Urgent: the server is down!", "hello", "", "I love this product"]
OPTIONS = RuntimeOptions(max_tokens=24)


def _model(program: TinyProgram) -> type[InterpreterModel]:
    return Qwen3_0_6B if program.interpreter.family == "qwen3" else GPT2


@pytest.mark.parametrize("name", ["qwen3_program", "gpt2_program", "qwen3_program_q4", "gpt2_program_q4"])
def test_cuda_float32_matches_cpu(name: str, request: pytest.FixtureRequest) -> None:
    program: TinyProgram = request.getfixturevalue(name)
    kind = PawFn.specialize(_model(program), Torch)
    base = program.interpreter.gguf_path
    with kind.load_sync(program.folder, base=base) as cpu, kind.load_sync(program.folder, base=base, config=PawConfig(device="cuda")) as gpu:
        for text in INPUTS:
            assert gpu.generate(text, OPTIONS).token_ids == cpu.generate(text, OPTIONS).token_ids, text


def test_cuda_bfloat16_runs(qwen3_program: TinyProgram) -> None:
    config = PawConfig(device="cuda", dtype="bfloat16", max_model_copies=2)
    with PawFn[Qwen3_0_6B, Torch].load_sync(qwen3_program.folder, base=qwen3_program.interpreter.hf_dir, config=config) as f:
        generation = f.generate(INPUTS[0], OPTIONS)
    assert len(generation.token_ids) == 24
