"""llama.cpp's own sources from the source distribution of the llama-cpp-python installed (fetched with pip, which
reaches its registry): its converter with gguf-py, and the real vocabularies its tokenizer tests ship."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import tarfile
from pathlib import Path

__all__ = ["VOCABULARIES", "fetch_llamacpp_source", "vocabulary_cases"]

VOCABULARIES = ("qwen2", "qwen35", "gpt-2")
"""llama.cpp's test vocabularies of the pre-tokenizers the supported interpreters' files name (`models/ggml-vocab-*`)."""


def fetch_llamacpp_source(folder: Path) -> Path | str:
    """`vendor/llama.cpp` of the installed llama-cpp-python's sdist, unpacked under `folder` (the converter, gguf-py
    and the test vocabularies only); a string says why it could not be had."""
    try:
        version = importlib.metadata.version("llama-cpp-python")
    except importlib.metadata.PackageNotFoundError:
        return "llama-cpp-python is not installed (the llamacpp extra)"
    command = [sys.executable, "-m", "pip", "download", f"llama-cpp-python=={version}", "--no-binary", ":all:", "--no-deps", "-d", str(folder)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, check=False)
    if done.returncode != 0:
        return f"pip could not fetch llama-cpp-python {version}'s source: {done.stderr.strip()[-300:]}"
    archive = next(folder.glob("*.tar.gz"))
    vocabularies = tuple(f"/vendor/llama.cpp/models/ggml-vocab-{name}.gguf" for name in VOCABULARIES)
    with tarfile.open(archive) as tar:
        wanted = [
            member
            for member in tar.getmembers()
            if "/vendor/llama.cpp/" in member.name
            and (
                member.name.endswith("/convert_hf_to_gguf.py")
                or "/vendor/llama.cpp/conversion/" in member.name
                or "/gguf-py/" in member.name
                or member.name.endswith(vocabularies)
                or member.name.endswith(tuple(v + ".inp" for v in vocabularies) + tuple(v + ".out" for v in vocabularies))
            )
        ]
        tar.extractall(folder, members=wanted, filter="data")
    return next(folder.glob("*/vendor/llama.cpp"))


def vocabulary_cases(source: Path, name: str) -> list[tuple[str, list[int]]]:
    """llama.cpp's tokenizer test cases for `models/ggml-vocab-{name}.gguf`: each text and its token ids (no special
    tokens parsed, no BOS: test-tokenizer-0)."""
    models = source / "models"
    separator = "\n__ggml_vocab_test__\n"
    raw = (models / f"ggml-vocab-{name}.gguf.inp").read_bytes().decode("utf-8")
    texts = raw.removesuffix(separator).split(separator)
    ids = (models / f"ggml-vocab-{name}.gguf.out").read_bytes().decode("utf-8").split("\n")[: len(texts)]
    assert len(texts) == len(ids) > 0, f"{name}: {len(texts)} inputs, {len(ids)} outputs"
    return [(text, [int(token) for token in line.split()]) for text, line in zip(texts, ids, strict=True)]
