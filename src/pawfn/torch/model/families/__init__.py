"""The model families the Torch backend runs, one module each; a new interpreter adds one module here."""

from __future__ import annotations

from ....core.errors import BaseModelError
from ....core.models import InterpreterModel
from .base import Architecture, Family, Ops
from .gpt2 import GPT2Family
from .qwen3 import Qwen3Family
from .qwen35 import Qwen35Family

__all__ = ["Architecture", "Family", "Ops", "family_for"]

_FAMILIES: dict[str, Family] = {family.name: family for family in (Qwen3Family(), Qwen35Family(), GPT2Family())}


def family_for(model: type[InterpreterModel]) -> Family:
    """The family that runs `model` (by `model.family`)."""
    family = _FAMILIES.get(model.family)
    if family is None:
        known = ", ".join(sorted(_FAMILIES))
        raise BaseModelError(None, f"{model.__name__} has family {model.family!r}, which the Torch backend does not run (known: {known})")
    return family
