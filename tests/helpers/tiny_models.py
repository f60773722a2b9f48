"""Tiny interpreters and programs generated for the tests: no network, no downloaded weights.

Tokenizers are byte-level BPE trained here; weights are random (seeded) in HF `transformers` checkpoints,
converted to GGUF with the `gguf` package under llama.cpp's tensor names (an independent table, not pawfn's).
"""

from __future__ import annotations

import json
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import gguf
import numpy as np
import numpy.typing as npt
import torch
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

Family = Literal["qwen3", "gpt2", "qwen35"]
Array = npt.NDArray[np.float32]

QWEN_SPLIT = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
QWEN35_SPLIT = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
"""Qwen3.5's tokenizer.json split rule: letter runs take combining marks (llama.cpp's pre-tokenizer `qwen35`)."""
CORPUS = [
    "Urgent: the server is down! Please classify the input and answer with one label.",
    "The quick brown fox jumps over the lazy dog while the cat sleeps.",
    "Classify sentiment: POSITIVE or NEGATIVE. I love this product, it works great.",
    "[INPUT] hello world [END_INPUT] output: immediate, later, never; 12345 67890",
    "Résumé naïve café — unicode words ünïcödé and emoji-free text.\n\nNew lines\tand tabs.",
]
MARKED = [
    "Cafe\u0301 re\u0301sume\u0301 nai\u0308ve: decomposed accents after their letters.",
    "नमस्ते दुनिया, हिन्दी में लिखा",
    "สวัสดีครับ ภาษาไทย",
    "مَرْحَبًا بِكُمْ",
]
"""Text whose letters carry combining marks (Devanagari and Thai vowel signs, Arabic harakat, decomposed accents),
which Qwen3.5's split rule keeps in the word and Qwen's splits off: the Qwen3.5 tokenizer learns merges across them."""
QWEN_TEMPLATE = (
    "<|im_start|>user\nClassify the urgency of the message.\n\n[INPUT]\n{INPUT_PLACEHOLDER}\n[END_INPUT]<|im_end|>\n"
    "<|im_start|>assistant\n<think>\n\n</think>\n\n"
)
GPT2_TEMPLATE = "Task: classify the urgency of the message.\nInput: {INPUT_PLACEHOLDER}\nOutput:"

QWEN_LORA_MODULES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
QWEN_BLOCK = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
"""HF module inside a Qwen block -> llama.cpp's GGUF name, what Qwen3 and Qwen3.5 share (not the second norm)."""
GPT2_LORA_MODULES = {"attn_qkv": "attn.c_attn", "attn_output": "attn.c_proj", "ffn_up": "mlp.c_fc", "ffn_down": "mlp.c_proj"}


@dataclass(frozen=True)
class TinyInterpreter:
    """A generated interpreter: HF folder, GGUF base file and the facts tests need."""

    family: Family
    hf_dir: Path
    gguf_path: Path
    eos_token: str

    @property
    def arch(self) -> str:
        return self.family

    def tokenizer(self) -> Tokenizer:
        return Tokenizer.from_file(str(self.hf_dir / "tokenizer.json"))

    def config(self) -> dict[str, object]:
        loaded: dict[str, object] = json.loads((self.hf_dir / "config.json").read_text())
        return loaded

    def lora_shapes(self) -> dict[str, tuple[int, int]]:
        """GGUF target weight name -> (out, in) for every LoRA-adaptable weight."""
        config = self.config()
        shapes: dict[str, tuple[int, int]] = {}
        if self.family == "qwen35":
            from .tiny_qwen35 import lora_shapes

            return lora_shapes(config)
        if self.family == "qwen3":
            hidden, heads = int(str(config["hidden_size"])), int(str(config["num_attention_heads"]))
            kv, head_dim = int(str(config["num_key_value_heads"])), int(str(config["head_dim"]))
            ffn, layers = int(str(config["intermediate_size"])), int(str(config["num_hidden_layers"]))
            per_layer = {
                "attn_q": (heads * head_dim, hidden),
                "attn_k": (kv * head_dim, hidden),
                "attn_v": (kv * head_dim, hidden),
                "attn_output": (hidden, heads * head_dim),
                "ffn_gate": (ffn, hidden),
                "ffn_up": (ffn, hidden),
                "ffn_down": (hidden, ffn),
            }
        else:
            hidden, layers = int(str(config["n_embd"])), int(str(config["n_layer"]))
            per_layer = {
                "attn_qkv": (3 * hidden, hidden),
                "attn_output": (hidden, hidden),
                "ffn_up": (4 * hidden, hidden),
                "ffn_down": (hidden, 4 * hidden),
            }
        for layer in range(layers):
            for module, shape in per_layer.items():
                shapes[f"blk.{layer}.{module}.weight"] = shape
        return shapes

    def hf_module(self, target: str) -> str:
        """HF module path of a GGUF LoRA target (``blk.0.attn_q.weight`` -> ``model.layers.0.self_attn.q_proj``)."""
        _, layer, module, _ = target.split(".")
        if self.family == "qwen35":
            from .tiny_qwen35 import LORA_MODULES

            return f"model.layers.{layer}.{LORA_MODULES[module]}"
        if self.family == "qwen3":
            return f"model.layers.{layer}.{QWEN_LORA_MODULES[module]}"
        return f"transformer.h.{layer}.{GPT2_LORA_MODULES[module]}"


def train_tokenizer(family: Family, texts: Sequence[str] = CORPUS * 20, vocab_size: int = 360) -> Tokenizer:
    """A byte-level BPE tokenizer trained on `texts` (default: a small corpus), with the family's split rule and
    special tokens; Qwen3 gets its two think tags on top of `vocab_size`."""
    tokenizer = Tokenizer(models.BPE())
    if family in ("qwen3", "qwen35"):
        split = QWEN35_SPLIT if family == "qwen35" else QWEN_SPLIT
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(split), behavior="isolated"), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
        )
        specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    else:
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        specials = ["<|endoftext|>"]
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tokenizer.train_from_iterator(texts, trainer)
    if family in ("qwen3", "qwen35"):
        # Like Qwen3's own tokenizer: the think tags are added tokens that are not special.
        think = [AddedToken("<think>", normalized=False), AddedToken("</think>", normalized=False)]
        tokenizer.add_tokens(think)  # pyright: ignore[reportUnknownMemberType]  # stub leaves list items open
    return tokenizer


def build_interpreter(family: Family, root: Path, seed: int = 0, width: int = 64) -> TinyInterpreter:
    """Write a tiny random HF checkpoint and its F32 GGUF twin under `root` (trained models: `tests.helpers.trained`).
    `width` is Qwen3's hidden size (feed-forward and attention 2x): 256 makes every row a whole K-quant block."""
    from transformers import GPT2Config, GPT2LMHeadModel, Qwen3Config, Qwen3ForCausalLM

    tokenizer = train_tokenizer(family)
    vocab_size = tokenizer.get_vocab_size()
    hf_dir = root / f"{family}-hf"
    hf_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)  # pyright: ignore[reportUnknownMemberType]  # torch leaves `seed` unannotated
    model: Qwen3ForCausalLM | GPT2LMHeadModel
    if family == "qwen3":
        eos = "<|im_end|>"
        qwen_config = Qwen3Config(
            vocab_size=vocab_size,
            hidden_size=width,
            intermediate_size=2 * width,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=width // 2,  # deliberately not hidden/heads: GGUF's attention.key_length must be honoured
            max_position_embeddings=512,
            rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
            tie_word_embeddings=True,
            initializer_range=0.3,
            eos_token_id=tokenizer.token_to_id(eos),
        )
        model = Qwen3ForCausalLM(qwen_config)
        config_dict = qwen_config.to_dict()
    else:
        eos = "<|endoftext|>"
        gpt2_config = GPT2Config(
            vocab_size=vocab_size,
            n_embd=64,
            n_layer=2,
            n_head=4,
            n_positions=256,
            initializer_range=0.3,
            bos_token_id=tokenizer.token_to_id(eos),
            eos_token_id=tokenizer.token_to_id(eos),
        )
        model = GPT2LMHeadModel(gpt2_config)
        config_dict = gpt2_config.to_dict()
    model.save_pretrained(str(hf_dir))  # pyright: ignore[reportUnknownMemberType]  # transformers' **kwargs
    write_tokenizer(hf_dir, tokenizer, eos)
    state = {name: tensor.detach().float().numpy() for name, tensor in model.state_dict().items()}
    gguf_path = root / f"{family}-f32.gguf"
    write_base_gguf(family, config_dict, tokenizer, state, gguf_path, eos)
    return TinyInterpreter(family=family, hf_dir=hf_dir, gguf_path=gguf_path, eos_token=eos)


def write_tokenizer(hf_dir: Path, tokenizer: Tokenizer, eos: str) -> None:
    """The tokenizer files of a HF folder."""
    tokenizer.save(str(hf_dir / "tokenizer.json"))
    (hf_dir / "tokenizer_config.json").write_text(json.dumps({"eos_token": eos, "tokenizer_class": "PreTrainedTokenizerFast"}))


def _gguf_tensor_name(family: Family, hf_name: str) -> str | None:
    if family == "qwen3":
        top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
        block = QWEN_BLOCK | {"post_attention_layernorm": "ffn_norm"}
        if hf_name in top:
            return top[hf_name]
        if hf_name == "lm_head.weight":
            return None  # tied to the embeddings, like Qwen3-0.6B
        parts = hf_name.split(".")
        module, kind = ".".join(parts[3:-1]), parts[-1]
        return f"blk.{parts[2]}.{block[module]}.{kind}"
    top = {
        "transformer.wte.weight": "token_embd.weight",
        "transformer.wpe.weight": "position_embd.weight",
        "transformer.ln_f.weight": "output_norm.weight",
        "transformer.ln_f.bias": "output_norm.bias",
    }
    block = {
        "ln_1": "attn_norm",
        "attn.c_attn": "attn_qkv",
        "attn.c_proj": "attn_output",
        "ln_2": "ffn_norm",
        "mlp.c_fc": "ffn_up",
        "mlp.c_proj": "ffn_down",
    }
    if hf_name in top:
        return top[hf_name]
    if hf_name == "lm_head.weight" or hf_name.endswith((".attn.bias", ".attn.masked_bias")):
        return None
    parts = hf_name.split(".")
    module, kind = ".".join(parts[3:-1]), parts[-1]
    return f"blk.{parts[2]}.{block[module]}.{kind}"


def write_base_gguf(family: Family, config: dict[str, object], tokenizer: Tokenizer, state: dict[str, Array], path: Path, eos: str) -> None:
    """Write base weights as llama.cpp's converter would (F32 tensors, BPE vocabulary)."""
    writer = gguf.GGUFWriter(str(path), family)
    writer.add_name(f"tiny-{family}")
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    if family == "qwen3":
        writer.add_context_length(int(str(config["max_position_embeddings"])))
        writer.add_embedding_length(int(str(config["hidden_size"])))
        writer.add_block_count(int(str(config["num_hidden_layers"])))
        writer.add_feed_forward_length(int(str(config["intermediate_size"])))
        writer.add_head_count(int(str(config["num_attention_heads"])))
        writer.add_head_count_kv(int(str(config["num_key_value_heads"])))
        writer.add_key_length(int(str(config["head_dim"])))
        writer.add_value_length(int(str(config["head_dim"])))
        writer.add_rope_freq_base(1000000.0)  # the rope_theta build_interpreter sets
        writer.add_layer_norm_rms_eps(float(str(config["rms_norm_eps"])))
    else:
        writer.add_context_length(int(str(config["n_positions"])))
        writer.add_embedding_length(int(str(config["n_embd"])))
        writer.add_block_count(int(str(config["n_layer"])))
        writer.add_feed_forward_length(4 * int(str(config["n_embd"])))
        writer.add_head_count(int(str(config["n_head"])))
        writer.add_layer_norm_eps(float(str(config["layer_norm_epsilon"])))
    write_base_gguf_header(writer, tokenizer, eos, "qwen2" if family == "qwen3" else "gpt-2")
    conv1d = (".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight")
    for hf_name, array in state.items():
        name = _gguf_tensor_name(family, hf_name)
        if name is None:
            continue
        if family == "gpt2" and hf_name.endswith(conv1d):
            array = np.ascontiguousarray(array.T)
        writer.add_tensor(name, np.ascontiguousarray(array, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def write_base_gguf_header(writer: gguf.GGUFWriter, tokenizer: Tokenizer, eos: str, pre: str) -> None:
    """A base GGUF's tokenizer keys, as llama.cpp's converter writes a BPE vocabulary (`pre`: its pre-tokenizer)."""
    writer.add_tokenizer_pre(pre)
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    tokens = [""] * len(vocab)
    for token, index in vocab.items():
        tokens[index] = token
    added = tokenizer.get_added_tokens_decoder()
    types = [
        (gguf.TokenType.CONTROL if added[i].special else gguf.TokenType.USER_DEFINED) if i in added else gguf.TokenType.NORMAL
        for i in range(len(tokens))
    ]
    model_json = json.loads(tokenizer.to_str())["model"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model_json["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    eos_id = tokenizer.token_to_id(eos)
    assert eos_id is not None
    writer.add_eos_token_id(eos_id)
    writer.add_bos_token_id(tokenizer.token_to_id("<|endoftext|>") or 0)
    writer.add_add_bos_token(False)


def random_lora(interpreter: TinyInterpreter, rank: int = 32, seed: int = 1, std: float = 0.3) -> dict[str, tuple[Array, Array]]:
    """Random LoRA pairs (a `[rank, in]`, b `[out, rank]`, entries of standard deviation `std`) for every
    adaptable weight."""
    rng = np.random.default_rng(seed)
    pairs: dict[str, tuple[Array, Array]] = {}
    for target, (out_features, in_features) in interpreter.lora_shapes().items():
        a = rng.normal(0.0, std, size=(rank, in_features)).astype(np.float32)
        b = rng.normal(0.0, std, size=(out_features, rank)).astype(np.float32)
        pairs[target] = (a, b)
    return pairs


def write_adapter_gguf(
    path: Path,
    architecture: str,
    pairs: dict[str, tuple[Array, Array]],
    alpha: float | None = 16.0,
    qtype: gguf.GGMLQuantizationType = gguf.GGMLQuantizationType.F32,
    extra_tensors: dict[str, Array] | None = None,
    general_type: str = "adapter",
) -> None:
    """Write a GGUF LoRA like llama.cpp's convert_lora_to_gguf.py (lora_a `[r, in]`, lora_b `[out, r]`)."""
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_string("general.type", general_type)
    writer.add_string("adapter.type", "lora")
    if alpha is not None:
        writer.add_float32("adapter.lora.alpha", alpha)
    tensors = {f"{target}.lora_a": a for target, (a, _) in pairs.items()}
    tensors |= {f"{target}.lora_b": b for target, (_, b) in pairs.items()}
    tensors |= extra_tensors or {}
    for name, array in tensors.items():
        if qtype == gguf.GGMLQuantizationType.F32:
            writer.add_tensor(name, array.astype(np.float32))
        elif qtype == gguf.GGMLQuantizationType.F16:
            writer.add_tensor(name, array.astype(np.float16))
        else:
            writer.add_tensor(name, gguf.quants.quantize(array, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def dequantized(pairs: dict[str, tuple[Array, Array]], qtype: gguf.GGMLQuantizationType) -> dict[str, tuple[Array, Array]]:
    """The pairs as a reader of a `qtype` GGUF sees them (quantize, then dequantize with `gguf`)."""

    def roundtrip(array: Array) -> Array:
        if qtype == gguf.GGMLQuantizationType.F32:
            return array
        if qtype == gguf.GGMLQuantizationType.F16:
            return array.astype(np.float16).astype(np.float32)
        restored: Array = gguf.quants.dequantize(gguf.quants.quantize(array, qtype), qtype)
        return restored.reshape(array.shape).astype(np.float32)

    return {target: (roundtrip(a), roundtrip(b)) for target, (a, b) in pairs.items()}


def write_bundle(folder: Path, adapter: Path, interpreter: str, template: str, meta_extra: dict[str, object] | None = None) -> Path:
    """Write an extracted bundle folder."""
    folder.mkdir(parents=True, exist_ok=True)
    meta: dict[str, object] = {"interpreter": interpreter, "program_id": "0123456789abcdef0123", "spec": "tiny test program"}
    meta |= meta_extra or {}
    (folder / "meta.json").write_text(json.dumps(meta))
    (folder / "prompt_template.txt").write_text(template, encoding="utf-8")
    (folder / "adapter.gguf").write_bytes(adapter.read_bytes())
    return folder


def zip_bundle(folder: Path, path: Path) -> Path:
    """Pack a bundle folder as a `.paw` zip."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for member in sorted(folder.iterdir()):
            archive.write(member, member.name)
    return path
