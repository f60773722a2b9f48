"""A program on the Torch backend: its LoRA side paths and cached prefix over a shared, reference-counted base."""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch

from ...formats.adapter import LoraAdapter, read_lora_adapter
from ...core.config import EngineSettings
from ...core.errors import BaseModelError, ProgramClosedError
from ...core.models import InterpreterModel
from ...core.progress import load_step
from ...core.options import Numerics, ResolvedNumerics, RuntimeOptions
from ...core.images import Image
from ...calls.prompt import Argument, image_prompt
from ...calls.runtime import CallInput, DecodeCounters, Decoding, ProgramFiles, Prompt, PromptRuntime, context_window
from ...calls.pending import PendingGeneration, TokenListener
from ..model.arithmetic import requested_arithmetic, resolved_numerics
from ..model.families import family_for
from .compute import on_compute_thread, set_threads, share_cores, trim_heap
from ..weights.converted import ConvertedStore
from ..model.kvcache import PrefixState
from ..weights.loading import gguf_head_dim, torch_dtype
from ..weights.lora import DeviceAdapter
from .network import TorchInterpreter
from .prefix_store import PrefixStore
from .registry import ENGINES, BaseEngine, EngineKey
from .scheduler import ScheduledCall
from .vision import PromptImage, VisionTower
from ..weights.reader import read_base_weights

__all__ = ["TorchProgram"]


def _check_device(device: str) -> torch.device:
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise BaseModelError(None, f"device {device!r} asked for, but torch sees no CUDA device; use device='cpu'")
    if device == "mps" and not torch.backends.mps.is_available():
        raise BaseModelError(None, "device 'mps' asked for, but torch has no MPS support here; use device='cpu'")
    return torch.device(device)


def _use_cores(threads: int | None, device: torch.device) -> None:
    if threads is not None:
        set_threads(threads)  # process-wide: only when the caller asked for it
    elif device.type == "cpu":
        share_cores()  # the cores other processes leave idle (see `FreeCores`)


def _shared_base(model: type[InterpreterModel], files: ProgramFiles, config: EngineSettings, device: torch.device, numerics: Numerics) -> BaseEngine:
    """The base `files` name on `device`, loaded on the compute thread by the first program that asks, with one
    more user (pair it with `ENGINES.release`)."""
    source, dtype, weight_dtype = str(files.base.resolve()), config.dtype, config.weight_dtype
    path = Path(source)
    resolved = resolved_numerics(numerics, family_for(model), lambda: gguf_head_dim(path, model), path, device, torch_dtype(dtype), weight_dtype)
    key = EngineKey(model=model, source=source, device=str(device), dtype=dtype, weight_dtype=weight_dtype, numerics=resolved)

    def load() -> TorchInterpreter:
        load_step(f"reading base {files.base.name} onto {device}")
        weights = read_base_weights(files.base, model)
        store = None
        if weight_dtype is not None and files.base_derived_dir is not None:
            store = ConvertedStore.for_base(files.base_derived_dir, files.base, weight_dtype)
        return on_compute_thread(TorchInterpreter.load, weights, device, torch_dtype(dtype), weight_dtype, numerics, store, config.progress)

    return ENGINES.acquire(key, load, config.max_model_copies, config.max_batch_rows)


def _prefix(base: BaseEngine, files: ProgramFiles, config: EngineSettings, prefix_ids: list[int], adapter: DeviceAdapter) -> PrefixState:
    """The program's prefix evaluated on `base`: from its stored KV beside the program where it was kept, else
    evaluated on a free KV slot (and stored)."""
    interpreter, device = base.interpreter, base.interpreter.device
    store = None
    if files.derived_dir is not None and files.adapter_path is not None:
        mode = config.dtype if config.weight_dtype is None else f"{config.dtype}+{config.weight_dtype}-weights"
        mode += interpreter.arithmetic.prefix_tag
        store = PrefixStore.in_folder(files.derived_dir, files.base, files.adapter_path, prefix_ids, mode, str(device))
    prefix = None if store is None else on_compute_thread(store.load, prefix_ids, interpreter.architecture, device)
    if prefix is None:
        with base.acquire() as slot:
            prefix = on_compute_thread(interpreter.prefill_prefix, prefix_ids, adapter, slot.cache)
        if store is not None:
            on_compute_thread(store.save, prefix)
    return prefix


class TorchProgram(PromptRuntime):
    """One program: the LoRA side paths and prefix KV it owns, and the shared base it borrows until `close`."""

    def __init__(
        self,
        base: BaseEngine,
        adapter: DeviceAdapter,
        prefix: PrefixState,
        prompt: Prompt,
        batch_invariant: bool = True,
        projector: tuple[Path, tuple[int, int]] | None = None,
        image_delimiters: tuple[str, str] = ("", ""),
    ) -> None:
        super().__init__(prompt)
        self._base: BaseEngine | None = base
        self._adapter = adapter
        self._prefix: PrefixState | None = prefix
        self.batch_invariant = batch_invariant
        """Its calls' decode steps are row-exact (`PawConfig.batch_invariant`, resolved for the device)."""
        self._projector = projector
        """The interpreter's projector GGUF and its bounds on an image's tokens (None: it takes no images, or none was
        found)."""
        self._image_delimiters = image_delimiters

    @classmethod
    def open(cls, model: type[InterpreterModel], files: ProgramFiles, config: EngineSettings) -> TorchProgram:
        """Read the adapter, get (or load once) the shared base, attach the adapter and evaluate the prefix."""
        adapter = LoraAdapter.none() if files.adapter_path is None else read_lora_adapter(files.adapter_path, model)
        device = _check_device(config.device)
        numerics, batch_invariant = requested_arithmetic(config.numerics, config.batch_invariant, device.type)
        _use_cores(config.threads, device)
        with contextlib.ExitStack() as on_error:
            base = _shared_base(model, files, config, device, numerics)
            on_error.callback(ENGINES.release, base)
            interpreter = base.interpreter
            n_ctx = context_window(model, config.n_ctx, interpreter.architecture.max_positions)
            prompt = files.prompt(interpreter.weights.codec, n_ctx, model.whole_prompt, interpreter.arithmetic.prefix_granule)
            load_step("attaching the program's adapter")
            device_adapter = on_compute_thread(interpreter.attach, adapter)
            load_step(f"its {len(prompt.prefix_ids)}-token prefix")
            prefix = _prefix(base, files, config, prompt.prefix_ids, device_adapter)
            projector = None if files.projector is None or model.image_tokens is None else (files.projector, model.image_tokens)
            on_error.pop_all()
        trim_heap()
        return cls(base, device_adapter, prefix, prompt, batch_invariant, projector, model.image_delimiters)

    @property
    def base(self) -> BaseEngine:
        """The shared base this program runs on (gone once the program is closed)."""
        if self._base is None:
            raise ProgramClosedError("this program was closed; its base is no longer held")
        return self._base

    @property
    def numerics(self) -> ResolvedNumerics:
        """The arithmetic the calls run (`PawConfig.numerics`, with `auto` decided at the base's load)."""
        return self.base.interpreter.arithmetic.numerics

    @property
    def decode_counters(self) -> DecodeCounters | None:
        if self._base is None:
            return None
        scheduler = self._base.scheduler
        return DecodeCounters(id(scheduler), scheduler.steps, scheduler.rows_stepped)

    @property
    def resident_bytes(self) -> int | None:
        tensors = [*self._adapter.tensors(), *([] if self._prefix is None else self._prefix.tensors())]
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}  # views counted once
        return sum(storages.values())

    @property
    def engine(self) -> str | None:
        """Which arithmetic runs the calls: torch's (its dtype and weight storage), or llama.cpp's and whether its C
        kernels or the torch emulation (several times slower) run it."""
        if self._base is None:
            return None
        interpreter = self._base.interpreter
        weight_dtype = interpreter.weights.weight_dtype
        stored = "" if weight_dtype is None else f", {weight_dtype} weights"
        return interpreter.arithmetic.describe(f"{str(interpreter.dtype).removeprefix('torch.')}{stored}", interpreter.device.type)

    @property
    def vision_tower(self) -> VisionTower | None:
        """The interpreter's image tower, read from its projector when first asked for (the first image call: ~415 MB
        for Qwen3.5's) and shared by the programs on its base; None without a projector."""
        if self._projector is None:
            return None
        (path, tokens), interpreter = self._projector, self.base.interpreter
        return self.base.vision_tower(
            path, lambda: on_compute_thread(VisionTower.read, path, interpreter.device, tokens, interpreter.arithmetic.tower())
        )

    @property
    def device_adapter(self) -> DeviceAdapter:
        """The program's LoRA side paths on the device (emptied by `close`)."""
        return self._adapter

    @property
    def prefix_state(self) -> PrefixState:
        """The cached prefix (evaluated once when the program loaded; let go by `close`)."""
        if self._prefix is None:
            raise ProgramClosedError("this program was closed; its prefix is no longer held")
        return self._prefix

    def submit(self, text: CallInput, options: RuntimeOptions, on_token: TokenListener | None = None) -> PendingGeneration:
        """Queue a call on the base's scheduler and return at once; errors come with the result."""
        pending = self.track(PendingGeneration())
        parts: list[list[int] | PromptImage] = []
        try:
            if isinstance(text, tuple) and any(isinstance(argument, Image) for argument in text):
                parts = self._image_parts(text, options)
                # the positions after the prefix, 0 where an image's went (as the LlamaCpp backend counts them)
                evaluated = [i for part in parts for i in ([0] * part.image.n_positions if isinstance(part, PromptImage) else part)]
                decoding = Decoding(self._prompt, text, options, on_token, evaluated, numerics=self.numerics)
            else:
                decoding = Decoding(self._prompt, text, options, on_token, numerics=self.numerics)
            self._enter_run()
        except Exception as exc:  # noqa: BLE001 - this call's error, delivered like a running call's
            pending.set_exception(exc)
            return pending
        if decoding.budget.limit == 0:
            pending.set_running_or_notify_cancel()
            pending.settle(decoding.result)
            self._exit_run()
            return pending
        call = ScheduledCall(decoding, self._adapter, self.prefix_state, pending, self._exit_run, self.batch_invariant, parts=parts)
        self.base.scheduler.submit(call)
        return pending

    def _image_parts(self, arguments: tuple[Argument, ...], options: RuntimeOptions) -> list[list[int] | PromptImage]:
        """The prompt of a call with images, after the prefix: runs of token ids and the images, each decoded,
        resized and normalized here (the caller's thread); the tower encodes them when the prompt runs."""
        vision = self.vision_tower
        prompt = image_prompt(self._prompt, vision is not None)
        assert vision is not None  # image_prompt refused a call without one
        parts = prompt.parts(arguments, options, self._image_delimiters)
        return [PromptImage(vision.prepare(part), vision) if isinstance(part, Image) else part for part in parts]

    def release(self) -> None:
        self._adapter.release()
        self._prefix = None  # its KV (66 MiB for Qwen3-0.6B's 303-token prefixes) goes even if the PawFn is kept
        base, self._base = self._base, None
        if base is not None:
            ENGINES.release(base)
            if base.users <= 0:  # the last program: the scheduler's last iteration lets go of the base as it ends
                base.scheduler.wait_idle()
                del base  # the weights go with this last reference; glibc keeps the pages unless trimmed
                trim_heap()
