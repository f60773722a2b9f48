# The ctypes layer (llama_cpp.llama_cpp) where pawfn reads llama.cpp's build and sets model parameters.
import ctypes

class llama_model_params(ctypes.Structure):
    use_extra_bufts: bool

class llama_context_params(ctypes.Structure):
    n_ctx: int
    n_batch: int
    n_ubatch: int
    n_seq_max: int
    n_threads: int
    n_threads_batch: int
    flash_attn_type: int
    type_k: int
    type_v: int
    offload_kqv: bool

def llama_model_default_params() -> llama_model_params: ...
def llama_print_system_info() -> bytes: ...
