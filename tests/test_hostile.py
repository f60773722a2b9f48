"""Damaged and hostile files and options: a typed error naming the file and the problem, one line from the CLI,
in bounded time and memory; non-finite numbers never become a silent empty output; cancelled calls stop."""

from __future__ import annotations

import asyncio
import json
import math
import os
import shutil
import struct
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np
import pytest
from safetensors import safe_open

import pawfn
from pawfn import AdapterError, BaseModelError, InterpreterModel, LlamaCpp, NonFiniteError, PawConfig, PawFn, RuntimeOptions, Torch
from pawfn.core.backends import Backend
from tests.helpers.bounded import PEAK_RSS_MB, SECONDS, run_cli
from tests.helpers.locks import lock_held_elsewhere
from tests.helpers.programs import HAS_LLAMA_CPP, INTERPRETER_IDS, TinyProgram, requires_llama_cpp
from tests.helpers.tiny_models import Array, TinyInterpreter, random_lora, write_adapter_gguf, write_base_gguf, write_bundle, zip_bundle


def _base(interpreter: TinyInterpreter, path: Path, edit: Callable[[dict[str, Array]], None] | None = None, **config: object) -> Path:
    """The tiny interpreter's GGUF rewritten with its tensors passed through `edit` and `config` overriding its
    hyperparameters (HF names)."""
    with safe_open(str(interpreter.hf_dir / "model.safetensors"), framework="pt") as handle:
        state = {name: handle.get_tensor(name).float().numpy() for name in handle.keys()}
    if edit is not None:
        edit(state)
    write_base_gguf(interpreter.family, interpreter.config() | config, interpreter.tokenizer(), state, path, interpreter.eos_token)
    return path


def _program(program: TinyProgram, folder: Path, pairs: dict[str, tuple[Array, Array]] | None = None, alpha: float = 16.0) -> Path:
    """A bundle folder for `program`'s interpreter with `pairs` (default: the program's) and `alpha`."""
    folder.mkdir(parents=True, exist_ok=True)
    adapter = folder / "adapter-source.gguf"
    write_adapter_gguf(adapter, program.interpreter.arch, pairs or program.pairs, alpha=alpha)
    return write_bundle(folder / "bundle", adapter, INTERPRETER_IDS[program.interpreter.family], program.template)


def _load(bundle: Path, base: Path, backend: type[Backend] = Torch, **config: object) -> PawFn[InterpreterModel, Backend]:
    return PawFn.load_any_sync(str(bundle), backend, base=base, config=PawConfig.model_validate(config))


def _cli_run(bundle: Path, base: Path, *extra: str) -> list[str]:
    return ["run", "--program", str(bundle), "--base", str(base), "--input", "hello", "--max-tokens", "4", *extra]


def _with_value(pairs: dict[str, tuple[Array, Array]], value: float) -> tuple[dict[str, tuple[Array, Array]], str]:
    """`pairs` with one entry of one lora_b set to `value`; the tensor's name."""
    target = sorted(pairs)[0]
    a, b = pairs[target]
    b = b.copy()
    b[0, 0] = value
    return {**pairs, target: (a, b)}, f"{target}.lora_b"


@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_a_non_finite_adapter_value_is_refused_by_name(qwen3_program: TinyProgram, tmp_path: Path, value: float) -> None:
    pairs, name = _with_value(qwen3_program.pairs, value)
    bundle, base = _program(qwen3_program, tmp_path, pairs), qwen3_program.interpreter.gguf_path
    with pytest.raises(AdapterError, match="non-finite") as caught:
        _load(bundle, base)
    assert name in str(caught.value)
    run = run_cli(*_cli_run(bundle, base))
    run.assert_one_line_error(1, name, "non-finite")


def test_a_non_finite_alpha_is_refused(gpt2_program: TinyProgram, tmp_path: Path) -> None:
    bundle, base = _program(gpt2_program, tmp_path, alpha=math.inf), gpt2_program.interpreter.gguf_path
    with pytest.raises(AdapterError, match="adapter.lora.alpha is inf"):
        _load(bundle, base)
    run_cli(*_cli_run(bundle, base)).assert_one_line_error(1, "adapter.lora.alpha")


def test_a_rank_zero_adapter_is_refused(qwen3_program: TinyProgram, tmp_path: Path) -> None:
    """It divided alpha by the rank (ZeroDivisionError)."""
    empty = {target: (a[:0], b[:, :0]) for target, (a, b) in random_lora(qwen3_program.interpreter).items()}
    bundle, base = _program(qwen3_program, tmp_path, empty), qwen3_program.interpreter.gguf_path
    with pytest.raises(AdapterError, match="rank 0"):
        _load(bundle, base)
    run = run_cli(*_cli_run(bundle, base))
    run.assert_one_line_error(1, "rank 0")


@pytest.mark.parametrize("weight_dtype", [None, "int8"])
def test_a_non_finite_base_tensor_is_refused_by_name(gpt2_program: TinyProgram, tmp_path: Path, weight_dtype: str | None) -> None:
    def poison(state: dict[str, Array]) -> None:
        state["transformer.h.1.mlp.c_fc.weight"][3, 5] = np.nan

    base = _base(gpt2_program.interpreter, tmp_path / "nan.gguf", poison)
    with pytest.raises(BaseModelError, match=r"tensor blk\.1\.ffn_up\.weight holds non-finite values"):
        _load(gpt2_program.folder, base, weight_dtype=weight_dtype)
    run = run_cli(*_cli_run(gpt2_program.folder, base))
    run.assert_one_line_error(1, "blk.1.ffn_up.weight", "non-finite")


@pytest.mark.parametrize("eps", [-1e-6, 0.0, math.nan])
def test_a_norm_epsilon_that_is_not_positive_is_refused(qwen3_program: TinyProgram, tmp_path: Path, eps: float) -> None:
    base = _base(qwen3_program.interpreter, tmp_path / "eps.gguf", rms_norm_eps=eps)
    with pytest.raises(BaseModelError, match="normalization epsilon"):
        _load(qwen3_program.folder, base)
    run_cli(*_cli_run(qwen3_program.folder, base)).assert_one_line_error(1, "normalization epsilon")


def test_a_base_claiming_a_billion_layers_fails_fast(qwen3_program: TinyProgram, tmp_path: Path) -> None:
    """Per-layer expectations were built before any tensor was looked at (2 GB in 17 s)."""
    base = _base(qwen3_program.interpreter, tmp_path / "layers.gguf", num_hidden_layers=10**9)
    with pytest.raises(BaseModelError, match="claims 1000000000 layers"):
        _load(qwen3_program.folder, base)
    run = run_cli(*_cli_run(qwen3_program.folder, base))
    run.assert_one_line_error(1, "layers")


def test_overflowing_logits_stop_the_run_with_a_typed_error(qwen3_program: TinyProgram, tmp_path: Path) -> None:
    """Finite weights whose products overflow: the run raises, it does not answer "" (argmax of NaN)."""

    def overflow(state: dict[str, Array]) -> None:
        state["model.norm.weight"][:] = 3e38

    base = _base(qwen3_program.interpreter, tmp_path / "overflow.gguf", overflow)
    with _load(qwen3_program.folder, base) as function, pytest.raises(NonFiniteError, match="non-finite"):
        function.run("hello")
    if HAS_LLAMA_CPP:  # llama.cpp computes the same overflow, and its sampler would pick from NaN all the same
        with _load(qwen3_program.folder, base, LlamaCpp) as function, pytest.raises(NonFiniteError, match="non-finite"):
            function.run("hello")
    run = run_cli(*_cli_run(qwen3_program.folder, base))
    run.assert_one_line_error(1, "logits became non-finite")


def test_a_non_finite_row_fails_its_call_only(qwen3_program: TinyProgram, tmp_path: Path) -> None:
    """Two programs on one base decoding together: the one whose side paths overflow fails, the other is untouched."""
    pairs, _ = _with_value(qwen3_program.pairs, 3e38)
    base = qwen3_program.interpreter.gguf_path
    options = RuntimeOptions(max_tokens=6)
    with _load(qwen3_program.folder, base) as good, _load(_program(qwen3_program, tmp_path, pairs), base) as bad:
        alone = good.generate("hello", options)
        pending = [good.submit("hello", options), bad.submit("hello", options), good.submit("hello", options)]
        assert pending[0].result().token_ids == alone.token_ids == pending[2].result().token_ids
        with pytest.raises(NonFiniteError):
            pending[1].result()
        with pytest.raises(NonFiniteError):
            pawfn.run_many([(good, "hello"), (bad, "hello")], options)


def test_an_out_of_range_seed_is_refused(qwen3_program: TinyProgram) -> None:
    """torch's generator takes seeds in [0, 2**64) only (it raised a RuntimeError mid-run)."""
    with pytest.raises(ValueError, match="seed"):
        RuntimeOptions(temperature=0.5, seed=2**64)
    run = run_cli(*_cli_run(qwen3_program.folder, qwen3_program.interpreter.gguf_path, "--temperature", "0.5", "--seed", str(2**64)))
    run.assert_one_line_error(2, "--seed")


def test_a_tiny_temperature_is_a_near_greedy_draw(qwen3_program: TinyProgram) -> None:
    """logits / 1e-300 (0 in float32) gave inf - inf = NaN in the softmax, and the sampler raised."""
    with _load(qwen3_program.folder, qwen3_program.interpreter.gguf_path) as function:
        greedy = function.generate("hello", RuntimeOptions(max_tokens=5))
        cold = function.generate("hello", RuntimeOptions(max_tokens=5, temperature=1e-300, seed=1))
    assert cold.token_ids == greedy.token_ids


def test_async_with_closes_without_blocking_the_loop(qwen3_program: TinyProgram) -> None:
    async def main() -> tuple[str, bool]:
        async with _load(qwen3_program.folder, qwen3_program.interpreter.gguf_path) as function:
            text = await function.arun("hello", RuntimeOptions(max_tokens=3))
        return text, function.closed

    text, closed = asyncio.run(main())
    assert closed and isinstance(text, str)


@requires_llama_cpp
def test_a_cancelled_arun_on_llamacpp_stops_at_its_next_token(gpt2_program: TinyProgram, monkeypatch: pytest.MonkeyPatch) -> None:
    """llama.cpp runs calls one by one on a worker thread; cancelling the task left it decoding to the end."""
    from pawfn.llamacpp.program import LlamaCppSession

    advance = LlamaCppSession.advance
    tokens: list[int] = []

    def slow_advance(self: LlamaCppSession, token: int) -> None:  # ~250 tokens to the context's end: 2.5 s
        tokens.append(token)
        time.sleep(0.01)
        advance(self, token)

    monkeypatch.setattr(LlamaCppSession, "advance", slow_advance)
    function = _load(gpt2_program.folder, gpt2_program.interpreter.gguf_path, LlamaCpp)

    async def main() -> float:
        task = asyncio.create_task(function.arun("hello", RuntimeOptions(max_tokens=100_000)))
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        started = time.perf_counter()
        await function.aclose()  # waits for the worker's call, which stops at its next token
        return time.perf_counter() - started

    waited = asyncio.run(main())
    assert function.closed and waited < 1.0
    assert 0 < len(tokens) < 100


@pytest.mark.parametrize(
    ("meta", "problem"),
    [
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
        ('{"interpreter": "Qwen/Qwen3-0.6B", "n": ' + "9" * 100_000 + "}", "not valid JSON"),
        ('{"interpreter": "Qwen/Qwen3-0.6B", "pad": "' + "x" * (2 << 20) + '"}', "more than the"),
    ],
    ids=["nested", "huge-number", "huge-file"],
)
def test_a_damaged_meta_json_is_a_bundle_error(qwen3_program: TinyProgram, tmp_path: Path, meta: str, problem: str) -> None:
    """Deep nesting raised RecursionError and a 100,000-digit number ValueError; a huge file was read whole."""
    bundle = _program(qwen3_program, tmp_path)
    (bundle / "meta.json").write_text(meta)
    with pytest.raises(pawfn.BundleError, match=problem):
        _load(bundle, qwen3_program.interpreter.gguf_path)
    run_cli(*_cli_run(bundle, qwen3_program.interpreter.gguf_path)).assert_one_line_error(1, "meta.json")


def test_a_huge_template_is_refused_before_it_is_tokenized(qwen3_program: TinyProgram, tmp_path: Path) -> None:
    """A 300 KB .paw held a 40 MB template, tokenized whole before the context check (4 GB in 15 s)."""
    bundle = _program(qwen3_program, tmp_path)
    (bundle / "prompt_template.txt").write_text("word " * (8 << 20) + "{INPUT_PLACEHOLDER}")
    archive = zip_bundle(bundle, tmp_path / "huge.paw")
    assert archive.stat().st_size < 1 << 20
    with pytest.raises(pawfn.BundleError, match="prompt_template.txt is 41943059 bytes"):
        _load(archive, qwen3_program.interpreter.gguf_path)
    run = run_cli(*_cli_run(archive, qwen3_program.interpreter.gguf_path))
    run.assert_one_line_error(1, "prompt_template.txt")


def test_any_str_is_an_input(qwen3_program: TinyProgram) -> None:
    """Lone surrogates (a tokenizer raised TypeError) read as U+FFFD; a valid pair as its character."""
    with _load(qwen3_program.folder, qwen3_program.interpreter.gguf_path) as function:
        options = RuntimeOptions(max_tokens=3)
        assert function.prompt_token_ids("a\ud800b") == function.prompt_token_ids("a\ufffdb")
        assert function.prompt_token_ids("\ud83d\ude00") == function.prompt_token_ids("\U0001f600")
        assert function.generate("a\udcffb", options).token_ids == function.generate("a\ufffdb", options).token_ids


def test_a_truncated_safetensors_base_is_a_base_model_error(qwen3_program: TinyProgram, tmp_path: Path) -> None:
    folder = tmp_path / "hf"
    shutil.copytree(qwen3_program.interpreter.hf_dir, folder)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(BaseModelError, match="truncated or damaged"):
        _load(qwen3_program.folder, folder)
    run_cli(*_cli_run(qwen3_program.folder, folder)).assert_one_line_error(1, "model.safetensors")


def _rewrite_method(archive: bytes, method: int) -> bytes:
    """`archive` with every member's compression method field set to `method` (headers only)."""
    data = bytearray(archive)
    for signature, field in ((b"PK\x03\x04", 8), (b"PK\x01\x02", 10)):
        at = data.find(signature)
        while at >= 0:
            data[at + field : at + field + 2] = method.to_bytes(2, "little")
            at = data.find(signature, at + 4)
    return bytes(data)


@pytest.mark.parametrize("damage", ["unknown-method", "bad-deflate"])
def test_an_undecodable_archive_member_is_a_bundle_error(qwen3_program: TinyProgram, tmp_path: Path, damage: str) -> None:
    """zipfile raised NotImplementedError (a method it lacks) and zlib.error (damaged data)."""
    data = qwen3_program.archive.read_bytes()
    if damage == "unknown-method":
        data = _rewrite_method(data, 99)
    else:
        start = data.find(b"PK\x03\x04") + 60  # inside the first member's deflate stream
        data = data[:start] + b"\xff" * 20 + data[start + 20 :]
    archive = tmp_path / "damaged.paw"
    archive.write_bytes(data)
    with pytest.raises(pawfn.BundleError, match="cannot extract"):
        _load(archive, qwen3_program.interpreter.gguf_path)
    run_cli(*_cli_run(archive, qwen3_program.interpreter.gguf_path)).assert_one_line_error(1, "cannot extract")


def test_one_broken_installed_program_leaves_the_cache_listable(qwen3_program: TinyProgram, tmp_path: Path) -> None:
    """A program folder with a deeply nested meta.json made `pawfn cache list` fail for every program."""
    from pawfn.hub.cache import PawCache

    cache = PawCache(tmp_path / "cache")
    good, broken = "0123456789abcdef0123", "fedcba98765432100123"
    for program_id in (good, broken):
        shutil.copytree(qwen3_program.folder, cache.program_dir(program_id))
        meta = {"interpreter": INTERPRETER_IDS["qwen3"], "program_id": program_id, "spec": program_id}
        (cache.program_dir(program_id) / "meta.json").write_text(json.dumps(meta))
    (cache.program_dir(broken) / "meta.json").write_text("[" * 100_000 + "]" * 100_000)
    assert [program.program_id for program in cache.list_programs()] == [good]
    run = run_cli("cache", "list", "--json", "--cache-dir", str(cache.root))
    assert run.status == 0 and run.stderr == "", run.stderr
    run.assert_within(SECONDS, PEAK_RSS_MB)
    assert [json.loads(line)["program_id"] for line in run.stdout.splitlines()] == [good]


def test_a_base_whose_merges_name_unknown_tokens_is_a_tokenizer_error(
    qwen3_program: TinyProgram, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tokenizers raised a plain Exception ("Token `zzq` out of vocabulary"); found by tests/test_fuzz.py."""
    add_merges = gguf.GGUFWriter.add_token_merges

    def with_unknown(writer: gguf.GGUFWriter, merges: list[str]) -> None:
        add_merges(writer, [*merges, "zzq qqz"])

    monkeypatch.setattr(gguf.GGUFWriter, "add_token_merges", with_unknown)
    base = _base(qwen3_program.interpreter, tmp_path / "merges.gguf")
    monkeypatch.undo()
    with pytest.raises(pawfn.TokenizerError, match="do not form a BPE vocabulary"):
        _load(qwen3_program.folder, base)
    run_cli(*_cli_run(qwen3_program.folder, base)).assert_one_line_error(1, "merges")


def test_archives_are_extracted_in_the_cache_and_a_dead_processs_folder_removed(qwen3_program: TinyProgram, tmp_path: Path) -> None:
    """A .paw opened from a path was extracted into the system temp dir, and a kill -9 left it there for good."""
    cache = tmp_path / "cache"
    staging = cache / ".staging"
    abandoned, live = staging / "pawfn-bundle-abandoned", staging / "pawfn-bundle-live"
    for folder in (abandoned, live):
        (folder / "bundle").mkdir(parents=True)
        (folder / ".in-use").touch()
        os.utime(folder, (time.time() - 3600, time.time() - 3600))
    with lock_held_elsewhere(live / ".in-use"):  # a live process holding its folder's lock
        temp_before = set(Path(tempfile.gettempdir()).glob("pawfn-bundle-*"))
        config = PawConfig(cache_dir=cache)
        with PawFn.load_any_sync(str(qwen3_program.archive), Torch, base=qwen3_program.interpreter.gguf_path, config=config):
            assert len(list(staging.glob("pawfn-bundle-*"))) == 1  # the live one; ours is gone once loaded
        assert not abandoned.exists() and live.exists()
        assert set(Path(tempfile.gettempdir()).glob("pawfn-bundle-*")) == temp_before


def test_a_prefix_that_cannot_fit_is_refused_before_it_is_tokenized(
    qwen3_program: TinyProgram, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under the size cap, a prefix longer than n_ctx tokens could hold is refused by its length alone."""
    from pawfn.formats.tokenizer import TextCodec

    bundle = _program(qwen3_program, tmp_path)
    (bundle / "prompt_template.txt").write_text("word " * 150_000 + "{INPUT_PLACEHOLDER}")  # 750 KB
    encode = TextCodec.encode

    def small_texts_only(codec: TextCodec, text: str, *, parse_special: bool) -> list[int]:
        assert len(text) < 10_000, "the whole prefix was tokenized"
        return encode(codec, text, parse_special=parse_special)

    monkeypatch.setattr(TextCodec, "encode", small_texts_only)
    with pytest.raises(pawfn.ContextOverflowError, match="at least"):
        _load(bundle, qwen3_program.interpreter.gguf_path, n_ctx=256)
    monkeypatch.undo()
    run = run_cli(*_cli_run(bundle, qwen3_program.interpreter.gguf_path, "--n-ctx", "256"))
    run.assert_one_line_error(1, "context overflow: at least")


def _huge_array_gguf(path: Path, architecture: str, general_type: str) -> Path:
    """A ~1 KB GGUF whose metadata claims an array of 2**40 strings (gguf's reader looped over the claim)."""

    def key(name: str) -> bytes:
        return struct.pack("<Q", len(name)) + name.encode()

    def string(value: str) -> bytes:
        return struct.pack("<I", 8) + key(value)

    data = b"GGUF" + struct.pack("<IQQ", 3, 0, 3)
    data += key("general.architecture") + string(architecture) + key("general.type") + string(general_type)
    data += key("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, 2**40) + bytes(1024)
    path.write_bytes(data)
    return path


def test_a_tiny_gguf_claiming_a_huge_array_is_refused_as_adapter_and_as_base(qwen3_program: TinyProgram, tmp_path: Path) -> None:
    bundle = _program(qwen3_program, tmp_path)
    (bundle / "adapter.gguf").write_bytes(_huge_array_gguf(tmp_path / "a.gguf", "qwen3", "adapter").read_bytes())
    run_cli(*_cli_run(bundle, qwen3_program.interpreter.gguf_path)).assert_one_line_error(1, "past the end")
    base = _huge_array_gguf(tmp_path / "base.gguf", "qwen3", "model")
    run_cli(*_cli_run(qwen3_program.folder, base)).assert_one_line_error(1, "past the end")


def test_a_non_utf8_input_on_the_command_line_is_a_usage_error(qwen3_program: TinyProgram) -> None:
    """argv bytes that are not UTF-8 reach Python as lone surrogates (a tokenizer raised TypeError)."""
    argv = ["run", "--program", str(qwen3_program.folder), "--base", str(qwen3_program.interpreter.gguf_path)]
    run_cli(*argv, "--input", b"caf\xe9").assert_one_line_error(2, "not valid text")


@requires_llama_cpp
def test_non_finite_logits_on_llamacpp_stop_the_run(qwen3_program: TinyProgram, tmp_path: Path) -> None:
    """llama.cpp loads the base itself (pawfn does not read its tensors then) and samples from NaN logits all the
    same: the run raises instead."""

    def poison(state: dict[str, Array]) -> None:
        state["model.norm.weight"][0] = np.nan

    base = _base(qwen3_program.interpreter, tmp_path / "nan-norm.gguf", poison)
    with _load(qwen3_program.folder, base, LlamaCpp) as function, pytest.raises(NonFiniteError, match="non-finite"):
        function.run("hello")
    run_cli(*_cli_run(qwen3_program.folder, base, "--backend", "llamacpp")).assert_one_line_error(1, "non-finite")
