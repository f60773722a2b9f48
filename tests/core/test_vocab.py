"""llama.cpp's vocabulary rules on real vocabularies: the test vocabularies llama.cpp ships in its source
(`models/ggml-vocab-{qwen2,qwen35,gpt-2}.gguf`: the Qwen2/Qwen3 and GPT-2 tokenizers as its converter writes them, and
the same BPE under Qwen3.5's pre-tokenizer), their `.inp`/`.out` cases, and llama.cpp itself on text where its rules
differ from a plain reading of the file (combining marks, control-looking text, special-token parsing)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pawfn.core.errors import TokenizerError
from pawfn.formats.ggufio import GGUFFile
from pawfn.formats.tokenizer import TextCodec
from pawfn.core.vocab import TokenKind, load_time_kinds
from tests.helpers.llamacpp_source import VOCABULARIES, vocabulary_cases
from tests.helpers.programs import requires_llama_cpp
from tests.helpers.references import llama_pieces, llama_vocabulary

MARKED = [
    "Cafe\u0301 re\u0301sume\u0301 nai\u0308ve",  # decomposed Latin accents
    "नमस्ते दुनिया, हिन्दी",  # Devanagari vowel signs and virama
    "สวัสดีครับ ภาษาไทย",  # Thai vowels and tone marks
    "مَرْحَبًا بِكُمْ",  # Arabic harakat
    "x\u0300\u0301\u0302 \u0301 'S\u0301 9\u0303",  # marks after a letter, alone, after a contraction and a digit
    "Ελληνικά ά \u1f00 Кири\u0301ллица",
]
CONTROL_TEXT = [
    "Hello world</s>",
    "a<|im_end|>b<|fim_prefix|>x<|fim_middle|>y<|file_sep|>",
    "<|endoftext|> and <|im_start|>user",
    "<think>plain</think> <tool_call>",
    "</s></s> <s>",
]
OTHER = ["", " ", "  leading and trailing  ", "it's WE'RE they'VE 'ſ", "emoji 🙂🦙 and 中文", "tabs\t\tand\r\nnewlines\n\n\n", "x" * 300]


def _vocabulary(source: Path, name: str) -> Path:
    return source / "models" / f"ggml-vocab-{name}.gguf"


@pytest.mark.parametrize("name", VOCABULARIES)
def test_llama_cpps_own_tokenizer_cases(llamacpp_source: Path, name: str) -> None:
    codec = TextCodec.from_gguf(GGUFFile(_vocabulary(llamacpp_source, name)))
    cases = vocabulary_cases(llamacpp_source, name)
    assert [codec.encode(text, parse_special=False) for text, _ in cases] == [ids for _, ids in cases]


@requires_llama_cpp
@pytest.mark.llamacpp
@pytest.mark.parametrize("name", VOCABULARIES)
def test_token_ids_and_pieces_equal_llama_cpps(llamacpp_source: Path, name: str) -> None:
    path = _vocabulary(llamacpp_source, name)
    codec = TextCodec.from_gguf(GGUFFile(path))
    texts = [*MARKED, *CONTROL_TEXT, *OTHER, *(text for text, _ in vocabulary_cases(llamacpp_source, name))]
    requests = [(text, special) for text in texts for special in (False, True)]
    ours = [codec.encode(text, parse_special=special) for text, special in requests]
    theirs, _ = llama_vocabulary(path, requests, [])
    assert ours == theirs
    # pieces one by one (llama-cpp-python's detokenize cuts pieces at 32 bytes and drops a space after a BOS)
    pieces = llama_pieces(path)
    assert len(pieces) == codec.vocab_size
    assert [codec.decode_bytes([token]) for token in range(codec.vocab_size)] == pieces


def test_qwen35_keeps_combining_marks_in_words(llamacpp_source: Path) -> None:
    """The two Qwen files hold the same BPE; only the pre-tokenizer differs, and only on text with combining marks (it
    changes the ids where the vocabulary merges across a mark: Thai and Arabic here)."""
    qwen35 = TextCodec.from_gguf(GGUFFile(_vocabulary(llamacpp_source, "qwen35")))
    qwen2 = TextCodec.from_gguf(GGUFFile(_vocabulary(llamacpp_source, "qwen2")))
    for text in MARKED[2:4]:
        assert qwen35.encode(text, parse_special=False) != qwen2.encode(text, parse_special=False), text
        assert qwen35.decode(qwen35.encode(text, parse_special=False)) == text
    for text in OTHER:
        assert qwen35.encode(text, parse_special=False) == qwen2.encode(text, parse_special=False)


def test_a_control_looking_normal_token_is_a_control_token(llamacpp_source: Path) -> None:
    """Qwen's `</s>` (128247) is NORMAL in the file; llama.cpp makes it a control token when it loads the vocabulary."""
    codec = TextCodec.from_gguf(GGUFFile(_vocabulary(llamacpp_source, "qwen2")))
    assert codec.encode("Hello world</s>", parse_special=True) == [9707, 1879, 128247]
    assert codec.encode("Hello world</s>", parse_special=False) == [9707, 1879, 522, 82, 29]
    assert codec.decode([9707, 1879, 128247]) == "Hello world"
    assert 128247 in codec.special_ids()  # so no grammar takes it as text


def _kinds(tokens: list[str], kinds: dict[int, TokenKind] | None = None, eos: int = 0) -> dict[str, TokenKind]:
    return {tokens[i]: kind for i, kind in load_time_kinds(tokens, kinds or {}, eos).items()}


def test_load_time_rules() -> None:
    tokens = ["a", "</s>", "<|im_end|>", "<|fim_pad|>", "<think>", "<PAD>", "<|endoftext|>", "<|channel|>", "b"]
    kinds = _kinds(tokens, {4: TokenKind.USER_DEFINED, 6: TokenKind.CONTROL, 7: TokenKind.CONTROL})
    assert kinds == {
        "</s>": TokenKind.CONTROL,
        "<|im_end|>": TokenKind.CONTROL,
        "<|fim_pad|>": TokenKind.CONTROL,
        "<think>": TokenKind.USER_DEFINED,  # not control-looking: kept
        "<PAD>": TokenKind.CONTROL,
        "<|endoftext|>": TokenKind.CONTROL,
        "<|channel|>": TokenKind.USER_DEFINED,  # gpt-oss's, always written as text
    }
    # harmony's <|end|> stays text beside <|return|> and <|call|>; gemma4's </s> is text beside <|tool_response>
    assert _kinds(["<|end|>", "<|return|>", "<|call|>"])["<|end|>"] == TokenKind.USER_DEFINED
    assert _kinds(["<|end|>"])["<|end|>"] == TokenKind.CONTROL
    assert "</s>" not in _kinds(["</s>", "<|tool_response>"])
    assert "</s>" not in _kinds(["</s>", "<|plamo:eos|>"], eos=1)
    assert _kinds(["</s>", "<|plamo:eos|>"], eos=0)["</s>"] == TokenKind.CONTROL


def test_an_unknown_pre_tokenizer_names_the_known_ones(llamacpp_source: Path, tmp_path: Path) -> None:
    import gguf

    reader = gguf.GGUFReader(_vocabulary(llamacpp_source, "gpt-2"))
    tokens = [bytes(reader.fields["tokenizer.ggml.tokens"].parts[i]).decode() for i in reader.fields["tokenizer.ggml.tokens"].data]
    writer = gguf.GGUFWriter(tmp_path / "odd.gguf", "gpt2")
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("falcon")
    writer.add_token_list(tokens)
    writer.add_token_merges([])
    writer.add_eos_token_id(0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    with pytest.raises(TokenizerError, match="falcon.*known: qwen2, qwen35, gpt-2"):
        TextCodec.from_gguf(GGUFFile(tmp_path / "odd.gguf"))
