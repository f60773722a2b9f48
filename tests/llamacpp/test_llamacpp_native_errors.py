"""No file and no NULL from llama.cpp crashes the LlamaCpp backend: a hostile adapter is refused with the Torch
backend's own error before llama.cpp sees it, and a NULL handle (llama.cpp refusing a file, or a call that returns
none) is a typed error. Each llama.cpp run is a process of its own, so a crash fails its test, not the session."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pawfn import AdapterError, PawFn, Torch
from tests.helpers.programs import INTERPRETER_IDS, TinyProgram, requires_llama_cpp
from tests.helpers.tiny_models import Array, write_adapter_gguf, write_bundle

pytestmark = [requires_llama_cpp, pytest.mark.llamacpp]

_PROBE = """
import ctypes, json, sys
import llama_cpp
from pawfn import LlamaCpp, PawFn, RuntimeOptions
from pawfn.llamacpp import program

request = json.loads(sys.argv[1])
if request["patch"] == "no-checks":  # llama.cpp alone judges the adapter (its refusal is a NULL adapter)
    program._check_adapter = lambda *arguments: None
elif request["patch"] == "null-adapter":
    llama_cpp.llama_adapter_lora_init = lambda *arguments: llama_cpp.llama_adapter_lora_p_ctypes()
elif request["patch"] == "null-logits":
    llama_cpp.llama_get_logits_ith = lambda *arguments: ctypes.POINTER(ctypes.c_float)()
elif request["patch"] == "null-context":
    llama_cpp.llama_init_from_model = lambda *arguments: llama_cpp.llama_context_p_ctypes()
try:
    with PawFn.load_any_sync(request["bundle"], LlamaCpp, base=request["base"]) as function:
        function.generate("hello", RuntimeOptions(max_tokens=3))
    print(json.dumps({"error": None}))
except Exception as exc:
    print(json.dumps({"error": type(exc).__name__, "message": str(exc)}))
"""


def _probe(bundle: Path, base: Path, patch: str = "") -> dict[str, str | None]:
    """Load `bundle` on the LlamaCpp backend in a process of its own (with `patch` applied) and run one call: the
    error it raised, if any; a crash fails the test with the child's exit status."""
    request = json.dumps({"bundle": str(bundle), "base": str(base), "patch": patch})
    done = subprocess.run([sys.executable, "-c", _PROBE, request], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, f"the LlamaCpp backend crashed (exit {done.returncode}):\n{done.stderr[-2000:]}"
    answer: dict[str, str | None] = json.loads(done.stdout.strip().splitlines()[-1])
    return answer


def _hostile(program: TinyProgram, folder: Path, kind: str) -> Path:
    """A bundle whose adapter is damaged in one way (`kind`) that its GGUF header does not show."""
    pairs: dict[str, tuple[Array, Array]] = dict(program.pairs)
    target = sorted(pairs)[0]
    a, b = pairs[target]
    extra: dict[str, Array] = {}
    if kind == "narrow-input":
        pairs[target] = (a[:, :-1], b)
    elif kind == "wide-output":
        pairs[target] = (a, np.vstack([b, b[:1]]))
    elif kind == "rank-mismatch":
        pairs[target] = (a[:-1], b)
    elif kind == "layer-past-the-base":
        pairs[target.replace("blk.0.", "blk.99.")] = (a, b)
    elif kind == "missing-half":
        del pairs[target]
        extra[f"{target}.lora_a"] = a
    adapter = folder / "adapter.gguf"
    write_adapter_gguf(adapter, program.interpreter.arch, pairs, extra_tensors=extra)
    return write_bundle(folder / "bundle", adapter, INTERPRETER_IDS[program.interpreter.family], program.template)


@pytest.mark.parametrize("kind", ["narrow-input", "wide-output", "rank-mismatch", "layer-past-the-base", "missing-half"])
@pytest.mark.parametrize("family", ["qwen3", "gpt2"])
def test_a_hostile_adapter_is_refused_alike_on_both_backends(family: str, kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    program: TinyProgram = request.getfixturevalue(f"{family}_program")
    bundle, base = _hostile(program, tmp_path, kind), program.interpreter.gguf_path
    with pytest.raises(AdapterError) as on_torch:
        PawFn.load_any_sync(str(bundle), Torch, base=base)
    assert _probe(bundle, base) == {"error": "AdapterError", "message": str(on_torch.value)}


def test_llama_cpps_own_refusal_a_null_adapter_is_an_adapter_error(qwen3_program: TinyProgram, tmp_path: Path) -> None:
    """With pawfn's checks out of the way, llama.cpp's loader refuses a wrong-size tensor by returning NULL (a NULL
    pointer object, never None): an `AdapterError`, where the backend used to go on and crash in the next decode."""
    bundle = _hostile(qwen3_program, tmp_path, "narrow-input")
    answer = _probe(bundle, qwen3_program.interpreter.gguf_path, "no-checks")
    assert answer["error"] == "AdapterError" and "llama.cpp could not load this LoRA adapter" in str(answer["message"])


@pytest.mark.parametrize(
    ("patch", "error", "words"),
    [
        ("null-adapter", "AdapterError", "llama.cpp could not load this LoRA adapter"),
        ("null-context", "BaseModelError", "could not make a context"),
        ("null-logits", "PawError", "no logits"),
    ],
)
def test_a_null_from_llama_cpp_is_a_typed_error(patch: str, error: str, words: str, qwen3_program: TinyProgram) -> None:
    answer = _probe(qwen3_program.folder, qwen3_program.interpreter.gguf_path, patch)
    assert answer["error"] == error and words in str(answer["message"])


def test_a_good_program_runs_in_the_probe(qwen3_program: TinyProgram) -> None:
    """The probe itself: an untouched program loads and runs (so the refusals above are the patches' doing)."""
    assert _probe(qwen3_program.folder, qwen3_program.interpreter.gguf_path) == {"error": None}
