"""The figures an evaluation reports: accuracy's 95% interval (Wilson's score interval), per-label precision and
recall, and the exact McNemar test of two programs on the same cases."""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["Z_95", "mcnemar_exact", "precision_recall", "wilson_interval"]

Z_95 = 1.959963984540054
"""The standard normal's 97.5% quantile: a two-sided 95% interval."""


def wilson_interval(correct: int, total: int, z: float = Z_95) -> tuple[float, float]:
    """Wilson's score interval for `correct` successes in `total` trials (both bounds in [0, 1]; (0, 1) for none)."""
    if total <= 0:
        return 0.0, 1.0
    p = correct / total
    denominator = 1 + z * z / total
    centre = (p + z * z / (2 * total)) / denominator
    half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


def mcnemar_exact(fixed: int, broken: int) -> float:
    """The exact (binomial) two-sided McNemar p-value for the discordant pairs: `fixed` cases right only in the
    second run, `broken` right only in the first (1.0 when there are none)."""
    n = fixed + broken
    if n == 0:
        return 1.0
    k = min(fixed, broken)
    tail: float = sum(math.comb(n, i) for i in range(k + 1)) / 2**n  # exact integers, one division
    return min(1.0, 2 * tail)


def precision_recall(expected: Sequence[str], got: Sequence[str], label: str) -> tuple[float | None, float | None]:
    """Precision (of the outputs that were `label`, the share that should be) and recall (of the cases whose label is
    `label`, the share that got it); None where nothing was counted."""
    predicted = sum(1 for output in got if output == label)
    actual = sum(1 for truth in expected if truth == label)
    hits = sum(1 for truth, output in zip(expected, got, strict=True) if truth == output == label)
    return (hits / predicted if predicted else None), (hits / actual if actual else None)
