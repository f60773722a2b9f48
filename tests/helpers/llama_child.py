"""One llama.cpp reference run in a process of its own: a JSON request on stdin, a JSON answer on stdout.

Run as ``python -m tests.helpers.llama_child`` by `tests.helpers.references`, so that a native crash in llama.cpp
ends this process, not the test session. Imports llama-cpp-python and the standard library only.
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import json
import os
import sys
from collections.abc import Generator
from typing import Any

PLACEHOLDER = "{INPUT_PLACEHOLDER}"
KV_TYPES = {"f32": 0, "f16": 1}  # GGML_TYPE_F32, GGML_TYPE_F16


@contextlib.contextmanager
def _stdout_to_stderr() -> Generator[None, None, None]:
    """llama.cpp may print on fd 1, which carries the answer: point fd 1 at stderr while it runs."""
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def _load(request: dict[str, Any], **extra: Any) -> Any:  # noqa: ANN401 - llama_cpp.Llama, untyped here
    import llama_cpp

    kv = KV_TYPES[request.get("kv", "f32")]
    if request.get("vision_runtime"):  # the official vision runtime's settings (its numerics follow them)
        extra |= {"n_batch": 128, "flash_attn": True, "n_threads_batch": 2}
    return llama_cpp.Llama(
        model_path=request["base"],
        lora_path=request.get("adapter"),
        n_ctx=request.get("n_ctx", 512),
        n_threads=2 if request.get("vision_runtime") else 1,
        type_k=kv,
        type_v=kv,
        verbose=False,
        **extra,
    )


def _prompt(llm: Any, template: str, text: str) -> None:  # noqa: ANN401 - llama_cpp.Llama, untyped here
    prefix, suffix = template.split(PLACEHOLDER)
    llm.eval(llm.tokenize(prefix.encode(), add_bos=False, special=True))
    llm.eval(llm.tokenize((text + suffix).encode(), add_bos=False, special=True))


def _generate(request: dict[str, Any]) -> list[list[int]]:
    """Greedy tokens per text, each on a fresh context driven the way the official SDK drives it."""
    out: list[list[int]] = []
    for text in request["texts"]:
        llm = _load(request)
        try:
            _prompt(llm, request["template"], text)
            out.append(_greedy(llm, request["max_tokens"]))
        finally:
            llm.close()
    return out


def _greedy(llm: Any, max_tokens: int) -> list[int]:  # noqa: ANN401 - llama_cpp.Llama, untyped here
    """Greedy tokens after the prompt already evaluated, to EOS or `max_tokens`."""
    tokens: list[int] = []
    for _ in range(max_tokens):
        token = int(llm.sample(temp=0.0))
        if token == llm.token_eos():
            break
        tokens.append(token)
        llm.eval([token])
    return tokens


def _logits(request: dict[str, Any]) -> list[list[float]]:
    """Logits after the whole prompt, per text."""
    out: list[list[float]] = []
    for text in request["texts"]:
        llm = _load(request, logits_all=True)
        try:
            _prompt(llm, request["template"], text)
            out.append([float(x) for x in llm.scores[llm.n_tokens - 1]])
        finally:
            llm.close()
    return out


def _vocabulary(request: dict[str, Any]) -> dict[str, list[Any]]:
    """Token ids of `texts` (special-token text parsed where `special` says) and the bytes of `ids`, as hex."""
    import llama_cpp

    llm = llama_cpp.Llama(model_path=request["base"], vocab_only=True, verbose=False)
    try:
        encoded = [
            list(llm.tokenize(text.encode(), add_bos=False, special=special))
            for text, special in zip(request["texts"], request["special"], strict=True)
        ]
        decoded = [bytes(llm.detokenize(ids)).hex() for ids in request["ids"]]
        return {"encoded": encoded, "decoded": decoded}
    finally:
        llm.close()


def _pieces(request: dict[str, Any]) -> list[str]:
    """Every token's piece as llama.cpp writes it (`llama_token_to_piece`, special tokens not rendered), as hex; a
    buffer long enough for any token (llama-cpp-python's `detokenize` cuts pieces at 32 bytes)."""
    import llama_cpp

    llm = llama_cpp.Llama(model_path=request["base"], vocab_only=True, verbose=False)
    try:
        vocab = llama_cpp.llama_model_get_vocab(llm.model)
        buffer = ctypes.create_string_buffer(4096)
        pieces: list[str] = []
        for token in range(llama_cpp.llama_vocab_n_tokens(vocab)):
            length = llama_cpp.llama_token_to_piece(vocab, token, buffer, len(buffer), 0, False)
            pieces.append(buffer.raw[:length].hex())
        return pieces
    finally:
        llm.close()


def _quantize(request: dict[str, Any]) -> None:
    """`source` quantized by llama.cpp's own quantizer to `ftype` (a LLAMA_FTYPE_MOSTLY_* suffix)."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{request['ftype']}")
    if llama_cpp.llama_model_quantize(request["source"].encode(), request["destination"].encode(), ctypes.byref(params)):
        raise RuntimeError(f"llama.cpp could not quantize {request['source']} to {request['ftype']}")


def _generate_json(request: dict[str, Any]) -> list[list[int]]:
    """Greedy tokens per text under llama.cpp's own grammar of `schema` (what `response_format` builds: its schema
    converter, its grammar sampler in `Llama.generate`), each on a fresh context."""
    from llama_cpp.llama_grammar import LlamaGrammar

    out: list[list[int]] = []
    for text in request["texts"]:
        llm = _load(request)
        try:
            grammar = LlamaGrammar.from_json_schema(json.dumps(request["schema"]), verbose=False)
            prefix, suffix = request["template"].split(PLACEHOLDER)
            prompt = llm.tokenize(prefix.encode(), add_bos=False, special=True) + llm.tokenize((text + suffix).encode(), add_bos=False, special=True)
            tokens: list[int] = []
            for token in llm.generate(prompt, temp=0.0, grammar=grammar):
                if token == llm.token_eos() or len(tokens) == request["max_tokens"]:
                    break
                tokens.append(int(token))
            out.append(tokens)
        finally:
            llm.close()
    return out


def _generate_whole(request: dict[str, Any]) -> list[list[int]]:
    """Greedy tokens per rendered prompt, tokenized whole with special tokens parsed and evaluated at once on a
    fresh context: the official SDK's base mode (a bare interpreter, no adapter) and its vision runtime (with one)."""
    out: list[list[int]] = []
    for prompt in request["prompts"]:
        llm = _load(request)
        try:
            llm.eval(llm.tokenize(prompt.encode(), add_bos=False, special=True))
            out.append(_greedy(llm, request["max_tokens"]))
        finally:
            llm.close()
    return out


def _segfault(request: dict[str, Any]) -> None:
    """Dies the way a native crash does (reads address 0): for the tests of the crash handling itself."""
    ctypes.string_at(0)


OPERATIONS = {
    "generate": _generate,
    "generate_json": _generate_json,
    "generate_whole": _generate_whole,
    "logits": _logits,
    "vocabulary": _vocabulary,
    "pieces": _pieces,
    "quantize": _quantize,
    "segfault": _segfault,
}


def main() -> None:
    faulthandler.enable()  # a crash prints where it happened on stderr, which the parent reports
    request: dict[str, Any] = json.loads(sys.stdin.read())
    with _stdout_to_stderr():
        answer = OPERATIONS[request["op"]](request)
    sys.stdout.write(json.dumps({"answer": answer}))


if __name__ == "__main__":
    main()
