"""The interpreter's tokenizer, built to tokenize and detokenize exactly like llama.cpp."""

from __future__ import annotations

import itertools
import re
import threading
from functools import lru_cache
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

from ..core.errors import TokenizerError
from .ggufio import GGUFFile, GGUFFormatError
from ..core.models import InterpreterModel
from ..core.vocab import KNOWN_PRE_TOKENIZERS, TokenKind, load_time_kinds, split_pattern

__all__ = ["TextCodec", "TokenKind"]


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """Inverse of GPT-2's byte-to-unicode table."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    codes = list(printable)
    shifted = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            codes.append(256 + shifted)
            shifted += 1
    return {chr(code): byte for byte, code in zip(printable, codes, strict=True)}


_BYTE_CHARS = frozenset(_byte_decoder())
_TO_LATIN1 = str.maketrans({char: chr(byte) for char, byte in _byte_decoder().items()})
"""Each byte-table character to the character whose Latin-1 code is its byte, so `encode("latin-1")` gives
the bytes in one pass (a whole 151,936-token vocabulary in a fraction of a second)."""


def _piece_bytes(token: str) -> bytes:
    """Bytes of a byte-level BPE token; text outside the byte table is taken as UTF-8."""
    if _BYTE_CHARS.issuperset(token):
        return token.translate(_TO_LATIN1).encode("latin-1")
    return token.encode()


def _all_piece_bytes(tokens: list[str]) -> list[bytes]:
    """`_piece_bytes` of every token: the whole vocabulary translated and encoded in one pass, then cut by the
    tokens' lengths (one byte per table character); token by token where any falls outside the table."""
    text = "".join(tokens)
    if not _BYTE_CHARS.issuperset(text):
        return [_piece_bytes(token) for token in tokens]
    joined = text.translate(_TO_LATIN1).encode("latin-1")  # every character now below 256: one byte each
    ends = list(itertools.accumulate(map(len, tokens)))
    return [joined[end - len(token) : end] for token, end in zip(tokens, ends, strict=True)]


def _texts_by_id(tokenizer: Tokenizer) -> list[str]:
    """Every token's text in id order (added tokens included; an id with no text: "")."""
    texts = [""] * tokenizer.get_vocab_size(with_added_tokens=True)
    for text, token_id in tokenizer.get_vocab(with_added_tokens=True).items():
        if 0 <= token_id < len(texts):
            texts[token_id] = text
    return texts


def scalar_text(text: str) -> str:
    """`text` with its surrogate code points read as UTF-16, which tokenizers cannot take: a high-low pair becomes
    its character, a lone surrogate U+FFFD (e.g. from undecodable bytes under Python's surrogateescape)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    return text


class TextCodec:
    """Byte-level BPE tokenizer with llama.cpp's special-token rules; encode/decode are thread-safe."""

    def __init__(self, tokenizer: Tokenizer, kinds: dict[int, TokenKind], eos_id: int, source: str, texts: list[str] | None = None) -> None:
        """`tokenizer` becomes the codec's own (its callers build it for the codec and keep no reference); `kinds`
        the ids whose kind is not NORMAL; `texts` each id's token text where the caller has them in id order."""
        self.source = source
        self.eos_id = eos_id
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        # Two copies: one splits special-token text into control tokens, one treats it as text. They differ only on
        # text holding a control token's text, so the second is made when such a text first comes (~0.2 s).
        self._special = tokenizer
        self._special.encode_special_tokens = False
        self._plain: Tokenizer | None = None
        self._plain_lock = threading.Lock()
        if texts is None or len(texts) != self.vocab_size:
            texts = _texts_by_id(tokenizer)
        self._pieces: list[bytes] = _all_piece_bytes(texts)
        self._special_texts: dict[int, bytes] = {}
        """Control, unknown and unused tokens: their text, which a grammar must never take as output."""
        for token_id, kind in kinds.items():
            if not 0 <= token_id < self.vocab_size:
                continue
            if kind in (TokenKind.CONTROL, TokenKind.UNKNOWN, TokenKind.UNUSED):
                self._special_texts[token_id] = texts[token_id].encode()
                self._pieces[token_id] = b""  # llama.cpp renders these as nothing unless asked for special text
            elif kind == TokenKind.USER_DEFINED:
                self._pieces[token_id] = texts[token_id].encode()
        controls = sorted((tokenizer.id_to_token(i) or "" for i, k in kinds.items() if k == TokenKind.CONTROL), key=len, reverse=True)
        self._control_pattern = re.compile("|".join(re.escape(t) for t in controls if t)) if controls else None
        self.max_token_bytes = max([1, *map(len, self._pieces), *(len(t.encode()) for t in controls)])
        """The most UTF-8 bytes of text one token stands for: a text of B bytes has at least B / this many tokens."""

    def encode(self, text: str, *, parse_special: bool) -> list[int]:
        """Token ids of `text` with no BOS; `parse_special` turns control-token text into control tokens."""
        if not text:
            return []
        text = scalar_text(text)
        plain = not parse_special and self._control_pattern is not None and self._control_pattern.search(text) is not None
        encoder = self._plain_tokenizer() if plain else self._special
        return list(encoder.encode(text, add_special_tokens=False).ids)

    def _plain_tokenizer(self) -> Tokenizer:
        """The copy that reads control-token text as plain text, made on first use."""
        with self._plain_lock:
            if self._plain is None:
                plain = Tokenizer.from_str(self._special.to_str())
                plain.encode_special_tokens = True
                self._plain = plain
            return self._plain

    def split_at_first_control(self, text: str) -> tuple[str, str]:
        """`text` split before its first control-token text: (plain head, rest)."""
        if self._control_pattern is None:
            return text, ""
        match = self._control_pattern.search(text)
        return (text, "") if match is None else (text[: match.start()], text[match.start() :])

    def control_spans(self, text: str) -> list[tuple[str, bool]]:
        """`text` cut at its control tokens' text, as llama.cpp cuts a prompt first: (piece, is a control token)."""
        if self._control_pattern is None:
            return [(text, False)]
        spans: list[tuple[str, bool]] = []
        end = 0
        for match in self._control_pattern.finditer(text):
            spans += [(text[end : match.start()], False), (match.group(), True)]
            end = match.end()
        return [*spans, (text[end:], False)]

    def settled_ids(self, text: str) -> list[int]:
        """The leading token ids of `text` (control tokens parsed) that every text starting with `text` begins with:
        all but those of its last pre-token after its last control token, which what follows may extend (a pre-token
        is a regex match that reads at most one character past its end; BPE merges stay inside one)."""
        text = scalar_text(text)
        spans = self.control_spans(text)
        tail = spans[-1][0] if not spans[-1][1] else ""
        pre_tokenizer = self._special.pre_tokenizer
        if not tail:  # it ends with a control token (or is empty): nothing after it can change a token
            return self.encode(text, parse_special=True)
        pieces: list[tuple[str, tuple[int, int]]] = [] if pre_tokenizer is None else pre_tokenizer.pre_tokenize_str(tail)  # none: one piece
        cut = len(text) - len(tail) + (pieces[-1][1][0] if pieces else 0)
        encoding = self._special.encode(text, add_special_tokens=False)
        return [token for token, (_, end) in zip(encoding.ids, encoding.offsets, strict=True) if end <= cut]

    def holds_control_text(self, text: str) -> bool:
        """Whether `text` holds a control token's text (which the official runtime would parse as that token)."""
        return len(self.control_spans(text)) > 1

    def decode_bytes(self, ids: list[int]) -> bytes:
        """Raw bytes of `ids`, control tokens rendered as nothing (llama.cpp detokenize, special=False)."""
        return b"".join(self._pieces[i] for i in ids if 0 <= i < len(self._pieces))

    def grammar_pieces(self) -> list[bytes]:
        """Each token's bytes for a grammar library: special tokens as 0xFF + their text (llguidance's marking,
        so no grammar of text takes them)."""
        pieces = list(self._pieces)
        for token_id in self.special_ids():
            pieces[token_id] = b"\xff" + self._special_texts.get(token_id, self._pieces[token_id])
        return pieces

    def special_ids(self) -> list[int]:
        """Ids of the control, unknown and unused tokens, and EOS (whatever its kind: a call ends on it)."""
        return sorted({*self._special_texts, self.eos_id})

    def decode(self, ids: list[int]) -> str:
        """Text of `ids`, invalid UTF-8 replaced with U+FFFD."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    @classmethod
    def from_gguf(cls, file: GGUFFile) -> TextCodec:
        """Build the tokenizer from GGUF `tokenizer.ggml.*` metadata (BPE vocabularies only)."""
        path = file.path
        try:
            tokenizer_model = file.string("tokenizer.ggml.model")
            pre = file.string("tokenizer.ggml.pre", "default") or "default"
            tokens = file.strings("tokenizer.ggml.tokens")
            merges = file.strings("tokenizer.ggml.merges") or []
            types = file.integers("tokenizer.ggml.token_type")
            eos_id = file.integer("tokenizer.ggml.eos_token_id")
        except GGUFFormatError as exc:
            raise TokenizerError(path, str(exc)) from exc
        if tokenizer_model != "gpt2" or tokens is None:
            raise TokenizerError(path, f"tokenizer.ggml.model is {tokenizer_model!r}; pawfn reads byte-level BPE ('gpt2') vocabularies")
        if types is not None and len(types) != len(tokens):
            raise TokenizerError(path, "tokenizer.ggml.token_type and tokenizer.ggml.tokens differ in length")
        try:
            split = split_pattern(pre)
        except KeyError:
            names = ", ".join(KNOWN_PRE_TOKENIZERS)
            raise TokenizerError(path, f"unsupported pre-tokenizer tokenizer.ggml.pre={pre!r} (known: {names})") from None
        if split is None:
            pre_tokenizer: pre_tokenizers.PreTokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=True)
        else:
            pre_tokenizer = pre_tokenizers.Sequence(
                [
                    pre_tokenizers.Split(Regex(split), behavior="isolated"),
                    pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
                ]
            )

        vocab: dict[str, int] = {}
        for index, token in enumerate(tokens):
            vocab.setdefault(token, index)
        pairs: list[tuple[str, str]] = []
        for merge in merges:
            cut = merge.find(" ", 1)
            if cut < 0:
                raise TokenizerError(path, f"malformed merge {merge!r} in tokenizer.ggml.merges")
            pairs.append((merge[:cut], merge[cut + 1 :]))
        try:
            tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False))
        except Exception as exc:  # tokenizers raises plain Exceptions, e.g. for a merge of tokens not in the vocabulary
            raise TokenizerError(path, f"tokenizer.ggml.tokens and merges do not form a BPE vocabulary: {exc}") from exc
        tokenizer.pre_tokenizer = pre_tokenizer
        tokenizer.decoder = decoders.ByteLevel()
        if eos_id is None or not 0 <= eos_id < len(tokens):
            raise TokenizerError(path, f"tokenizer.ggml.eos_token_id is missing or out of range ({eos_id})")
        known = TokenKind._value2member_map_
        kinds = load_time_kinds(tokens, {i: TokenKind(t) for i, t in enumerate(types or []) if t != TokenKind.NORMAL and t in known}, eos_id)
        controls = [AddedToken(tokens[i], special=True, normalized=False) for i, k in kinds.items() if k == TokenKind.CONTROL]
        user_defined = [AddedToken(tokens[i], special=False, normalized=False) for i, k in kinds.items() if k == TokenKind.USER_DEFINED]
        tokenizer.add_special_tokens(controls)  # pyright: ignore[reportUnknownMemberType]  # stub leaves list items open
        tokenizer.add_tokens(user_defined)  # pyright: ignore[reportUnknownMemberType]  # stub leaves list items open
        return cls(tokenizer, kinds, eos_id, str(path), list(tokens))

    @classmethod
    def from_hf_folder(cls, folder: Path, model: type[InterpreterModel]) -> TextCodec:
        """Build the tokenizer from a Hugging Face folder's `tokenizer.json`; EOS from its config files; token types
        as llama.cpp would have them after converting the folder (its load-time rules)."""
        path = folder / "tokenizer.json"
        if not path.is_file():
            raise TokenizerError(folder, "tokenizer.json is missing; pawfn needs the fast-tokenizer file")
        try:
            tokenizer = Tokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises plain Exception subclasses for parse errors
            raise TokenizerError(path, f"cannot parse tokenizer.json: {exc}") from exc
        kinds = {
            token_id: TokenKind.CONTROL if added.special else TokenKind.USER_DEFINED
            for token_id, added in tokenizer.get_added_tokens_decoder().items()
        }
        eos_text = _hf_eos_text(folder) or model.eos_token
        eos_id = tokenizer.token_to_id(eos_text)
        if eos_id is None:
            raise TokenizerError(folder, f"the EOS token {eos_text!r} is not in the vocabulary")
        texts = _texts_by_id(tokenizer)
        overridden = load_time_kinds(texts, kinds, eos_id)
        became_control = [
            AddedToken(texts[i], special=True, normalized=False) for i, kind in overridden.items() if kind == TokenKind.CONTROL != kinds.get(i)
        ]
        tokenizer.add_special_tokens(became_control)  # pyright: ignore[reportUnknownMemberType]  # stub leaves list items open
        return cls(tokenizer, overridden, eos_id, str(folder), texts)


class _AddedTokenJson(BaseModel):
    model_config = ConfigDict(extra="allow")

    content: str


class _TokenizerConfig(BaseModel):
    """The part of `tokenizer_config.json` pawfn reads."""

    model_config = ConfigDict(extra="allow")

    eos_token: str | _AddedTokenJson | None = None


def _hf_eos_text(folder: Path) -> str | None:
    config_path = folder / "tokenizer_config.json"
    if not config_path.is_file():
        return None
    try:
        config = _TokenizerConfig.model_validate_json(config_path.read_bytes())
    except (OSError, ValidationError) as exc:
        raise TokenizerError(config_path, f"cannot read tokenizer_config.json: {exc}") from exc
    eos = config.eos_token
    return eos.content if isinstance(eos, _AddedTokenJson) else eos
