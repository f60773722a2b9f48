"""Session fixtures: tiny Qwen3 and GPT-2 interpreters, adapters and bundles generated on the fly."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import gguf
import pytest

from pawfn import BaseRegistry
from tiny_models import (
    GPT2_TEMPLATE,
    QWEN_TEMPLATE,
    Array,
    Family,
    TinyInterpreter,
    build_interpreter,
    random_lora,
    write_adapter_gguf,
    write_bundle,
    zip_bundle,
)

HAS_LLAMA_CPP = importlib.util.find_spec("llama_cpp") is not None
requires_llama_cpp = pytest.mark.skipif(not HAS_LLAMA_CPP, reason="llama-cpp-python is not installed")
INTERPRETER_IDS: dict[Family, str] = {"qwen3": "Qwen/Qwen3-0.6B", "gpt2": "gpt2"}
TEMPLATES: dict[Family, str] = {"qwen3": QWEN_TEMPLATE, "gpt2": GPT2_TEMPLATE}
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


@pytest.fixture(scope="session")
def tiny_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tiny")


@pytest.fixture(scope="session")
def qwen3(tiny_root: Path) -> TinyInterpreter:
    return build_interpreter("qwen3", tiny_root)


@pytest.fixture(scope="session")
def gpt2(tiny_root: Path) -> TinyInterpreter:
    return build_interpreter("gpt2", tiny_root)


def make_program(
    interpreter: TinyInterpreter,
    root: Path,
    name: str,
    qtype: gguf.GGMLQuantizationType = gguf.GGMLQuantizationType.F32,
    seed: int = 1,
    template: str | None = None,
) -> TinyProgram:
    """Write an adapter and a bundle (folder + .paw) for `interpreter` under `root / name`."""
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    pairs = random_lora(interpreter, seed=seed)
    adapter = folder / "adapter-source.gguf"
    write_adapter_gguf(adapter, interpreter.arch, pairs, alpha=ALPHA, qtype=qtype)
    template = template or TEMPLATES[interpreter.family]
    bundle = write_bundle(folder / "bundle", adapter, INTERPRETER_IDS[interpreter.family], template)
    archive = zip_bundle(bundle, folder / "program.paw")
    return TinyProgram(interpreter, pairs, ALPHA, adapter, bundle, archive, template)


@pytest.fixture(scope="session")
def qwen3_program(qwen3: TinyInterpreter, tiny_root: Path) -> TinyProgram:
    return make_program(qwen3, tiny_root, "qwen3-program")


@pytest.fixture(scope="session")
def gpt2_program(gpt2: TinyInterpreter, tiny_root: Path) -> TinyProgram:
    return make_program(gpt2, tiny_root, "gpt2-program")


@pytest.fixture(scope="session")
def qwen3_program_q4(qwen3: TinyInterpreter, tiny_root: Path) -> TinyProgram:
    return make_program(qwen3, tiny_root, "qwen3-program-q4", qtype=gguf.GGMLQuantizationType.Q4_0, seed=2)


@pytest.fixture(scope="session")
def gpt2_program_q4(gpt2: TinyInterpreter, tiny_root: Path) -> TinyProgram:
    return make_program(gpt2, tiny_root, "gpt2-program-q4", qtype=gguf.GGMLQuantizationType.Q4_0, seed=2)


@pytest.fixture(autouse=True)
def fresh_registry() -> Iterator[None]:
    """Each test starts with no base loaded, so load counts are the test's own."""
    BaseRegistry.clear()
    yield
    BaseRegistry.clear()
