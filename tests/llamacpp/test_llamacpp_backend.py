"""PawFn[M, LlamaCpp]: llama.cpp itself behind the typed API gives the Torch backend's greedy tokens."""

from __future__ import annotations

import ctypes
import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from pawfn import (
    GPT2,
    BaseModelError,
    ConfigError,
    InterpreterModel,
    LlamaCpp,
    PawConfig,
    PawError,
    PawFn,
    ProgramClosedError,
    Qwen3_0_6B,
    RuntimeOptions,
    Torch,
)
from pawfn.core import cpuinfo as cpuinfo_module
from pawfn.llamacpp import cpu
from pawfn.llamacpp import native_logs
from pawfn.llamacpp import program as llamacpp_program
from tests.helpers.programs import TinyProgram, llamacpp_program_of, requires_llama_cpp

pytestmark = [requires_llama_cpp, pytest.mark.llamacpp]
INPUTS = ["Urgent: the server is down!", "hello", "", "Résumé café ünïcödé 12345"]
OPTIONS = RuntimeOptions(max_tokens=16)


def _model(program: TinyProgram) -> type[InterpreterModel]:
    return Qwen3_0_6B if program.interpreter.family == "qwen3" else GPT2


@pytest.mark.parametrize("family", ["qwen3", "gpt2"])
def test_llama_cpp_backend_matches_torch(family: str, request: pytest.FixtureRequest) -> None:
    program: TinyProgram = request.getfixturevalue(f"{family}_program")
    base = program.interpreter.gguf_path
    model = _model(program)
    with (
        PawFn.specialize(model, LlamaCpp).load_sync(program.folder, base=base) as llama,
        PawFn.specialize(model, Torch).load_sync(program.folder, base=base) as torch_fn,
    ):
        assert type(llama).backend_type() is LlamaCpp
        for _ in range(2):  # the second round checks the rewind to the cached prefix
            for text in INPUTS:
                assert llama.generate(text, OPTIONS).token_ids == torch_fn.generate(text, OPTIONS).token_ids, text
        assert llama.prefix_tokens == torch_fn.prefix_tokens


def test_llama_cpp_runs_are_serialized(qwen3_program: TinyProgram) -> None:
    base = qwen3_program.interpreter.gguf_path
    with PawFn[Qwen3_0_6B, LlamaCpp].load_sync(qwen3_program.folder, base=base) as function:
        expected = {text: function.generate(text, OPTIONS).token_ids for text in INPUTS}

        def run(text: str) -> tuple[str, tuple[int, ...]]:
            return text, function.generate(text, OPTIONS).token_ids

        with ThreadPoolExecutor(max_workers=4) as pool:
            assert all(tokens == expected[text] for text, tokens in pool.map(run, INPUTS * 3))
    with pytest.raises(ProgramClosedError):
        function.run("hello")


def test_llama_cpp_needs_a_gguf_base(qwen3_program: TinyProgram) -> None:
    with pytest.raises(BaseModelError, match="needs a GGUF file"):
        PawFn[Qwen3_0_6B, LlamaCpp].load_sync(qwen3_program.folder, base=qwen3_program.interpreter.hf_dir)


AMX_FLAGS = "flags\t\t: fpu sse4_2 avx avx2 fma f16c bmi2 avx512f avx512cd avx512vl avx512dq avx512bw amx_tile amx_int8\n"
ZEN4_FLAGS = "flags\t\t: fpu sse4_2 avx avx2 fma f16c bmi2 avx512f avx512cd avx512vl avx512dq avx512bw avx512_vnni\n"
AMX_BUILD = "CPU : SSE3 = 1 | AVX512 = 1 | AMX_INT8 = 1 | REPACK = 1 |"
PLAIN_BUILD = "CPU : SSE3 = 1 | AVX512 = 1 | REPACK = 1 |"


def _fake_machine(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, cpuinfo: str, system_info: str) -> None:
    """The CPU flags and llama.cpp build the backend reads, faked; nothing on the system changes."""
    path = tmp_path / "cpuinfo"
    path.write_text(cpuinfo)
    monkeypatch.setattr(cpuinfo_module, "CPUINFO", path)
    monkeypatch.setattr(llamacpp_program, "_system_info", lambda: system_info)


def _extra_bufts(function: PawFn[Qwen3_0_6B, LlamaCpp]) -> bool:
    runtime = function.runtime
    assert isinstance(runtime, llamacpp_program.LlamaCppProgram)
    return bool(runtime.context.model_params.use_extra_bufts)


@pytest.mark.parametrize(
    ("cpuinfo", "system_info", "setting", "repack"),
    [
        (AMX_FLAGS, AMX_BUILD, None, False),  # the crash's configuration: refused
        (AMX_FLAGS, PLAIN_BUILD, None, True),  # a build without AMX repacks as usual
        (ZEN4_FLAGS, AMX_BUILD, None, True),
        (ZEN4_FLAGS, PLAIN_BUILD, None, True),
        (AMX_FLAGS, AMX_BUILD, "1", True),  # PAW_LLAMACPP_REPACK overrides either way
        (ZEN4_FLAGS, PLAIN_BUILD, "0", False),
        (AMX_FLAGS, AMX_BUILD, "auto", False),
    ],
    ids=["amx-cpu-amx-build", "amx-cpu-plain-build", "zen4-amx-build", "zen4-plain-build", "forced-on", "forced-off", "auto"],
)
def test_weight_repacking_is_refused_where_amx_would_crash(
    cpuinfo: str,
    system_info: str,
    setting: str | None,
    repack: bool,
    qwen3_program: TinyProgram,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    _fake_machine(monkeypatch, tmp_path, cpuinfo, system_info)
    vars(llamacpp_program)["_log_amx_refusal"].cache_clear()  # logged once per process; this test reads the log
    caplog.set_level(logging.INFO, logger="pawfn")
    if setting is not None:
        monkeypatch.setenv("PAW_LLAMACPP_REPACK", setting)
    config = PawConfig.from_env()
    assert llamacpp_program.uses_repack(config) is repack
    base = qwen3_program.interpreter.gguf_path
    with (
        PawFn[Qwen3_0_6B, LlamaCpp].load_sync(qwen3_program.folder, base=base, config=config) as function,
        PawFn[Qwen3_0_6B, Torch].load_sync(qwen3_program.folder, base=base) as torch_fn,
    ):
        assert _extra_bufts(function) is repack
        assert function.generate(INPUTS[0], OPTIONS).token_ids == torch_fn.generate(INPUTS[0], OPTIONS).token_ids
    assert (cpu.AMX_ISSUE in caplog.text) == (not repack and setting != "0")


def test_the_repack_setting_leaves_other_loads_alone(qwen3_program: TinyProgram) -> None:
    """The parameters pawfn sets reach its own load only: llama.cpp's defaults are as they were after it."""
    import llama_cpp

    defaults = llama_cpp.llama_cpp.llama_model_default_params
    config = PawConfig(llamacpp_repack=False)
    with PawFn[Qwen3_0_6B, LlamaCpp].load_sync(qwen3_program.folder, base=qwen3_program.interpreter.gguf_path, config=config) as function:
        assert not _extra_bufts(function)
    assert llama_cpp.llama_cpp.llama_model_default_params is defaults
    assert llama_cpp.llama_model_default_params().use_extra_bufts


def test_a_llama_cpp_python_without_the_setting_is_refused_where_it_is_needed(qwen3_program: TinyProgram, monkeypatch: pytest.MonkeyPatch) -> None:
    import ctypes

    import llama_cpp

    class OldParams(ctypes.Structure):
        _fields_ = [("vocab_only", ctypes.c_bool)]

    monkeypatch.setattr(llama_cpp, "llama_model_params", OldParams)
    with pytest.raises(PawError, match="cannot load without weight repacking.*20824.*pip install -U llama-cpp-python"):
        PawFn[Qwen3_0_6B, LlamaCpp].load_sync(qwen3_program.folder, base=qwen3_program.interpreter.gguf_path, config=PawConfig(llamacpp_repack=False))


def test_an_invalid_repack_setting_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PAW_LLAMACPP_REPACK", "sometimes")
    with pytest.raises(ConfigError, match="PAW_LLAMACPP_REPACK='sometimes'.*auto, 1 or 0"):
        PawConfig.from_env()


@requires_llama_cpp
@pytest.mark.llamacpp
def test_submit_returns_before_the_call_runs_and_calls_run_in_order(qwen3_program: TinyProgram) -> None:
    """llama.cpp runs a program's calls one by one on the program's own worker: `submit` queues and returns at once;
    a cancelled queued call never starts; the others finish in order with the tokens they get alone."""
    import threading

    from pawfn import RuntimeOptions

    with PawFn[Qwen3_0_6B, LlamaCpp].load_sync(qwen3_program.folder, base=qwen3_program.interpreter.gguf_path) as program:
        alone = program.generate("hello", RuntimeOptions(max_tokens=8)).token_ids
        caller = threading.get_ident()
        seen: list[int] = []
        first = program.runtime.submit("hello", RuntimeOptions(max_tokens=400), lambda token: seen.append(threading.get_ident()))
        assert not first.done()  # queued, not run on the caller's thread
        second = program.submit("hello", RuntimeOptions(max_tokens=8))
        third = program.submit("hello", RuntimeOptions(max_tokens=8))
        assert second.cancel() and second.cancelled()
        assert third.result(timeout=120).token_ids == alone
        assert first.done() and caller not in seen


def _official_constant_keywords(module: str) -> dict[str, object]:
    """The constant keyword arguments of every `Llama(...)` call in the official SDK's module `module` (read from its
    source, so a new release's settings show here)."""
    import ast
    import importlib.util

    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        pytest.skip(f"the official SDK (dev extra) is not installed: no {module}")
    found: dict[str, object] = {}
    calls = 0
    for node in ast.walk(ast.parse(Path(spec.origin).read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and (ast.unparse(node.func).endswith("Llama")):
            calls += 1
            found |= {k.arg: k.value.value for k in node.keywords if k.arg is not None and isinstance(k.value, ast.Constant)}
    assert calls, f"no Llama(...) call in {module}"
    return found


def _plain_fields(params: ctypes.Structure) -> dict[str, object]:
    """A ctypes parameter struct's numbers and flags by name (pointers and callbacks left out)."""
    names = [field[0] for field in type(params)._fields_]
    return {name: value for name in names if isinstance(value := getattr(params, name), (bool, int, float))}


_PARAMETERS = ("n_ctx", "n_batch", "n_ubatch", "n_seq_max", "n_threads", "n_threads_batch", "type_k", "type_v", "flash_attn_type", "offload_kqv")


@pytest.mark.parametrize(
    ("family", "module"),
    [("qwen3", "programasweights.runtime_llamacpp"), ("gpt2", "programasweights.runtime_llamacpp"), ("qwen35", "programasweights._runtime_vision")],
)
def test_the_context_is_the_official_sdks(family: str, module: str, request: pytest.FixtureRequest) -> None:
    """With no setting named, a program's llama.cpp context has the parameters the official SDK's own `Llama(...)`
    call gives it: llama-cpp-python's defaults for text programs (an f16 KV cache), the vision runtime's for Qwen3.5."""
    import llama_cpp

    from pawfn import Qwen3_5_0_8B

    program: TinyProgram = request.getfixturevalue(f"{family}_program")
    model = {"qwen3": Qwen3_0_6B, "gpt2": GPT2, "qwen35": Qwen3_5_0_8B}[family]
    official = _official_constant_keywords(module)
    assert official == llamacpp_program.official_llama_settings(model)
    base = program.interpreter.gguf_path
    with PawFn.specialize(model, LlamaCpp).load_sync(program.folder, base=base, config=PawConfig(n_ctx=512)) as ours:
        runtime = llamacpp_program_of(ours)
        context = runtime.context.context_params
        theirs = llama_cpp.Llama(
            model_path=str(base), n_ctx=context.n_ctx, n_gpu_layers=0, verbose=False, **llamacpp_program.official_llama_settings(model)
        )
        try:
            assert {name: getattr(context, name) for name in _PARAMETERS} == {name: getattr(theirs.context_params, name) for name in _PARAMETERS}
            assert _plain_fields(context) == _plain_fields(theirs.context_params)  # every other field as Llama sets it
            assert _plain_fields(runtime.context.model_params) == _plain_fields(theirs.model_params)
        finally:
            theirs.close()
        assert context.type_k == context.type_v == 1  # GGML_TYPE_F16
        assert "f16 KV cache" in runtime.engine


def test_a_named_setting_changes_only_what_it_names(qwen3_program: TinyProgram) -> None:
    config = PawConfig(n_ctx=512, threads=1, llamacpp_kv_dtype="float32", dtype="bfloat16")  # dtype: the Torch backend's
    with PawFn[Qwen3_0_6B, LlamaCpp].load_sync(qwen3_program.folder, base=qwen3_program.interpreter.gguf_path, config=config) as function:
        runtime = llamacpp_program_of(function)
        context = runtime.context.context_params
        assert (context.type_k, context.type_v, context.n_threads, context.n_threads_batch, context.n_batch) == (0, 0, 1, 1, 512)
        assert "f32 KV cache, 1/1 threads" in runtime.engine


@requires_llama_cpp
def test_a_sampled_call_draws_what_llamas_sampler_draws(qwen3_program: TinyProgram) -> None:
    """At a temperature the backend's sampler chain (made anew per token, seeded by the call) draws the tokens that
    `Llama.sample` draws after the same evaluations, on the same program."""
    import llama_cpp

    from pawfn import RuntimeOptions

    base = qwen3_program.interpreter.gguf_path
    options = RuntimeOptions(max_tokens=12, temperature=0.9, top_p=0.9, seed=7)
    with PawFn[Qwen3_0_6B, LlamaCpp].load_sync(qwen3_program.folder, base=base, config=PawConfig(n_ctx=512)) as function:
        runtime = llamacpp_program_of(function)
        prefix, prompt = runtime.prefix_ids, function.prompt_token_ids("hello there")
        found = list(function.generate("hello there", options).token_ids)
    theirs = llama_cpp.Llama(model_path=str(base), n_ctx=512, n_gpu_layers=0, verbose=False, lora_path=str(qwen3_program.adapter))
    try:
        theirs.eval(prefix)  # as the backend: the prefix at load, then the call's prompt
        theirs.eval(prompt)
        theirs.set_seed(7)
        expected: list[int] = []
        while len(expected) < len(found):
            token = theirs.sample(temp=0.9, top_p=0.9, top_k=0, min_p=0.0)
            expected.append(token)
            theirs.eval([token])
    finally:
        theirs.close()
    assert len(set(found)) > 1 and found == expected


def test_a_recurrent_models_calls_log_nothing_python_would_print(qwen35_program: TinyProgram, caplog: pytest.LogCaptureFixture) -> None:
    """Qwen3.5 on llama.cpp: every evaluation drops the cache past its start with seq_id -1, as `Llama.eval` does, and
    llama.cpp's recurrent memory answers with an error it then ignores; pawfn logs that one at DEBUG (Python prints an
    unhandled ERROR record on stderr, once per call), every other error as an error."""
    from pawfn import Qwen3_5_0_8B

    caplog.set_level(logging.DEBUG, logger="pawfn.llamacpp")
    with PawFn[Qwen3_5_0_8B, LlamaCpp].load_sync(qwen35_program.folder, base=qwen35_program.interpreter.gguf_path) as function:
        function.generate("hello", OPTIONS)
        function.generate("hello again", OPTIONS)
    native = [(record.levelno, record.getMessage()) for record in caplog.records if record.name == "pawfn.llamacpp"]
    assert (logging.DEBUG, "seq_rm: invalid seq_id (-1) - larger than n_seq_max (1)") in native
    assert [message for level, message in native if level >= logging.WARNING] == []
    assert native_logs.native_log_level(4, b"seq_rm: invalid seq_id (3) - larger than n_seq_max (1)\n", logging.DEBUG) == logging.ERROR
    assert native_logs.native_log_level(4, b"llama_decode: failed to decode\n", logging.DEBUG) == logging.ERROR
    assert native_logs.native_log_level(3, b"a warning\n", logging.DEBUG) == logging.INFO
    assert native_logs.native_log_level(5, b" continued\n", logging.ERROR) == logging.ERROR  # a continuation keeps the level


@requires_llama_cpp
def test_a_cancelled_prompt_stops_between_llama_cpps_batches_and_the_next_call_is_whole(qwen3_program: TinyProgram) -> None:
    """The LlamaCpp backend evaluates a long prompt in batches of `n_batch` and asks before each one after the first
    whether its call was cancelled: the first true answer stops it there (CancelledError), the context holding what it
    evaluated, and the program's next call gives the tokens a fresh program gives."""
    from concurrent.futures import CancelledError

    options = RuntimeOptions(max_tokens=8)
    config = PawConfig(n_ctx=4096)
    with PawFn[Qwen3_0_6B, LlamaCpp].load_sync(qwen3_program.folder, base=qwen3_program.interpreter.gguf_path, config=config) as function:
        expected = function.generate("hello", options).token_ids
        runtime = llamacpp_program_of(function)
        context, session = runtime.context, llamacpp_program.LlamaCppSession(runtime, options)
        prompt = function.prompt_token_ids("word " * 700)
        assert len(prompt) > 2 * context.n_batch
        asked: list[int] = []

        def cancelled() -> bool:  # the call's cancellation as a prefill asks it: cancelled from the first question on
            asked.append(context.n_tokens)
            return True

        with pytest.raises(CancelledError):
            session.prefill(prompt, cancelled)
        n_prefix = function.prefix_tokens
        assert asked == [n_prefix + context.n_batch] and context.n_tokens == n_prefix + context.n_batch  # one batch in
        assert function.generate("hello", options).token_ids == expected
