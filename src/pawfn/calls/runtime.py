"""The runtime interface every backend implements, and what every call shares.

`ProgramRuntime` is the contract: `submit` returns a future at once on every backend. A `Decoding` is one call's
bookkeeping whatever runs it: prompt encoding, the context budget, stopping, timings and the `Generation`; Torch's
scheduler steps many of them together, llama.cpp's worker one at a time.
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ..formats.bundle import ProgramBundle
from .pending import PendingGeneration, StreamSink, TokenListener, results_in_order
from ..core.config import EngineSettings
from ..formats.constraint import Constraint, check_json_value, compile_output, describe
from ..core.grammar import JsonSchemaFormat
from ..core.errors import OutputTypeError, PawError, ProgramClosedError
from .prompt import Budget, CallInput, Prompt, WholePrompt
from .stops import StopSearch
from ..core.templates import NumberedTemplate
from ..core.models import InterpreterModel
from ..core.options import ResolvedNumerics, RuntimeOptions
from ..core.results import Generation, StopReason, Timings
from ..formats.tokenizer import TextCodec

__all__ = [
    "Budget",
    "CallInput",
    "DecodeCounters",
    "Decoding",
    "PromptRuntime",
    "ProgramFiles",
    "ProgramRuntime",
    "Prompt",
    "RuntimeOpener",
    "WholePrompt",
    "context_window",
]


@dataclass(frozen=True)
class ProgramFiles:
    """What a backend is handed to open a program: the opened bundle, the base weights and where it may
    keep files derived from the program (e.g. an evaluated prefix) and from the base (e.g. converted weights);
    None keeps it from writing there."""

    bundle: ProgramBundle | None
    """None for a bare interpreter (no program: no adapter, `template` is the prompt)."""
    base: Path
    derived_dir: Path | None
    base_derived_dir: Path | None = None
    template: NumberedTemplate | None = None
    """A bare interpreter's template, each call's prompt rendered whole (None for a program: its bundle's)."""
    projector: Path | None = None
    """The interpreter's image projector GGUF (mmproj), where it takes images and one was found."""

    @property
    def adapter_path(self) -> Path | None:
        """The program's LoRA adapter (None on a bare interpreter)."""
        return None if self.bundle is None else self.bundle.adapter_path

    def prompt(self, codec: TextCodec, n_ctx: int, whole: bool = False, prefix_granule: int | None = 1) -> Prompt:
        """The call encoding: the bundle's template split at its placeholder, or rendered whole (a bare template,
        or `whole`: an interpreter whose official runtime renders every call's prompt whole, `InterpreterModel.whole_prompt`;
        a whole prompt's cached prefix is a multiple of `prefix_granule` tokens, None: nothing cached)."""
        if self.bundle is not None:
            template = self.bundle.template
            if isinstance(template, NumberedTemplate):
                return WholePrompt(codec, template, n_ctx, prefix_granule)
            if not whole:
                return Prompt(codec, template, n_ctx)
            return WholePrompt(codec, NumberedTemplate((template.prefix, 0, template.suffix)), n_ctx, prefix_granule)
        if self.template is None:
            raise ValueError("ProgramFiles needs a bundle or a bare template")
        return WholePrompt(codec, self.template, n_ctx, prefix_granule)


def context_window(model: type[InterpreterModel], requested: int, trained_positions: int) -> int:
    """The context a program gets: `requested`, capped by the model's limit and, for learned positions,
    by the positions the checkpoint was trained for (tokens)."""
    limits = [requested]
    if model.max_context is not None:
        limits.append(model.max_context)
    if model.learned_positions:
        limits.append(trained_positions)
    return min(limits)


class Decoding:
    """One call from its input to its `Generation`, token by token: the stopping rules and timings every loop shares."""

    def __init__(
        self,
        prompt: Prompt,
        text: CallInput,
        options: RuntimeOptions,
        on_token: TokenListener | None = None,
        prompt_ids: list[int] | None = None,
        *,
        numerics: ResolvedNumerics,
    ) -> None:
        """Encode `text` (unless a backend evaluated it already: `prompt_ids`, the positions it took after the prefix)
        and fix the budget (`ContextOverflowError` when the prompt leaves no room); `numerics`: the arithmetic that
        computes the call, for its `Generation`."""
        self._on_token = on_token
        self._numerics: ResolvedNumerics = numerics
        self._clock = time.perf_counter
        self._started = self._clock()
        self._prompt = prompt
        self.options = options
        self.prompt_ids = prompt.encode(text, options) if prompt_ids is None else prompt_ids
        self.budget = prompt.budget(len(self.prompt_ids), options)
        if self.budget.limit > 0 and not self.prompt_ids and not prompt.prefix_ids:
            raise PawError("the program's template and the input are both empty: there is nothing to continue")
        self.output: list[int] = []
        self.stop: StopReason = self.budget.exhausted_reason
        output_format = options.response_format
        self.constraint: Constraint | None = None if output_format is None else compile_output(prompt.codec, output_format)
        """The call's grammar state, when its output is constrained: its mask applies to every step's logits."""
        self._stops = StopSearch(options.stop)
        self._tokenized = self._prompt_done = self._clock()

    def prefilled(self) -> None:
        """Note that the prompt has been evaluated."""
        self._prompt_done = self._clock()

    def take(self, token: int) -> bool:
        """Record a sampled token; True when the call goes on (so `token` must be evaluated next)."""
        if token == self._prompt.codec.eos_id:
            self.stop = "eos"
            return False
        if self.constraint is not None:
            self.constraint.consume(token)
        self.output.append(token)
        if self._on_token is not None:
            self._on_token(token)
        if self.constraint is not None and self.constraint.finished:
            self.stop = "eos"  # the grammar allows only the end now: the next token would be EOS
            return False
        if self.options.stop and self._stops.seen(self._prompt.codec.decode(self.output)):
            self.stop = "stop"
            return False
        return len(self.output) < self.budget.limit

    def result(self) -> Generation:
        """The call's `Generation` (its timings end now); `OutputTypeError` if its output is constrained and no value
        finished within its budget."""
        finished = self._clock()
        if self.constraint is not None and not self.constraint.accepting:
            text = self._prompt.codec.decode(self.output)
            reason = "max_tokens" if self.stop == "max_tokens" else "the context window"
            problem = f"no value finished within {len(self.output)} tokens (stopped by {reason})"
            raise OutputTypeError(describe(self.constraint.output), text, problem)
        text = self._prompt.codec.decode(self.output)
        text = text[: self._stops.at].strip()  # `at` is None (the whole text) unless a stop sequence ended the call
        if self.constraint is not None and isinstance(self.constraint.output, JsonSchemaFormat):
            check_json_value(self.constraint.output, text)
        return Generation(
            text=text,
            token_ids=tuple(self.output),
            # counted as the template fixes them, whether a backend cached the prefix or evaluates it in each call
            prefix_tokens=self._prompt.counted_prefix,
            prompt_tokens=len(self._prompt.prefix_ids) + len(self.prompt_ids) - self._prompt.counted_prefix,
            stop_reason=self.stop,
            numerics=self._numerics,
            timings=Timings(
                tokenize_ms=(self._tokenized - self._started) * 1e3,
                prompt_ms=(self._prompt_done - self._tokenized) * 1e3,
                generate_ms=(finished - self._prompt_done) * 1e3,
                total_ms=(finished - self._started) * 1e3,
            ),
        )


@dataclass(frozen=True)
class DecodeCounters:
    """A scheduler's totals: `scheduler` identifies it (programs on one base share one), `steps` its forward passes,
    `rows` the rows they stepped (rows / steps: the mean batch)."""

    scheduler: int
    steps: int
    rows: int


class ProgramRuntime(ABC):
    """A loaded program, wherever it runs: what `PawFn` calls, and the bookkeeping of running and closing.

    `PromptRuntime` runs programs in this process (Torch, llama.cpp); `pawfn.remote` runs them on a server.
    """

    def __init__(self) -> None:
        self._state = threading.Condition()
        self._active_runs = 0
        self._closed = False
        self._calls: set[PendingGeneration] = set()

    @property
    @abstractmethod
    def n_ctx(self) -> int:
        """Context window in tokens."""

    @property
    @abstractmethod
    def prefix_tokens(self) -> int:
        """Length of the cached prompt prefix in tokens."""

    @property
    def closed(self) -> bool:
        """Whether `close()` was called."""
        return self._closed

    @property
    def engine(self) -> str | None:
        """What computes the calls, for reports (a native runtime's build); None where nothing needs saying."""
        return None

    @property
    def arity(self) -> int:
        """How many positional arguments a call takes (a numbered template's slots; otherwise one input)."""
        return 1

    @property
    def decode_counters(self) -> DecodeCounters | None:
        """The decode passes of the scheduler this program's calls share (Torch), for a service's metrics; None where
        calls are not batched here."""
        return None

    @property
    def resident_bytes(self) -> int | None:
        """Bytes of memory this program holds of its own, beside the base it shares (its adapter and evaluated
        prefix), for a resident-program budget; None where the backend cannot say."""
        return None

    @abstractmethod
    def encode_prompt(self, text: CallInput, options: RuntimeOptions) -> list[int]:
        """Token ids of input + suffix, as evaluated after the cached prefix."""

    @abstractmethod
    def decode_tokens(self, token_ids: Sequence[int]) -> str:
        """Text of generated token ids, unstripped (incomplete UTF-8 as U+FFFD)."""

    @abstractmethod
    def submit(self, text: CallInput, options: RuntimeOptions, on_token: TokenListener | None = None) -> PendingGeneration:
        """Start a call and return at once, on every backend: its result or error comes through the future, and
        `cancel()` stops it at its next token. `on_token` sees each generated token."""

    def submit_streaming(self, text: CallInput, options: RuntimeOptions, stream: StreamSink) -> PendingGeneration:
        """Start a call that `stream` follows: its tokens as they are taken (a remote backend sends text instead)."""
        return self.submit(text, options, stream.on_token)

    def submit_batch(self, texts: Sequence[str], options: RuntimeOptions) -> list[PendingGeneration]:
        """`submit` for each text (a remote backend sends them as one request)."""
        return [self.submit(text, options) for text in texts]

    def generate(self, text: CallInput, options: RuntimeOptions) -> Generation:
        """Run the program on `text`; safe to call from several threads. Interrupted while it waits (Ctrl-C), it
        cancels the call, which stops at its next token."""
        return results_in_order([self.submit(text, options)])[0]

    @abstractmethod
    def release(self) -> None:
        """Free the program's own resources; called once, after every run has ended."""

    def track(self, pending: PendingGeneration) -> PendingGeneration:
        """Count `pending` among the program's calls until it ends, for `cancel_all` (every backend's `submit` does)."""
        with self._state:
            self._calls.add(pending)
        pending.add_done_callback(self._forget)
        return pending

    def _forget(self, pending: Future[Generation]) -> None:
        with self._state:
            self._calls.discard(pending)

    def cancel_all(self) -> None:
        """Cancel every call of this program that has not ended: queued ones never start, running ones stop at their
        next token (a remote one when its connection closes)."""
        with self._state:
            calls = list(self._calls)
        for call in calls:
            call.cancel()

    def _enter_run(self) -> None:
        """Count a run that starts (refused once the program is closed); pair with `_exit_run`."""
        with self._state:
            if self._closed:
                raise ProgramClosedError()
            self._active_runs += 1

    def _exit_run(self) -> None:
        with self._state:
            self._active_runs -= 1
            self._state.notify_all()

    def close(self) -> None:
        """Wait for running calls, then free the program (the shared base goes with its last program)."""
        with self._state:
            if self._closed:
                return
            self._closed = True
            self._state.notify_all()  # an idle worker ends
            while self._active_runs:
                self._state.wait()
        self.release()


class PromptRuntime(ProgramRuntime):
    """A program run in this process: its template's `Prompt` on the interpreter's tokenizer (the Torch and
    llama.cpp backends; each schedules its calls itself)."""

    def __init__(self, prompt: Prompt) -> None:
        super().__init__()
        self._prompt = prompt

    @property
    def n_ctx(self) -> int:
        """Context window in tokens."""
        return self._prompt.n_ctx

    @property
    def prefix_tokens(self) -> int:
        """Length of the cached prompt prefix in tokens."""
        return len(self._prompt.prefix_ids)

    @property
    def arity(self) -> int:
        """How many positional arguments a call takes."""
        return self._prompt.arity

    def encode_prompt(self, text: CallInput, options: RuntimeOptions) -> list[int]:
        """Token ids of input + suffix, as evaluated after the cached prefix."""
        return self._prompt.encode(text, options)

    def decode_tokens(self, token_ids: Sequence[int]) -> str:
        """Text of generated token ids, unstripped (incomplete UTF-8 as U+FFFD)."""
        return self._prompt.codec.decode(list(token_ids))


class RuntimeOpener(Protocol):
    """How a backend opens a program: `open(model, files, settings)` (a `PawConfig` is an `EngineSettings`)."""

    def __call__(self, model: type[InterpreterModel], files: ProgramFiles, config: EngineSettings) -> ProgramRuntime: ...
