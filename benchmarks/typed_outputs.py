"""What a typed output costs on a Qwen3-0.6B-shaped program (its 151,936-token vocabulary), in one run: the grammar
compile per output type (first time, then from the cache), the mask per decode step (llguidance's bitmask, unpacked
and applied to the step's logits) next to the step itself, and whole calls with and without a constraint that
keeps the same tokens (any text), on pawfn's Torch backend and beside llama.cpp with the same grammar through its
own sampler. Prints the figures and the ratios.

    python benchmarks/typed_outputs.py [--workdir /tmp/pawfn-qwen3-shape] [--tokens 32] [--rounds 3]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time
from pathlib import Path

import torch
from load_cost import INPUT, llama_cpp_build, prepare

from pawfn import ChoicesFormat, JsonSchemaFormat, JsonSchemaSpec, PatternFormat, PawConfig, PawFn, Qwen3_0_6B, RuntimeOptions, Torch
from pawfn.formats.constraint import _grammars, compile_output
from pawfn.core.grammar import OutputFormat

FORMATS: dict[str, OutputFormat] = {
    "choice of 3": ChoicesFormat(choices=("immediate", "later", "never")),
    "int": PatternFormat(pattern="[-+]?[0-9]{1,19}"),
    "pattern": PatternFormat(pattern="[A-Z]{3}-[0-9]{4}"),
    "JSON object": JsonSchemaFormat(
        json_schema=JsonSchemaSpec(
            schema={
                "type": "object",
                "properties": {"label": {"enum": ["urgent", "normal", "spam"]}, "score": {"type": "integer"}, "note": {"type": "string"}},
                "required": ["label", "score"],
            }
        )
    ),
}
ANY_TEXT = PatternFormat(pattern=r"[\s\S]*")


def compile_times(codec: object) -> None:
    print("grammar compile per output type (ms): first | cached")
    for name, output in FORMATS.items():
        started = time.perf_counter()
        compile_output(codec, output)  # type: ignore[arg-type]
        first = (time.perf_counter() - started) * 1e3
        started = time.perf_counter()
        compile_output(codec, output)  # type: ignore[arg-type]
        print(f"  {name:12s} {first:8.2f} | {(time.perf_counter() - started) * 1e3:6.3f}")


def mask_times(codec: object, width: int, steps: int) -> dict[str, float]:
    """Median microseconds to compute and apply one row's mask, taking the first allowed token each step."""
    logits = torch.zeros(1, width)
    figures: dict[str, float] = {}
    for name, output in FORMATS.items():
        constraint = compile_output(codec, output)  # type: ignore[arg-type]
        times: list[float] = []
        for _ in range(steps):
            if constraint.finished:
                break
            started = time.perf_counter()
            allowed = torch.as_tensor(constraint.allowed(width))
            masked = logits.masked_fill(~allowed, float("-inf"))
            times.append((time.perf_counter() - started) * 1e6)
            choices = torch.nonzero(masked[0] > float("-inf")).flatten().tolist()
            constraint.consume(int(choices[len(choices) // 2]) if name != "JSON object" else int(choices[0]))
        figures[name] = statistics.median(times)
    return figures


def pawfn_calls(function: PawFn[Qwen3_0_6B, Torch], tokens: int, rounds: int) -> tuple[float, float, bool]:
    """Median ms per generated token, plain and under any-text, and whether both gave the same tokens."""
    plain_options = RuntimeOptions(max_tokens=tokens)
    typed_options = RuntimeOptions(max_tokens=tokens, response_format=ANY_TEXT)
    plain, typed, same = [], [], True
    for _ in range(rounds):
        a = function.generate(INPUT, plain_options)
        b = function.generate(INPUT, typed_options)
        same = same and a.token_ids == b.token_ids
        plain.append(a.timings.generate_ms / max(len(a.token_ids), 1))
        typed.append(b.timings.generate_ms / max(len(b.token_ids), 1))
    return statistics.median(plain), statistics.median(typed), same


def llama_calls(base: Path, bundle: Path, tokens: int, rounds: int) -> tuple[float, float] | None:
    """llama.cpp's ms per generated token, plain and under its own grammar of any text."""
    if importlib.util.find_spec("llama_cpp") is None:
        return None
    import llama_cpp
    from llama_cpp.llama_grammar import LlamaGrammar

    prefix, suffix = (bundle / "prompt_template.txt").read_text(encoding="utf-8").split("{INPUT_PLACEHOLDER}")
    model = llama_cpp.Llama(str(base), n_ctx=2048, verbose=False, lora_path=str(bundle / "adapter.gguf"))
    prompt = model.tokenize(prefix.encode(), add_bos=False, special=True) + model.tokenize((INPUT + suffix).encode(), add_bos=False, special=True)
    figures: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(rounds):
        for constrained in (False, True):
            grammar = LlamaGrammar.from_string("root ::= [^\\x00]*", verbose=False) if constrained else None
            model.reset()
            model.eval(prompt)
            started, count = time.perf_counter(), 0
            for token in model.generate(prompt, temp=0.0, grammar=grammar, reset=False):
                if token == model.token_eos() or count == tokens:
                    break
                count += 1
            figures[constrained].append((time.perf_counter() - started) * 1e3 / max(count, 1))
    model.close()
    return statistics.median(figures[False]), statistics.median(figures[True])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/pawfn-qwen3-shape"))
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    base, bundle = prepare(args.workdir)
    print(llama_cpp_build())
    with PawFn[Qwen3_0_6B, Torch].load_sync(bundle, base=base, config=PawConfig()) as function:
        codec = function.runtime._prompt.codec  # type: ignore[attr-defined]  # noqa: SLF001 - a benchmark's look inside
        started = time.perf_counter()
        _grammars(codec)
        print(f"llguidance tokenizer of the {codec.vocab_size}-token vocabulary: {(time.perf_counter() - started) * 1e3:.0f} ms, once per base")
        compile_times(codec)
        plain, typed, same = pawfn_calls(function, args.tokens, args.rounds)
        width = int(function.runtime.base.interpreter.architecture.vocab_size)  # type: ignore[attr-defined]
        masks = mask_times(codec, width, args.tokens)
    print(f"\npawfn Torch float32, {args.tokens}-token greedy calls: {plain:.1f} ms per decode step")
    for name, micros in masks.items():
        print(f"  mask of a {name:12s} row: {micros:7.1f} us per step = {micros / 1e3 / plain:6.2%} of a step")
    overhead = typed / plain - 1
    print(f"whole calls under any text (same tokens: {same}): {typed:.1f} vs {plain:.1f} ms per token ({overhead:+.1%})")
    llama = llama_calls(base, bundle, args.tokens, args.rounds)
    if llama is not None:
        free, grammar = llama
        print(f"llama.cpp, same program: {free:.1f} ms per token; under its grammar of any text {grammar:.1f} ({grammar / free - 1:+.1%})")
        print(f"ratios: pawfn / llama.cpp per token {plain / free:.2f} plain, {typed / grammar:.2f} constrained")


if __name__ == "__main__":
    main()
