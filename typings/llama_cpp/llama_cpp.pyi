# The ctypes layer (llama_cpp.llama_cpp) where pawfn reads llama.cpp's build and sets model parameters.
import ctypes

class llama_model_params(ctypes.Structure):
    use_extra_bufts: bool

def llama_model_default_params() -> llama_model_params: ...
def llama_print_system_info() -> bytes: ...
