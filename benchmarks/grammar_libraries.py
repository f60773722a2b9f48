"""Which grammar library should constrain pawfn's decoding (issue 22): xgrammar, llguidance and outlines-core side by
side in one run, on a byte-level BPE vocabulary of Qwen3's size (151,936 tokens, made here: the real one is not
reachable from this machine), for the output types a program promises (a choice, an integer, a pattern, a JSON
object). Prints each library's compile time per type and its mask time per decode step (the mask of the allowed
next tokens computed and applied to the step's logits; then one allowed token is taken), median over a decode of
up to 32 tokens. Libraries not installed are
skipped (`pip install xgrammar llguidance outlines-core`).

    python benchmarks/grammar_libraries.py [--vocab 151936] [--steps 32]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from tokenizers.pre_tokenizers import ByteLevel

EOS = "<|im_end|>"
TYPES: dict[str, tuple[str, str]] = {
    "choice": ("regex", "(immediate|later|never)"),
    "integer": ("regex", "-?(0|[1-9][0-9]{0,17})"),
    "pattern": ("regex", "[A-Z]{3}-[0-9]{4}"),
    "json object": (
        "json_schema",
        json.dumps(
            {
                "type": "object",
                "properties": {"label": {"enum": ["urgent", "normal", "spam"]}, "score": {"type": "integer"}},
                "required": ["label", "score"],
                "additionalProperties": False,
            }
        ),
    ),
}


def synthetic_tokenizer(size: int, seed: int = 0) -> Tokenizer:
    """A byte-level BPE of `size` tokens (EOS last): the 256 byte symbols, then merges of existing tokens into
    word-like pieces (letters with and without a leading space, digits, punctuation), as a real vocabulary grows."""
    alphabet = list(ByteLevel.alphabet())
    rng = random.Random(seed)
    vocab = {symbol: index for index, symbol in enumerate(sorted(alphabet))}
    merges: list[tuple[str, str]] = []
    letters = [c for c in "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"]
    tokens = list(vocab)
    while len(vocab) < size - 1:
        left = rng.choice(tokens[-2000:] if len(tokens) > 2000 and rng.random() < 0.7 else tokens)
        right = rng.choice(letters if rng.random() < 0.8 else alphabet)
        merged = left + right
        if merged not in vocab and len(merged) <= 16:
            vocab[merged] = len(vocab)
            merges.append((left, right))
            tokens.append(merged)
        elif rng.random() < 0.3:  # words that start with a space, as most of a real vocabulary does
            start = "\u0120" + rng.choice(letters)
            if start not in vocab:
                vocab["\u0120"] = vocab.get("\u0120", len(vocab))
                vocab[start] = len(vocab)
                merges.append(("\u0120", start[1:]))
                tokens.append(start)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([EOS])
    return tokenizer


@dataclass
class Figures:
    compile_ms: float
    mask_us: float
    steps: int


def _decode(
    mask: Callable[[], object], allowed: Callable[[], torch.Tensor], take: Callable[[int], bool], vocab: int, steps: int, rng: random.Random
) -> tuple[float, int]:
    """Median microseconds of `mask()` (the library's own call, in its own form) over a decode that takes a random
    allowed token each step (`allowed()` reads the mask as booleans, untimed)."""
    times: list[float] = []
    for _ in range(steps):
        started = time.perf_counter()
        mask()  # the mask, applied to a step's logits: what a sampler pays per row
        times.append((time.perf_counter() - started) * 1e6)
        ids = allowed().nonzero().flatten().tolist()
        ids = [i for i in ids if i < vocab]
        if not ids or not take(rng.choice(ids)):
            break
    return statistics.median(times), len(times)


def _bits(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """A packed int32 bitmask [1, words] as a boolean per token."""
    words = bitmask[0].to(torch.int64) & 0xFFFFFFFF
    shifts = torch.arange(32, dtype=torch.int64)
    return (((words.unsqueeze(1) >> shifts) & 1).flatten()[:vocab]).bool()


def run_xgrammar(tokenizer: Tokenizer, kind: str, grammar: str, steps: int) -> Figures:
    import xgrammar as xgr
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=EOS)
    vocab = tokenizer.get_vocab_size()
    info = xgr.TokenizerInfo.from_huggingface(hf, vocab_size=vocab)
    compiler = xgr.GrammarCompiler(info, cache_enabled=False)
    started = time.perf_counter()
    compiled = compiler.compile_regex(grammar) if kind == "regex" else compiler.compile_json_schema(grammar, any_whitespace=False)
    compile_ms = (time.perf_counter() - started) * 1e3
    matcher = xgr.GrammarMatcher(compiled)
    bitmask = xgr.allocate_token_bitmask(1, vocab)

    def take(token: int) -> bool:
        return bool(matcher.accept_token(token)) and not matcher.is_terminated()

    logits = torch.zeros(vocab)

    def mask() -> None:
        matcher.fill_next_token_bitmask(bitmask)
        xgr.apply_token_bitmask_inplace(logits, bitmask)

    mask_us, taken = _decode(mask, lambda: _bits(bitmask, vocab), take, vocab, steps, random.Random(1))
    return Figures(compile_ms, mask_us, taken)


def run_llguidance(tokenizer: Tokenizer, kind: str, grammar: str, steps: int) -> Figures:
    import llguidance
    import llguidance.torch as llg_torch

    vocab = tokenizer.get_vocab_size()
    eos = tokenizer.token_to_id(EOS)
    lltokenizer = llguidance.LLTokenizer(tokenizer.to_str(), n_vocab=vocab, eos_token=eos)
    started = time.perf_counter()
    matcher = llguidance.LLMatcher(lltokenizer, llguidance.grammar_from(kind, grammar))
    bitmask = llg_torch.allocate_token_bitmask(1, vocab)
    llg_torch.fill_next_token_bitmask(matcher, bitmask, 0)  # the first mask finishes the lazy compile
    compile_ms = (time.perf_counter() - started) * 1e3
    if matcher.is_error():
        raise RuntimeError(matcher.get_error())

    def take(token: int) -> bool:
        return bool(matcher.consume_token(token)) and not matcher.is_stopped()

    logits = torch.zeros(vocab)

    def mask() -> None:
        llg_torch.fill_next_token_bitmask(matcher, bitmask, 0)
        llg_torch.apply_token_bitmask_inplace(logits, bitmask)

    mask_us, taken = _decode(mask, lambda: _bits(bitmask, vocab), take, vocab, steps, random.Random(1))
    return Figures(compile_ms, mask_us, taken)


def run_outlines_core(tokenizer: Tokenizer, kind: str, grammar: str, steps: int) -> Figures:
    from outlines_core import Guide, Index, Vocabulary
    from outlines_core.json_schema import build_regex_from_schema

    vocab_size = tokenizer.get_vocab_size()
    eos = tokenizer.token_to_id(EOS)
    decoder = decoders.ByteLevel()
    pieces: dict[str, list[int]] = {}
    for token, index in tokenizer.get_vocab().items():
        if index != eos:
            pieces.setdefault(decoder.decode([token]), []).append(index)
    vocabulary = Vocabulary(eos, pieces)
    regex = grammar if kind == "regex" else build_regex_from_schema(grammar)
    started = time.perf_counter()
    guide = Guide(Index(regex, vocabulary))
    compile_ms = (time.perf_counter() - started) * 1e3

    def allowed() -> torch.Tensor:
        booleans = torch.zeros(vocab_size, dtype=torch.bool)
        booleans[guide.get_tokens()] = True
        return booleans

    def take(token: int) -> bool:
        guide.advance(token)
        return not guide.is_finished()

    logits = torch.zeros(vocab_size)

    def mask() -> None:
        ids = torch.tensor(guide.get_tokens(), dtype=torch.long)
        masked = torch.full_like(logits, float("-inf"))
        masked[ids] = logits[ids]

    mask_us, taken = _decode(mask, allowed, take, vocab_size, steps, random.Random(1))
    return Figures(compile_ms, mask_us, taken)


LIBRARIES = {"xgrammar": run_xgrammar, "llguidance": run_llguidance, "outlines-core": run_outlines_core}
MODULES = {"xgrammar": "xgrammar", "llguidance": "llguidance", "outlines-core": "outlines_core"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--vocab", type=int, default=151_936)
    parser.add_argument("--steps", type=int, default=32)
    args = parser.parse_args()
    started = time.perf_counter()
    tokenizer = synthetic_tokenizer(args.vocab)
    print(f"vocabulary: {tokenizer.get_vocab_size()} tokens (synthetic byte-level BPE, {time.perf_counter() - started:.1f} s to build)")
    print(f"{'library':14} {'type':12} {'compile':>10} {'mask/step':>10} {'steps':>6}")
    for name, run in LIBRARIES.items():
        if importlib.util.find_spec(MODULES[name]) is None:
            print(f"{name:14} not installed")
            continue
        for label, (kind, grammar) in TYPES.items():
            try:
                figures = run(tokenizer, kind, grammar, args.steps)
            except Exception as exc:  # noqa: BLE001 - a library's failure is a row of the table, not the end of the run
                print(f"{name:14} {label:12} failed: {type(exc).__name__}: {str(exc)[:80]}")
                continue
            print(f"{name:14} {label:12} {figures.compile_ms:7.1f} ms {figures.mask_us:7.0f} us {figures.steps:6d}", flush=True)


if __name__ == "__main__":
    main()
