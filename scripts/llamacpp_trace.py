"""Every intermediate tensor llama.cpp computes for one call of a program, driven as the official SDK drives it
(llama-cpp-python's defaults: f16 KV cache, no flash attention; with ``--whole``, as its vision runtime drives
Qwen3.5: the whole rendered prompt at once, flash attention, batches of 128), saved to an .npz for comparing op by op.

For the official-numerics work (issue 19): which op first departs from pawfn's arithmetic. llama.cpp names its
graph's tensors per layer (``attn_norm-0``, ``Qcur-0``, ``kq-0``, ``kq_soft_max-0``, ``kqv_out-0``, ``ffn_out-0``,
``result_output`` ...); each evaluation of the graph (0: the prefix, 1: the input) adds its own copies under
``<eval>/<order> <name>``, in the order computed. Only float32 tensors are kept (the f16 caches and quantized weights are inputs, not results).

    python scripts/llamacpp_trace.py --program DIR --base BASE.gguf --input TEXT --out trace.npz [--kv f16|f32] [--no-repack] [--steps N] [--whole]
"""

from __future__ import annotations

import argparse
import ctypes
import sys
from pathlib import Path

import numpy as np
import numpy.typing as npt

GGML_TYPE_F32 = 0
PLACEHOLDER = "{INPUT_PLACEHOLDER}"


class GgmlTensor(ctypes.Structure):
    """`struct ggml_tensor` of ggml/include/ggml.h (GGML_MAX_DIMS 4, GGML_MAX_OP_PARAMS 64, GGML_MAX_SRC 10,
    GGML_MAX_NAME 64), as far as `name` and the data: what this script reads."""

    _fields_ = [
        ("type", ctypes.c_int),
        ("buffer", ctypes.c_void_p),
        ("ne", ctypes.c_int64 * 4),
        ("nb", ctypes.c_size_t * 4),
        ("op", ctypes.c_int),
        ("op_params", ctypes.c_int32 * 16),
        ("flags", ctypes.c_int32),
        ("src", ctypes.c_void_p * 10),
        ("view_src", ctypes.c_void_p),
        ("view_offs", ctypes.c_size_t),
        ("data", ctypes.c_void_p),
        ("name", ctypes.c_char * 64),
    ]


def _read(tensor: GgmlTensor) -> npt.NDArray[np.float32]:
    """A copy of a float32 tensor's values, shaped as numpy sees ggml's (ne reversed), strides honoured."""
    shape = tuple(int(n) for n in reversed(tensor.ne))
    strides = tuple(int(s) for s in reversed(tensor.nb))
    extent = sum((n - 1) * s for n, s in zip(shape, strides, strict=True)) + 4
    raw = (ctypes.c_char * extent).from_address(int(tensor.data))
    view = np.lib.stride_tricks.as_strided(np.frombuffer(raw, dtype=np.float32), shape=shape, strides=strides)
    return np.array(view, dtype=np.float32)


def trace(
    program: Path, base: Path, text: str, kv: str, repack: bool = True, steps: int = 0, whole: bool = False, threads: int = 1
) -> dict[str, npt.NDArray[np.float32]]:
    import llama_cpp
    from llama_cpp import llama_cpp as native

    captured: dict[str, npt.NDArray[np.float32]] = {}
    evaluation = [0]

    @native.ggml_backend_sched_eval_callback
    def observe(pointer: int, ask: bool, _user: int) -> bool:
        tensor = ctypes.cast(pointer, ctypes.POINTER(GgmlTensor)).contents
        if ask:
            return tensor.type == GGML_TYPE_F32
        if tensor.data:  # keys keep the graph's order: a name may repeat (each rms_norm is "norm-N" at first)
            captured[f"{evaluation[0]}/{len(captured):04d} {tensor.name.decode()}"] = _read(tensor)
        return True

    defaults = native.llama_context_default_params

    def with_callback() -> native.llama_context_params:
        params = defaults()
        params.cb_eval = observe
        return params

    model_defaults = native.llama_model_default_params

    def with_repack() -> native.llama_model_params:
        params = model_defaults()
        params.use_extra_bufts = repack  # repacked weights run other kernels (other summation orders)
        return params

    native.llama_context_default_params = with_callback
    native.llama_model_default_params = with_repack
    try:
        kv_type = {"f16": 1, "f32": 0}[kv]
        llm = llama_cpp.Llama(
            model_path=str(base),
            lora_path=str(program / "adapter.gguf"),
            n_ctx=2048,
            n_threads=threads,
            n_threads_batch=threads,
            type_k=kv_type,
            type_v=kv_type,
            verbose=False,
            n_batch=128 if whole else 512,
            flash_attn=whole,
        )
    finally:
        native.llama_context_default_params = defaults
        native.llama_model_default_params = model_defaults
    template = (program / "prompt_template.txt").read_text(encoding="utf-8")
    prefix, suffix = template.split(PLACEHOLDER)
    if whole:
        llm.eval(llm.tokenize((prefix + text + suffix).encode(), add_bos=False, special=True))
    else:
        llm.eval(llm.tokenize(prefix.encode(), add_bos=False, special=True))
        evaluation[0] = 1
        llm.eval(llm.tokenize((text + suffix).encode(), add_bos=False, special=True))
    first_step = evaluation[0] + 1
    for step in range(steps):  # greedy decode steps, each its own evaluation
        logits = next(v for k, v in reversed(captured.items()) if k.endswith(" result_output"))
        evaluation[0] = first_step + step
        llm.eval([int(np.argmax(logits.reshape(-1, logits.shape[-1])[-1]))])
    llm.close()
    return captured


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--program", type=Path, required=True, help="a bundle folder")
    parser.add_argument("--base", type=Path, required=True)
    parser.add_argument("--input", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--kv", choices=("f16", "f32"), default="f16", help="KV cache type (default: f16, the official)")
    parser.add_argument("--steps", type=int, default=0, help="greedy decode steps to trace after the input (evaluations 2, 3 ...)")
    parser.add_argument("--no-repack", action="store_true", help="load without llama.cpp's extra buffer types (--no-repack)")
    parser.add_argument("--whole", action="store_true", help="the vision runtime's way (Qwen3.5): whole prompt, flash attention")
    parser.add_argument("--threads", type=int, default=1, help="llama.cpp's threads (the vision runtime's: 2)")
    args = parser.parse_args()
    captured = trace(args.program, args.base, args.input, args.kv, not args.no_repack, args.steps, args.whole, args.threads)
    np.savez(args.out, **captured)
    print(f"{len(captured)} tensors -> {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
