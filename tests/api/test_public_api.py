"""The top-level namespace: flat, complete, documented, and every error a PawError."""

from __future__ import annotations

import inspect

import pawfn


def test_everything_in_all_is_importable_and_documented() -> None:
    undocumented: list[str] = []
    for name in pawfn.__all__:
        obj = getattr(pawfn, name)
        if name.startswith("__"):
            continue
        if not (getattr(obj, "__doc__", None) or "").strip():
            undocumented.append(name)
        if inspect.isclass(obj):
            for attr, value in vars(obj).items():
                if attr.startswith("_"):
                    continue
                target = value.fget if isinstance(value, property) else getattr(value, "__func__", value)
                if (callable(target) or isinstance(value, property)) and not (getattr(target, "__doc__", None) or "").strip():
                    undocumented.append(f"{name}.{attr}")
    assert undocumented == []


def test_the_names_the_issue_promises() -> None:
    from pawfn import GPT2, LlamaCpp, PawConfig, PawFn, PawFnBuilder, Qwen3_0_6B, RuntimeOptions, Torch

    assert all(obj.__module__.startswith("pawfn") for obj in (GPT2, LlamaCpp, PawConfig, PawFn, PawFnBuilder, Qwen3_0_6B, RuntimeOptions, Torch))


def test_every_error_is_a_paw_error() -> None:
    errors = [getattr(pawfn, name) for name in pawfn.__all__ if name.endswith("Error")]
    assert len(errors) >= 15
    assert all(issubclass(error, pawfn.PawError) for error in errors)
