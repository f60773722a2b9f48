"""A program on the Torch backend: adapter + cached prefix over a shared base, and the decode loop."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import torch

from .adapter import read_lora_adapter
from .backends import ProgramRuntime
from .bundle import ProgramBundle
from .errors import BaseModelError, ContextOverflowError, PawError, ProgramClosedError
from .generation import Generation, StopReason, Timings, make_generator, pick_token
from .models import InterpreterModel
from .config import PawConfig
from .options import RuntimeOptions
from .prefix_store import PrefixStore
from .prompt import PromptEncoder, budget
from .registry import BaseKey, BaseRegistry, SharedBase
from .torch_engine import DeviceAdapter, PrefixState, TorchInterpreter, torch_dtype
from .weights import read_base_weights

__all__ = ["TorchProgram"]


def _check_device(device: str) -> torch.device:
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise BaseModelError(None, f"device {device!r} asked for, but torch sees no CUDA device; use device='cpu'")
    if device == "mps" and not torch.backends.mps.is_available():
        raise BaseModelError(None, "device 'mps' asked for, but torch has no MPS support here; use device='cpu'")
    return torch.device(device)


class TorchProgram(ProgramRuntime):
    """One program: the LoRA side paths and prefix KV it owns, and the shared base it borrows."""

    def __init__(
        self, base: SharedBase, adapter: DeviceAdapter, prefix: PrefixState, suffix: str, n_ctx: int
    ) -> None:
        self._base = base
        self._adapter = adapter
        self._prefix = prefix
        self._prompt = PromptEncoder(base.interpreter.codec, suffix)
        self._n_ctx = n_ctx
        self._state = threading.Condition()
        self._active_runs = 0
        self._closed = False

    @classmethod
    def open(
        cls, model: type[InterpreterModel], bundle: ProgramBundle, base_path: Path, config: PawConfig
    ) -> TorchProgram:
        """Read the adapter, get (or load once) the shared base, attach the adapter and evaluate the prefix."""
        adapter = read_lora_adapter(bundle.adapter_path, model)
        device = _check_device(config.device)
        if config.threads is not None:
            torch.set_num_threads(config.threads)  # process-wide: only when the caller asked for it
        key = BaseKey(model=model, source=str(base_path.resolve()), device=str(device), dtype=config.dtype)

        def load() -> TorchInterpreter:
            weights = read_base_weights(base_path, model)
            return TorchInterpreter(weights, device, torch_dtype(config.dtype))

        base = BaseRegistry.get_or_load(key, load, config.max_model_copies)
        interpreter = base.interpreter
        n_ctx = config.n_ctx
        if model.max_context is not None or interpreter.architecture.family == "gpt2":
            n_ctx = min(n_ctx, interpreter.architecture.max_positions, model.max_context or n_ctx)
        device_adapter = interpreter.attach(adapter)
        prefix_ids = interpreter.codec.encode(bundle.template.prefix, parse_special=True)
        if len(prefix_ids) >= n_ctx:
            raise ContextOverflowError(len(prefix_ids), 0, n_ctx)
        store = PrefixStore.for_program(
            bundle.source, config.cache_dir, base_path, bundle.adapter_path, prefix_ids, config.dtype, str(device)
        )
        prefix = None if store is None else store.load(prefix_ids, interpreter.architecture, device)
        if prefix is None:
            with base.acquire() as copy, torch.inference_mode():
                prefix = interpreter.prefill_prefix(prefix_ids, device_adapter, copy.cache)
            if store is not None:
                store.save(prefix)
        return cls(base, device_adapter, prefix, bundle.template.suffix, n_ctx)

    @property
    def n_ctx(self) -> int:
        return self._n_ctx

    @property
    def prefix_tokens(self) -> int:
        return self._prefix.length

    @property
    def base(self) -> SharedBase:
        """The shared base this program runs on."""
        return self._base

    @property
    def device_adapter(self) -> DeviceAdapter:
        """The program's LoRA side paths on the device (emptied by `close`)."""
        return self._adapter

    @property
    def prefix_state(self) -> PrefixState:
        """The cached prefix (evaluated once when the program loaded)."""
        return self._prefix

    def encode_prompt(self, text: str, options: RuntimeOptions) -> list[int]:
        """Token ids of input + suffix, continuing after the prefix."""
        return self._prompt.encode(text, options)

    def generate(self, text: str, options: RuntimeOptions) -> Generation:
        with self._state:
            if self._closed:
                raise ProgramClosedError("this program was closed; load it again to run it")
            self._active_runs += 1
        try:
            return self._generate(text, options)
        finally:
            with self._state:
                self._active_runs -= 1
                self._state.notify_all()

    @torch.inference_mode()
    def _generate(self, text: str, options: RuntimeOptions) -> Generation:
        started = time.perf_counter()
        interpreter = self._base.interpreter
        prompt_ids = self.encode_prompt(text, options)
        n_prefix = self._prefix.length
        used = n_prefix + len(prompt_ids)
        allowed = budget(n_prefix, len(prompt_ids), self._n_ctx, options)
        limit = allowed.limit
        tokenized = time.perf_counter()
        generator = make_generator(options)
        output: list[int] = []
        stop: StopReason = allowed.exhausted_reason
        prompt_done = tokenized
        if limit > 0:
            with self._base.acquire() as copy:
                copy.cache.load(self._prefix)
                if prompt_ids:
                    logits = interpreter.forward(prompt_ids, n_prefix, copy.cache, self._adapter)
                elif self._prefix.last_logits is not None:
                    logits = self._prefix.last_logits
                else:
                    raise PawError("the program's template and the input are both empty: there is nothing to continue")
                prompt_done = time.perf_counter()
                position = used
                for step in range(limit):
                    token = pick_token(logits, options, generator)
                    if token == interpreter.codec.eos_id:
                        stop = "eos"
                        break
                    output.append(token)
                    if step + 1 < limit:
                        logits = interpreter.forward([token], position, copy.cache, self._adapter)
                        position += 1
        finished = time.perf_counter()
        text_out = interpreter.codec.decode(output).strip()
        timings = Timings(
            tokenize_ms=(tokenized - started) * 1e3,
            prompt_ms=(prompt_done - tokenized) * 1e3,
            generate_ms=(finished - prompt_done) * 1e3,
            total_ms=(finished - started) * 1e3,
        )
        return Generation(
            text=text_out,
            token_ids=tuple(output),
            prefix_tokens=n_prefix,
            prompt_tokens=len(prompt_ids),
            stop_reason=stop,
            timings=timings,
        )

    def close(self) -> None:
        with self._state:
            if self._closed:
                return
            self._closed = True
            while self._active_runs:
                self._state.wait()
        self._adapter.release()
