"""How an output is judged against its case: exactly (the default), as normalized text, or by a scorer of the
user's (`module:function` on the command line, any callable in Python)."""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable

from ..core.errors import ConfigError
from .cases import EvalCase

__all__ = ["Scorer", "exact", "load_scorer", "normalized"]

Scorer = Callable[[EvalCase, str], bool]
"""Whether `output` (the program's text, stripped as every call's is) is right for `case`."""

_SPACE = re.compile(r"\s+")


def exact(case: EvalCase, output: str) -> bool:
    """The output is the expected text, character for character."""
    return output == case.expected


def _normal(text: str) -> str:
    return _SPACE.sub(" ", text).strip().casefold()


def normalized(case: EvalCase, output: str) -> bool:
    """The output is the expected text up to case and runs of white space."""
    return _normal(output) == _normal(case.expected)


def load_scorer(path: str) -> Scorer:
    """The callable `module:function` names (importable from the current directory or the path), called as
    `function(case, output)`; a `ConfigError` saying what is missing otherwise."""
    module_name, _, attribute = path.partition(":")
    if not module_name or not attribute:
        raise ConfigError(f"--scorer {path!r}: name it as module:function (e.g. my_scorers:same_label)")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"--scorer {path}: cannot import {module_name} ({exc}); run from its folder or put it on PYTHONPATH") from exc
    found: object = module
    for part in attribute.split("."):
        found = getattr(found, part, None)
    if not callable(found):
        raise ConfigError(f"--scorer {path}: {module_name} has no function {attribute}")
    scorer = found

    def score(case: EvalCase, output: str) -> bool:
        return bool(scorer(case, output))

    return score
