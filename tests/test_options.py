"""RuntimeOptions and PawConfig refuse invalid values with clear errors; model types carry their facts."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from pawfn import GPT2, PawConfig, Qwen3_0_6B, RuntimeOptions
from pawfn.models import model_for_interpreter


def test_defaults_are_the_official_runtime_s() -> None:
    options = RuntimeOptions()
    assert (options.max_tokens, options.temperature, options.top_p, options.seed) == (None, 0.0, 1.0, None)
    assert options.parse_special_in_input is False
    config = PawConfig()
    assert (config.device, config.dtype, config.n_ctx) == ("cpu", "float32", 2048)
    assert (config.max_model_copies, config.max_batch_rows) == (8, 8)  # made only when runs overlap


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"max_tokens": -1}, "greater than or equal to 0"),
        ({"max_tokens": "5"}, "Input should be a valid integer"),
        ({"temperature": -0.1}, "greater than or equal to 0"),
        ({"temperature": float("nan")}, "greater than or equal to 0"),
        ({"temperature": float("inf")}, "must be a finite number"),
        ({"temperature": "hot"}, "Input should be a valid number"),
        ({"top_p": 0.0}, "greater than 0"),
        ({"top_p": 1.5}, "less than or equal to 1"),
        ({"seed": 1.5}, "Input should be a valid integer"),
        ({"parse_special_in_input": "yes"}, "Input should be a valid boolean"),
        ({"max_token": 3}, "Extra inputs are not permitted"),
    ],
)
def test_invalid_runtime_options(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        RuntimeOptions(**fields)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"device": "gpu"}, "device\n  Input should be 'cpu', 'mps', 'cuda', 'cuda:0'"),
        ({"device": "cuda:16"}, "Input should be 'cpu'"),
        ({"dtype": "int8"}, "Input should be 'float32', 'bfloat16' or 'float16'"),
        ({"n_ctx": 0}, "greater than 0"),
        ({"max_model_copies": 0}, "greater than or equal to 1"),
        ({"threads": 0}, "greater than or equal to 1"),
    ],
)
def test_invalid_config(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        PawConfig(**fields)


def test_valid_devices() -> None:
    assert [PawConfig(device=d).device for d in ("cpu", "cuda", "cuda:1", "mps")] == ["cpu", "cuda", "cuda:1", "mps"]


def test_options_are_frozen() -> None:
    options = RuntimeOptions()
    with pytest.raises(ValidationError, match="frozen"):
        setattr(options, "max_tokens", 3)  # noqa: B010 - assignment the checkers would refuse statically


def test_model_facts() -> None:
    assert Qwen3_0_6B.interpreter_id == "Qwen/Qwen3-0.6B" and GPT2.interpreter_id == "gpt2"
    assert Qwen3_0_6B.runtime_id == "qwen3-0.6b-q6_k" and GPT2.runtime_id == "gpt2-q8_0"
    assert Qwen3_0_6B.default_gguf.url == (
        "https://huggingface.co/programasweights/Qwen3-0.6B-GGUF-Q6_K/resolve/main/qwen3-0.6b-q6_k.gguf"
    )
    assert Qwen3_0_6B.lora_module_map["attn_q"] == "self_attn.q_proj"
    assert GPT2.lora_module_map["attn_qkv"] == "attn.c_attn" and "attn_qkv" in GPT2.conv1d_modules
    assert GPT2.max_context == 1024 and Qwen3_0_6B.eos_token == "<|im_end|>"


def test_model_lookup_by_interpreter() -> None:
    assert model_for_interpreter("Qwen/Qwen3-0.6B") is Qwen3_0_6B
    assert model_for_interpreter("openai-community/gpt2") is GPT2
    assert model_for_interpreter("llama") is None
