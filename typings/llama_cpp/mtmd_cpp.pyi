# The part of llama-cpp-python's mtmd bindings (llama.cpp's multimodal library) that pawfn uses.
import ctypes

from . import llama_context_p, llama_model_p

mtmd_context_p = ctypes.c_void_p
mtmd_bitmap_p = ctypes.c_void_p
mtmd_bitmap_p_ctypes = ctypes.c_void_p
mtmd_input_chunks_p = ctypes.c_void_p
mtmd_input_chunk_p = ctypes.c_void_p
MTMD_INPUT_CHUNK_TYPE_TEXT: int
MTMD_INPUT_CHUNK_TYPE_IMAGE: int

class mtmd_context_params(ctypes.Structure):
    use_gpu: bool
    print_timings: bool
    n_threads: int
    image_min_tokens: int
    image_max_tokens: int
    flash_attn_type: int

class mtmd_input_text(ctypes.Structure):
    text: bytes
    text_len: int
    add_special: bool
    parse_special: bool

def mtmd_default_marker() -> bytes: ...
def mtmd_context_params_default() -> mtmd_context_params: ...
def mtmd_init_from_file(mmproj_fname: bytes, text_model: llama_model_p, ctx_params: mtmd_context_params, /) -> mtmd_context_p | None: ...
def mtmd_free(ctx: mtmd_context_p, /) -> None: ...
def mtmd_support_vision(ctx: mtmd_context_p, /) -> bool: ...
def mtmd_helper_bitmap_init_from_buf(
    ctx: mtmd_context_p, buf: ctypes.Array[ctypes.c_uint8], length: int, placeholder: bool, /
) -> mtmd_bitmap_p | None: ...
def mtmd_bitmap_free(bitmap: mtmd_bitmap_p, /) -> None: ...
def mtmd_input_chunks_init() -> mtmd_input_chunks_p | None: ...
def mtmd_input_chunks_free(chunks: mtmd_input_chunks_p, /) -> None: ...
def mtmd_input_chunks_size(chunks: mtmd_input_chunks_p, /) -> int: ...
def mtmd_input_chunks_get(chunks: mtmd_input_chunks_p, index: int, /) -> mtmd_input_chunk_p: ...
def mtmd_input_chunk_get_type(chunk: mtmd_input_chunk_p, /) -> int: ...
def mtmd_input_chunk_get_n_tokens(chunk: mtmd_input_chunk_p, /) -> int: ...
def mtmd_input_chunk_get_tokens_text(chunk: mtmd_input_chunk_p, n_tokens_output: ctypes._CArgObject, /) -> ctypes._Pointer[ctypes.c_int]: ...
def mtmd_tokenize(
    ctx: mtmd_context_p, output: mtmd_input_chunks_p, text: ctypes._CArgObject, bitmaps: ctypes.Array[ctypes.c_void_p], n_bitmaps: int, /
) -> int: ...
def mtmd_helper_eval_chunk_single(
    ctx: mtmd_context_p,
    lctx: llama_context_p,
    chunk: mtmd_input_chunk_p,
    n_past: ctypes.c_int,
    seq_id: ctypes.c_int,
    n_batch: int,
    logits_last: bool,
    new_n_past: ctypes._CArgObject,
    /,
) -> int: ...
