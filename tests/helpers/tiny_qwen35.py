"""A tiny random Qwen3.5 (three Gated DeltaNet layers, one gated attention layer) made with transformers, and its
GGUF twin written as llama.cpp's converter writes it (an independent table of its transformations, not pawfn's).

The converter's transformations: zero-centred norms stored as 1 + w (not the gated norm of the recurrent
layers), A_log stored as -exp(A_log), the convolution's kernel squeezed to [channels, width], and the value heads
reordered from grouped to tiled order (value head j of key head k moves from k * r + j to j * n_key_heads + k).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, cast

import gguf
import numpy as np
import torch
from tokenizers import Tokenizer

if TYPE_CHECKING:
    from transformers import Qwen3_5TextConfig

from .tiny_models import (
    CORPUS,
    MARKED,
    QWEN_BLOCK,
    QWEN_LORA_MODULES,
    Array,
    TinyInterpreter,
    train_tokenizer,
    write_base_gguf_header,
    write_tokenizer,
)

TEMPLATE = "<|im_start|>user\nClassify the urgency of the message.\n\n[INPUT]\n{INPUT_PLACEHOLDER}\n[END_INPUT]<|im_end|>\n<|im_start|>assistant\n"
LORA_MODULES = QWEN_LORA_MODULES | {
    "attn_qkv": "linear_attn.in_proj_qkv",
    "attn_gate": "linear_attn.in_proj_z",
    "ssm_alpha": "linear_attn.in_proj_a",
    "ssm_beta": "linear_attn.in_proj_b",
    "ssm_out": "linear_attn.out_proj",
}
_BLOCK = QWEN_BLOCK | {
    "post_attention_layernorm": "post_attention_norm",
    "linear_attn.in_proj_qkv": "attn_qkv",
    "linear_attn.in_proj_z": "attn_gate",
    "linear_attn.in_proj_b": "ssm_beta",
    "linear_attn.in_proj_a": "ssm_alpha",
    "linear_attn.conv1d": "ssm_conv1d",
    "linear_attn.norm": "ssm_norm",
    "linear_attn.out_proj": "ssm_out",
}


def tiny_config(vocab_size: int, eos_id: int, width: int = 64) -> Qwen3_5TextConfig:
    """4 layers (the fourth attends), 2 key heads shared by 4 value heads, a quarter of each attention head rotating
    with M-RoPE sections 2/1/1."""
    from transformers import Qwen3_5TextConfig

    return Qwen3_5TextConfig(
        vocab_size=vocab_size,
        hidden_size=width,
        intermediate_size=2 * width,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        linear_conv_kernel_dim=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        max_position_embeddings=512,
        rms_norm_eps=1e-6,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 1000000.0,
            "partial_rotary_factor": 0.25,
            "mrope_section": [2, 1, 1],
            "mrope_interleaved": True,
        },
        tie_word_embeddings=True,
        initializer_range=0.3,
        eos_token_id=eos_id,
    )


def build_qwen35(root: Path, seed: int = 0) -> TinyInterpreter:
    """Write a tiny random Qwen3.5 HF checkpoint (norms perturbed, so 1 + w matters) and its F32 GGUF under `root`."""
    from transformers import Qwen3_5ForCausalLM

    tokenizer = train_tokenizer("qwen35", (CORPUS + MARKED) * 20, vocab_size=420)
    eos = "<|im_end|>"
    eos_id = tokenizer.token_to_id(eos)
    assert eos_id is not None
    hf_dir = root / "qwen35-hf"
    hf_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)  # pyright: ignore[reportUnknownMemberType]  # torch leaves `seed` unannotated
    config = tiny_config(tokenizer.get_vocab_size(), eos_id)
    model = Qwen3_5ForCausalLM(config)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("norm.weight"):
                parameter.add_(torch.randn_like(parameter) * 0.2)
    model.save_pretrained(str(hf_dir))  # pyright: ignore[reportUnknownMemberType]  # transformers' **kwargs
    write_tokenizer(hf_dir, tokenizer, eos)
    state = {name: tensor.detach().float().numpy() for name, tensor in model.state_dict().items()}
    gguf_path = root / "qwen35-f32.gguf"
    write_qwen35_gguf(config.to_dict(), tokenizer, state, gguf_path, eos)
    return TinyInterpreter(family="qwen35", hf_dir=hf_dir, gguf_path=gguf_path, eos_token=eos)


def _swapped(array: Array, axis: int, outer: int, inner: int, head: int) -> Array:
    """`array`'s head axis `axis`, read as [outer, inner, head], reordered to [inner, outer, head]."""
    moved = np.moveaxis(array, axis, 0)
    rest = moved.shape[1:]
    swapped = np.swapaxes(moved.reshape(outer, inner, head, *rest), 0, 1).reshape(outer * inner * head, *rest)
    return np.ascontiguousarray(np.moveaxis(swapped, 0, axis))


def _tiled(array: Array, axis: int, n_key_heads: int, per_key: int, head: int) -> Array:
    """`array`'s value-head axis `axis` ([n_key_heads * per_key * head]) from grouped to tiled order."""
    return _swapped(array, axis, n_key_heads, per_key, head)


def converted(config: dict[str, object], hf_name: str, array: Array) -> tuple[str, Array] | None:
    """A HF tensor as llama.cpp's converter stores it: (GGUF name, values), None for the tied output matrix."""
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
    n_key, n_value = int(str(config["linear_num_key_heads"])), int(str(config["linear_num_value_heads"]))
    head, per_key = int(str(config["linear_value_head_dim"])), n_value // n_key
    if hf_name == "lm_head.weight":
        return None
    if hf_name in top:
        name = top[hf_name]
    else:
        parts = hf_name.split(".")
        module, kind = ".".join(parts[3:-1]), parts[-1]
        if kind in ("A_log", "dt_bias"):
            name = f"blk.{parts[2]}.ssm_a" if kind == "A_log" else f"blk.{parts[2]}.ssm_dt.bias"
            module = "linear_attn." + kind
        else:
            name = f"blk.{parts[2]}.{_BLOCK[module]}.{kind}"
        if module == "linear_attn.in_proj_qkv":
            keys = 2 * n_key * int(str(config["linear_key_head_dim"]))
            array = np.concatenate([array[:keys], _tiled(array[keys:], 0, n_key, per_key, head)])
        elif module == "linear_attn.in_proj_z":
            array = _tiled(array, 0, n_key, per_key, head)
        elif module in ("linear_attn.in_proj_a", "linear_attn.in_proj_b", "linear_attn.A_log", "linear_attn.dt_bias"):
            array = _tiled(array, 0, n_key, per_key, 1)
        elif module == "linear_attn.conv1d":
            array = array.squeeze(1)
            keys = 2 * n_key * int(str(config["linear_key_head_dim"]))
            array = np.concatenate([array[:keys], _tiled(array[keys:], 0, n_key, per_key, head)])
        elif module == "linear_attn.out_proj":
            array = _tiled(array, 1, n_key, per_key, head)
        if module == "linear_attn.A_log":
            array = -torch.exp(torch.as_tensor(array)).numpy()  # torch's exp, as the converter computes it
    if hf_name.endswith("norm.weight") and not hf_name.endswith("linear_attn.norm.weight"):
        array = array + 1.0
    return name, np.ascontiguousarray(array, dtype=np.float32)


def write_qwen35_gguf(config: dict[str, object], tokenizer: Tokenizer, state: dict[str, Array], path: Path, eos: str, mtp: bool = False) -> None:
    """The F32 GGUF llama.cpp's converter writes for this checkpoint (keys and tensors); `mtp`: with one more block
    for multi-token prediction after the trunk (random weights: it is never run), as Qwen3.5's own GGUFs carry."""
    writer = gguf.GGUFWriter(str(path), "qwen35")
    head_dim = int(str(config["head_dim"]))
    rope = cast("dict[str, object]", config["rope_parameters"])  # cast: a transformers config dict's JSON object
    writer.add_name("tiny-qwen35")
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_context_length(int(str(config["max_position_embeddings"])))
    writer.add_embedding_length(int(str(config["hidden_size"])))
    layers = int(str(config["num_hidden_layers"]))
    writer.add_block_count(layers + mtp)
    if mtp:
        writer.add_uint32("qwen35.nextn_predict_layers", 1)
    writer.add_feed_forward_length(int(str(config["intermediate_size"])))
    writer.add_head_count(int(str(config["num_attention_heads"])))
    writer.add_head_count_kv(int(str(config["num_key_value_heads"])))
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_freq_base(float(str(rope["rope_theta"])))
    writer.add_layer_norm_rms_eps(float(str(config["rms_norm_eps"])))
    writer.add_ssm_conv_kernel(int(str(config["linear_conv_kernel_dim"])))
    writer.add_ssm_state_size(int(str(config["linear_key_head_dim"])))
    writer.add_ssm_group_count(int(str(config["linear_num_key_heads"])))
    writer.add_ssm_time_step_rank(int(str(config["linear_num_value_heads"])))
    writer.add_ssm_inner_size(int(str(config["linear_value_head_dim"])) * int(str(config["linear_num_value_heads"])))
    writer.add_full_attention_interval(4)
    writer.add_rope_dimension_count(int(head_dim * float(str(rope["partial_rotary_factor"]))))
    writer.add_rope_dimension_sections([*(int(str(s)) for s in cast("list[object]", rope["mrope_section"])), 0])  # cast: JSON list
    write_base_gguf_header(writer, tokenizer, eos, "qwen35")  # the name llama.cpp's converter gives Qwen3.5's tokenizer
    for hf_name, array in state.items():
        named = converted(config, hf_name, array)
        if named is not None:
            writer.add_tensor(*named)
    if mtp:
        hidden, rng = int(str(config["hidden_size"])), np.random.default_rng(7)
        last = f"blk.{layers - 1}."  # an attention block's tensors, then the predictor's own
        for name, array in [(n, a) for n, a in ((converted(config, k, v) or ("", v)) for k, v in state.items()) if n.startswith(last)]:
            writer.add_tensor(name.replace(last, f"blk.{layers}.", 1), array)
        writer.add_tensor(f"blk.{layers}.nextn.eh_proj.weight", rng.normal(0.0, 0.3, (hidden, 2 * hidden)).astype(np.float32))
        writer.add_tensor(f"blk.{layers}.nextn.enorm.weight", np.ones(hidden, dtype=np.float32))
        writer.add_tensor(f"blk.{layers}.nextn.hnorm.weight", np.ones(hidden, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def lora_shapes(config: dict[str, object]) -> dict[str, tuple[int, int]]:
    """GGUF target weight name -> (out, in) for every LoRA-adaptable weight of the tiny Qwen3.5."""
    nested = config.get("text_config")  # a checkpoint with images keeps the text model's config inside
    if isinstance(nested, dict):
        config = cast("dict[str, object]", nested)  # cast: the nested JSON object of a config.json
    hidden, heads, kv = (int(str(config[k])) for k in ("hidden_size", "num_attention_heads", "num_key_value_heads"))
    head, ffn = int(str(config["head_dim"])), int(str(config["intermediate_size"]))
    n_key, n_value = int(str(config["linear_num_key_heads"])), int(str(config["linear_num_value_heads"]))
    state = int(str(config["linear_key_head_dim"]))
    feed_forward = {"ffn_gate": (ffn, hidden), "ffn_up": (ffn, hidden), "ffn_down": (hidden, ffn)}
    attention = {
        "attn_q": (2 * heads * head, hidden),
        "attn_k": (kv * head, hidden),
        "attn_v": (kv * head, hidden),
        "attn_output": (hidden, heads * head),
    }
    recurrent = {
        "attn_qkv": ((2 * n_key + n_value) * state, hidden),
        "attn_gate": (n_value * state, hidden),
        "ssm_alpha": (n_value, hidden),
        "ssm_beta": (n_value, hidden),
        "ssm_out": (hidden, n_value * state),
    }
    shapes: dict[str, tuple[int, int]] = {}
    for layer in range(int(str(config["num_hidden_layers"]))):
        modules = attention if (layer + 1) % 4 == 0 else recurrent
        for module, shape in (modules | feed_forward).items():
            shapes[f"blk.{layer}.{module}.weight"] = shape
    return shapes


def config_of(interpreter: TinyInterpreter) -> dict[str, object]:
    loaded: dict[str, object] = json.loads((interpreter.hf_dir / "config.json").read_text())
    return loaded


def _grouped(array: Array, axis: int, n_key_heads: int, per_key: int, head: int) -> Array:
    """`_tiled`'s inverse: a value-head axis from tiled back to grouped (HF) order."""
    return _swapped(array, axis, per_key, n_key_heads, head)


def hf_pairs(config: dict[str, object], pairs: dict[str, tuple[Array, Array]]) -> dict[str, tuple[Array, Array]]:
    """GGUF LoRA pairs (value heads in tiled order) as peft adapts the HF modules (grouped order)."""
    n_key, n_value = int(str(config["linear_num_key_heads"])), int(str(config["linear_num_value_heads"]))
    head, per_key = int(str(config["linear_value_head_dim"])), n_value // n_key
    keys = 2 * n_key * int(str(config["linear_key_head_dim"]))
    out: dict[str, tuple[Array, Array]] = {}
    for target, (a, b) in pairs.items():
        module = target.split(".")[2]
        if module == "attn_qkv":
            b = np.concatenate([b[:keys], _grouped(b[keys:], 0, n_key, per_key, head)])
        elif module == "attn_gate":
            b = _grouped(b, 0, n_key, per_key, head)
        elif module in ("ssm_alpha", "ssm_beta"):
            b = _grouped(b, 0, n_key, per_key, 1)
        elif module == "ssm_out":
            a = _grouped(a, 1, n_key, per_key, head)
        out[target] = (a, b)
    return out


VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
_VISION_BLOCK = {
    "norm1": "ln1",
    "norm2": "ln2",
    "attn.qkv": "attn_qkv",
    "attn.proj": "attn_out",
    "mlp.linear_fc1": "ffn_up",
    "mlp.linear_fc2": "ffn_down",
}
_MERGER = {"norm": "v.post_ln", "linear_fc1": "mm.0", "linear_fc2": "mm.2"}
IMAGE_MEAN = IMAGE_STD = [0.5, 0.5, 0.5]
PREPROCESSOR: dict[str, object] = {
    "image_processor_type": "Qwen2VLImageProcessorFast",
    "image_mean": IMAGE_MEAN,
    "image_std": IMAGE_STD,
    "patch_size": 16,
    "merge_size": 2,
    "temporal_patch_size": 2,
}


@dataclass(frozen=True)
class TinyVision:
    """A tiny Qwen3.5 with its vision tower: the HF folder, the text GGUF and the projector GGUF (mmproj)."""

    text: TinyInterpreter
    projector: Path
    """F32, beside the text GGUF."""
    typed_projectors: dict[str, Path]
    """The same tower with BF16 ("BF16", as unsloth's mmproj-BF16, patch kernels too) or F16 ("F16", as llama.cpp's
    converter writes `--outtype f16`) matrices, each in its own folder beside a copy of the text GGUF."""


def build_qwen35_vision(root: Path, seed: int = 0) -> TinyVision:
    """A tiny random Qwen3.5 with images (2 vision blocks of width 32, 16-pixel patches merged 2x2 into the text's
    64), its text GGUF and its projector written as llama.cpp's converter writes them."""
    from tokenizers import AddedToken
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    tokenizer = train_tokenizer("qwen35", (CORPUS + MARKED) * 20, vocab_size=420)
    tokenizer.add_special_tokens([AddedToken(token, special=True) for token in VISION_TOKENS])  # pyright: ignore[reportUnknownMemberType]  # stub leaves list items open
    eos = "<|im_end|>"
    ids: dict[str, int] = {}
    for token in [eos, *VISION_TOKENS]:
        found = tokenizer.token_to_id(token)
        assert found is not None
        ids[token] = found
    vision = {
        "depth": 2,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_heads": 2,
        "patch_size": 16,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "out_hidden_size": 64,
        "num_position_embeddings": 64,
        "initializer_range": 0.3,
    }
    text = tiny_config(tokenizer.get_vocab_size(), ids[eos])
    config = Qwen3_5Config(
        text_config=text.to_dict(),
        vision_config=vision,
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)  # pyright: ignore[reportUnknownMemberType]  # torch leaves `seed` unannotated
    model = Qwen3_5ForConditionalGeneration(config)
    hf_dir = root / "qwen35-vision-hf"
    hf_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(hf_dir))  # pyright: ignore[reportUnknownMemberType]  # transformers' **kwargs
    write_tokenizer(hf_dir, tokenizer, eos)
    (hf_dir / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR))
    state = {name: tensor.detach().float().numpy() for name, tensor in model.state_dict().items()}
    text_state = {
        "model." + name.removeprefix("model.language_model."): array for name, array in state.items() if name.startswith("model.language_model.")
    }
    folder = root / "qwen35-vision"
    folder.mkdir(parents=True, exist_ok=True)
    text_gguf = folder / "qwen35-vision-text-f32.gguf"
    write_qwen35_gguf(text.to_dict(), tokenizer, text_state, text_gguf, eos)
    projector = folder / "mmproj-qwen35-vision-f32.gguf"  # beside the text GGUF, where pawfn looks for it
    write_projector(vision, state, projector, gguf.GGMLQuantizationType.F32)
    typed: dict[str, Path] = {}
    for qtype in (gguf.GGMLQuantizationType.BF16, gguf.GGMLQuantizationType.F16):
        typed_folder = root / f"qwen35-vision-{qtype.name.lower()}"
        typed_folder.mkdir(parents=True, exist_ok=True)
        text_copy = typed_folder / text_gguf.name
        text_copy.unlink(missing_ok=True)
        text_copy.hardlink_to(text_gguf)
        typed[qtype.name] = typed_folder / f"mmproj-qwen35-vision-{qtype.name.lower()}.gguf"
        write_projector(vision, state, typed[qtype.name], qtype)
    return TinyVision(TinyInterpreter(family="qwen35", hf_dir=hf_dir, gguf_path=text_gguf, eos_token=eos), projector, typed)


_FILE_TYPES = {
    gguf.GGMLQuantizationType.F32: gguf.LlamaFileType.ALL_F32,
    gguf.GGMLQuantizationType.F16: gguf.LlamaFileType.MOSTLY_F16,
    gguf.GGMLQuantizationType.BF16: gguf.LlamaFileType.MOSTLY_BF16,
}


def write_projector(vision: dict[str, int | float], state: dict[str, Array], path: Path, matrices: gguf.GGMLQuantizationType) -> None:
    """The projector GGUF llama.cpp's converter writes (`--mmproj`) for a Qwen3.5 vision tower: architecture clip,
    projector type qwen3vl_merger, the 3-D patch kernel split into its two frames; every matrix (the patch kernels
    too, the position table not) in `matrices`' type, vectors in F32."""
    writer = gguf.GGUFWriter(str(path), "clip")
    writer.add_string("general.type", "mmproj")
    writer.add_file_type(_FILE_TYPES[matrices])

    def add(name: str, array: Array) -> None:
        values = np.ascontiguousarray(array, dtype=np.float32)
        if values.ndim < 2 or name == "v.position_embd.weight" or matrices == gguf.GGMLQuantizationType.F32:
            writer.add_tensor(name, values)
        elif matrices == gguf.GGMLQuantizationType.F16:
            writer.add_tensor(name, values.astype(np.float16))
        else:
            stored = gguf.quants.quantize(values, matrices)
            writer.add_tensor(name, stored, raw_shape=stored.shape, raw_dtype=matrices)

    patch, positions = int(vision["patch_size"]), int(vision["num_position_embeddings"])
    writer.add_bool("clip.has_vision_encoder", True)
    writer.add_uint32("clip.vision.projection_dim", int(vision["out_hidden_size"]))
    writer.add_uint32("clip.vision.image_size", int(positions**0.5 * patch))
    writer.add_uint32("clip.vision.patch_size", patch)
    writer.add_uint32("clip.vision.embedding_length", int(vision["hidden_size"]))
    writer.add_uint32("clip.vision.feed_forward_length", int(vision["intermediate_size"]))
    writer.add_uint32("clip.vision.block_count", int(vision["depth"]))
    writer.add_uint32("clip.vision.attention.head_count", int(vision["num_heads"]))
    writer.add_array("clip.vision.image_mean", IMAGE_MEAN)
    writer.add_array("clip.vision.image_std", IMAGE_STD)
    writer.add_string("clip.projector_type", "qwen3vl_merger")
    writer.add_bool("clip.use_gelu", True)
    writer.add_uint32("clip.vision.spatial_merge_size", int(vision["spatial_merge_size"]))
    writer.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    writer.add_array("clip.vision.is_deepstack_layers", [False] * int(vision["depth"]))
    for name, array in state.items():
        if not name.startswith("model.visual."):
            continue
        inner = name.removeprefix("model.visual.")
        if inner == "patch_embed.proj.weight":
            add("v.patch_embd.weight", array[:, :, 0])
            add("v.patch_embd.weight.1", array[:, :, 1])
            continue
        if inner == "patch_embed.proj.bias":
            target = "v.patch_embd.bias"
        elif inner == "pos_embed.weight":
            target = "v.position_embd.weight"
        elif inner.startswith("blocks."):
            _, block, rest = inner.split(".", 2)
            module, kind = rest.rsplit(".", 1)
            target = f"v.blk.{block}.{_VISION_BLOCK[module]}.{kind}"
        else:
            module, kind = inner.removeprefix("merger.").rsplit(".", 1)
            target = f"{_MERGER[module]}.{kind}"
        add(target, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
