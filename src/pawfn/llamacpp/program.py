"""A program on the LlamaCpp backend: llama.cpp itself (the official runtime), driven the official way.

Needs the `llamacpp` extra (llama-cpp-python). Tokenization uses pawfn's llama.cpp-exact tokenizer (so plain
input and `parse_special_in_input` behave as on Torch); llama.cpp evaluates and samples. Every native handle is
registered in an `ExitStack` as it is created, so any failure while opening frees what was made.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import os
import threading
import types
from collections import deque
from collections.abc import Callable
from pathlib import Path
from concurrent.futures import CancelledError
from typing import TYPE_CHECKING

import numpy as np

from ..core.config import EngineSettings
from ..formats.constraint import Constraint
from ..core.errors import AdapterError, BaseModelError, ConfigError, ContextOverflowError, NonFiniteError, PawError
from ..formats.adapter import check_adapter_fits, read_lora_adapter
from ..formats.ggufio import GGUFFile, GGUFFormatError
from ..core.models import InterpreterModel
from ..core.options import RuntimeOptions
from ..core.results import Generation
from ..core.images import Image, ImageError
from ..core.progress import load_step
from ..calls.prompt import Argument, image_prompt
from ..calls.runtime import CallInput, Decoding, ProgramFiles, Prompt, PromptRuntime, context_window
from ..calls.pending import PendingGeneration, TokenListener
from ..formats.tokenizer import TextCodec
from . import cpu
from .native_logs import quiet_native_stderr, route_native_logs
from .context import LlamaSettings, NativeContext

if TYPE_CHECKING:
    from llama_cpp import mtmd_cpp as mtmd

__all__ = ["LlamaCppProgram", "LlamaCppSession", "LlamaSettings", "llama_settings", "official_llama_settings", "uses_repack"]

_KV_TYPES = {"float32": 0, "float16": 1, "bfloat16": 30}  # GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16
_KV_NAMES = {0: "f32", 1: "f16", 30: "bf16"}
_LOG = logging.getLogger("pawfn")


@functools.cache
def _system_info() -> str:
    return cpu.llama_cpp_system_info() or ""


def uses_repack(config: EngineSettings) -> bool:
    """Whether a LlamaCpp load lets llama.cpp repack weights (`PawConfig.llamacpp_repack`, None: auto)."""
    if config.llamacpp_repack is not None:
        return config.llamacpp_repack
    if cpu.repack_is_safe(cpu.cpu_flags(), _system_info()):
        return True
    _log_amx_refusal()
    return False


@functools.cache  # once per process
def _log_amx_refusal() -> None:
    _LOG.info(
        "llama.cpp's AMX kernels segfault on quantized weights (%s): loading without weight repacking on this AMX "
        "CPU (PAW_LLAMACPP_REPACK=1 overrides)",
        cpu.AMX_ISSUE,
    )


class LlamaCppSession:
    """One call on the program's llama.cpp context, rewound to the cached prefix."""

    def __init__(self, program: LlamaCppProgram, options: RuntimeOptions) -> None:
        self._context = program.context
        self._prefix_ids = program.prefix_ids
        self._rewinds = program.rewinds
        self._options = options

    def prefill(self, prompt_ids: list[int], stop: Callable[[], bool] = lambda: False) -> None:
        context, n_prefix = self._context, len(self._prefix_ids)
        if not self._rewinds:  # a recurrent state cannot go back: the whole prompt on a cleared context
            context.clear()
            context.eval(self._prefix_ids + prompt_ids, stop)
        elif prompt_ids:
            context.rewind(n_prefix)  # to the cached prefix; eval trims the KV cache past it
            context.eval(prompt_ids, stop)
        else:
            context.rewind(n_prefix - 1)  # re-evaluate the prefix's last token for fresh logits
            context.eval(self._prefix_ids[-1:])

    def sample(self, constraint: Constraint | None = None) -> int:
        """The next token, by llama.cpp's sampler; a constrained call's forbidden tokens are masked first (the logits
        in place, as `Llama`'s logits hook would)."""
        context = self._context
        logits = context.logits()
        if not np.isfinite(logits).all():  # llama.cpp's sampler would pick a token from them anyway
            raise NonFiniteError(context.n_tokens, "the base or adapter holds extreme or non-finite values; check the program's files")
        if constraint is not None:
            logits[~constraint.allowed(logits.shape[0])[: logits.shape[0]]] = -np.inf
        options = self._options
        return context.sample(options.temperature, options.top_p, options.seed)

    def advance(self, token: int) -> None:
        self._context.eval([token])


def _check_adapter(adapter_path: Path, model: type[InterpreterModel], base: GGUFFile) -> None:
    """Refuse an adapter llama.cpp must never see, with the Torch backend's errors: its names, types, ranks and values
    read as the Torch backend reads them, its shapes against the base's (llama.cpp's own checks end in a NULL adapter
    at best; a file can hold what they miss)."""
    adapter = read_lora_adapter(adapter_path, model)
    check_adapter_fits(adapter, {name: base.tensor_shape(name) for name in base.tensor_names()})


def _apply_adapter(llama_cpp: types.ModuleType, context: NativeContext, adapter_path: Path, resources: contextlib.ExitStack) -> None:
    """Load the program's LoRA and apply it at scale 1, undone (then freed) when `resources` close."""
    with quiet_native_stderr():
        adapter = llama_cpp.llama_adapter_lora_init(context.model, str(adapter_path).encode())
    if not adapter:  # a NULL pointer object, never None: llama.cpp refused the file
        raise AdapterError(adapter_path, "llama.cpp could not load this LoRA adapter")
    resources.callback(llama_cpp.llama_adapter_lora_free, adapter)
    adapters = (llama_cpp.llama_adapter_lora_p_ctypes * 1)(adapter)
    scales = (ctypes.c_float * 1)(1.0)
    if llama_cpp.llama_set_adapters_lora(context.ctx, adapters, 1, scales):
        raise AdapterError(adapter_path, "llama.cpp could not apply this LoRA adapter")
    # Detach before the adapter is freed: callbacks run last-registered first.
    resources.callback(llama_cpp.llama_set_adapters_lora, context.ctx, None, 0, None)


def _open_projector(
    path: Path, text: NativeContext, model: type[InterpreterModel], config: EngineSettings, resources: contextlib.ExitStack
) -> mtmd.mtmd_context_p:
    """llama.cpp's mtmd context on the projector GGUF, with the official vision runtime's parameters; freed with
    `resources`."""
    from llama_cpp import mtmd_cpp as mtmd

    import llama_cpp

    params = mtmd.mtmd_context_params_default()
    params.use_gpu = config.device != "cpu"
    params.print_timings = False
    params.n_threads = text.context_params.n_threads  # the text context's, as the vision runtime sets it
    if model.image_tokens is not None:
        params.image_min_tokens, params.image_max_tokens = model.image_tokens
    params.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
    with quiet_native_stderr():
        context = mtmd.mtmd_init_from_file(os.fsencode(path), text.model, params)
    if not context:
        raise BaseModelError(path, "llama.cpp's mtmd could not load this projector (mmproj GGUF)")
    resources.callback(mtmd.mtmd_free, context)
    if not mtmd.mtmd_support_vision(context):
        raise BaseModelError(path, "this projector takes no images")
    return context


def official_llama_settings(model: type[InterpreterModel]) -> LlamaSettings:
    """What the official SDK (programasweights 0.4.14) passes `Llama` for `model`'s programs beside the model path,
    `n_ctx`, `n_gpu_layers` and `verbose`: nothing for text programs (llama-cpp-python's defaults: an f16 KV cache,
    batches of 512, no flash attention, its thread counts), its vision runtime's settings for Qwen3.5."""
    if model.whole_prompt:
        return {"n_batch": 128, "n_threads": 2, "n_threads_batch": 2, "flash_attn": True}
    return {}


def llama_settings(model: type[InterpreterModel], config: EngineSettings) -> LlamaSettings:
    """The official settings with what `config` names explicitly on top: `threads` (both thread counts) and
    `llamacpp_kv_dtype` (the KV cache's type); `dtype` is the Torch backend's and changes nothing here."""
    settings = official_llama_settings(model)
    if config.threads is not None:
        settings["n_threads"] = settings["n_threads_batch"] = config.threads
    if config.llamacpp_kv_dtype is not None:
        settings["type_k"] = settings["type_v"] = _KV_TYPES[config.llamacpp_kv_dtype]
    return settings


class LlamaCppProgram(PromptRuntime):
    """One program on its own llama.cpp context (the base GGUF is memory-mapped, so the OS shares it); its calls
    queue for the program's own worker thread and run one by one, in order."""

    def __init__(self, resources: contextlib.ExitStack, context: NativeContext, prompt: Prompt, vision: mtmd.mtmd_context_p | None = None) -> None:
        super().__init__(prompt)
        self._resources = resources
        self.context = context
        """llama.cpp's model and context (on llama-cpp-python's low-level API, configured as `Llama` configures them)."""
        self._vision = vision
        """llama.cpp's mtmd context on the projector, for image arguments (None: no projector)."""
        self.rewinds = not context.recurrent
        """Whether a call rewinds the context to the evaluated prefix; a model with recurrent layers cannot (llama.cpp
        refuses the next input), so each call clears it and evaluates its whole prompt, as the official runtime does."""
        self._lock = threading.Lock()
        self._queue: deque[tuple[PendingGeneration, CallInput, RuntimeOptions, TokenListener | None]] = deque()
        """Calls waiting for the worker (guarded by `_state`)."""
        self._worker: threading.Thread | None = None

    def submit(self, text: CallInput, options: RuntimeOptions, on_token: TokenListener | None = None) -> PendingGeneration:
        """Queue the call for the program's worker and return at once; its error comes with the result, and
        `cancel()` stops it at its next token (a queued one never starts)."""
        pending = self.track(PendingGeneration())
        self._enter_run()  # counted from now: close() waits for queued calls too
        with self._state:
            self._queue.append((pending, text, options, on_token))
            if self._worker is None:
                self._worker = threading.Thread(target=self._work, name="pawfn-llamacpp", daemon=True)
                self._worker.start()
            self._state.notify_all()
        return pending

    def _work(self) -> None:
        """The worker: the queued calls in order, until the program closes with nothing queued."""
        while True:
            with self._state:
                while not self._queue and not self._closed:
                    self._state.wait()
                if not self._queue:
                    return
                pending, text, options, on_token = self._queue.popleft()
            try:
                if pending.set_running_or_notify_cancel():
                    pending.set_result(self._decode(text, options, pending, on_token))
            except BaseException as exc:  # noqa: BLE001 - the caller gets it from the result, as from any backend
                pending.set_exception(exc)
            finally:
                self._exit_run()

    def _decode(self, text: CallInput, options: RuntimeOptions, pending: PendingGeneration, on_token: TokenListener | None) -> Generation:
        """One call to its end on the program's context; once the call is cancelled it stops at its next token."""
        if not isinstance(text, str) and any(isinstance(argument, Image) for argument in text):
            with self._lock:
                evaluated = self._evaluate_images(text, options)
                decoding = Decoding(self._prompt, text, options, on_token, evaluated, numerics="llamacpp")
                decoding.prefilled()
                return self._continue(decoding, LlamaCppSession(self, options), pending)
        decoding = Decoding(self._prompt, text, options, on_token, numerics="llamacpp")
        if decoding.budget.limit > 0:
            with self._lock:  # the context is the program's: release() takes it too
                session = LlamaCppSession(self, options)
                session.prefill(decoding.prompt_ids, pending.abandoned.is_set)  # a cancelled long prompt stops between batches
                decoding.prefilled()
                return self._continue(decoding, session, pending)
        return decoding.result()

    def _continue(self, decoding: Decoding, session: LlamaCppSession, pending: PendingGeneration) -> Generation:
        """Sample the call's tokens after its prompt was evaluated, to its end or its cancellation."""
        if decoding.budget.limit > 0:
            token = session.sample(decoding.constraint)
            while decoding.take(token):
                if pending.abandoned.is_set():
                    raise CancelledError()
                session.advance(token)
                token = session.sample(decoding.constraint)
        return decoding.result()

    def _evaluate_images(self, text: tuple[Argument, ...], options: RuntimeOptions) -> list[int]:
        """Evaluate a call with image arguments on a cleared context as the official vision runtime does: the whole
        prompt rendered with mtmd's marker for each image, tokenized by mtmd one image at a time (its text up to and
        including the image's marker; the rest with the last image), text chunks evaluated as tokens and image chunks
        by mtmd. Returns the ids of the positions after the prefix (0 where an image's embeddings went)."""
        from llama_cpp import mtmd_cpp as mtmd

        vision = self._vision
        prompt = image_prompt(self._prompt, vision is not None)
        assert vision is not None  # image_prompt refused a call without one
        if not options.parse_special_in_input and any(isinstance(a, str) and prompt.codec.holds_control_text(a) for a in text):
            raise ConfigError(
                "an argument beside an image holds control-token text, and mtmd parses the whole prompt's special tokens "
                "(as the official runtime does): pass parse_special_in_input=True to accept that, or remove the text"
            )
        marker = mtmd.mtmd_default_marker().decode("utf-8")
        rendered, images = prompt.rendered(text, marker)
        self.context.clear()
        bitmaps: list[mtmd.mtmd_bitmap_p] = []
        try:
            for image in images:
                data = image.png()  # the official preprocessing contract's pixels, decoded again by mtmd (stb_image)
                buffer = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
                bitmap = mtmd.mtmd_helper_bitmap_init_from_buf(vision, buffer, len(data), False)
                if not bitmap:
                    raise ImageError("llama.cpp's mtmd could not read the image; it is damaged or of an unsupported kind")
                bitmaps.append(bitmap)
            pieces = rendered.split(marker)  # a call here holds at least one image (`_decode` sends only those)
            for index, bitmap in enumerate(bitmaps):  # one image per tokenization: never merged as a video's frames
                tail = pieces[-1] if index == len(bitmaps) - 1 else ""
                self._evaluate_chunks(vision, pieces[index] + marker + tail, [bitmap])
        finally:
            for bitmap in bitmaps:
                mtmd.mtmd_bitmap_free(bitmap)
        return self.context.tokens[len(prompt.prefix_ids) :]

    def _evaluate_chunks(self, vision: mtmd.mtmd_context_p, text: str, bitmaps: list[mtmd.mtmd_bitmap_p]) -> None:
        """One mtmd tokenization (text with at most one image) evaluated on the context after what is there."""
        import llama_cpp
        from llama_cpp import mtmd_cpp as mtmd

        context, encoded = self.context, text.encode("utf-8")
        given = mtmd.mtmd_input_text()
        given.text, given.text_len, given.add_special, given.parse_special = encoded, len(encoded), False, True
        chunks = mtmd.mtmd_input_chunks_init()
        if not chunks:
            raise PawError("llama.cpp's mtmd could not allocate the prompt's chunks")
        try:
            array = (mtmd.mtmd_bitmap_p_ctypes * len(bitmaps))(*bitmaps)
            if mtmd.mtmd_tokenize(vision, chunks, ctypes.byref(given), array, len(bitmaps)) != 0:
                raise PawError("llama.cpp's mtmd could not tokenize the prompt with its image")
            for index in range(mtmd.mtmd_input_chunks_size(chunks)):
                chunk = mtmd.mtmd_input_chunks_get(chunks, index)
                if not chunk:
                    raise PawError(f"llama.cpp's mtmd returned no chunk {index} of the prompt with its image")
                size = mtmd.mtmd_input_chunk_get_n_tokens(chunk)
                if context.n_tokens + size >= context.n_ctx:
                    raise ContextOverflowError(context.n_tokens, size, context.n_ctx)
                if mtmd.mtmd_input_chunk_get_type(chunk) == mtmd.MTMD_INPUT_CHUNK_TYPE_TEXT:
                    count = ctypes.c_size_t()
                    tokens = mtmd.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(count))
                    if count.value and not tokens:
                        raise PawError("llama.cpp's mtmd returned no tokens for a text chunk of the prompt")
                    if count.value:
                        context.eval([tokens[i] for i in range(count.value)])
                    continue
                start, end = context.n_tokens, llama_cpp.llama_pos(0)
                status = mtmd.mtmd_helper_eval_chunk_single(
                    vision, context.ctx, chunk, llama_cpp.llama_pos(start), llama_cpp.llama_seq_id(0), context.n_batch, True, ctypes.byref(end)
                )
                if status != 0 or not start < end.value < context.n_ctx:
                    raise PawError(f"llama.cpp's mtmd could not evaluate the image (status {status})")
                context.moved_to(end.value, [0] * (end.value - start))  # the image's positions, as the official runtime counts them
        finally:
            mtmd.mtmd_input_chunks_free(chunks)

    @property
    def engine(self) -> str:
        """llama.cpp's build (its system info line), its KV cache type and thread counts, and whether it repacked
        the weights."""
        repacked = "on" if self.context.model_params.use_extra_bufts else "off"
        params = self.context.context_params
        kv = _KV_NAMES.get(int(params.type_k), str(params.type_k))
        return f"llama.cpp {_system_info()}; {kv} KV cache, {params.n_threads}/{params.n_threads_batch} threads; weight repacking {repacked}"

    @property
    def prefix_ids(self) -> list[int]:
        """The template prefix's token ids, evaluated once at load."""
        return self._prompt.prefix_ids

    @classmethod
    def open(cls, model: type[InterpreterModel], files: ProgramFiles, config: EngineSettings) -> LlamaCppProgram:
        """Load the base GGUF, apply the adapter at scale 1 and evaluate the prefix."""
        try:  # an optional extra: imported when a LlamaCpp program opens, not with pawfn
            import llama_cpp
        except ImportError as exc:
            raise PawError("the LlamaCpp backend needs llama-cpp-python: pip install 'pawfn[llamacpp]'") from exc
        route_native_logs()
        base, adapter_path = files.base, files.adapter_path
        if base.is_dir() or not base.is_file():
            raise BaseModelError(base, "the LlamaCpp backend needs a GGUF file of the base weights")
        try:
            file = GGUFFile(base)
            architecture = file.string("general.architecture")
            trained = file.integer(f"{architecture}.context_length") or config.n_ctx
        except GGUFFormatError as exc:
            raise BaseModelError(base, str(exc)) from exc
        if architecture != model.gguf_architecture:
            raise BaseModelError(base, f"GGUF architecture is {architecture!r}, but {model.__name__} needs {model.gguf_architecture!r}")
        prompt = files.prompt(TextCodec.from_gguf(file), context_window(model, config.n_ctx, trained), model.whole_prompt)
        repack = uses_repack(config)
        if not repack and not any(name == "use_extra_bufts" for name, *_ in llama_cpp.llama_model_params._fields_):
            raise PawError(
                "this llama-cpp-python cannot load without weight repacking (asked for by PAW_LLAMACPP_REPACK, or "
                f"needed on this AMX CPU: llama.cpp issue {cpu.AMX_ISSUE}); upgrade it: pip install -U llama-cpp-python"
            )
        load_step(f"reading base {base.name} into llama.cpp, then the adapter and the prefix")
        with contextlib.ExitStack() as resources:
            with quiet_native_stderr():
                n_gpu_layers = 0 if config.device == "cpu" else -1
                context = NativeContext(base, prompt.n_ctx, n_gpu_layers, llama_settings(model, config), repack, resources)
            if adapter_path is not None:
                _check_adapter(adapter_path, model, file)
                _apply_adapter(llama_cpp, context, adapter_path, resources)
            if prompt.prefix_ids and not context.recurrent:
                context.eval(prompt.prefix_ids)
            vision = None if files.projector is None else _open_projector(files.projector, context, model, config, resources)
            return cls(resources.pop_all(), context, prompt, vision)

    def release(self) -> None:
        with self._lock:
            self._resources.close()
