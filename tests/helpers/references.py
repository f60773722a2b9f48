"""Independent references for parity: transformers + peft, and llama.cpp (the official runtime).

llama.cpp runs in a child process per call (`tests.helpers.llama_child`): a native crash there (llama.cpp's AMX
kernels segfault on some CPUs) fails the calling test with the signal named, and the session goes on."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer

from pawfn.llamacpp import cpu

from .tiny_models import Array, TinyInterpreter

PLACEHOLDER = "{INPUT_PLACEHOLDER}"
REPOSITORY = Path(__file__).resolve().parents[2]
KV = Literal["f32", "f16"]
"""The KV cache type of a reference run: f32 (exact comparisons) or f16 (llama-cpp-python's default, so the
official SDK's)."""


def official_token_ids(tokenizer: Tokenizer, template: str, text: str) -> tuple[list[int], list[int]]:
    """Prefix ids and input+suffix ids as the official runtime forms them (special tokens parsed, no BOS)."""
    prefix, suffix = template.split(PLACEHOLDER)
    prefix_ids = tokenizer.encode(prefix, add_special_tokens=False).ids if prefix else []
    prompt_ids = tokenizer.encode(text + suffix, add_special_tokens=False).ids if text + suffix else []
    return list(prefix_ids), list(prompt_ids)


def peft_logits(interpreter: TinyInterpreter, pairs: dict[str, tuple[Array, Array]], alpha: float, template: str, text: str) -> Array:
    """transformers + peft logits after the whole prompt (prefix + input + suffix)."""
    model = _peft_model(interpreter, pairs, alpha)
    tokenizer = interpreter.tokenizer()
    prefix_ids, prompt_ids = official_token_ids(tokenizer, template, text)
    with torch.no_grad():
        logits: torch.Tensor = model(input_ids=torch.tensor([prefix_ids + prompt_ids]), use_cache=False).logits[0, -1]
    return logits.float().numpy()


def _peft_model(interpreter: TinyInterpreter, pairs: dict[str, tuple[Array, Array]] | None, alpha: float) -> torch.nn.Module:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model: torch.nn.Module = AutoModelForCausalLM.from_pretrained(  # pyright: ignore[reportUnknownMemberType]  # transformers' **kwargs
        str(interpreter.hf_dir), dtype=torch.float32
    )
    if pairs is not None:
        assert float(alpha).is_integer(), "peft takes an integer lora_alpha"
        rank = next(iter(pairs.values()))[0].shape[0]
        modules = sorted({interpreter.hf_module(t).rsplit(".", 1)[-1] for t in pairs})
        config = LoraConfig(r=rank, lora_alpha=int(alpha), target_modules=modules, lora_dropout=0.0, fan_in_fan_out=interpreter.family == "gpt2")
        model = get_peft_model(model, config)
        with torch.no_grad():
            for target, (a, b) in pairs.items():
                path = f"base_model.model.{interpreter.hf_module(target)}"
                _weight(model.get_submodule(f"{path}.lora_A.default")).copy_(torch.as_tensor(a))
                _weight(model.get_submodule(f"{path}.lora_B.default")).copy_(torch.as_tensor(b))
    return model


def peft_generate(
    interpreter: TinyInterpreter, pairs: dict[str, tuple[Array, Array]] | None, alpha: float, template: str, text: str, max_tokens: int
) -> list[int]:
    """Greedy tokens of transformers + peft LoRA (no KV cache: every step re-reads the whole sequence)."""
    prefix_ids, prompt_ids = official_token_ids(interpreter.tokenizer(), template, text)
    return peft_generate_ids(interpreter, pairs, alpha, prefix_ids + prompt_ids, max_tokens)


def peft_generate_ids(
    interpreter: TinyInterpreter, pairs: dict[str, tuple[Array, Array]] | None, alpha: float, prompt_ids: list[int], max_tokens: int
) -> list[int]:
    """`peft_generate` after a prompt given as token ids."""
    model = _peft_model(interpreter, pairs, alpha)
    eos = interpreter.tokenizer().token_to_id(interpreter.eos_token)
    ids = list(prompt_ids)
    out: list[int] = []
    with torch.no_grad():
        for _ in range(max_tokens):
            logits = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1]
            token = int(torch.argmax(logits).item())
            if token == eos:
                break
            out.append(token)
            ids.append(token)
    return out


def _weight(module: torch.nn.Module) -> torch.Tensor:
    weight = module.weight
    assert isinstance(weight, torch.Tensor)
    return weight


REFERENCE_TIMEOUT_S = 600.0
"""Longest one reference run may take, in seconds (a hung llama.cpp fails its test, not the session)."""


def llama_reference(request: dict[str, Any]) -> Any:  # noqa: ANN401 - the child's JSON answer
    """Run one request of `tests.helpers.llama_child` in a process of its own; a native crash there fails the
    calling test with the signal and, where one is known, the reason (the session goes on)."""
    try:
        child = subprocess.run(
            [sys.executable, "-m", "tests.helpers.llama_child"],
            input=json.dumps(request),
            capture_output=True,
            text=True,
            cwd=REPOSITORY,
            timeout=REFERENCE_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"llama.cpp's reference run ({request['op']}) took over {REFERENCE_TIMEOUT_S:.0f} s", pytrace=False)
    if child.returncode < 0:
        pytest.fail(crash_report(request["op"], -child.returncode, child.stderr), pytrace=False)
    if child.returncode != 0:
        pytest.fail(f"llama.cpp's reference run ({request['op']}) failed:\n{_last_lines(child.stderr)}", pytrace=False)
    return json.loads(child.stdout)["answer"]


def crash_report(operation: str, signal_number: int, stderr: str) -> str:
    """What a test says when llama.cpp's reference run died of a signal: which, the known reason, the child's stderr."""
    name = signal.Signals(signal_number).name if signal_number in signal.valid_signals() else f"signal {signal_number}"
    info = cpu.llama_cpp_system_info() or ""
    if signal_number == signal.SIGSEGV and not cpu.repack_is_safe(cpu.cpu_flags(), info):
        reason = (
            f"this llama.cpp has its AMX backend on a CPU with AMX, whose ggml_backend_amx_mul_mat segfaults on "
            f"quantized weights ({cpu.AMX_ISSUE}); build llama-cpp-python without AMX: bash scripts/install.sh"
        )
    else:
        reason = "a native crash in llama.cpp, no known cause"
    return (
        f"llama.cpp's reference run ({operation}) died with {name}: {reason}\n"
        f"llama.cpp: {info or 'not importable'}\nits stderr:\n{_last_lines(stderr)}"
    )


def _last_lines(text: str, count: int = 20) -> str:
    return "\n".join(text.strip().splitlines()[-count:])


def llama_generate_each(
    base: Path, adapter: Path | None, template: str, texts: Sequence[str], max_tokens: int, n_ctx: int = 512, kv: KV = "f32"
) -> list[list[int]]:
    """llama.cpp's greedy tokens per text, driven the way the official SDK drives it (KV cache in `kv`)."""
    answer = llama_reference(
        {
            "op": "generate",
            "base": str(base),
            "adapter": None if adapter is None else str(adapter),
            "template": template,
            "texts": list(texts),
            "max_tokens": max_tokens,
            "n_ctx": n_ctx,
            "kv": kv,
        }
    )
    return [[int(token) for token in tokens] for tokens in answer]


def llama_generate_json(
    base: Path, adapter: Path | None, template: str, texts: Sequence[str], schema: dict[str, Any], max_tokens: int, n_ctx: int = 512, kv: KV = "f32"
) -> list[list[int]]:
    """llama.cpp's greedy tokens per text under its own grammar of the JSON `schema` (its `response_format`)."""
    request = {"op": "generate_json", "base": str(base), "adapter": None if adapter is None else str(adapter), "template": template}
    answer = llama_reference({**request, "texts": list(texts), "schema": schema, "max_tokens": max_tokens, "n_ctx": n_ctx, "kv": kv})
    return [[int(token) for token in tokens] for tokens in answer]


def llama_generate_whole(
    base: Path, prompts: Sequence[str], max_tokens: int, n_ctx: int = 512, kv: KV = "f32", adapter: Path | None = None, vision_runtime: bool = False
) -> list[list[int]]:
    """llama.cpp's greedy tokens per whole rendered prompt on a fresh context: the official SDK's base mode (no
    adapter) and its vision runtime (a program's `adapter` applied); `vision_runtime`: with that runtime's
    settings (flash attention, batches of 128, 2 threads), which its arithmetic follows."""
    request = {
        "op": "generate_whole",
        "base": str(base),
        "prompts": list(prompts),
        "max_tokens": max_tokens,
        "n_ctx": n_ctx,
        "kv": kv,
        "vision_runtime": vision_runtime,
    }
    answer = llama_reference(request | {"adapter": None if adapter is None else str(adapter)})
    return [[int(token) for token in tokens] for tokens in answer]


def llama_generate(base: Path, adapter: Path | None, template: str, text: str, max_tokens: int, n_ctx: int = 512, kv: KV = "f32") -> list[int]:
    """llama.cpp's greedy tokens for one text (see `llama_generate_each`)."""
    return llama_generate_each(base, adapter, template, [text], max_tokens, n_ctx, kv)[0]


def llama_logits_each(base: Path, adapter: Path, template: str, texts: Sequence[str], n_ctx: int = 512, kv: KV = "f32") -> list[Array]:
    """llama.cpp's logits after each whole prompt, driven as the official SDK drives it."""
    answer = llama_reference(
        {"op": "logits", "base": str(base), "adapter": str(adapter), "template": template, "texts": list(texts), "n_ctx": n_ctx, "kv": kv}
    )
    return [np.array(row, dtype=np.float32) for row in answer]


def llama_vocabulary(base: Path, texts: Sequence[tuple[str, bool]], ids: Sequence[Sequence[int]]) -> tuple[list[list[int]], list[bytes]]:
    """llama.cpp's token ids for each (text, special-token text parsed) and its bytes for each id list (special
    tokens not rendered, as the official SDK)."""
    answer = llama_reference(
        {
            "op": "vocabulary",
            "base": str(base),
            "texts": [text for text, _ in texts],
            "special": [special for _, special in texts],
            "ids": [list(row) for row in ids],
        }
    )
    return [[int(t) for t in row] for row in answer["encoded"]], [bytes.fromhex(row) for row in answer["decoded"]]


def llama_pieces(base: Path) -> list[bytes]:
    """Every token's bytes as llama.cpp's `llama_token_to_piece` writes them (special tokens not rendered)."""
    return [bytes.fromhex(piece) for piece in llama_reference({"op": "pieces", "base": str(base)})]


OFFICIAL_BASE_TYPES = ["Q8_0", "Q6_K", "Q4_0"]
"""Base types the tests quantize to with llama.cpp's quantizer (the official bases: Qwen3 Q6_K, GPT-2 Q8_0)."""


def llama_quantize(source: Path, destination: Path, ftype: str) -> Path:
    """`source` as a GGUF quantized by llama.cpp's own quantizer (`ftype`: Q8_0, Q6_K, Q4_0, ...)."""
    llama_reference({"op": "quantize", "source": str(source), "destination": str(destination), "ftype": ftype})
    return destination
