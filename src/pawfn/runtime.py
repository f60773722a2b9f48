"""The runtime interface every backend implements, and the one decode loop they all run.

A backend supplies a `DecodeSession` (prefill, sample, advance) per call; `ProgramRuntime.generate` does the
rest once: prompt encoding, the context budget, stopping, timings and the `Generation`. Rows are independent
sessions, so a batched loop can drive several of them per step.
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Generator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from .bundle import ProgramBundle, PromptTemplate
from .config import PawConfig
from .errors import ContextOverflowError, PawError, ProgramClosedError
from .models import InterpreterModel
from .options import RuntimeOptions
from .results import Generation, StopReason, Timings
from .tokenizer import TextCodec

__all__ = [
    "Budget",
    "DecodeSession",
    "ProgramFiles",
    "ProgramRuntime",
    "Prompt",
    "RuntimeOpener",
    "context_window",
]


@dataclass(frozen=True)
class ProgramFiles:
    """What a backend is handed to open a program: the opened bundle, the base weights and where it may
    keep files derived from the program (e.g. an evaluated prefix) and from the base (e.g. converted weights);
    None keeps it from writing there."""

    bundle: ProgramBundle
    base: Path
    derived_dir: Path | None
    base_derived_dir: Path | None = None


def context_window(model: type[InterpreterModel], requested: int, trained_positions: int) -> int:
    """The context a program gets: `requested`, capped by the model's limit and, for learned positions,
    by the positions the checkpoint was trained for (tokens)."""
    limits = [requested]
    if model.max_context is not None:
        limits.append(model.max_context)
    if model.learned_positions:
        limits.append(trained_positions)
    return min(limits)


@dataclass(frozen=True)
class Budget:
    """How many tokens a call may generate, and the stop reason if it uses them all."""

    limit: int
    exhausted_reason: StopReason


class Prompt:
    """A program's template on one tokenizer: the prefix's ids (checked against the context) and the encoding
    of each call's input + suffix, like the official runtime."""

    def __init__(self, codec: TextCodec, template: PromptTemplate, n_ctx: int) -> None:
        self.codec = codec
        self.n_ctx = n_ctx
        self.prefix_ids = codec.encode(template.prefix, parse_special=True)
        if len(self.prefix_ids) >= n_ctx:
            raise ContextOverflowError(len(self.prefix_ids), 0, n_ctx)
        self._suffix = template.suffix
        # The official runtime tokenizes input + suffix as one string; llama.cpp first cuts it at special
        # tokens, so the input joins the suffix's text up to its first control token, and the rest follows.
        self._suffix_head, rest = codec.split_at_first_control(template.suffix)
        self._suffix_rest_ids = codec.encode(rest, parse_special=True)

    def encode(self, text: str, options: RuntimeOptions) -> list[int]:
        """Token ids of `text` + suffix, as evaluated after the prefix."""
        if options.parse_special_in_input:
            return self.codec.encode(text + self._suffix, parse_special=True)
        return self.codec.encode(text + self._suffix_head, parse_special=False) + self._suffix_rest_ids

    def budget(self, n_prompt: int, options: RuntimeOptions) -> Budget:
        """The official runtime's rule: what is left of the context, capped by `max_tokens`; none left is an error."""
        n_prefix = len(self.prefix_ids)
        remaining = self.n_ctx - n_prefix - n_prompt
        if remaining <= 0:
            raise ContextOverflowError(n_prefix, n_prompt, self.n_ctx)
        if options.max_tokens is not None and options.max_tokens <= remaining:
            return Budget(options.max_tokens, "max_tokens")
        return Budget(remaining, "context")


class DecodeSession(Protocol):
    """One call's state on a backend, positioned after the program's cached prefix."""

    def prefill(self, prompt_ids: list[int]) -> None:
        """Evaluate the call's prompt ids after the prefix (none: continue from the prefix's last logits)."""
        ...

    def sample(self) -> int:
        """The next token from the current logits (greedy or the call's seeded sampler)."""
        ...

    def advance(self, token: int) -> None:
        """Evaluate `token` at the next position."""
        ...


class ProgramRuntime(ABC):
    """A loaded program on a backend: its adapter, its cached prefix and a handle on the shared base.

    Subclasses give `session` and `release`; running, closing and the decode loop are shared.
    """

    def __init__(self, prompt: Prompt) -> None:
        self._prompt = prompt
        self._state = threading.Condition()
        self._active_runs = 0
        self._closed = False

    @property
    def n_ctx(self) -> int:
        """Context window in tokens."""
        return self._prompt.n_ctx

    @property
    def prefix_tokens(self) -> int:
        """Length of the cached prompt prefix in tokens."""
        return len(self._prompt.prefix_ids)

    @property
    def closed(self) -> bool:
        """Whether `close()` was called."""
        return self._closed

    def encode_prompt(self, text: str, options: RuntimeOptions) -> list[int]:
        """Token ids of input + suffix, as evaluated after the cached prefix."""
        return self._prompt.encode(text, options)

    @abstractmethod
    def session(self, options: RuntimeOptions) -> AbstractContextManager[DecodeSession]:
        """A decode session for one call, holding whatever the backend needs (a model copy, a lock)."""

    @abstractmethod
    def release(self) -> None:
        """Free the program's own resources; called once, after every run has ended."""

    @contextmanager
    def _running(self) -> Generator[None, None, None]:
        with self._state:
            if self._closed:
                raise ProgramClosedError("this program was closed; load it again to run it")
            self._active_runs += 1
        try:
            yield
        finally:
            with self._state:
                self._active_runs -= 1
                self._state.notify_all()

    def generate(self, text: str, options: RuntimeOptions) -> Generation:
        """Run the program on `text`; safe to call from several threads."""
        clock = time.perf_counter
        started = clock()
        prompt_ids = self._prompt.encode(text, options)
        allowed = self._prompt.budget(len(prompt_ids), options)
        eos_id = self._prompt.codec.eos_id
        output: list[int] = []
        stop: StopReason = allowed.exhausted_reason
        tokenized = prompt_done = clock()
        with self._running():
            if allowed.limit > 0:
                if not prompt_ids and not self._prompt.prefix_ids:
                    raise PawError("the program's template and the input are both empty: there is nothing to continue")
                with self.session(options) as session:
                    session.prefill(prompt_ids)
                    prompt_done = clock()
                    for step in range(allowed.limit):
                        token = session.sample()
                        if token == eos_id:
                            stop = "eos"
                            break
                        output.append(token)
                        if step + 1 < allowed.limit:
                            session.advance(token)
        finished = clock()
        return Generation(
            text=self._prompt.codec.decode(output).strip(),
            token_ids=tuple(output),
            prefix_tokens=len(self._prompt.prefix_ids),
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
        """Wait for running calls, then free the program (the shared base goes with its last program)."""
        with self._state:
            if self._closed:
                return
            self._closed = True
            while self._active_runs:
                self._state.wait()
        self.release()


class RuntimeOpener(Protocol):
    """How a backend opens a program: `open(model, files, config)`."""

    def __call__(self, model: type[InterpreterModel], files: ProgramFiles, config: PawConfig) -> ProgramRuntime:
        ...
