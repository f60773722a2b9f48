"""The committed trained fixtures (`tests/fixtures/trained`, made by `scripts/make_trained_fixtures.py`): a small
Qwen3 and GPT-2 trained until peaked, each with a rank-32 program, in the files the official runtime reads."""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pawfn import GPT2, InterpreterModel, PawConfig, PawFn, Qwen3_0_6B, RuntimeOptions, Torch

from .references import llama_generate_each

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "trained"
BaseType = Literal["f32", "q8_0", "q6_k"]
Family = Literal["qwen3", "gpt2"]
OFFICIAL_BASE: dict[str, BaseType] = {"qwen3": "q6_k", "gpt2": "q8_0"}
"""The base type the official runtime runs each interpreter on (Qwen3: Q6_K, GPT-2: Q8_0)."""
MAX_TOKENS = 32
"""Greedy tokens per input in every fidelity comparison."""


@dataclass(frozen=True)
class TrainedProgram:
    """One family's files: bases by type, the program (Q4_0 adapter), its F32 adapter, and the fidelity inputs."""

    family: Family
    folder: Path
    inputs: tuple[str, ...]
    template: str

    @property
    def model(self) -> type[InterpreterModel]:
        return Qwen3_0_6B if self.family == "qwen3" else GPT2

    def base(self, kind: BaseType) -> Path:
        """The base GGUF in `kind` (llama.cpp's converter, then its quantizer)."""
        return self.folder / f"base-{kind}.gguf"

    @property
    def program(self) -> Path:
        """The bundle folder, its adapter in Q4_0 as PAW ships programs."""
        return self.folder / "program"

    @property
    def adapter_q4_0(self) -> Path:
        return self.program / "adapter.gguf"

    @property
    def adapter_f32(self) -> Path:
        return self.folder / "adapter-f32.gguf"

    def program_with_f32_adapter(self, root: Path) -> Path:
        """A copy of the bundle under `root` whose adapter is the F32 one (for comparisons on exact arithmetic)."""
        folder = root / f"{self.family}-program-f32"
        if not folder.exists():
            shutil.copytree(self.program, folder)
            shutil.copyfile(self.adapter_f32, folder / "adapter.gguf")
        return folder


def load_trained(family: Family, root: Path = FIXTURES) -> TrainedProgram:
    """A family's fixtures under `root`, every file checked against the manifest's sha256 (a damaged or
    LFS-pointer file fails)."""
    manifest = json.loads((root / "manifest.json").read_text())
    for name, digest in manifest["sha256"].items():
        if name.startswith(f"{family}/"):
            found = hashlib.sha256((root / name).read_bytes()).hexdigest()
            assert found == digest, f"{root / name} is not the file the manifest describes"
    facts = manifest["families"][family]
    return TrainedProgram(family=family, folder=root / family, inputs=tuple(facts["inputs"]), template=facts["template"])


def llama_tokens(fixture: TrainedProgram, base: BaseType, adapter: Path, kv: Literal["f32", "f16"] = "f16") -> list[list[int]]:
    """llama.cpp's greedy tokens on every fidelity input (the official runtime with `base`, `adapter` and an f16 KV)."""
    return llama_generate_each(fixture.base(base), adapter, fixture.template, fixture.inputs, MAX_TOKENS, n_ctx=2048, kv=kv)


def pawfn_tokens(fixture: TrainedProgram, program: Path, base: BaseType, config: PawConfig) -> list[list[int]]:
    """pawfn's greedy tokens (Torch) on every fidelity input: the bundle `program` on `base` under `config`."""
    with PawFn.specialize(fixture.model, Torch).load_sync(program, base=fixture.base(base), config=config) as function:
        return [list(function.generate(text, RuntimeOptions(max_tokens=MAX_TOKENS)).token_ids) for text in fixture.inputs]


def first_difference(expected: list[int], found: list[int]) -> int | None:
    """The first step where two token sequences differ (a missing token counts), or None when equal."""
    for step, (a, b) in enumerate(zip(expected, found, strict=False)):
        if a != b:
            return step
    return None if len(expected) == len(found) else min(len(expected), len(found))


def differences(inputs: tuple[str, ...], expected: list[list[int]], found: list[list[int]]) -> list[str]:
    """One line per input whose tokens differ: the input and the step of the first difference."""
    lines: list[str] = []
    for text, a, b in zip(inputs, expected, found, strict=True):
        step = first_difference(a, b)
        if step is not None:
            lines.append(f"{text[:40]!r}...: differs at step {step}")
    return lines
