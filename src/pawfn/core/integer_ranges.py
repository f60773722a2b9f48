"""Regular expressions of exactly the integers in a range (`integer_range`): the language of llama.cpp's bounded-integer
grammar, for a JSON schema's `minimum`/`maximum` (`grammar`)."""

from __future__ import annotations

__all__ = ["integer_range"]


def integer_range(low: int, high: int) -> str:
    """A regular expression of exactly the integers from `low` to `high` (inclusive) written without leading zeros
    or a sign on zero: the language of llama.cpp's bounded-integer grammar."""
    if low > high:
        raise ValueError(f"empty range {low}..{high}")
    parts: list[str] = []
    if low < 0:
        parts.append(f"-({_natural_range(max(1, -high), -low)})")
    if high >= 0:
        parts.append(_natural_range(max(0, low), high))
    return "|".join(parts)


def _natural_range(low: int, high: int) -> str:
    """The numbers `low`..`high` (0 <= low <= high) in decimal, one alternative per digit count."""
    parts: list[str] = []
    for digits in range(len(str(low)), len(str(high)) + 1):
        first = low if digits == len(str(low)) else 10 ** (digits - 1)
        last = high if digits == len(str(high)) else 10**digits - 1
        parts.append(_same_length(str(first), str(last)))
    return "|".join(f"({part})" for part in parts) if len(parts) > 1 else parts[0]


def _same_length(low: str, high: str) -> str:
    """Numbers from `low` to `high`, written with as many digits as both have."""
    if low == high:
        return low
    if len(low) == 1:
        return f"[{low}-{high}]"
    common = 0
    while low[common] == high[common]:
        common += 1
    if common:
        return f"{low[:common]}({_same_length(low[common:], high[common:])})"
    rest = len(low) - 1
    zeros, nines = "0" * rest, "9" * rest
    parts: list[str] = []
    first, last = int(low[0]), int(high[0])
    if low[1:] != zeros:
        parts.append(f"{low[0]}({_same_length(low[1:], nines)})")
        first += 1
    tail = high[1:] != nines
    if tail:
        last -= 1
    if first <= last:
        parts.append(f"[{first}-{last}][0-9]{{{rest}}}")
    if tail:
        parts.append(f"{high[0]}({_same_length(zeros, high[1:])})")
    return "|".join(parts)
