# Typed surface of llama-cpp-python that pawfn (the LlamaCpp backend and the parity tests) uses.
# Checking against this stub keeps strict mode independent of whether the optional extra is installed.
import ctypes
from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from .llama_cpp import llama_context_params as llama_context_params
from .llama_cpp import llama_model_default_params as llama_model_default_params
from .llama_cpp import llama_model_params as llama_model_params
from .llama_cpp import llama_print_system_info as llama_print_system_info

class llama_adapter_lora(ctypes.Structure): ...

llama_adapter_lora_p = ctypes.c_void_p
llama_adapter_lora_p_ctypes = ctypes.c_void_p
llama_model_p = ctypes.c_void_p
llama_vocab_p = ctypes.c_void_p
llama_context_p = ctypes.c_void_p
llama_memory_t = ctypes.c_void_p

llama_pos = ctypes.c_int
llama_seq_id = ctypes.c_int
LLAMA_FLASH_ATTN_TYPE_ENABLED: int

class Llama:
    n_tokens: int
    n_batch: int
    model_params: llama_model_params
    context_params: llama_context_params
    scores: npt.NDArray[np.single]
    input_ids: npt.NDArray[np.intc]
    def __init__(
        self,
        model_path: str,
        *,
        n_gpu_layers: int = 0,
        vocab_only: bool = False,
        seed: int = ...,
        n_ctx: int = 512,
        n_threads: int | None = None,
        n_threads_batch: int | None = None,
        logits_all: bool = False,
        lora_path: str | None = None,
        lora_scale: float = 1.0,
        type_k: int | None = None,
        type_v: int | None = None,
        n_batch: int = 512,
        flash_attn: bool = False,
        verbose: bool = True,
    ) -> None: ...
    @property
    def model(self) -> llama_model_p: ...
    @property
    def ctx(self) -> llama_context_p: ...
    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = False) -> list[int]: ...
    def detokenize(self, tokens: list[int], prev_tokens: list[int] | None = None, special: bool = False) -> bytes: ...
    def eval(self, tokens: Sequence[int]) -> None: ...
    def sample(
        self,
        top_k: int = 40,
        top_p: float = 0.95,
        min_p: float = 0.05,
        typical_p: float = 1.0,
        temp: float = 0.80,
        repeat_penalty: float = 1.0,
        logits_processor: list[Callable[[npt.NDArray[np.intc], npt.NDArray[np.single]], npt.NDArray[np.single]]] | None = None,
    ) -> int: ...
    def set_seed(self, seed: int) -> None: ...
    def token_eos(self) -> int: ...
    def n_vocab(self) -> int: ...
    def n_ctx(self) -> int: ...
    def reset(self) -> None: ...
    def close(self) -> None: ...

def llama_model_is_recurrent(model: llama_model_p, /) -> bool: ...
def llama_model_get_vocab(model: llama_model_p, /) -> llama_vocab_p: ...
def llama_vocab_n_tokens(vocab: llama_vocab_p, /) -> int: ...
def llama_token_to_piece(vocab: llama_vocab_p, token: int, buf: ctypes.Array[ctypes.c_char], length: int, lstrip: int, special: bool, /) -> int: ...
def llama_model_is_hybrid(model: llama_model_p, /) -> bool: ...
def llama_get_memory(ctx: llama_context_p, /) -> llama_memory_t | None: ...
def llama_memory_clear(mem: llama_memory_t | None, data: bool, /) -> None: ...
def llama_adapter_lora_init(model: llama_model_p, path_lora: bytes, /) -> llama_adapter_lora_p | None: ...
def llama_adapter_lora_free(adapter: llama_adapter_lora_p, /) -> None: ...
def llama_set_adapters_lora(
    ctx: llama_context_p,
    adapters: ctypes.Array[ctypes.c_void_p] | None,
    n_adapters: int,
    scales: ctypes.Array[ctypes.c_float] | None,
    /,
) -> int: ...

class llama_model_quantize_params(ctypes.Structure):
    ftype: int
    nthread: int

LLAMA_FTYPE_MOSTLY_Q8_0: int
LLAMA_FTYPE_MOSTLY_Q6_K: int

def llama_model_quantize_default_params() -> llama_model_quantize_params: ...
def llama_model_quantize(
    fname_inp: bytes, fname_out: bytes, params: ctypes._Pointer[llama_model_quantize_params] | ctypes._CArgObject, /
) -> int: ...

def llama_get_logits_ith(ctx: llama_context_p, i: int, /) -> ctypes._Pointer[ctypes.c_float]: ...

_LogCallbackT = TypeVar("_LogCallbackT", bound=Callable[[int, bytes, ctypes.c_void_p | None], None])

def llama_log_callback(function: _LogCallbackT, /) -> _LogCallbackT: ...
def llama_log_set(log_callback: Callable[[int, bytes, ctypes.c_void_p | None], None] | None, user_data: ctypes.c_void_p | None, /) -> None: ...
