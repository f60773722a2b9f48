"""The tiny Qwen3.5 fixtures against llama.cpp's own converter (`convert_hf_to_gguf.py` from the installed
llama-cpp-python's source distribution, fetched with pip): the text GGUF and the projector the tests write hold the
converter's tensors bit for bit and its metadata, so the tests on them run on what the converter makes of the same
checkpoints. The converter is run with one change: a tokenizer trained in the test has no known pre-tokenizer hash,
so it gets the name the converter gives Qwen3.5's own tokenizer, "qwen35", whose split rule the test tokenizer
was trained with (letter runs take combining marks)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest

from pawfn import PawFn, Qwen3_5_0_8B, RuntimeOptions, Torch
from tests.helpers.programs import torch_program
from tests.helpers.tiny_models import TinyInterpreter
from tests.helpers.tiny_qwen35 import TinyVision

pytestmark = pytest.mark.llamacpp

_CONVERT = """
import runpy, sys
source = sys.argv[1]
sys.path[:0] = [source, source + "/gguf-py"]
import conversion.base as base
owner = next(c for c in vars(base).values() if isinstance(c, type) and "get_vocab_base_pre" in vars(c))
owner.get_vocab_base_pre = lambda self, tokenizer: "qwen35"
sys.argv = [source + "/convert_hf_to_gguf.py", *sys.argv[2:]]
runpy.run_path(source + "/convert_hf_to_gguf.py", run_name="__main__")
"""
_OWN_KEYS = {"GGUF.kv_count", "general.name", "general.basename", "general.finetune", "general.size_label"}
"""Metadata that names the file rather than the model."""


@pytest.fixture
def converter(llamacpp_source: Path) -> Path:
    """llama.cpp's converter and its gguf-py, from the source distribution of the llama-cpp-python installed."""
    return llamacpp_source


def _convert(converter: Path, checkpoint: Path, out: Path, *flags: str) -> Path:
    command = [sys.executable, "-c", _CONVERT, str(converter), str(checkpoint), "--outfile", str(out), "--outtype", "f32", *flags]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def _same_file(ours: Path, theirs: Path) -> set[str]:
    """Assert every tensor equal (type, shape, bytes) and every metadata key both files hold equal; returns the keys
    only the converter writes."""
    mine, converted = gguf.GGUFReader(ours), gguf.GGUFReader(theirs)
    tensors = {t.name: t for t in mine.tensors}
    assert set(tensors) == {t.name for t in converted.tensors}
    for tensor in converted.tensors:
        own = tensors[tensor.name]
        assert (own.tensor_type, list(own.shape)) == (tensor.tensor_type, list(tensor.shape)), tensor.name
        assert np.array_equal(np.asarray(own.data).view(np.uint8), np.asarray(tensor.data).view(np.uint8)), tensor.name
    for key in set(mine.fields) & set(converted.fields) - _OWN_KEYS:
        own_field, field = mine.fields[key], converted.fields[key]
        assert [np.asarray(own_field.parts[i]).tolist() for i in own_field.data] == [np.asarray(field.parts[i]).tolist() for i in field.data], key
    return set(converted.fields) - set(mine.fields) - _OWN_KEYS


def test_the_tiny_qwen35_gguf_is_the_converters(converter: Path, qwen35: TinyInterpreter, tmp_path: Path) -> None:
    """Bit for bit (norms as 1 + w, -exp(A_log), the value heads reordered, the kernel squeezed); the converter also
    lists the recurrent layers, which pawfn reads the same as the attention interval ours gives."""
    converted = _convert(converter, qwen35.hf_dir, tmp_path / "converted.gguf", "--no-mtp")
    assert _same_file(qwen35.gguf_path, converted) <= {"general.quantization_version", "general.type", "qwen35.attention.recurrent_layers"}
    options = RuntimeOptions(max_tokens=8)
    with PawFn[Qwen3_5_0_8B, Torch].bare(base=converted) as theirs, PawFn[Qwen3_5_0_8B, Torch].bare(base=qwen35.gguf_path) as ours:
        assert torch_program(theirs).base.interpreter.architecture == torch_program(ours).base.interpreter.architecture
        assert theirs.generate("hello", options).token_ids == ours.generate("hello", options).token_ids


def test_the_tiny_projector_is_the_converters(converter: Path, qwen35_vision: TinyVision, tmp_path: Path) -> None:
    converted = _convert(converter, qwen35_vision.text.hf_dir, tmp_path / "mmproj.gguf", "--mmproj")
    assert _same_file(qwen35_vision.projector, converted) <= {"general.quantization_version"}
