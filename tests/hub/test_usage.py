"""`pawfn cache list` shows base models and pawfn's derived files with their sizes; `pawfn cache clear --derived`
deletes only the derived ones, which the next load rebuilds with the same tokens."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from pawfn import PawConfig, PawFn, Qwen3_0_6B, RuntimeOptions, Torch
from pawfn.cli import main
from pawfn.hub.cache import PawCache
from pawfn.hub.usage import cache_files, prune_derived
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


def _derived_file(path: Path, size: int, used_at: float) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\0" * size)
    os.utime(path, (used_at, used_at))
    return path


def test_prune_removes_the_least_recently_used_derived_files_first(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Derived files (prefixes, converted bases, kernels) go oldest use first until they fit; programs and base
    models stay whatever the bound; `pawfn cache prune` says what it freed."""
    cache = PawCache(tmp_path / "cache")
    derived = cache.root / ".pawfn-derived"
    oldest = _derived_file(derived / "a" / ".pawfn-prefix-1.pt", 400, 1000)
    converted = _derived_file(cache.base_derived_dir() / "b.safetensors", 300, 2000)
    kernel = _derived_file(derived / "kernels" / "ggml-x.so", 200, 3000)
    newest = _derived_file(derived / "c" / ".pawfn-prefix-2.pt", 100, 4000)
    base = _derived_file(cache.base_models_dir / "base.gguf", 5000, 500)
    removed = prune_derived(cache, 350)
    assert [item.path for item in removed] == [oldest, converted]  # 1000 bytes -> 300
    assert kernel.exists() and newest.exists() and base.exists()
    assert prune_derived(cache, 350) == []
    assert main(["cache", "prune", "--max-bytes", "0", "--cache-dir", str(cache.root)]) == 0
    assert capsys.readouterr().out.startswith("removed 2 derived files (")
    assert not kernel.exists() and not newest.exists() and base.exists()


def test_loads_keep_the_derived_files_under_their_bound(qwen3_program: TinyProgram, tmp_path: Path) -> None:
    """Programs loaded one after another with a bound of about two stored prefixes: after each load the derived
    files fit it and the program just loaded keeps its prefix (marked used); an evicted program's next load
    evaluates its prefix again and gives the same tokens."""
    bundles: list[Path] = []
    for index in range(4):  # different prefixes: a stored prefix each
        bundle = Path(shutil.copytree(qwen3_program.folder, tmp_path / f"bundle-{index}"))
        template = bundle / "prompt_template.txt"
        template.write_text(f"Program {index}: " + template.read_text())
        bundles.append(bundle)
    cache = PawCache(tmp_path / "cache")
    base = qwen3_program.interpreter.gguf_path

    def run(bundle: Path, bound: int) -> tuple[int, ...]:
        config = PawConfig(cache_dir=cache.root, derived_cache_max_bytes=bound)
        with PawFn[Qwen3_0_6B, Torch].load_sync(bundle, base=base, config=config) as loaded:
            return loaded.generate(INPUT, RuntimeOptions(max_tokens=6)).token_ids

    def prefixes() -> set[Path]:
        return {item.path for item in cache_files(cache) if item.kind == "prefix"}

    first = run(bundles[0], 1 << 40)
    (stored,) = [item for item in cache_files(cache) if item.kind == "prefix"]
    prefix_of, bound = [stored.path], stored.size_bytes * 5 // 2
    for bundle in bundles[1:]:
        before = prefixes()
        run(bundle, bound)
        (new,) = prefixes() - before
        prefix_of.append(new)
        held = [item for item in cache_files(cache) if item.derived]
        assert sum(item.size_bytes for item in held) <= bound and len(held) == 2 and new.exists()
    assert prefixes() == {prefix_of[2], prefix_of[3]}  # the least recently used went first
    time.sleep(0.01)
    run(bundles[2], bound)  # its stored prefix read: marked used, so bundle 3's is now the least recently used
    time.sleep(0.01)
    assert run(bundles[0], bound) == first  # evaluated again: the same tokens
    assert prefixes() == {prefix_of[0], prefix_of[2]}
