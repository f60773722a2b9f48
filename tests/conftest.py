"""Session fixtures: tiny Qwen3 and GPT-2 interpreters, adapters and bundles generated on the fly."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import gguf
import pytest

from pawfn import ModelRegistry
from tests.helpers.programs import TinyProgram, make_program
from tests.helpers.tiny_models import TinyInterpreter, build_interpreter


@pytest.fixture(scope="session")
def tiny_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tiny")


@pytest.fixture(scope="session")
def qwen3(tiny_root: Path) -> TinyInterpreter:
    return build_interpreter("qwen3", tiny_root)


@pytest.fixture(scope="session")
def gpt2(tiny_root: Path) -> TinyInterpreter:
    return build_interpreter("gpt2", tiny_root)


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
    ModelRegistry.clear()
    yield
    ModelRegistry.clear()


@pytest.fixture(autouse=True)
def private_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cache of each test's own (PAW_CACHE_DIR), so no test writes to the user's and none sees another's files."""
    monkeypatch.setenv("PAW_CACHE_DIR", str(tmp_path_factory.mktemp("paw-cache")))


@pytest.fixture(scope="session")
def trained_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("trained")


@pytest.fixture(scope="session")
def trained_qwen3_program(trained_root: Path) -> TinyProgram:
    """A tiny Qwen3 trained on the corpus (peaked predictions) with a small LoRA: for measuring fidelity."""
    return make_program(build_interpreter("qwen3", trained_root, train_steps=300), trained_root, "qwen3-program", lora_std=0.05)


@pytest.fixture(scope="session")
def trained_gpt2_program(trained_root: Path) -> TinyProgram:
    """A tiny GPT-2 trained on the corpus (peaked predictions) with a small LoRA: for measuring fidelity."""
    return make_program(build_interpreter("gpt2", trained_root, train_steps=300), trained_root, "gpt2-program", lora_std=0.05)
