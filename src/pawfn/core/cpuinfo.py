"""The host CPU's x86 feature flags, read from /proc/cpuinfo: which of llama.cpp's kernels (AVX2, AVX-512, VNNI, AMX)
this machine runs, for the torch backend's arithmetic and the llama.cpp backend's AMX workaround alike.

Standard library only: `scripts/install.sh` runs `pawfn/llamacpp/cpu.py` (which reads flags here) before pawfn's
dependencies are installed."""

from __future__ import annotations

import functools
from pathlib import Path

__all__ = ["CPUINFO", "cpu_flags", "host_cpu_flags"]

_PROC_CPUINFO = Path("/proc/cpuinfo")
CPUINFO = _PROC_CPUINFO
"""Where `cpu_flags()` reads by default (tests point the llama.cpp backend's checks at another machine's)."""


def cpu_flags(cpuinfo: Path | None = None) -> frozenset[str]:
    """The x86 feature flags of the first CPU in `cpuinfo` (default `CPUINFO`); empty where there are none."""
    try:
        text = (CPUINFO if cpuinfo is None else cpuinfo).read_text(encoding="ascii", errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


@functools.cache
def host_cpu_flags() -> frozenset[str]:
    """This machine's flags, read once: the kernels compiled and the arithmetic chosen in this process follow them."""
    return cpu_flags(_PROC_CPUINFO)
