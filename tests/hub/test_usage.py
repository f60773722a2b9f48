"""`pawfn cache list` shows base models and pawfn's derived files with their sizes; `pawfn cache clear --derived`
deletes only the derived ones, which the next load rebuilds with the same tokens."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from pawfn import PawConfig, PawFn, Qwen3_0_6B, RuntimeOptions, Torch
from pawfn.cli import main
from pawfn.hub.cache import PawCache
from pawfn.hub.usage import cache_files
from tests.helpers.programs import TinyProgram

INPUT = "Urgent: the server is down!"


def _tokens(program: TinyProgram, cache: PawCache) -> tuple[int, ...]:
    """One int8 run of the installed copy of `program`: converts the base, stores the prefix."""
    config = PawConfig(weight_dtype="int8", cache_dir=cache.root)
    with PawFn.specialize(Qwen3_0_6B, Torch).load_sync(
        cache.program_dir("0123456789abcdef0123"), base=cache.base_models_dir / "base.gguf", config=config
    ) as loaded:
        return loaded.generate(INPUT, RuntimeOptions(max_tokens=6)).token_ids


def test_derived_files_are_listed_with_sizes_and_cleared_alone(qwen3_program: TinyProgram, capsys: pytest.CaptureFixture[str]) -> None:
    cache = PawCache(Path(os.environ["PAW_CACHE_DIR"]))
    shutil.copytree(qwen3_program.folder, cache.program_dir("0123456789abcdef0123"))
    cache.base_models_dir.mkdir(parents=True)
    base = cache.base_models_dir / "base.gguf"
    shutil.copyfile(qwen3_program.interpreter.gguf_path, base)
    expected = _tokens(qwen3_program, cache)

    kinds = {item.kind: item for item in cache_files(cache)}
    assert set(kinds) == {"base_model", "converted_base", "prefix"}
    assert kinds["converted_base"].detail == f"int8 of {base.resolve()}"
    assert kinds["base_model"].size_bytes == base.stat().st_size > 0
    assert kinds["converted_base"].size_bytes == kinds["converted_base"].path.stat().st_size > 0

    assert main(["cache", "list"]) == 0
    listed = capsys.readouterr().out
    assert "0123456789abcdef0123" in listed and "base.gguf" in listed
    assert f"converted base: int8 of {base.resolve()}" in listed and "1 stored prefixes" in listed
    assert "pawfn cache clear --derived" in listed
    assert main(["cache", "list", "--json"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [record["kind"] for record in records] == ["program", "base_model", "converted_base", "prefix"]
    assert records[2]["size_bytes"] == kinds["converted_base"].size_bytes

    assert main(["cache", "clear", "--derived"]) == 0
    freed = sum(item.size_bytes for item in kinds.values() if item.derived)
    assert capsys.readouterr().out.startswith("removed 2 derived files (")
    assert [item.kind for item in cache_files(cache)] == ["base_model"]
    assert [program.program_id for program in cache.list_programs()] == ["0123456789abcdef0123"]
    assert freed > 0 and not kinds["converted_base"].path.exists()
    assert _tokens(qwen3_program, cache) == expected  # rebuilt, same tokens
    assert {item.kind for item in cache_files(cache)} == {"base_model", "converted_base", "prefix"}


def test_a_foreign_safetensors_file_is_listed_without_a_detail(capsys: pytest.CaptureFixture[str]) -> None:
    cache = PawCache(Path(os.environ["PAW_CACHE_DIR"]))
    cache.base_derived_dir().mkdir(parents=True)
    (cache.base_derived_dir() / "odd.safetensors").write_bytes(b"\xff" * 64)
    (item,) = cache_files(cache)
    assert (item.kind, item.size_bytes, item.detail) == ("converted_base", 64, None)
    assert main(["cache", "list"]) == 0
    assert "converted base: odd.safetensors" in capsys.readouterr().out
