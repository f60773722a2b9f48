"""A program on the LlamaCpp backend: llama.cpp itself (the official runtime), driven the official way.

Needs the `llamacpp` extra (llama-cpp-python). Tokenization uses pawfn's llama.cpp-exact tokenizer (so plain
input and `parse_special_in_input` behave as on Torch); llama.cpp evaluates and samples.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
import time
from collections.abc import Generator
from pathlib import Path
from typing import TYPE_CHECKING

from .backends import ProgramRuntime
from .bundle import ProgramBundle
from .config import PawConfig
from .errors import AdapterError, BaseModelError, ContextOverflowError, PawError, ProgramClosedError
from .generation import Generation, StopReason, Timings
from .ggufio import GGUFFile, GGUFFormatError
from .models import InterpreterModel
from .options import RuntimeOptions
from .prompt import PromptEncoder, budget
from .tokenizer import TextCodec

if TYPE_CHECKING:
    import llama_cpp

__all__ = ["LlamaCppProgram"]

_KV_TYPES = {"float32": 0, "float16": 1, "bfloat16": 30}  # GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16
_NATIVE_STDERR = threading.Lock()


@contextlib.contextmanager
def _quiet_native_stderr() -> Generator[None, None, None]:
    """Silence llama.cpp's C-level logging on fd 2 while it loads (process-wide, so serialized)."""
    with _NATIVE_STDERR:
        saved = os.dup(2)
        try:
            with open(os.devnull, "wb") as devnull:
                os.dup2(devnull.fileno(), 2)
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


class LlamaCppProgram(ProgramRuntime):
    """One program on its own llama.cpp context; the base GGUF is memory-mapped, so the OS shares it."""

    def __init__(
        self,
        llm: llama_cpp.Llama,
        adapter: llama_cpp.llama_adapter_lora_p,
        codec: TextCodec,
        prefix_ids: list[int],
        suffix: str,
        n_ctx: int,
    ) -> None:
        self._llm = llm
        self._adapter = adapter
        self._codec = codec
        self._prefix_ids = prefix_ids
        self._prompt = PromptEncoder(codec, suffix)
        self._n_ctx = n_ctx
        self._lock = threading.Lock()
        self._closed = False

    @classmethod
    def open(cls, model: type[InterpreterModel], bundle: ProgramBundle, base: Path, config: PawConfig) -> LlamaCppProgram:
        """Load the base GGUF, apply the adapter at scale 1 and evaluate the prefix."""
        try:
            import llama_cpp
        except ImportError as exc:
            raise PawError("the LlamaCpp backend needs llama-cpp-python: pip install 'pawfn[llamacpp]'") from exc
        if base.is_dir() or not base.is_file():
            raise BaseModelError(base, "the LlamaCpp backend needs a GGUF file of the base weights")
        try:
            file = GGUFFile(base)
            architecture = file.string("general.architecture")
        except GGUFFormatError as exc:
            raise BaseModelError(base, str(exc)) from exc
        if architecture != model.gguf_architecture:
            raise BaseModelError(base, f"GGUF architecture is {architecture!r}, but {model.__name__} needs {model.gguf_architecture!r}")
        codec = TextCodec.from_gguf(file)
        n_ctx = config.n_ctx if model.max_context is None else min(config.n_ctx, model.max_context)
        kv_type = _KV_TYPES[config.dtype]
        with _quiet_native_stderr():
            llm = llama_cpp.Llama(
                model_path=str(base), n_ctx=n_ctx, n_gpu_layers=0 if config.device == "cpu" else -1,
                type_k=kv_type, type_v=kv_type, n_threads=config.threads, verbose=False,
            )
            adapter = llama_cpp.llama_adapter_lora_init(llm.model, str(bundle.adapter_path).encode())
        if adapter is None:
            llm.close()
            raise AdapterError(bundle.adapter_path, "llama.cpp could not load this LoRA adapter")
        adapters = (llama_cpp.llama_adapter_lora_p_ctypes * 1)(adapter)
        scales = (ctypes.c_float * 1)(1.0)
        if llama_cpp.llama_set_adapters_lora(llm.ctx, adapters, 1, scales):
            llama_cpp.llama_adapter_lora_free(adapter)
            llm.close()
            raise AdapterError(bundle.adapter_path, "llama.cpp could not apply this LoRA adapter")
        prefix_ids = codec.encode(bundle.template.prefix, parse_special=True)
        if len(prefix_ids) >= n_ctx:
            raise ContextOverflowError(len(prefix_ids), 0, n_ctx)
        if prefix_ids:
            llm.eval(prefix_ids)
        return cls(llm, adapter, codec, prefix_ids, bundle.template.suffix, n_ctx)

    @property
    def n_ctx(self) -> int:
        return self._n_ctx

    @property
    def prefix_tokens(self) -> int:
        return len(self._prefix_ids)

    def encode_prompt(self, text: str, options: RuntimeOptions) -> list[int]:
        return self._prompt.encode(text, options)

    def generate(self, text: str, options: RuntimeOptions) -> Generation:
        started = time.perf_counter()
        prompt_ids = self.encode_prompt(text, options)
        n_prefix = len(self._prefix_ids)
        allowed = budget(n_prefix, len(prompt_ids), self._n_ctx, options)
        limit = allowed.limit
        stop: StopReason = allowed.exhausted_reason
        output: list[int] = []
        tokenized = prompt_done = time.perf_counter()
        with self._lock:
            if self._closed:
                raise ProgramClosedError("this program was closed; load it again to run it")
            llm = self._llm
            if limit > 0:
                if prompt_ids:
                    llm.n_tokens = n_prefix  # rewind to the cached prefix; eval trims the KV cache past it
                    llm.eval(prompt_ids)
                elif n_prefix:
                    llm.n_tokens = n_prefix - 1  # re-evaluate the prefix's last token for fresh logits
                    llm.eval(self._prefix_ids[-1:])
                else:
                    raise PawError("the program's template and the input are both empty: there is nothing to continue")
                prompt_done = time.perf_counter()
                if options.seed is not None:
                    llm.set_seed(options.seed)
                for step in range(limit):
                    if options.temperature == 0.0:
                        token = llm.sample(temp=0.0)
                    else:
                        token = llm.sample(temp=options.temperature, top_p=options.top_p, top_k=0, min_p=0.0)
                    if token == self._codec.eos_id:
                        stop = "eos"
                        break
                    output.append(token)
                    if step + 1 < limit:
                        llm.eval([token])
        finished = time.perf_counter()
        return Generation(
            text=self._codec.decode(output).strip(),
            token_ids=tuple(output),
            prefix_tokens=n_prefix,
            prompt_tokens=len(prompt_ids),
            stop_reason=stop,
            timings=Timings(
                tokenize_ms=(tokenized - started) * 1e3,
                prompt_ms=(prompt_done - tokenized) * 1e3,
                generate_ms=(finished - prompt_done) * 1e3,
                total_ms=(finished - started) * 1e3,
            ),
        )

    def close(self) -> None:
        import llama_cpp

        with self._lock:
            if self._closed:
                return
            self._closed = True
            llama_cpp.llama_set_adapters_lora(self._llm.ctx, None, 0, None)
            llama_cpp.llama_adapter_lora_free(self._adapter)
            self._llm.close()
