"""Generated programs (adapter + bundle folder + .paw) on the tiny interpreters, and the llama.cpp marker."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from pathlib import Path

import gguf
import pytest

from pawfn import PawFn
from pawfn.torch.engine.program import TorchProgram

if TYPE_CHECKING:
    from pawfn.llamacpp.program import LlamaCppProgram

from .tiny_models import GPT2_TEMPLATE, QWEN_TEMPLATE, Array, Family, TinyInterpreter, random_lora, write_adapter_gguf, write_bundle, zip_bundle
from .tiny_qwen35 import TEMPLATE as QWEN35_TEMPLATE

__all__ = ["HAS_LLAMA_CPP", "INTERPRETER_IDS", "TEMPLATES", "TinyProgram", "llamacpp_program_of", "make_program", "requires_llama_cpp"]

HAS_LLAMA_CPP = importlib.util.find_spec("llama_cpp") is not None
requires_llama_cpp = pytest.mark.skipif(not HAS_LLAMA_CPP, reason="llama-cpp-python is not installed")
INTERPRETER_IDS: dict[Family, str] = {"qwen3": "Qwen/Qwen3-0.6B", "gpt2": "gpt2", "qwen35": "Qwen/Qwen3.5-0.8B"}
TEMPLATES: dict[Family, str] = {"qwen3": QWEN_TEMPLATE, "gpt2": GPT2_TEMPLATE, "qwen35": QWEN35_TEMPLATE}
ALPHA = 16.0


@dataclass(frozen=True)
class TinyProgram:
    """A generated program: its interpreter, LoRA pairs, adapter file and bundle (folder and zip)."""

    interpreter: TinyInterpreter
    pairs: dict[str, tuple[Array, Array]]
    alpha: float
    adapter: Path
    folder: Path
    archive: Path
    template: str


def make_program(
    interpreter: TinyInterpreter,
    root: Path,
    name: str,
    qtype: gguf.GGMLQuantizationType = gguf.GGMLQuantizationType.F32,
    seed: int = 1,
    template: str | None = None,
    lora_std: float = 0.3,
    program_id: str | None = None,
    meta_extra: dict[str, object] | None = None,
) -> TinyProgram:
    """Write an adapter and a bundle (folder + .paw) for `interpreter` under `root / name`."""
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    pairs = random_lora(interpreter, seed=seed, std=lora_std)
    adapter = folder / "adapter-source.gguf"
    write_adapter_gguf(adapter, interpreter.arch, pairs, alpha=ALPHA, qtype=qtype)
    template = template or TEMPLATES[interpreter.family]
    meta: dict[str, object] = ({} if program_id is None else {"program_id": program_id}) | (meta_extra or {})
    bundle = write_bundle(folder / "bundle", adapter, INTERPRETER_IDS[interpreter.family], template, meta)
    archive = zip_bundle(bundle, folder / "program.paw")
    return TinyProgram(interpreter, pairs, ALPHA, adapter, bundle, archive, template)


def llamacpp_program_of(function: PawFn[Any, Any]) -> LlamaCppProgram:
    """The llama.cpp runtime under a loaded program (a test failure if it runs on another backend)."""
    from pawfn.llamacpp.program import LlamaCppProgram

    runtime = function.runtime
    assert isinstance(runtime, LlamaCppProgram)
    return runtime


def torch_program(function: PawFn[Any, Any]) -> TorchProgram:
    """The Torch runtime under a loaded program (a test failure if it runs on another backend)."""
    runtime = function.runtime
    assert isinstance(runtime, TorchProgram)
    return runtime
