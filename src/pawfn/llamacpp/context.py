"""llama.cpp's model and one context on it, on llama-cpp-python's low-level API: configured as `Llama(...)`
configures them (so the official SDK's numbers), with the model parameters pawfn needs (weight repacking) set
directly rather than through `Llama`, and the context's position kept here (rewinding to a cached prefix, images)."""

from __future__ import annotations

import contextlib
import functools
import multiprocessing
from collections.abc import Callable, Sequence
from concurrent.futures import CancelledError
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

import numpy as np
from numpy.typing import NDArray

from ..core.errors import BaseModelError, PawError

if TYPE_CHECKING:
    import llama_cpp

__all__ = ["LlamaSettings", "NativeContext"]


class LlamaSettings(TypedDict, total=False):
    """`Llama`'s keyword arguments that pawfn sets beside the model path, `n_ctx`, `n_gpu_layers` and `verbose`."""

    n_batch: int
    n_threads: int
    n_threads_batch: int
    flash_attn: bool
    type_k: int
    type_v: int


_LLAMA_BATCH = 512
"""`Llama`'s default `n_batch` and `n_ubatch`."""


@functools.cache
def _backend() -> None:
    """llama.cpp's process-wide set-up, once (as `Llama` does before its first model)."""
    import llama_cpp

    llama_cpp.llama_backend_init()


def model_parameters(n_gpu_layers: int, use_extra_bufts: bool) -> llama_cpp.llama_model_params:
    """`Llama`'s model parameters (its defaults: layer split, memory-mapped, no lock) with `use_extra_bufts`, which
    `Llama` does not take: whether llama.cpp may repack the weights for its CPU kernels."""
    import llama_cpp

    params = llama_cpp.llama_model_default_params()
    params.n_gpu_layers = 0x7FFFFFFF if n_gpu_layers == -1 else n_gpu_layers  # Llama's "all layers"
    params.split_mode = llama_cpp.LLAMA_SPLIT_MODE_LAYER
    params.main_gpu = 0
    params.vocab_only = False
    params.load_mode = llama_cpp.LLAMA_LOAD_MODE_MMAP
    params.use_extra_bufts = use_extra_bufts
    return params


def context_parameters(n_ctx: int, settings: LlamaSettings) -> llama_cpp.llama_context_params:
    """`Llama(n_ctx=n_ctx, **settings)`'s context parameters, field for field (its defaults for the rest: batches of
    512, half the cores for one token and all for a batch, no flash attention, an f16 cache)."""
    import llama_cpp

    params = llama_cpp.llama_context_default_params()
    n_batch = min(n_ctx, settings.get("n_batch", _LLAMA_BATCH))
    params.n_ctx = n_ctx
    params.n_batch = n_batch
    params.n_ubatch = min(n_batch, _LLAMA_BATCH)
    params.n_threads = settings.get("n_threads") or max(multiprocessing.cpu_count() // 2, 1)
    params.n_threads_batch = settings.get("n_threads_batch") or multiprocessing.cpu_count()
    params.rope_scaling_type = llama_cpp.LLAMA_ROPE_SCALING_TYPE_UNSPECIFIED
    params.pooling_type = llama_cpp.LLAMA_POOLING_TYPE_UNSPECIFIED
    params.attention_type = llama_cpp.LLAMA_ATTENTION_TYPE_UNSPECIFIED
    params.rope_freq_base = 0.0
    params.rope_freq_scale = 0.0
    params.yarn_ext_factor = -1.0
    params.yarn_attn_factor = 1.0
    params.yarn_beta_fast = 32.0
    params.yarn_beta_slow = 1.0
    params.yarn_orig_ctx = 0
    params.embeddings = False
    params.offload_kqv = True
    flash = settings.get("flash_attn", False)
    params.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
    if "type_k" in settings:
        params.type_k = settings["type_k"]
    if "type_v" in settings:
        params.type_v = settings["type_v"]
    params.no_perf = False
    return params


class NativeContext:
    """A base GGUF loaded by llama.cpp and one context on it (freed with `resources`); `n_tokens` is the position the
    next evaluation starts at, and `tokens` what the context holds before it (0 where an image's embeddings went)."""

    def __init__(
        self, path: Path, n_ctx: int, n_gpu_layers: int, settings: LlamaSettings, use_extra_bufts: bool, resources: contextlib.ExitStack
    ) -> None:
        import llama_cpp

        _backend()
        self.model_params = model_parameters(n_gpu_layers, use_extra_bufts)
        model = llama_cpp.llama_model_load_from_file(str(path).encode(), self.model_params)
        if not model:
            raise BaseModelError(path, "llama.cpp could not load this GGUF")
        resources.callback(llama_cpp.llama_model_free, model)
        self.model = model
        self.context_params = context_parameters(n_ctx, settings)
        context = llama_cpp.llama_init_from_model(model, self.context_params)
        if not context:
            raise BaseModelError(path, f"llama.cpp could not make a context of {n_ctx} tokens on this GGUF")
        resources.callback(llama_cpp.llama_free, context)
        self.ctx = context
        self.n_batch = int(self.context_params.n_batch)
        self._batch = llama_cpp.llama_batch_init(self.n_batch, 0, n_ctx)
        resources.callback(llama_cpp.llama_batch_free, self._batch)
        batch = self._batch
        if not (batch.token and batch.pos and batch.n_seq_id and batch.seq_id and batch.logits):  # malloc's NULLs, unchecked in C
            raise PawError(f"llama.cpp could not allocate a batch of {self.n_batch} tokens (out of memory)")
        vocab = llama_cpp.llama_model_get_vocab(model)
        if not vocab:
            raise BaseModelError(path, "llama.cpp found no vocabulary in this GGUF")
        self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(vocab))
        self._memory = llama_cpp.llama_get_memory(context)
        if not self._memory:
            raise PawError("llama.cpp gave the context no memory (KV cache)")
        self.recurrent = bool(llama_cpp.llama_model_is_recurrent(model) or llama_cpp.llama_model_is_hybrid(model))
        """Whether the model keeps recurrent states, which cannot go back to an earlier position."""
        self.n_tokens = 0
        self.tokens: list[int] = []

    @property
    def n_ctx(self) -> int:
        """The context's size in tokens."""
        import llama_cpp

        return int(llama_cpp.llama_n_ctx(self.ctx))

    def eval(self, tokens: Sequence[int], stop: Callable[[], bool] = lambda: False) -> None:
        """Evaluate `tokens` from `n_tokens` on, as `Llama.eval` does: the cache past `n_tokens` dropped, then batches
        of `n_batch` tokens, each asking for its last token's logits. `stop` is asked before each batch after the
        first: true once the call is cancelled, it raises CancelledError there (the context holds what it evaluated)."""
        import llama_cpp

        llama_cpp.llama_memory_seq_rm(self._memory, -1, self.n_tokens, -1)
        batch = self._batch
        for start in range(0, len(tokens), self.n_batch):
            if start and stop():
                raise CancelledError()
            chunk = tokens[start : start + self.n_batch]
            batch.n_tokens = len(chunk)
            for index, token in enumerate(chunk):
                batch.token[index] = token
                batch.pos[index] = self.n_tokens + index
                batch.seq_id[index][0] = 0
                batch.n_seq_id[index] = 1
                batch.logits[index] = index == len(chunk) - 1
            status = llama_cpp.llama_decode(self.ctx, batch)
            if status != 0:
                raise PawError(f"llama.cpp could not evaluate the prompt (llama_decode returned {status})")
            self.moved_to(self.n_tokens + len(chunk), chunk)

    def moved_to(self, position: int, tokens: Sequence[int]) -> None:
        """Record that the context holds `tokens` up to `position` (an image evaluated by mtmd: zeros)."""
        del self.tokens[self.n_tokens :]
        self.tokens.extend(tokens)
        self.n_tokens = position

    def rewind(self, position: int) -> None:
        """Go back to `position`: the next evaluation starts there and drops what the cache holds after it."""
        del self.tokens[position:]
        self.n_tokens = position

    def clear(self) -> None:
        """Empty the context, memory included (KV and recurrent states), as the official vision runtime does."""
        import llama_cpp

        self.rewind(0)
        llama_cpp.llama_memory_clear(self._memory, True)

    def logits(self) -> NDArray[np.single]:
        """The last evaluated token's logits, in place (writing them changes what the next sample sees)."""
        import llama_cpp

        logits = llama_cpp.llama_get_logits_ith(self.ctx, -1)
        if not logits:  # NULL: llama.cpp logged why (no evaluated token asked for its logits)
            raise PawError("llama.cpp returned no logits for the last evaluated token")
        return np.ctypeslib.as_array(logits, shape=(self.n_vocab,))

    def sample(self, temperature: float, top_p: float, seed: int | None) -> int:
        """The next token from the logits as `Llama.sample(temp=temperature, top_p=top_p, top_k=0, min_p=0.0)` draws it:
        the greedy pick at temperature 0, else its sampler chain, made anew (and so seeded anew) for each token."""
        import llama_cpp

        if temperature == 0.0:
            return int(np.argmax(self.logits()))  # llama.cpp's greedy sampler: the first highest logit
        chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
        if not chain:
            raise PawError("llama.cpp could not make a sampler chain")
        try:
            stages = [
                llama_cpp.llama_sampler_init_penalties(self.n_vocab, 64, 1.0, 0.0, 0.0),  # Llama's, all neutral
                llama_cpp.llama_sampler_init_top_k(0),
                llama_cpp.llama_sampler_init_typical(1.0, 1),
                llama_cpp.llama_sampler_init_top_p(top_p, 1),
                llama_cpp.llama_sampler_init_min_p(0.0, 1),
                llama_cpp.llama_sampler_init_temp(temperature),
                llama_cpp.llama_sampler_init_dist(llama_cpp.LLAMA_DEFAULT_SEED if seed is None else seed),
            ]
            if not all(stages):  # a NULL stage would crash the chain: free the others (not in it yet) and stop
                for stage in filter(None, stages):
                    llama_cpp.llama_sampler_free(stage)
                raise PawError("llama.cpp could not make a sampler stage")
            for stage in stages:
                llama_cpp.llama_sampler_chain_add(chain, stage)
            return int(llama_cpp.llama_sampler_sample(chain, self.ctx, -1))
        finally:
            llama_cpp.llama_sampler_free(chain)  # the chain frees its stages
