"""Qwen3.5 (Gated DeltaNet layers and gated attention) on a tiny random checkpoint made with transformers and
written as llama.cpp's converter writes it: pawfn's tokens equal llama.cpp's (the official vision runtime: each
call's whole prompt on a fresh context) and transformers + peft's, bare and with F32 and Q4_0 adapters; batched
calls equal lone ones; the prefix's recurrent states, cached and stored, give the tokens of no cache."""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
from pathlib import Path
from typing import Any, TypeVar

import gguf
import httpx
import pytest
import torch

from pawfn import ArityError, BaseModelError, BundleError, LlamaCpp, PawConfig, PawFn, Positional, Qwen3_5_0_8B, Remote, RuntimeOptions, Torch
from pawfn.core.backends import Backend
from pawfn.torch.model.families.base import Architecture, LinearAttention
from pawfn.torch.ggml.c_kernels import native_kernels
from pawfn.torch.model.arithmetic import NativeLlamaCppArithmetic
from pawfn.torch.model.kvcache import PrefixState
from pawfn.torch.engine.prefix_store import PrefixStore
from tests.helpers.programs import TinyProgram, make_program, requires_llama_cpp, torch_program
from tests.helpers.servers import start_server
from tests.helpers.references import llama_generate_whole, peft_generate_ids
from tests.helpers.tiny_models import TinyInterpreter, dequantized
from tests.helpers.tiny_qwen35 import config_of, hf_pairs, write_qwen35_gguf

TEXTS = [
    "Urgent: the server is down!",
    "hello",
    "The quick brown fox jumps over the lazy dog while the cat sleeps. " * 3,
    "x",
    "สวัสดีครับ नमस्ते re\u0301sume\u0301",  # combining marks: Qwen3.5's split rule keeps them in the word
]
MAX_TOKENS = 16
B = TypeVar("B", bound=Backend)
BACKENDS = [Torch, pytest.param(LlamaCpp, marks=requires_llama_cpp)]


def _rendered(template: str, text: str) -> str:
    return template.replace("{INPUT_PLACEHOLDER}", text)


def _tokens(function: PawFn[Qwen3_5_0_8B, B], texts: list[str]) -> list[list[int]]:
    return [list(function.generate(text, RuntimeOptions(max_tokens=MAX_TOKENS)).token_ids) for text in texts]


def test_the_architecture_comes_from_the_gguf(qwen35: TinyInterpreter) -> None:
    with PawFn[Qwen3_5_0_8B, Torch].bare(base=qwen35.gguf_path) as bare:
        architecture = torch_program(bare).base.interpreter.architecture
    assert architecture.linear == LinearAttention(layers=frozenset({0, 1, 2}), conv_kernel=4, n_key_heads=2, n_value_heads=4, head_dim=16)
    assert architecture.rope_dims == 8
    assert [architecture.attends(layer) for layer in range(4)] == [False, False, False, True]


@requires_llama_cpp
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_multi_token_prediction_block_is_not_run(qwen35: TinyInterpreter, tmp_path: Path, backend: type[Backend]) -> None:
    """Qwen3.5's GGUFs may end with an MTP block (nextn_predict_layers): the trunk's tokens are unchanged."""
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    hf: Any = AutoModelForCausalLM.from_pretrained(str(qwen35.hf_dir), dtype=torch.float32)  # pyright: ignore[reportUnknownMemberType]  # Any: transformers' auto class
    state = {name: tensor.detach().float().numpy() for name, tensor in hf.state_dict().items()}
    with_mtp = tmp_path / "with-mtp.gguf"
    write_qwen35_gguf(config_of(qwen35), Tokenizer.from_file(str(qwen35.hf_dir / "tokenizer.json")), state, with_mtp, qwen35.eos_token, mtp=True)
    expected = llama_generate_whole(with_mtp, TEXTS[:2], MAX_TOKENS)
    with PawFn.specialize(Qwen3_5_0_8B, backend).bare(base=with_mtp) as bare, PawFn[Qwen3_5_0_8B, Torch].bare(base=qwen35.gguf_path) as plain:
        assert _tokens(bare, TEXTS[:2]) == expected == _tokens(plain, TEXTS[:2])


@requires_llama_cpp
@pytest.mark.parametrize("backend", BACKENDS)
def test_bare_tokens_equal_llama_cpp_and_transformers(qwen35: TinyInterpreter, backend: type[Backend]) -> None:
    """The official base contract for Qwen3.5 is `{INPUT_0}`: the caller's text is the whole prompt."""
    expected = llama_generate_whole(qwen35.gguf_path, TEXTS, MAX_TOKENS)
    tokenizer = qwen35.tokenizer()
    assert expected == [peft_generate_ids(qwen35, None, 16.0, tokenizer.encode(text).ids, MAX_TOKENS) for text in TEXTS]
    with PawFn.specialize(Qwen3_5_0_8B, backend).bare(base=qwen35.gguf_path) as bare:
        assert _tokens(bare, TEXTS) == expected


@requires_llama_cpp
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("quantized", [False, True], ids=["f32", "q4_0"])
def test_program_tokens_equal_llama_cpp(qwen35_program: TinyProgram, qwen35_program_q4: TinyProgram, backend: type[Backend], quantized: bool) -> None:
    """The default mode on an F32 base gives the official vision runtime's tokens (f16 cache, flash attention) with an
    F32 and with a Q4_0 program (whose products' inputs llama.cpp quantizes: torch's float32 misses them)."""
    program = qwen35_program_q4 if quantized else qwen35_program
    tiny = program.interpreter
    prompts = [_rendered(program.template, text) for text in TEXTS]
    expected = llama_generate_whole(tiny.gguf_path, prompts, MAX_TOKENS, kv="f16", adapter=program.adapter, vision_runtime=True)
    with PawFn.specialize(Qwen3_5_0_8B, backend).load_sync(program.folder, base=tiny.gguf_path) as function:
        assert _tokens(function, TEXTS) == expected


@pytest.mark.parametrize("quantized", [False, True], ids=["f32", "q4_0"])
def test_program_tokens_equal_peft(qwen35_program: TinyProgram, qwen35_program_q4: TinyProgram, quantized: bool) -> None:
    """A Q4_0 adapter against peft on the same adapter dequantized (what torch's arithmetic reads)."""
    program = qwen35_program_q4 if quantized else qwen35_program
    tiny = program.interpreter
    pairs = dequantized(program.pairs, gguf.GGMLQuantizationType.Q4_0) if quantized else program.pairs
    tokenizer = tiny.tokenizer()
    expected = [
        peft_generate_ids(tiny, hf_pairs(config_of(tiny), pairs), program.alpha, tokenizer.encode(_rendered(program.template, text)).ids, MAX_TOKENS)
        for text in TEXTS
    ]
    with PawFn[Qwen3_5_0_8B, Torch].load_sync(program.folder, base=tiny.gguf_path, config=PawConfig(numerics="native")) as function:
        assert _tokens(function, TEXTS) == expected
        without = peft_generate_ids(tiny, None, program.alpha, tokenizer.encode(_rendered(program.template, TEXTS[0])).ids, MAX_TOKENS)
        assert expected[0] != without  # the adapter is not silently ignored


@pytest.mark.parametrize("batch_invariant", [True, False])
def test_batched_calls_equal_lone_calls(qwen35_program: TinyProgram, batch_invariant: bool) -> None:
    """Rows of one decode step each carry their own recurrent state (continuous batching over calls)."""
    program = qwen35_program
    config = PawConfig(max_batch_rows=4, batch_invariant=batch_invariant)
    with PawFn[Qwen3_5_0_8B, Torch].load_sync(program.folder, base=program.interpreter.gguf_path, config=config) as function:
        lone = _tokens(function, TEXTS)
        batched = [list(g.token_ids) for g in function.generate_batch(TEXTS, RuntimeOptions(max_tokens=MAX_TOKENS))]
    assert batched == lone


def test_the_prefix_state_cache_gives_the_tokens_of_no_cache(qwen35_program: TinyProgram) -> None:
    """A program's prefix is evaluated once (its recurrent states kept) and stored beside it; a bare interpreter on
    the same whole template with the adapter's effect aside cannot serve as reference, so the check is against the
    prompt evaluated whole, from position 0, on the same weights (torch's arithmetic: llama.cpp's runs each prompt whole,
    as the official vision runtime does)."""
    program = qwen35_program
    config = PawConfig(numerics="native")
    with PawFn[Qwen3_5_0_8B, Torch].load_sync(program.folder, base=program.interpreter.gguf_path, config=config) as function:
        runtime = torch_program(function)
        interpreter, adapter = runtime.base.interpreter, runtime.device_adapter
        prefix = runtime.prefix_state
        assert prefix.length > 0 and set(prefix.states) == {0, 1, 2}
        for text in TEXTS[:2]:
            prompt = function.prompt_token_ids(text)
            cached = interpreter.new_cache()
            cached.begin(prefix)
            after_prefix = interpreter.forward(prompt, prefix.length, cached, adapter)
            whole = interpreter.new_cache()
            whole.begin(None)
            from_start = interpreter.forward(list(prefix.token_ids) + prompt, 0, whole, adapter)
            torch.testing.assert_close(after_prefix, from_start, rtol=0, atol=1e-4 * float(from_start.abs().max()))
            assert int(after_prefix.argmax()) == int(from_start.argmax())


def test_the_stored_prefix_keeps_its_recurrent_states(qwen35_program: TinyProgram, tmp_path: Path, prefills: list[int]) -> None:
    """The second load reads the prefix from the shared cache (no evaluation) and gives the same tokens; a stored
    prefix whose states do not fit the architecture is a miss."""
    config = PawConfig(cache_dir=tmp_path / "cache", numerics="native")  # llama.cpp's runs each prompt whole
    base = qwen35_program.interpreter.gguf_path

    def run() -> tuple[list[list[int]], PrefixState, Architecture]:
        with PawFn[Qwen3_5_0_8B, Torch].load_sync(qwen35_program.folder, base=base, config=config) as function:
            runtime = torch_program(function)
            return _tokens(function, TEXTS[:2]), runtime.prefix_state, runtime.base.interpreter.architecture

    first, _, _ = run()
    second, prefix, arch = run()
    assert first == second and len(prefills) == 1
    (stored,) = (tmp_path / "cache" / ".pawfn-derived").glob("*/.pawfn-prefix-*.pt")
    store = PrefixStore(stored)
    loaded = store.load(list(prefix.token_ids), arch, torch.device("cpu"))
    assert loaded is not None and set(loaded.states) == {0, 1, 2}
    for layer, state in prefix.states.items():
        for kept, read in zip(state, loaded.states[layer], strict=True):
            assert torch.equal(kept, read)
    store.save(dataclasses.replace(prefix, states={layer: state[:1] for layer, state in prefix.states.items()}))
    assert store.load(list(prefix.token_ids), arch, torch.device("cpu")) is None


NUMBERED = "<|im_start|>system\n{INPUT_0}<|im_end|>\n<|im_start|>user\n{INPUT_1}<|im_end|>\n<|im_start|>assistant\n"


@requires_llama_cpp
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("qtype", [gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.Q4_0], ids=["f32", "q4_0"])
def test_a_vision_runtime_program_takes_its_numbered_arguments(
    qwen35: TinyInterpreter, tmp_path: Path, backend: type[Backend], qtype: gguf.GGMLQuantizationType
) -> None:
    """A program of the official vision runtime (meta.json's runtime_manifest_version 2) holds a numbered template:
    its calls take one argument per slot, each prompt rendered whole (the official vision runtime's tokens, with an
    F32 and a Q4_0 adapter, no mode named)."""
    meta: dict[str, object] = {"runtime_manifest_version": 2, "runtime_id": "qwen3.5-0.8b-q8_0"}
    program = make_program(qwen35, tmp_path, "numbered", qtype=qtype, seed=4, template=NUMBERED, meta_extra=meta)
    calls = [("be brief", text) for text in TEXTS]
    prompts = [NUMBERED.replace("{INPUT_0}", first).replace("{INPUT_1}", second) for first, second in calls]
    expected = llama_generate_whole(qwen35.gguf_path, prompts, MAX_TOKENS, kv="f16", adapter=program.adapter, vision_runtime=True)
    with PawFn.specialize(Qwen3_5_0_8B, backend).load_sync(program.folder, base=qwen35.gguf_path) as function:
        chat = Positional[str, str](function)
        assert [list(chat.generate(first, second, options=RuntimeOptions(max_tokens=MAX_TOKENS)).token_ids) for first, second in calls] == expected
        with pytest.raises(ArityError):
            function.run("one argument for two slots")


def test_a_vision_runtime_program_with_a_gap_in_its_slots_is_refused(qwen35: TinyInterpreter, tmp_path: Path) -> None:
    program = make_program(qwen35, tmp_path, "gap", template="{INPUT_0} and {INPUT_2}", meta_extra={"runtime_manifest_version": 2})
    with pytest.raises(BundleError, match="without gaps"):
        PawFn[Qwen3_5_0_8B, Torch].load_sync(program.folder, base=qwen35.gguf_path)


@pytest.mark.skipif(importlib.util.find_spec("fastapi") is None, reason="pawfn serve needs the serve extra")
def test_a_server_takes_a_numbered_programs_arguments(qwen35: TinyInterpreter, tmp_path: Path) -> None:
    """`pawfn serve` and `Remote` carry a call's several arguments (`RunRequest.arguments`); the served program says
    how many it takes, so a wrong count is refused before any request, and a raw request with one gets a 422."""
    program_id = "d6b454023d41ac9ca845"
    meta: dict[str, object] = {"runtime_manifest_version": 2}
    program = make_program(qwen35, tmp_path, "served", template=NUMBERED, program_id=program_id, meta_extra=meta)
    server = start_server("--program", str(program.archive), "--base", str(qwen35.gguf_path))
    options = RuntimeOptions(max_tokens=MAX_TOKENS)
    try:
        with (
            PawFn[Qwen3_5_0_8B, Torch].load_sync(program.folder, base=qwen35.gguf_path) as local,
            PawFn[Qwen3_5_0_8B, Remote].load_sync(program_id, config=PawConfig.from_env(server_url=server.url, max_retries=0)) as remote,
        ):
            here, there = Positional[str, str](local), Positional[str, str](remote)
            assert remote.runtime.arity == 2
            for text in TEXTS[:2]:
                assert there.generate("be brief", text, options=options).token_ids == here.generate("be brief", text, options=options).token_ids
            assert there.prompt_token_ids("be brief", TEXTS[0]) == here.prompt_token_ids("be brief", TEXTS[0])

            async def streamed() -> str:
                async with await there.astream("be brief", TEXTS[0], options=options) as stream:
                    return "".join([piece async for piece in stream])

            assert asyncio.run(streamed()).strip() == here.run("be brief", TEXTS[0], options=options)
            with pytest.raises(ArityError):
                remote.run("one input for two slots")
        with httpx.Client(base_url=server.url, timeout=30) as client:
            for body, code in (({"arguments": ["one"]}, "wrong_argument_count"), ({"input": "x", "arguments": ["a", "b"]}, "invalid_request")):
                response = client.post(f"/v1/programs/{program_id}/run", json=body)
                assert (response.status_code, response.json()["error"]) == (422, code), response.text
    finally:
        server.stop()


def test_a_hugging_face_folder_is_refused_with_the_way(qwen35: TinyInterpreter) -> None:
    """The converter changes the norms and the head order: the GGUF is what runs."""
    with pytest.raises(BaseModelError, match="GGUF"):
        PawFn[Qwen3_5_0_8B, Torch].bare(base=qwen35.hf_dir)


LONG = "The quick brown fox jumps over the lazy dog while the cat sleeps. "
LLAMACPP_TEXTS = [*TEXTS, LONG * 12, LONG * 9 + "end"]
"""With prompts of one batch under 64 rows, one of 64 or more, several batches (128 each), and decode steps over 512
cache cells or more: each of llama.cpp's three flash-attention kernels."""


@requires_llama_cpp
@pytest.mark.llamacpp
@pytest.mark.parametrize("kernels", ["c", "torch"])
def test_llamacpp_numerics_give_the_vision_runtimes_tokens_with_a_q4_0_adapter(
    qwen35_q8_0: Path, qwen35_program_q4: TinyProgram, kernels: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The official configuration (Q8_0 base, Q4_0 adapter, f16 cache, flash attention, batches of 128, 2 threads):
    llama.cpp quantizes the adapter's inputs, and `numerics="llamacpp"` follows every op of it, on its C kernels and
    on the torch emulation alike; the plain mode parts from it on this program."""
    if kernels == "torch":
        monkeypatch.setenv("PAW_NATIVE_KERNELS", "0")
    native_kernels.cache_clear()
    program = qwen35_program_q4
    prompts = [_rendered(program.template, text) for text in LLAMACPP_TEXTS]
    expected = llama_generate_whole(qwen35_q8_0, prompts, MAX_TOKENS, n_ctx=1024, kv="f16", adapter=program.adapter, vision_runtime=True)
    config = PawConfig(numerics="llamacpp", n_ctx=1024)
    try:
        with PawFn[Qwen3_5_0_8B, Torch].load_sync(program.folder, base=qwen35_q8_0, config=config) as function:
            assert isinstance(torch_program(function).base.interpreter.arithmetic, NativeLlamaCppArithmetic) == (kernels != "torch")
            assert _tokens(function, LLAMACPP_TEXTS) == expected
            batched = function.generate_batch(LLAMACPP_TEXTS[:3], RuntimeOptions(max_tokens=MAX_TOKENS))
            assert [list(g.token_ids) for g in batched] == expected[:3]  # rows stepped together, each as alone
            assert len(function.prompt_token_ids(LLAMACPP_TEXTS[-2])) > 256  # its decode steps see 512 cells
    finally:
        native_kernels.cache_clear()
    with PawFn[Qwen3_5_0_8B, Torch].load_sync(program.folder, base=qwen35_q8_0, config=PawConfig(n_ctx=1024, numerics="native")) as plain:
        assert _tokens(plain, LLAMACPP_TEXTS[:3]) != expected[:3]  # the case this mode is for


LONG_HEAD = "<|im_start|>user\n" + "Sort the message by urgency: outages first, then billing, then the rest. " * 12 + "\n\n[INPUT]\n"


@requires_llama_cpp
@pytest.mark.llamacpp
def test_llamacpp_numerics_cache_the_whole_batches_of_a_long_head(qwen35: TinyInterpreter, qwen35_q8_0: Path, tmp_path: Path) -> None:
    """The official vision runtime evaluates each call's whole prompt in batches of 128 from position 0, so the batches
    that lie inside the head's settled tokens are the same in every call: the exact mode keeps the state after them
    and gives llama.cpp's tokens of the whole prompt, lone and batched, with inputs that extend the head's last
    pre-token (a newline after its "]\\n") and that do not."""
    program = make_program(
        qwen35,
        tmp_path,
        "long-head",
        gguf.GGMLQuantizationType.Q4_0,
        seed=5,
        template=LONG_HEAD + "{INPUT_PLACEHOLDER}\n[END_INPUT]<|im_end|>\n<|im_start|>assistant\n",
    )
    texts = ["\nUrgent: the server is down!", "hello", "x " * 140]
    expected = llama_generate_whole(
        qwen35_q8_0,
        [_rendered(program.template, text) for text in texts],
        MAX_TOKENS,
        n_ctx=1024,
        kv="f16",
        adapter=program.adapter,
        vision_runtime=True,
    )
    with PawFn[Qwen3_5_0_8B, Torch].load_sync(program.folder, base=qwen35_q8_0, config=PawConfig(numerics="llamacpp", n_ctx=1024)) as function:
        cached = torch_program(function).prefix_state.length
        assert cached >= 256 and cached % 128 == 0  # whole batches of the head, its control token's cut long passed
        assert _tokens(function, texts) == expected
        batched = function.generate_batch(texts, RuntimeOptions(max_tokens=MAX_TOKENS))
        assert [list(g.token_ids) for g in batched] == expected
        runtime = torch_program(function)  # the same batches give the same bits: the logits of no cache, exactly
        interpreter, adapter, prefix = runtime.base.interpreter, runtime.device_adapter, runtime.prefix_state
        for text in texts:
            prompt = function.prompt_token_ids(text)
            cache = interpreter.new_cache()
            cache.begin(prefix)
            after_prefix = interpreter.forward(prompt, prefix.length, cache, adapter)
            cache.begin(None)
            assert torch.equal(after_prefix, interpreter.forward(list(prefix.token_ids) + prompt, 0, cache, adapter))


@requires_llama_cpp
@pytest.mark.llamacpp
def test_llamacpp_numerics_on_prompts_of_several_passes(qwen35_q8_0: Path, qwen35_program_q4: TinyProgram) -> None:
    """A prompt of many passes (128 tokens each; a cancelled call stops between passes): the recurrent states and
    the KV carried from pass to pass give the vision runtime's tokens."""
    program = qwen35_program_q4
    texts = ["word " * 700, "Résumé café " * 250 + "end"]
    prompts = [_rendered(program.template, text) for text in texts]
    expected = llama_generate_whole(qwen35_q8_0, prompts, MAX_TOKENS, n_ctx=2048, kv="f16", adapter=program.adapter, vision_runtime=True)
    with PawFn[Qwen3_5_0_8B, Torch].load_sync(program.folder, base=qwen35_q8_0, config=PawConfig(numerics="llamacpp", n_ctx=2048)) as function:
        assert all(len(function.prompt_token_ids(text)) > 1024 for text in texts)
        assert _tokens(function, texts) == expected


def test_the_exact_modes_last_feed_forward_takes_the_last_row_only(
    qwen35_q8_0: Path, qwen35_program_q4: TinyProgram, monkeypatch: pytest.MonkeyPatch
) -> None:
    """llama.cpp's graph keeps only the output rows after the last layer's mixing (`inp_out_ids`), so its last
    feed-forward takes one row of a call's prompt: the exact mode does the same work (its tokens are llama.cpp's: the
    tests above), every layer before it all the rows."""
    rows: list[int] = []
    swiglu = NativeLlamaCppArithmetic.swiglu

    def recording(self: NativeLlamaCppArithmetic, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        rows.append(gate.shape[0])
        return swiglu(self, gate, up)

    monkeypatch.setattr(NativeLlamaCppArithmetic, "swiglu", recording)
    config = PawConfig(numerics="llamacpp", n_ctx=1024)
    with PawFn[Qwen3_5_0_8B, Torch].load_sync(qwen35_program_q4.folder, base=qwen35_q8_0, config=config) as function:
        if not isinstance(torch_program(function).base.interpreter.arithmetic, NativeLlamaCppArithmetic):
            pytest.skip("the C kernels did not build here")
        layers = torch_program(function).base.interpreter.architecture.n_layers
        rows.clear()  # the call's pass only, not the load's
        function.run("Sort these words: pear, apple, fig, plum.", options=RuntimeOptions(max_tokens=1))
    assert len(rows) == layers and rows[-1] == 1
    assert min(rows[:-1]) > 20  # the whole prompt
