"""Interpreter-model types: each class carries the architecture facts of one frozen interpreter."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import ClassVar

from pydantic import BaseModel, ConfigDict

__all__ = ["GPT2", "InterpreterModel", "Qwen3_0_6B", "WeightFile", "builtin_models", "model_for_interpreter"]


class WeightFile(BaseModel):
    """A pinned base-weight file on a hub: repo, file name, size (bytes) and sha256."""

    model_config = ConfigDict(frozen=True)

    repo: str
    file: str
    size_bytes: int | None = None
    sha256: str | None = None

    @property
    def url(self) -> str:
        """The Hugging Face download URL of the file."""
        return f"https://huggingface.co/{self.repo}/resolve/main/{self.file}"


class InterpreterModel:
    """Base of interpreter-model types; subclass a built-in one to point at a private mirror.

    The class is a type-level marker: it is never instantiated, its class variables carry the facts.
    """

    interpreter_id: ClassVar[str]
    """The interpreter name programs record in `meta.json` (e.g. ``"Qwen/Qwen3-0.6B"``)."""
    interpreter_aliases: ClassVar[frozenset[str]] = frozenset()
    """Other names that denote the same interpreter."""
    family: ClassVar[str]
    """Which forward pass the interpreter uses: a module of `pawfn.torch.families` (``qwen3``, ``gpt2``)."""
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
    base_template: ClassVar[str] = "{INPUT_PLACEHOLDER}"
    """The official runtime's prompt for the bare interpreter (its base-inference contract, version 1)."""
    """Positions come from a learned table, so a checkpoint's trained length also bounds the context."""

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


def builtin_models() -> tuple[type[InterpreterModel], ...]:
    """The interpreter models pawfn ships, in lookup order."""
    return (Qwen3_0_6B, GPT2)


def model_for_interpreter(interpreter: str) -> type[InterpreterModel] | None:
    """The built-in model type that runs programs compiled for `interpreter`, if any."""
    for model in builtin_models():
        if model.accepts(interpreter):
            return model
    return None
