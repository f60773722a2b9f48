"""llama.cpp's vocabulary rules for byte-level BPE files: the split regex of each `tokenizer.ggml.pre` and the token
types it sets when it loads a vocabulary (`llama_vocab::impl::load`), whatever the file's `token_type` says."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from enum import IntEnum

__all__ = ["KNOWN_PRE_TOKENIZERS", "TokenKind", "load_time_kinds", "split_pattern"]


class TokenKind(IntEnum):
    """GGUF `tokenizer.ggml.token_type` values."""

    NORMAL = 1
    UNKNOWN = 2
    CONTROL = 3
    USER_DEFINED = 4
    UNUSED = 5
    BYTE = 6


_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
# llama.cpp's own spellings (`llama_vocab::impl::load` then `unicode_regex_split`): the contractions by explicit
# case classes, not `(?i:...)`, which would also fold e.g. U+017F (long s) into `'s`.
_QWEN2 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_QWEN35 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
"""Qwen3.5's: letter runs also take combining marks (LLAMA_VOCAB_PRE_TYPE_QWEN35)."""

_SPLITS: Mapping[str, str | None] = {"qwen2": _QWEN2, "qwen35": _QWEN35, "gpt-2": None, "gpt2": None, "default": None}
"""Pre-tokenizer name -> split regex; None: GPT-2's byte-level regex (llama.cpp's default for BPE files)."""

KNOWN_PRE_TOKENIZERS = tuple(name for name in _SPLITS if name not in ("gpt2", "default"))
"""The names an error lists (the aliases left out)."""


def split_pattern(pre: str) -> str | None:
    """The split regex llama.cpp uses for `tokenizer.ggml.pre` (None: GPT-2's); KeyError for one it does not
    support here."""
    return _SPLITS[pre]


# Texts llama.cpp turns into control tokens at load, whatever their type in the file: the end-of-generation
# list and the fill-in-the-middle spellings (src/llama-vocab.cpp, llama-cpp-python 0.3.36).
_END_OF_GENERATION = frozenset(
    {
        "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>", "<end_of_turn>",
        "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>",
        "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>", "<｜end▁of▁sentence｜>", "[e~[",
    }
)  # fmt: skip
_FILL_IN_MIDDLE = frozenset(
    {
        "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>", "<|code_prefix|>",
        "<|prefix|>", "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
        "<|code_suffix|>", "<|suffix|>", "<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>",
        "▁<MID>", "<|code_middle|>", "<|middle|>", "<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]",
        "<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>", "<|file_sep|>",
    }
)  # fmt: skip
_ALWAYS_RENDERED = frozenset({"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"})
"""gpt-oss's tokens, which llama.cpp makes USER_DEFINED (written as text)."""


def load_time_kinds(tokens: Sequence[str], kinds: Mapping[int, TokenKind], eos_id: int) -> dict[int, TokenKind]:
    """`kinds` (id -> the file's type, NORMAL left out) as llama.cpp has them after loading `tokens`: texts that
    look like control tokens become CONTROL, gpt-oss's channel tokens USER_DEFINED, and the two exceptions it makes
    for harmony's `<|end|>` and a `</s>` that is text in gemma4 and plamo (whose EOS is `<|plamo:eos|>`)."""
    result = dict(kinds)
    ids = {text: token_id for token_id, text in enumerate(tokens)}  # a repeated text maps to its last id, as there
    for text in _END_OF_GENERATION | _FILL_IN_MIDDLE:
        token_id = ids.get(text)
        if token_id is not None and result.get(token_id) not in (TokenKind.CONTROL, TokenKind.UNKNOWN):
            result[token_id] = TokenKind.CONTROL
    for text in _ALWAYS_RENDERED & ids.keys():
        result[ids[text]] = TokenKind.USER_DEFINED
    if "<|end|>" in ids and {"<|return|>", "<|call|>"} <= ids.keys() or {"<|calls|>", "<|flush|>", "<|end|>"} <= ids.keys():
        result[ids["<|end|>"]] = TokenKind.USER_DEFINED
    if "</s>" in ids and ("<|tool_response>" in ids or tokens[eos_id] == "<|plamo:eos|>"):
        result.pop(ids["</s>"], None)  # NORMAL
    return result
