"""Property-based fuzzing (hypothesis, fixed seed and budget): any bytes given as a `.paw` archive, a LoRA adapter,
base weights or meta.json either load or raise a `PawError`, within bounded time and memory; any `str` tokenizes.

Inputs are random byte strings and mutations (truncation, overwritten spans, inserted bytes) of valid files the
tiny interpreters generate, so the readers get past their first checks."""

from __future__ import annotations

import os
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pawfn import GPT2, PawError, Qwen3_0_6B
from pawfn.formats.adapter import read_lora_adapter
from pawfn.formats.bundle import open_bundle
from pawfn.formats.ggufio import GGUFFile
from pawfn.formats.tokenizer import TextCodec
from pawfn.torch.weights.reader import read_base_weights
from tests.helpers.programs import TinyProgram

SECONDS, PEAK_MB = 10.0, 256.0
"""Per example: the damage these readers were fixed for grew past 2 GB in seconds."""
FUZZ = settings(
    max_examples=int(os.environ.get("PAWFN_FUZZ_EXAMPLES", "60")),
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@st.composite
def _mutated(draw: st.DrawFn, original: bytes) -> bytes:
    """`original` truncated, with a span overwritten, or with bytes inserted (at a drawn place)."""
    at = draw(st.integers(0, len(original)))
    kind = draw(st.sampled_from(["truncate", "overwrite", "insert"]))
    if kind == "truncate":
        return original[:at]
    noise = draw(st.binary(min_size=1, max_size=64))
    if kind == "overwrite":
        return original[:at] + noise + original[at + len(noise) :]
    return original[:at] + noise + original[at:]


def _files(original: bytes) -> st.SearchStrategy[bytes]:
    return st.one_of(st.binary(max_size=4096), _mutated(original))


def _bounded(read: Callable[[Path], object], data: bytes, suffix: str) -> None:
    """`read` a file holding `data`: it returns or raises a PawError, within SECONDS and PEAK_MB of new memory."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"fuzzed{suffix}"
        path.write_bytes(data)
        tracemalloc.start()
        started = time.perf_counter()
        try:
            read(path)
        except PawError:
            pass
        finally:
            peak = tracemalloc.get_traced_memory()[1] / 2**20
            tracemalloc.stop()
        elapsed = time.perf_counter() - started
    assert elapsed < SECONDS, f"took {elapsed:.1f} s"
    assert peak < PEAK_MB, f"allocated {peak:.0f} MB at its peak"


def _fuzz_files(files: st.SearchStrategy[bytes], read: Callable[[Path], object], suffix: str) -> None:
    """The FUZZ budget of `files`, each written to a `suffix` file and given to `read` (see `_bounded`)."""

    @FUZZ
    @given(files)
    def check(data: bytes) -> None:
        _bounded(read, data, suffix)

    check()


def _read_archive(path: Path) -> None:
    with open_bundle(path) as bundle:
        repr(bundle.template).encode()


def test_fuzz_archives(qwen3_program: TinyProgram) -> None:
    _fuzz_files(_files(qwen3_program.archive.read_bytes()), _read_archive, ".paw")


def test_fuzz_meta_json(qwen3_program: TinyProgram) -> None:
    """meta.json text inside an otherwise valid bundle folder."""
    original = (qwen3_program.folder / "meta.json").read_bytes()

    def read(path: Path) -> None:
        with tempfile.TemporaryDirectory() as folder:
            bundle = Path(folder)
            for member in qwen3_program.folder.iterdir():
                (bundle / member.name).write_bytes(member.read_bytes())
            (bundle / "meta.json").write_bytes(path.read_bytes())
            with open_bundle(bundle):
                pass

    _fuzz_files(st.one_of(_files(original), st.text(max_size=512).map(str.encode)), read, ".json")


@pytest.mark.parametrize("family", ["qwen3", "gpt2"])
def test_fuzz_adapters(family: str, request: pytest.FixtureRequest) -> None:
    program: TinyProgram = request.getfixturevalue(f"{family}_program")
    model = Qwen3_0_6B if family == "qwen3" else GPT2

    _fuzz_files(_files(program.adapter.read_bytes()), lambda path: read_lora_adapter(path, model), ".gguf")


@pytest.mark.parametrize("family", ["qwen3", "gpt2"])
def test_fuzz_base_weights(family: str, request: pytest.FixtureRequest) -> None:
    """The GGUF base reader, its tokenizer and every tensor it yields."""
    program: TinyProgram = request.getfixturevalue(f"{family}_program")
    model = Qwen3_0_6B if family == "qwen3" else GPT2

    def read(path: Path) -> None:
        weights = read_base_weights(path, model)
        for _ in weights.tensors():
            pass

    _fuzz_files(_files(program.interpreter.gguf_path.read_bytes()), read, ".gguf")


@pytest.mark.parametrize("family", ["qwen3", "gpt2"])
def test_fuzz_tokenizer_input(family: str, request: pytest.FixtureRequest) -> None:
    """Any str, surrogates and control-token text included, encodes to ids of the vocabulary."""
    program: TinyProgram = request.getfixturevalue(f"{family}_program")
    codec = TextCodec.from_gguf(GGUFFile(program.interpreter.gguf_path))
    any_character = st.characters(codec="utf-8", exclude_categories=()) | st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
    specials = st.sampled_from(["<|im_end|>", "<|endoftext|>", "<|im_start|>"])

    @FUZZ
    @given(st.lists(st.one_of(st.text(any_character, max_size=40), specials), max_size=8).map("".join), st.booleans())
    def check(text: str, parse_special: bool) -> None:
        ids = codec.encode(text, parse_special=parse_special)
        assert all(0 <= token < codec.vocab_size for token in ids)

    check()
