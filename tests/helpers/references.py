"""Independent references for parity: transformers + peft, and llama.cpp (the official runtime)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Generator
from pathlib import Path

import torch
from tokenizers import Tokenizer

from .tiny_models import Array, TinyInterpreter

PLACEHOLDER = "{INPUT_PLACEHOLDER}"


def official_token_ids(tokenizer: Tokenizer, template: str, text: str) -> tuple[list[int], list[int]]:
    """Prefix ids and input+suffix ids as the official runtime forms them (special tokens parsed, no BOS)."""
    prefix, suffix = template.split(PLACEHOLDER)
    prefix_ids = tokenizer.encode(prefix, add_special_tokens=False).ids if prefix else []
    prompt_ids = tokenizer.encode(text + suffix, add_special_tokens=False).ids if text + suffix else []
    return list(prefix_ids), list(prompt_ids)


def peft_logits(
    interpreter: TinyInterpreter, pairs: dict[str, tuple[Array, Array]], alpha: float, template: str, text: str
) -> Array:
    """transformers + peft logits after the whole prompt (prefix + input + suffix)."""
    model = _peft_model(interpreter, pairs, alpha)
    tokenizer = interpreter.tokenizer()
    prefix_ids, prompt_ids = official_token_ids(tokenizer, template, text)
    with torch.no_grad():
        logits: torch.Tensor = model(input_ids=torch.tensor([prefix_ids + prompt_ids]), use_cache=False).logits[0, -1]
    return logits.float().numpy()


def _peft_model(
    interpreter: TinyInterpreter, pairs: dict[str, tuple[Array, Array]] | None, alpha: float
) -> torch.nn.Module:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model: torch.nn.Module = AutoModelForCausalLM.from_pretrained(  # pyright: ignore[reportUnknownMemberType]  # transformers' **kwargs
        str(interpreter.hf_dir), dtype=torch.float32
    )
    if pairs is not None:
        assert float(alpha).is_integer(), "peft takes an integer lora_alpha"
        rank = next(iter(pairs.values()))[0].shape[0]
        modules = sorted({interpreter.hf_module(t).rsplit(".", 1)[-1] for t in pairs})
        config = LoraConfig(
            r=rank,
            lora_alpha=int(alpha),
            target_modules=modules,
            lora_dropout=0.0,
            fan_in_fan_out=interpreter.family == "gpt2",
        )
        model = get_peft_model(model, config)
        with torch.no_grad():
            for target, (a, b) in pairs.items():
                path = f"base_model.model.{interpreter.hf_module(target)}"
                _weight(model.get_submodule(f"{path}.lora_A.default")).copy_(torch.as_tensor(a))
                _weight(model.get_submodule(f"{path}.lora_B.default")).copy_(torch.as_tensor(b))
    return model


def peft_generate(
    interpreter: TinyInterpreter,
    pairs: dict[str, tuple[Array, Array]] | None,
    alpha: float,
    template: str,
    text: str,
    max_tokens: int,
) -> list[int]:
    """Greedy tokens of transformers + peft LoRA (no KV cache: every step re-reads the whole sequence)."""
    model = _peft_model(interpreter, pairs, alpha)
    tokenizer = interpreter.tokenizer()
    eos = tokenizer.token_to_id(interpreter.eos_token)
    prefix_ids, prompt_ids = official_token_ids(tokenizer, template, text)
    ids = prefix_ids + prompt_ids
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


@contextlib.contextmanager
def _quiet_stderr() -> Generator[None, None, None]:
    saved = os.dup(2)
    with open(os.devnull, "wb") as devnull:
        os.dup2(devnull.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def llama_generate(
    base: Path, adapter: Path | None, template: str, text: str, max_tokens: int, n_ctx: int = 512
) -> list[int]:
    """Greedy tokens of llama.cpp, driven the way the official SDK drives it, with an f32 KV cache."""
    import llama_cpp

    with _quiet_stderr():
        llm = llama_cpp.Llama(
            model_path=str(base),
            lora_path=None if adapter is None else str(adapter),
            n_ctx=n_ctx,
            n_threads=1,
            type_k=0,  # GGML_TYPE_F32
            type_v=0,
            verbose=False,
        )
    try:
        prefix, suffix = template.split(PLACEHOLDER)
        prefix_ids = llm.tokenize(prefix.encode(), add_bos=False, special=True)
        llm.eval(prefix_ids)
        prompt_ids = llm.tokenize((text + suffix).encode(), add_bos=False, special=True)
        llm.eval(prompt_ids)
        out: list[int] = []
        for _ in range(max_tokens):
            token = llm.sample(temp=0.0)
            if token == llm.token_eos():
                break
            out.append(token)
            llm.eval([token])
        return out
    finally:
        llm.close()


def llama_logits(base: Path, adapter: Path, template: str, text: str, n_ctx: int = 512) -> Array:
    """llama.cpp's logits after the whole prompt, driven as the official SDK drives it (f32 KV cache)."""
    import llama_cpp
    import numpy as np

    with _quiet_stderr():
        llm = llama_cpp.Llama(
            model_path=str(base), lora_path=str(adapter), n_ctx=n_ctx, n_threads=1, type_k=0, type_v=0,
            logits_all=True, verbose=False,
        )
    try:
        prefix, suffix = template.split(PLACEHOLDER)
        llm.eval(llm.tokenize(prefix.encode(), add_bos=False, special=True))
        llm.eval(llm.tokenize((text + suffix).encode(), add_bos=False, special=True))
        return np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
    finally:
        llm.close()


def llama_tokenize(base: Path, text: str, special: bool) -> list[int]:
    """llama.cpp's token ids for `text` (vocabulary only)."""
    import llama_cpp

    with _quiet_stderr():
        llm = llama_cpp.Llama(model_path=str(base), vocab_only=True, verbose=False)
    try:
        return list(llm.tokenize(text.encode(), add_bos=False, special=special))
    finally:
        llm.close()


def llama_detokenize(base: Path, ids: list[int]) -> bytes:
    """llama.cpp's bytes for `ids` (special tokens not rendered, as the official SDK)."""
    import llama_cpp

    with _quiet_stderr():
        llm = llama_cpp.Llama(model_path=str(base), vocab_only=True, verbose=False)
    try:
        return bytes(llm.detokenize(ids))
    finally:
        llm.close()
