"""A local bundle's evaluated prefix is kept in the shared cache, keyed by the bundle's content, never beside it."""

from __future__ import annotations

from pathlib import Path

import pytest

from pawfn import PawConfig, PawFn, Qwen3_0_6B, RuntimeOptions, Torch
from pawfn.hub.cache import PawCache
from tests.helpers.programs import TinyProgram

OPTIONS = RuntimeOptions(max_tokens=12)


@pytest.mark.parametrize("kind", ["archive", "folder"])
def test_a_local_bundle_evaluates_its_prefix_once(
    qwen3_program: TinyProgram, qwen3_program_q4: TinyProgram, tmp_path: Path, prefills: list[int], kind: str
) -> None:
    config = PawConfig(cache_dir=tmp_path / "cache")
    base = qwen3_program.interpreter.gguf_path
    bundle = qwen3_program.archive if kind == "archive" else qwen3_program.folder
    outputs: list[tuple[int, ...]] = []
    for _ in range(2):  # an archive is extracted to a new temporary folder each time: still one evaluation
        with PawFn[Qwen3_0_6B, Torch].load_sync(bundle, base=base, config=config) as program:
            outputs.append(program.generate("hello", OPTIONS).token_ids)
    assert len(prefills) == 1 and outputs[0] == outputs[1]
    stored = list((tmp_path / "cache" / ".pawfn-derived").glob("*/.pawfn-prefix-*.pt"))
    assert len(stored) == 1
    assert stored[0].parent == PawCache(tmp_path / "cache").derived_dir(bundle)
    other = qwen3_program_q4.archive if kind == "archive" else qwen3_program_q4.folder
    PawFn[Qwen3_0_6B, Torch].load_sync(other, base=base, config=config).close()
    assert len(prefills) == 2  # another adapter: another key, evaluated again
    assert len(list((tmp_path / "cache" / ".pawfn-derived").glob("*/.pawfn-prefix-*.pt"))) == 2


def test_an_unwritable_cache_only_costs_the_evaluation(qwen3_program: TinyProgram, tmp_path: Path, prefills: list[int]) -> None:
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the cache should be", encoding="utf-8")
    config = PawConfig(cache_dir=blocked)
    for _ in range(2):
        PawFn[Qwen3_0_6B, Torch].load_sync(qwen3_program.folder, base=qwen3_program.interpreter.gguf_path, config=config).close()
    assert len(prefills) == 2


def test_cache_clear_removes_derived_files(qwen3_program: TinyProgram, tmp_path: Path) -> None:
    config = PawConfig(cache_dir=tmp_path / "cache")
    PawFn[Qwen3_0_6B, Torch].load_sync(qwen3_program.archive, base=qwen3_program.interpreter.gguf_path, config=config).close()
    assert (tmp_path / "cache" / ".pawfn-derived").is_dir()
    PawCache(tmp_path / "cache").clear()
    assert not (tmp_path / "cache" / ".pawfn-derived").exists()


def test_other_code_misses_the_stored_prefix(
    qwen3_program: TinyProgram, tmp_path: Path, prefills: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A prefix stored by other arithmetic (another pawfn version, a changed kernel) is evaluated again, not reused."""
    from pawfn.torch.engine import prefix_store

    config = PawConfig(cache_dir=tmp_path / "cache")
    base = qwen3_program.interpreter.gguf_path
    PawFn[Qwen3_0_6B, Torch].load_sync(qwen3_program.folder, base=base, config=config).close()
    monkeypatch.setattr(prefix_store, "_code_digest", lambda: "other code")
    PawFn[Qwen3_0_6B, Torch].load_sync(qwen3_program.folder, base=base, config=config).close()
    assert len(prefills) == 2
