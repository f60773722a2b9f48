"""Converted base weights in the shared cache: written by the first load of a compact mode, read (not converted
again) by the next, and rebuilt when corrupt, truncated or stale; never used when they do not fit."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from pawfn import GPT2, PawConfig, PawFn, Qwen3_0_6B, RuntimeOptions, Torch
from pawfn.core.options import WeightDType
from pawfn.torch.weights import loading
from pawfn.torch.weights.loading import DeviceWeights
from pawfn.torch.engine.program import TorchProgram
from pawfn.torch.weights.reader import BaseWeights
from tests.helpers.programs import TinyProgram

INPUT = "Urgent: the server is down!"


def _stores() -> list[Path]:
    return sorted((Path(os.environ["PAW_CACHE_DIR"]) / ".pawfn-derived" / "bases").glob("*.safetensors"))


class _Conversions:
    """Counts the loads that converted the base instead of reading stored weights."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        convert = loading._convert  # pyright: ignore[reportPrivateUsage]  # a spy on the conversion step

        def counted(loaded: DeviceWeights, weights: BaseWeights, weight_dtype: WeightDType, progress: bool | None) -> dict[str, torch.Tensor]:
            self.count += 1
            return convert(loaded, weights, weight_dtype, progress)

        monkeypatch.setattr(loading, "_convert", counted)


def _tokens(program: TinyProgram, base: Path, weight_dtype: WeightDType, check: Callable[[TorchProgram], bool] | None = None) -> tuple[int, ...]:
    """The program's tokens for INPUT in `weight_dtype` on `base`, after `check` holds for its runtime."""
    model = GPT2 if program.interpreter.family == "gpt2" else Qwen3_0_6B
    config = PawConfig(weight_dtype=weight_dtype)
    with PawFn.specialize(model, Torch).load_sync(program.folder, base=base, config=config) as loaded:
        runtime = loaded.runtime
        assert check is None or (isinstance(runtime, TorchProgram) and check(runtime))
        return loaded.generate(INPUT, RuntimeOptions(max_tokens=12)).token_ids


def _converted_once(
    program: TinyProgram, base: Path, weight_dtype: WeightDType, conversions: _Conversions, check: Callable[[TorchProgram], bool] | None = None
) -> None:
    """A first load converts and stores; a second reads the store and gives the same tokens."""
    first = _tokens(program, base, weight_dtype, check)
    assert conversions.count == 1 and len(_stores()) == 1
    assert _tokens(program, base, weight_dtype, check) == first
    assert conversions.count == 1  # read, not converted


@pytest.mark.parametrize("weight_dtype", ["float16", "int8"])
def test_a_later_load_reads_the_converted_weights(weight_dtype: WeightDType, qwen3_program: TinyProgram, monkeypatch: pytest.MonkeyPatch) -> None:
    conversions, base = _Conversions(monkeypatch), qwen3_program.interpreter.gguf_path
    _converted_once(qwen3_program, base, weight_dtype, conversions)
    other: WeightDType = "int8" if weight_dtype == "float16" else "float16"
    _tokens(qwen3_program, base, other)
    assert conversions.count == 2 and len(_stores()) == 2  # one file per mode


def _flip_data_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) - 100] ^= 0xFF  # inside the last tensor's values; the header stays valid
    path.write_bytes(bytes(data))


def _truncate(path: Path) -> None:
    with path.open("r+b") as handle:
        handle.truncate(path.stat().st_size // 2)


def _garble_header(path: Path) -> None:
    path.write_bytes(b"\xff" * 64)


@pytest.mark.parametrize("damage", [_flip_data_byte, _truncate, _garble_header])
def test_a_damaged_store_is_detected_and_rebuilt(damage: object, qwen3_program: TinyProgram, monkeypatch: pytest.MonkeyPatch) -> None:
    conversions = _Conversions(monkeypatch)
    base = qwen3_program.interpreter.gguf_path
    expected = _tokens(qwen3_program, base, "int8")
    (store,) = _stores()
    good = store.read_bytes()
    assert callable(damage)
    damage(store)
    assert _tokens(qwen3_program, base, "int8") == expected
    assert conversions.count == 2  # converted again, not used
    assert store.read_bytes() == good  # and written again


def test_a_changed_base_gets_new_converted_weights(qwen3_program: TinyProgram, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    conversions = _Conversions(monkeypatch)
    base = tmp_path / "base.gguf"
    shutil.copyfile(qwen3_program.interpreter.gguf_path, base)
    _tokens(qwen3_program, base, "int8")
    stat = base.stat()
    os.utime(base, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # replaced in place: a new identity
    _tokens(qwen3_program, base, "int8")
    assert conversions.count == 2
    assert len(_stores()) == 1  # the earlier version's file is gone


def test_a_store_written_for_another_base_is_not_used(qwen3_program: TinyProgram, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    conversions = _Conversions(monkeypatch)
    base = qwen3_program.interpreter.gguf_path
    other = tmp_path / "other.gguf"
    shutil.copyfile(base, other)
    _tokens(qwen3_program, other, "int8")
    (foreign,) = _stores()
    foreign_bytes = foreign.read_bytes()
    expected = _tokens(qwen3_program, base, "int8")
    own = next(path for path in _stores() if path != foreign)
    own.write_bytes(foreign_bytes)  # the right name, another base's identity inside
    assert _tokens(qwen3_program, base, "int8") == expected
    assert conversions.count == 3


def test_an_unwritable_cache_only_costs_a_conversion(qwen3_program: TinyProgram, monkeypatch: pytest.MonkeyPatch) -> None:
    conversions = _Conversions(monkeypatch)
    base = qwen3_program.interpreter.gguf_path
    expected = _tokens(qwen3_program, base, "int8")
    (store,) = _stores()
    shutil.rmtree(store.parent)
    store.parent.write_bytes(b"")  # a file where the folder should be: nothing can be written there
    assert _tokens(qwen3_program, base, "int8") == expected
    assert conversions.count == 2 and store.parent.is_file()


@pytest.mark.parametrize("weight_dtype", ["float16", "int8"])
def test_a_hugging_face_folder_base_converts_and_stores_too(
    weight_dtype: WeightDType, gpt2_program: TinyProgram, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No GGUF to decode embedding rows from: the table is stored float16 with the rest, and read back."""

    def table_kept(runtime: TorchProgram) -> bool:
        return "token_embd.weight" in runtime.base.interpreter.weights.tensors

    _converted_once(gpt2_program, gpt2_program.interpreter.hf_dir, weight_dtype, _Conversions(monkeypatch), table_kept)
