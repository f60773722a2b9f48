"""Continuous batching on one shared base, the executing half: a scheduler's `Plan` run on the compute thread.

Prompts are evaluated one by one (each is already a many-row product), then each decode step runs as one forward
pass over its rows (`TorchInterpreter.step`), and every row's next token is sampled: finiteness and greedy picks
for all rows at once (one host sync per step), sampled rows each with the call's own generator.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import torch

from ...core.errors import NonFiniteError
from .network import ImageEmbeddings, TorchInterpreter
from .sampling import sample_token
from .scheduler import Failures, Plan, ScheduledCall, Step
from .session import TorchSession
from .vision import PromptImage

__all__ = ["Runner"]


class Runner:
    """Executes plans on one base's interpreter; a failure (an overflow, non-finite logits) fails its call only."""

    def __init__(self, interpreter: TorchInterpreter) -> None:
        self._interpreter = interpreter

    def __call__(self, plan: Plan) -> Failures:
        failures: Failures = []
        for call in plan.start:
            try:
                self._start(call)
            except Exception as exc:  # noqa: BLE001 - one call's failure is that call's result
                failures.append((call, exc))
        for step in plan.steps:
            failures += self._step(step)
        return failures

    def _start(self, call: ScheduledCall) -> None:
        """Evaluate the call's prompt after its program's prefix and sample its first token."""
        assert call.slot is not None  # a started call holds a slot
        session = TorchSession(call.adapter, call.prefix, call.slot.cache, call.decoding.options)
        call.session = session
        prompt_ids = call.decoding.prompt_ids  # with images: 0 at each image's positions
        logits = call.prefix.last_logits
        stop = call.pending.abandoned.is_set  # a cancelled call's prompt stops within a layer of one batch
        if call.parts:
            parts = [ImageEmbeddings(p.embeddings(), p.image.rows, p.image.columns) if isinstance(p, PromptImage) else p for p in call.parts]
            logits = self._interpreter.forward_with_images(parts, session.position, session.cache, session.adapter, stop)
        elif prompt_ids:
            logits = self._interpreter.forward(prompt_ids, session.position, session.cache, session.adapter, stop)
        session.position += len(prompt_ids)
        call.decoding.prefilled()
        assert logits is not None  # a `Decoding` refuses an empty prefix with an empty prompt
        token = self._tokens([call], logits.unsqueeze(0))[0]
        if isinstance(token, Exception):
            raise token
        call.token = token

    def _step(self, step: Step) -> Failures:
        sessions = [_session(call) for call in step.calls]
        rows = [session.step_row(call.token) for call, session in zip(step.calls, sessions, strict=True)]
        try:
            logits = self._interpreter.step(rows, step.batch_invariant)
        except Exception as exc:  # noqa: BLE001 - a failed pass fails the calls in it, not the scheduler
            return [(call, exc) for call in step.calls]
        for session in sessions:
            session.position += 1
        failures: Failures = []
        for call, token in zip(step.calls, self._tokens(step.calls, logits), strict=True):
            if isinstance(token, Exception):
                failures.append((call, token))
            else:
                call.token = token
        return failures

    def _tokens(self, calls: list[ScheduledCall], logits: torch.Tensor) -> list[int | Exception]:
        """Each row's next token (`logits` [rows, vocab]), or the `NonFiniteError` of a row holding NaN or infinity."""
        finite: list[bool] = torch.isfinite(logits).all(dim=-1).cpu().numpy().tolist()  # one host sync for all rows
        logits, refused = _constrained(calls, logits)
        greedy = [i for i, call in enumerate(calls) if _session(call).generator is None]
        picked: list[int] = torch.argmax(logits[greedy], dim=-1).cpu().numpy().tolist() if greedy else []  # first maximum, as llama.cpp
        by_row = dict(zip(greedy, picked, strict=True))
        tokens: list[int | Exception] = []
        for i, call in enumerate(calls):
            session = _session(call)
            if i in refused:
                tokens.append(refused[i])
            elif not finite[i]:
                dtype = str(self._interpreter.dtype).removeprefix("torch.")
                tokens.append(
                    NonFiniteError(
                        session.position,
                        f"the base or adapter holds extreme values, or the {dtype} computation overflowed; "
                        "load the program with dtype='float32' and check its files",
                    )
                )
            elif session.generator is None:
                tokens.append(by_row[i])
            else:
                tokens.append(sample_token(logits[i], session.options, session.generator))
        return tokens


def _constrained(calls: list[ScheduledCall], logits: torch.Tensor) -> tuple[torch.Tensor, dict[int, Exception]]:
    """`logits` with each constrained row's forbidden tokens at -inf (a new tensor: a prefix's logits are shared),
    and the rows whose grammar failed."""
    width = logits.shape[-1]
    masks: dict[int, npt.NDArray[np.bool_]] = {}
    refused: dict[int, Exception] = {}
    for i, call in enumerate(calls):
        if call.decoding.constraint is not None:
            try:
                masks[i] = call.decoding.constraint.allowed(width)
            except Exception as exc:  # noqa: BLE001 - a failing mask fails its own call
                refused[i] = exc
    if not masks:
        return logits, refused
    allowed = torch.as_tensor(np.stack(list(masks.values())), device=logits.device)
    index = torch.tensor(list(masks), device=logits.device)
    masked = logits.clone()
    masked[index] = logits[index].masked_fill(~allowed, float("-inf"))
    return masked, refused


def _session(call: ScheduledCall) -> TorchSession:
    """The session of a call in a plan's steps (each started in an earlier iteration)."""
    assert call.session is not None
    return call.session
