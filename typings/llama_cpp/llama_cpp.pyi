# The ctypes layer (llama_cpp.llama_cpp) where pawfn reads llama.cpp's build and sets model parameters.
import ctypes

class llama_model_params(ctypes.Structure):
    n_gpu_layers: int
    split_mode: int
    main_gpu: int
    vocab_only: bool
    load_mode: int
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
    rope_scaling_type: int
    pooling_type: int
    attention_type: int
    rope_freq_base: float
    rope_freq_scale: float
    yarn_ext_factor: float
    yarn_attn_factor: float
    yarn_beta_fast: float
    yarn_beta_slow: float
    yarn_orig_ctx: int
    embeddings: bool
    no_perf: bool

def llama_model_default_params() -> llama_model_params: ...
def llama_context_default_params() -> llama_context_params: ...
def llama_print_system_info() -> bytes: ...
