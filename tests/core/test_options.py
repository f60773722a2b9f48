"""RuntimeOptions and PawConfig refuse invalid values with clear errors; model types carry their facts."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from pawfn import GPT2, EngineSettings, HubSettings, OptionError, PawConfig, PawError, Qwen3_0_6B, RemoteSettings, RuntimeOptions
from pawfn.core.models import model_for_interpreter


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
        ({"max_tokens": -1}, "invalid max_tokens=-1: expected an integer >= 0, or None"),
        ({"max_tokens": "5"}, "invalid max_tokens='5': expected an integer >= 0, or None"),
        ({"temperature": -0.1}, "invalid temperature=-0.1: expected a finite number >= 0"),
        ({"temperature": float("nan")}, "invalid temperature=nan: expected a finite number >= 0"),
        ({"temperature": float("inf")}, "invalid temperature=inf: expected a finite number >= 0"),
        ({"temperature": "hot"}, "invalid temperature='hot': expected a finite number >= 0"),
        ({"top_p": 0.0}, r"invalid top_p=0.0: expected a finite number in \(0, 1\]"),
        ({"top_p": 1.5}, r"invalid top_p=1.5: expected a finite number in \(0, 1\]"),
        ({"seed": 1.5}, r"invalid seed=1.5: expected an integer in \[0, 2\*\*64\), or None"),
        ({"parse_special_in_input": "yes"}, "invalid parse_special_in_input='yes': expected true or false"),
        ({"max_token": 3}, "invalid max_token=3: unknown option; the options are max_tokens, temperature"),
    ],
)
def test_invalid_runtime_options_are_paw_errors(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(OptionError, match=f"^{message}") as raised:
        RuntimeOptions(**fields)
    assert isinstance(raised.value, PawError) and isinstance(raised.value, ValueError)
    ((field, value),) = fields.items()
    assert (raised.value.field, raised.value.value) == (field, value) or raised.value.value != raised.value.value


def test_option_error_names_every_invalid_field_and_its_range() -> None:
    with pytest.raises(OptionError) as raised:
        RuntimeOptions(max_tokens=-2, top_p=2.0)
    assert [(item.field, item.value, item.allowed) for item in raised.value.problems] == [
        ("max_tokens", -2, "an integer >= 0, or None"),
        ("top_p", 2.0, "a finite number in (0, 1]"),
    ]
    relabeled = raised.value.labeled({"top_p": "--top-p"})
    assert str(relabeled).endswith("; invalid --top-p=2.0: expected a finite number in (0, 1]")


def test_options_nested_in_a_request_keep_pydantic_s_error_with_the_same_wording() -> None:
    class Body(BaseModel):
        options: RuntimeOptions = RuntimeOptions()

    with pytest.raises(ValidationError, match="invalid max_tokens=-1: expected an integer >= 0, or None"):
        Body.model_validate_json('{"options": {"max_tokens": -1}}')
    assert Body.model_validate_json('{"options": {"temperature": 0, "top_p": 0.5}}').options.temperature == 0.0


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"device": "gpu"}, "invalid device='gpu': expected one of 'cpu', 'mps', 'cuda', 'cuda:0', .*'cuda:15'"),
        ({"device": "cuda:16"}, "invalid device='cuda:16': expected one of 'cpu'"),
        ({"dtype": "int8"}, "invalid dtype='int8': expected one of 'float32', 'bfloat16', 'float16'"),
        ({"n_ctx": 0}, "invalid n_ctx=0: expected an integer > 0"),
        ({"max_model_copies": 0}, "invalid max_model_copies=0: expected an integer >= 1"),
        ({"threads": 0}, "invalid threads=0: expected an integer >= 1, or None"),
        ({"api_key": 3}, "invalid api_key=<hidden>: expected text, or None"),
        ({"api_url": "ftp://x"}, "invalid api_url='ftp://x': api_url must be an http"),
    ],
)
def test_invalid_config(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(OptionError, match=message):
        PawConfig(**fields)
    with pytest.raises(OptionError, match=message):
        PawConfig().with_options(**fields)


def test_valid_devices() -> None:
    assert [PawConfig(device=d).device for d in ("cpu", "cuda", "cuda:1", "mps")] == ["cpu", "cuda", "cuda:1", "mps"]


def test_options_are_frozen() -> None:
    options = RuntimeOptions()
    with pytest.raises(ValidationError, match="frozen"):
        setattr(options, "max_tokens", 3)  # noqa: B010 - assignment the checkers would refuse statically


def test_model_facts() -> None:
    assert Qwen3_0_6B.interpreter_id == "Qwen/Qwen3-0.6B" and GPT2.interpreter_id == "gpt2"
    assert Qwen3_0_6B.runtime_id == "qwen3-0.6b-q6_k" and GPT2.runtime_id == "gpt2-q8_0"
    assert Qwen3_0_6B.default_gguf.url == ("https://huggingface.co/programasweights/Qwen3-0.6B-GGUF-Q6_K/resolve/main/qwen3-0.6b-q6_k.gguf")
    assert Qwen3_0_6B.lora_module_map["attn_q"] == "self_attn.q_proj"
    assert GPT2.lora_module_map["attn_qkv"] == "attn.c_attn" and "attn_qkv" in GPT2.conv1d_modules
    assert GPT2.max_context == 1024 and Qwen3_0_6B.eos_token == "<|im_end|>"


def test_model_lookup_by_interpreter() -> None:
    assert model_for_interpreter("Qwen/Qwen3-0.6B") is Qwen3_0_6B
    assert model_for_interpreter("openai-community/gpt2") is GPT2
    assert model_for_interpreter("llama") is None


def test_pawconfig_is_its_three_groups_and_nothing_else() -> None:
    """Every setting belongs to exactly one group (hub, engine, remote); a `PawConfig` is each group, so a layer that
    takes one (a backend: `EngineSettings`) takes a whole config too; every official variable names a setting."""
    from pawfn.core.config import _ENV_VARIABLES  # pyright: ignore[reportPrivateUsage]  # the official variables table is what this checks

    groups = [set(group.model_fields) for group in (HubSettings, EngineSettings, RemoteSettings)]
    assert set(PawConfig.model_fields) == set().union(*groups)
    assert sum(len(group) for group in groups) == len(PawConfig.model_fields)  # no setting in two groups
    assert set(_ENV_VARIABLES) <= set(PawConfig.model_fields)
    config = PawConfig.from_env(device="cpu", offline=True, server_url="http://127.0.0.1:9/")
    assert isinstance(config, HubSettings) and isinstance(config, EngineSettings) and isinstance(config, RemoteSettings)
    assert (config.offline, config.device, config.server_url) == (True, "cpu", "http://127.0.0.1:9")
    assert list(PawConfig.model_fields)[0] == "api_url"  # the hub's settings first, as the docs list them
    with pytest.raises(OptionError, match="invalid server_url='ftp://x': server_url must be an http"):
        RemoteSettings(server_url="ftp://x")
