"""The CPU llama.cpp runs on and the llama.cpp build it runs, for one known failure: AMX.

llama.cpp built with native flags on a CPU with AMX (Intel Sapphire Rapids and later) puts quantized weights in
its AMX buffer, and `ggml_backend_amx_mul_mat` segfaults on the first product (upstream issue #20824, open).
Two ways around it, both here: build llama-cpp-python without AMX (`cmake_args_without_amx`, printed by
``python -m pawfn.llamacpp cmake-args``), or load models without llama.cpp's extra buffer types
(`use_extra_bufts`, llama.cpp's ``--no-repack``), which the LlamaCpp backend does on such a build by itself.

Standard library only (with `pawfn.core.cpuinfo`, which is too), and nothing here imports llama-cpp-python unless
asked for its build.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING or __package__:
    from ..core.cpuinfo import CPUINFO, cpu_flags
else:  # run by path (scripts/install.sh) before pawfn's dependencies are installed: the same reader, found beside
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "core"))
    from cpuinfo import CPUINFO, cpu_flags

__all__ = [
    "AMX_ISSUE",
    "CPUINFO",
    "REBUILD_WITHOUT_AMX",
    "build_has_amx",
    "cmake_args_without_amx",
    "cpu_flags",
    "cpu_has_amx",
    "llama_cpp_system_info",
    "repack_is_safe",
]

AMX_ISSUE = "https://github.com/ggml-org/llama.cpp/issues/20824"
"""The upstream report of the crash (`ggml_backend_amx_mul_mat` segfaults on quantized weights)."""
REBUILD_WITHOUT_AMX = 'CMAKE_ARGS="$(python -m pawfn.llamacpp cmake-args)" pip install --force-reinstall --no-deps --no-cache-dir llama-cpp-python'
"""The command that replaces an installed llama-cpp-python with one built for this CPU without AMX."""

# cpuinfo flags that ggml's CMake options need, in the order ggml lists them. GGML_AVX512 compiles with
# -mavx512f/cd/vl/dq/bw, so it needs all five; every other option is one flag.
_GGML_OPTIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("GGML_SSE42", ("sse4_2",)),
    ("GGML_F16C", ("f16c",)),
    ("GGML_FMA", ("fma",)),
    ("GGML_BMI2", ("bmi2",)),
    ("GGML_AVX", ("avx",)),
    ("GGML_AVX2", ("avx2",)),
    ("GGML_AVX_VNNI", ("avx_vnni",)),
    ("GGML_AVX512", ("avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw")),
    ("GGML_AVX512_VBMI", ("avx512vbmi",)),
    ("GGML_AVX512_VNNI", ("avx512_vnni",)),
    ("GGML_AVX512_BF16", ("avx512_bf16",)),
)


def cpu_has_amx(flags: Iterable[str]) -> bool:
    """Whether the CPU has the AMX tiles and int8 products llama.cpp's AMX backend uses."""
    present = set(flags)
    return "amx_tile" in present and "amx_int8" in present


def cmake_args_without_amx(flags: Iterable[str]) -> list[str]:
    """llama-cpp-python's CMAKE_ARGS for a CPU with `flags`: none (ggml's native build) unless it has AMX; then
    native detection off and every x86 feature ggml uses that the CPU has, named, AMX left out."""
    present = frozenset(flags)
    if not cpu_has_amx(present):
        return []
    args = ["-DGGML_NATIVE=OFF"]
    for option, needed in _GGML_OPTIONS:
        args.append(f"-D{option}={'ON' if present.issuperset(needed) else 'OFF'}")
    args += ["-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"]
    return args


def llama_cpp_system_info() -> str | None:
    """llama.cpp's system info line (its build's CPU features), or None without llama-cpp-python."""
    try:
        import llama_cpp
    except ImportError:
        return None
    return llama_cpp.llama_print_system_info().decode(errors="replace").strip()


def build_has_amx(system_info: str) -> bool:
    """Whether a llama.cpp build's system info says its AMX backend is compiled in."""
    return "AMX_INT8 = 1" in system_info


def repack_is_safe(flags: Iterable[str], system_info: str) -> bool:
    """Whether llama.cpp's extra buffer types can be used: not where both the CPU and the build have AMX."""
    return not (cpu_has_amx(flags) and build_has_amx(system_info))


def main(argv: Sequence[str] | None = None) -> int:
    """``cmake-args``: print CMAKE_ARGS for this CPU; ``check``: print llama.cpp's build, exit 1 if it would crash."""
    parser = argparse.ArgumentParser(prog="python -m pawfn.llamacpp", description=main.__doc__)
    parser.add_argument("command", choices=("cmake-args", "check"))
    parser.add_argument("--cpuinfo", type=Path, help=f"read CPU flags from this file (default: {CPUINFO})")
    args = parser.parse_args(argv)
    flags = cpu_flags(args.cpuinfo)
    if args.command == "cmake-args":
        print(shlex.join(cmake_args_without_amx(flags)))
        return 0
    info = llama_cpp_system_info()
    if info is None:
        print("llama-cpp-python is not installed", file=sys.stderr)
        return 1
    print(f"llama.cpp: {info}")
    if not repack_is_safe(flags, info):
        print(
            f"llama.cpp here was built with its AMX backend on a CPU with AMX: llama.cpp itself segfaults on quantized "
            f"weights ({AMX_ISSUE}); pawfn's LlamaCpp backend loads without repacking, but rebuild for everything else: "
            f"{REBUILD_WITHOUT_AMX}",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
