"""Interpreter-model types: each class carries the architecture facts of one frozen interpreter."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import ClassVar

from pydantic import BaseModel, ConfigDict

__all__ = ["GPT2", "InterpreterModel", "Qwen3_0_6B", "Qwen3_5_0_8B", "WeightFile", "builtin_models", "model_for_interpreter"]


class WeightFile(BaseModel):
    """A pinned base-weight file on a hub: repo, file name, size (bytes) and sha256."""

    model_config = ConfigDict(frozen=True)

    repo: str
    file: str
    size_bytes: int | None = None
    sha256: str | None = None
    revision: str = "main"
    """The repo's branch or commit the file is read from (the official runtimes pin some by commit)."""

    @property
    def url(self) -> str:
        """The Hugging Face download URL of the file."""
        return f"https://huggingface.co/{self.repo}/resolve/{self.revision}/{self.file}"


class InterpreterModel:
    """Base of interpreter-model types; subclass a built-in one to point at a private mirror.

    The class is a type-level marker: it is never instantiated, its class variables carry the facts.
    """

    interpreter_id: ClassVar[str]
    """The interpreter name programs record in `meta.json` (e.g. ``"Qwen/Qwen3-0.6B"``)."""
    interpreter_aliases: ClassVar[frozenset[str]] = frozenset()
    """Other names that denote the same interpreter."""
    family: ClassVar[str]
    """Which forward pass the interpreter uses: a module of `pawfn.torch.model.families` (``qwen3``, ``gpt2``)."""
    gguf_architecture: ClassVar[str]
    """`general.architecture` of its GGUF files."""
    hf_model_type: ClassVar[str]
    """`model_type` of its Hugging Face `config.json`."""
    runtime_id: ClassVar[str]
    """The official runtime id (base GGUF quantization) of the interpreter."""
    default_gguf: ClassVar[WeightFile]
    """The official runtime's base GGUF."""
    default_hf_repo: ClassVar[str]
    """The Hugging Face safetensors repo of the same weights."""
    transformers_model_class: ClassVar[str]
    """Name of the `transformers` causal-LM class for this architecture."""
    transformers_config_class: ClassVar[str]
    """Name of the `transformers` config class for this architecture."""
    lora_module_map: ClassVar[Mapping[str, str]]
    """GGUF LoRA module name (e.g. ``attn_q``) to `transformers` module path inside a block."""
    conv1d_modules: ClassVar[frozenset[str]] = frozenset()
    """GGUF modules stored as `transformers` Conv1D (weight `[in, out]`) in HF checkpoints."""
    eos_token: ClassVar[str]
    """End-of-sequence token text, used when the weights do not name one."""
    max_context: ClassVar[int | None]
    """Hard position limit of the architecture in tokens (None: bounded by n_ctx only)."""
    learned_positions: ClassVar[bool] = False
    """Positions come from a learned table, so a checkpoint's trained length also bounds the context."""
    base_template: ClassVar[str] = "{INPUT_PLACEHOLDER}"
    """The official runtime's prompt for the bare interpreter (its base-inference contract, version 1)."""
    default_n_ctx: ClassVar[int] = 2048
    """The official runtime's context size for this interpreter (tokens)."""
    default_projector: ClassVar[WeightFile | None] = None
    """The official vision runtime's image projector GGUF (None: the interpreter takes no images)."""
    image_tokens: ClassVar[tuple[int, int] | None] = None
    """The vision runtime's bounds on one image's tokens (min, max)."""
    image_delimiters: ClassVar[tuple[str, str]] = ("", "")
    """Control-token texts mtmd puts before and after an image's embeddings."""
    whole_prompt: ClassVar[bool] = False
    """The official runtime tokenizes each call's rendered prompt whole (its vision runtime) rather than the
    template's prefix once and the input with the suffix per call."""

    def __init__(self) -> None:
        raise TypeError(f"{type(self).__name__} is a type marker; use it as PawFn[{type(self).__name__}, ...]")

    @classmethod
    def accepts(cls, interpreter: str) -> bool:
        """Whether a program compiled for `interpreter` runs on this model."""
        return interpreter == cls.interpreter_id or interpreter in cls.interpreter_aliases


class Qwen3_0_6B(InterpreterModel):  # noqa: N801 - the name mirrors the model's own spelling
    """Qwen3-0.6B: 28 layers, hidden 1024, GQA 16/8 heads of 128, tied embeddings."""

    interpreter_id = "Qwen/Qwen3-0.6B"
    interpreter_aliases = frozenset({"qwen3-0.6b", "Qwen3-0.6B"})
    family = "qwen3"
    gguf_architecture = "qwen3"
    hf_model_type = "qwen3"
    runtime_id = "qwen3-0.6b-q6_k"
    default_gguf = WeightFile(
        repo="programasweights/Qwen3-0.6B-GGUF-Q6_K",
        file="qwen3-0.6b-q6_k.gguf",
        size_bytes=622733120,
        sha256="9a16ed5cacba959e63b62e2b6840c3eca2b51c3c3e51d31367ef8e4aafeae33c",
    )
    default_hf_repo = "Qwen/Qwen3-0.6B"
    transformers_model_class = "Qwen3ForCausalLM"
    transformers_config_class = "Qwen3Config"
    lora_module_map = MappingProxyType(
        {
            "attn_q": "self_attn.q_proj",
            "attn_k": "self_attn.k_proj",
            "attn_v": "self_attn.v_proj",
            "attn_output": "self_attn.o_proj",
            "ffn_gate": "mlp.gate_proj",
            "ffn_up": "mlp.up_proj",
            "ffn_down": "mlp.down_proj",
        }
    )
    eos_token = "<|im_end|>"
    # one raw user message as Qwen3's chat template renders it (add_generation_prompt, thinking off)
    base_template = "<|im_start|>user\n{INPUT_PLACEHOLDER}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    max_context = None


class GPT2(InterpreterModel):
    """GPT-2 124M: 12 layers, hidden 768, learned positions (at most 1024)."""

    interpreter_id = "gpt2"
    interpreter_aliases = frozenset({"openai-community/gpt2", "GPT2", "gpt-2"})
    family = "gpt2"
    gguf_architecture = "gpt2"
    hf_model_type = "gpt2"
    runtime_id = "gpt2-q8_0"
    default_gguf = WeightFile(
        repo="programasweights/GPT2-GGUF-Q8_0",
        file="gpt2-q8_0.gguf",
        size_bytes=139804832,
        sha256="0aa260efb2cce9def922e0546b88ad731cf1a68554db73fa2d4a0949cfa958c5",
    )
    default_hf_repo = "openai-community/gpt2"
    transformers_model_class = "GPT2LMHeadModel"
    transformers_config_class = "GPT2Config"
    lora_module_map = MappingProxyType({"attn_qkv": "attn.c_attn", "attn_output": "attn.c_proj", "ffn_up": "mlp.c_fc", "ffn_down": "mlp.c_proj"})
    conv1d_modules = frozenset({"attn_qkv", "attn_output", "ffn_up", "ffn_down"})
    eos_token = "<|endoftext|>"
    max_context = 1024
    learned_positions = True


class Qwen3_5_0_8B(InterpreterModel):  # noqa: N801 - the name mirrors the model's own spelling
    """Qwen3.5-0.8B: 24 layers (Gated DeltaNet, full attention every fourth), hidden 1024, tied embeddings; text
    (its images are not run yet)."""

    interpreter_id = "Qwen/Qwen3.5-0.8B"
    interpreter_aliases = frozenset({"qwen3.5-0.8b", "Qwen3.5-0.8B"})
    family = "qwen35"
    gguf_architecture = "qwen35"
    hf_model_type = "qwen3_5_text"
    runtime_id = "qwen3.5-0.8b-q8_0"
    default_gguf = WeightFile(
        repo="ggml-org/Qwen3.5-0.8B-GGUF",
        file="Qwen3.5-0.8B-Q8_0.gguf",
        size_bytes=833592096,
        sha256="37ae482d336108d23516fa35e8e0c4126688d81018b87178a18d752a1357814f",
        revision="8fea620810c4afa23dd6443f999a48574c1611a3",
    )
    default_hf_repo = "Qwen/Qwen3.5-0.8B"
    transformers_model_class = "Qwen3_5ForCausalLM"
    transformers_config_class = "Qwen3_5TextConfig"
    lora_module_map = MappingProxyType(
        {
            "attn_q": "self_attn.q_proj",
            "attn_k": "self_attn.k_proj",
            "attn_v": "self_attn.v_proj",
            "attn_output": "self_attn.o_proj",
            "attn_qkv": "linear_attn.in_proj_qkv",
            "attn_gate": "linear_attn.in_proj_z",
            "ssm_alpha": "linear_attn.in_proj_a",
            "ssm_beta": "linear_attn.in_proj_b",
            "ssm_out": "linear_attn.out_proj",
            "ffn_gate": "mlp.gate_proj",
            "ffn_up": "mlp.up_proj",
            "ffn_down": "mlp.down_proj",
        }
    )
    eos_token = "<|im_end|>"
    default_projector = WeightFile(
        repo="unsloth/Qwen3.5-0.8B-GGUF",
        file="mmproj-BF16.gguf",
        size_bytes=207346528,
        sha256="d312c4d02fd46eea7a16e4f3bbb58840e6222209322ca1e33ca03247ad8935d6",
        revision="6ab461498e2023f6e3c1baea90a8f0fe38ab64d0",
    )
    image_tokens = (1, 512)
    image_delimiters = ("<|vision_start|>", "<|vision_end|>")
    base_template = "{INPUT_0}"  # the official vision runtime's base contract: the caller's whole prompt
    default_n_ctx = 4096
    whole_prompt = True
    max_context = None


def builtin_models() -> tuple[type[InterpreterModel], ...]:
    """The interpreter models pawfn ships, in lookup order."""
    return (Qwen3_0_6B, GPT2, Qwen3_5_0_8B)


def model_for_interpreter(interpreter: str) -> type[InterpreterModel] | None:
    """The built-in model type that runs programs compiled for `interpreter`, if any."""
    for model in builtin_models():
        if model.accepts(interpreter):
            return model
    return None
