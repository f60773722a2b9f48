"""llama.cpp's block products in C (`ggml_kernels.c`), for the `numerics="llamacpp"` mode: the arithmetic of
`ggml.BlockMatrix` (bit-identical, tested against it and against llama.cpp) at llama.cpp's speed.

The C file is compiled on first use with the system's C compiler (`$CC`, else `cc`, `gcc` or `clang`) into
`<cache>/kernels/`, keyed by a hash of the source and flags, and loaded with ctypes; where no compiler works, the
mode falls back to the torch emulation (the same tokens, several times slower) with one warning. Products split
their output features across `torch.get_num_threads()` threads (ctypes releases the GIL during a call).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

from ..config import default_cache_dir
from ..files import write_atomically

__all__ = ["NativeBlockMatrix", "native_attention", "native_expf", "native_kernels"]

_SOURCE = Path(__file__).with_name("ggml_kernels.c")
_FLAGS = ["-O3", "-mavx2", "-mfma", "-mf16c", "-ffp-contract=off", "-fno-fast-math", "-fPIC", "-shared"]
_TILED_MIN_ROWS = 8  # ggml_tiled_min_batch
_SPLIT_MIN_WORK = 1 << 16  # int8 products below which a call runs on one thread (a thread hand-off costs ~20 us)
_I64 = ctypes.c_int64
_PTR = ctypes.c_void_p


class _Kernels:
    """The compiled library's functions, their argument types declared."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self.quantize_q8_k = self._declare(library.paw_quantize_q8_k, [_PTR, _I64, _I64, _PTR, _PTR, _PTR])
        self.quantize_q8_0 = self._declare(library.paw_quantize_q8_0, [_PTR, _I64, _I64, _PTR, _PTR])
        product = [_PTR, _PTR, _PTR, _PTR, _PTR, _PTR, _PTR, _I64, _I64, _I64, _I64, _I64]
        self.q6_k_rows = self._declare(library.paw_q6_k_rows, product)
        self.q6_k_tiled = self._declare(library.paw_q6_k_tiled, product)
        self.q6_k_tiled_sums = self._declare(library.paw_q6_k_tiled_sums, product[3:])
        self.q0_rows = self._declare(library.paw_q0_rows, product[2:])
        self.q4_0_repacked = self._declare(library.paw_q4_0_repacked, product[2:])
        self.attention = self._declare(library.paw_attention, [
            _PTR, _PTR, _PTR, _I64, _I64, _PTR, _PTR, _I64, _I64, _PTR, _I64, _I64, _I64, _I64, _I64, ctypes.c_float,
            _I64, _PTR, _I64, _I64])
        self.expf = self._declare(library.paw_expf, [_PTR, _PTR, _I64, _I64])

    @staticmethod
    def _declare(function: Callable[..., None], arguments: list[type[ctypes.c_int64] | type[ctypes.c_void_p] | type[ctypes.c_float]]) -> Callable[..., None]:
        function.argtypes = arguments  # type: ignore[attr-defined]  # ctypes function pointers take these attributes
        function.restype = None  # type: ignore[attr-defined]
        return function


def _compilers() -> list[str]:
    named = os.environ.get("CC")
    candidates = ([named] if named else []) + ["cc", "gcc", "clang"]
    return [path for path in (shutil.which(c) for c in candidates) if path is not None]


class _BuildError(Exception):
    """A compiler's failure (internal: `native_kernels` tries the next one, then warns)."""


def _build(target: Path) -> str | None:
    """Compile the kernels into `target`; None on success, else why not (the last compiler's error)."""
    failure = "no C compiler found (set CC, or install gcc or clang)"
    for compiler in _compilers():
        def compile_to(path: Path, compiler: str = compiler) -> None:
            result = subprocess.run([compiler, *_FLAGS, str(_SOURCE), "-o", str(path), "-lm"],
                                    capture_output=True, text=True, check=False, timeout=300)
            if result.returncode != 0:
                raise _BuildError(f"{compiler} failed: {result.stderr.strip()[-500:]}")
        try:
            write_atomically(target, compile_to)
        except _BuildError as error:
            failure = str(error)
            continue
        return None
    return failure


@functools.cache
def native_kernels() -> _Kernels | None:
    """The compiled kernels (built on first use, then reused from the cache), or None where they cannot be built."""
    if os.environ.get("PAW_NATIVE_KERNELS", "1").lower() in ("0", "false", "no", "off"):
        return None
    key = hashlib.sha256(_SOURCE.read_bytes() + " ".join(_FLAGS).encode()).hexdigest()[:16]
    target = default_cache_dir() / "kernels" / f"ggml-{key}.so"
    failure = None
    if not target.exists():
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            failure = _build(target)
        except (OSError, subprocess.SubprocessError) as error:
            failure = str(error)
    if failure is None:
        try:
            return _Kernels(ctypes.CDLL(str(target)))
        except (OSError, AttributeError) as error:
            failure = str(error)
    warnings.warn(f"pawfn: numerics='llamacpp' runs on its torch emulation (the same tokens, several times slower): "
                  f"its C kernels could not be built ({failure})", RuntimeWarning, stacklevel=2)
    return None


@functools.cache
def _pool(workers: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=workers, thread_name_prefix="pawfn-ggml")


def _split(run: Callable[[int, int], None], out: int, work: int) -> None:
    """`run(first, last)` over output features [0, out), in one chunk per torch thread when the call is large."""
    threads = min(torch.get_num_threads(), out)
    if threads <= 1 or work < _SPLIT_MIN_WORK:
        run(0, out)
        return
    bounds = [out * i // threads for i in range(threads + 1)]
    futures = [_pool(threads - 1).submit(run, bounds[i], bounds[i + 1]) for i in range(1, threads)]
    run(bounds[0], bounds[1])
    for future in futures:
        future.result()


def _int_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """int8 [m, k] times int8 [k, n], summed exactly in int32 (torch's oneDNN int8 GEMM; private but stable API)."""
    product: torch.Tensor = torch._int_mm(a, b)  # pyright: ignore[reportPrivateUsage, reportPrivateImportUsage]  # no public int8 GEMM
    return product


def _ptr(tensor: torch.Tensor) -> int:
    return tensor.data_ptr()


def native_attention(
    kernels: _Kernels, q: torch.Tensor, prefix: tuple[torch.Tensor, torch.Tensor] | None, keys: torch.Tensor,
    values: torch.Tensor, width: int,
) -> torch.Tensor:
    """`ggml.ggml_attention` in C: q [n, H, D] over a program's prefix keys/values [KV, P, D] (f16, or None) then
    the sequence's own [KV, L, D] (f16 views whose rows are contiguous), as one cache. Returns [n, H * D]."""
    q = q.float().contiguous()
    n, heads, dim = q.shape
    kv_heads, own = keys.shape[0], keys.shape[1]
    for view in (keys, values) + (prefix or ()):
        if view.dtype != torch.float16 or view.stride(2) != 1 or view.stride(1) != dim:
            raise ValueError("attention needs f16 keys and values with contiguous rows")
    prefix_keys, prefix_values = prefix if prefix is not None else (keys, values)
    prefix_length = prefix_keys.shape[1] if prefix is not None else 0
    length = prefix_length + own
    padded = -(-length // (4 * width)) * (4 * width)  # llama.cpp pads its KV view; padded positions weigh 0
    scale = float(torch.div(torch.tensor(1.0), torch.sqrt(torch.tensor(float(dim), dtype=torch.float64)).float()))
    out = torch.empty((n, heads * dim), dtype=torch.float32)

    def run(first: int, last: int) -> None:
        scratch = torch.empty(padded + dim + 64 * dim, dtype=torch.float32)
        kernels.attention(_ptr(q), _ptr(prefix_keys), _ptr(prefix_values), prefix_length, prefix_keys.stride(0),
                          _ptr(keys), _ptr(values), own, keys.stride(0), _ptr(out), n, heads, kv_heads, dim, padded,
                          scale, width, _ptr(scratch), first, last)

    _split(run, heads, n * heads * length * dim)
    return out


def native_expf(kernels: _Kernels, x: torch.Tensor, width: int) -> torch.Tensor:
    """`ggml.ggml_expf` in C."""
    x = x.float().contiguous()
    y = torch.empty_like(x)
    kernels.expf(_ptr(x), _ptr(y), x.numel(), width)
    return y


@dataclass
class NativeBlockMatrix:
    """A quantized `[out, in]` GGUF matrix kept as its codes, multiplied by the C kernels as llama.cpp does."""

    kind: Literal["q4_0", "q8_0", "q6_k"]
    codes: torch.Tensor
    """Q6_K: unsigned codes (0..63) uint8 [out, blocks, 256]; Q4_0/Q8_0: signed codes int8 [out, blocks, 32]."""
    scale: torch.Tensor
    """Per block f16 scale as float32, [out, blocks]."""
    sub_scales: torch.Tensor | None
    """Q6_K: int8 sub-block scales [out, blocks, 16]."""
    repacked: bool = False
    """A Q4_0 base weight llama.cpp repacks (see `ggml.BlockMatrix.repacked`)."""
    kernels: _Kernels | None = None
    split: torch.Tensor | None = None
    """Q6_K matrices multiplied 8 rows at a time or more (base layers): each unsigned code times its sub-block scale
    as `64 * high + low`, int8 [2, blocks, out, 256], so the tiled kernel's exact block sums come from torch's int8
    GEMM (oneDNN: AMX or VNNI where the CPU has them)."""

    @property
    def out_features(self) -> int:
        """Output width."""
        return int(self.codes.shape[0])

    def _kernels(self) -> _Kernels:
        if self.kernels is None:
            raise RuntimeError("a NativeBlockMatrix needs its kernels")
        return self.kernels

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """`x @ W.T` for `x` [n, in] evaluated in one graph of n rows (the kernel depends on n for Q6_K)."""
        return self._product(x, tiled=self.kind == "q6_k" and x.shape[0] >= _TILED_MIN_ROWS)

    def rows(self, x: torch.Tensor) -> torch.Tensor:
        """Every row as if multiplied alone (one-row kernels): a row's result never depends on the others."""
        return self._product(x, tiled=False)

    def accumulate(self, y: torch.Tensor, x: torch.Tensor, alpha: float, by_rows: bool) -> None:
        """`y += alpha * self(x)` (`self.rows(x)` if `by_rows`), the product and the scaling rounded apart."""
        y += (self.rows(x) if by_rows else self(x)) * alpha

    def _product(self, x: torch.Tensor, tiled: bool) -> torch.Tensor:
        kernels = self._kernels()
        x = x.float().contiguous()
        rows, width = x.shape
        out, blocks = self.out_features, self.scale.shape[1]
        y = torch.empty((rows, out), dtype=torch.float32)
        codes = torch.empty((rows, width), dtype=torch.int8)
        x_scale = torch.empty((rows, blocks), dtype=torch.float32)
        if self.kind == "q6_k":
            sums = torch.empty((rows, blocks, 16), dtype=torch.int16)
            kernels.quantize_q8_k(_ptr(x), rows, width, _ptr(codes), _ptr(x_scale), _ptr(sums))
            sub = self.sub_scales if self.sub_scales is not None else self.scale
            if tiled and self.split is not None:
                block_sums = self._block_sums(codes, sums, sub)
                _split(lambda first, last: kernels.q6_k_tiled_sums(
                    _ptr(block_sums), _ptr(self.scale), _ptr(x_scale), _ptr(y), rows, out, blocks, first, last),
                    out, rows * out * blocks * 64)
                return y

            kernel = kernels.q6_k_tiled if tiled else kernels.q6_k_rows
            _split(lambda first, last: kernel(_ptr(self.codes), _ptr(sub), _ptr(self.scale), _ptr(codes), _ptr(x_scale),
                                              _ptr(sums), _ptr(y), rows, out, blocks, first, last), out, rows * out * width)
        else:
            kernels.quantize_q8_0(_ptr(x), rows, width, _ptr(codes), _ptr(x_scale))
            kernel = kernels.q4_0_repacked if self.repacked else kernels.q0_rows
            _split(lambda first, last: kernel(_ptr(self.codes), _ptr(self.scale), _ptr(codes), _ptr(x_scale), _ptr(y),
                                              rows, out, blocks, first, last), out, rows * out * width)
        return y

    def _block_sums(self, codes: torch.Tensor, sums: torch.Tensor, sub: torch.Tensor) -> torch.Tensor:
        """Exact int32 sums of signed code products per block, [blocks, rows, out]: the unsigned codes' (two int8
        GEMMs joined) less 32 * the Q8_K code sums times the sub-block scales (exact in float32: below 2**23)."""
        assert self.split is not None
        rows, blocks = codes.shape[0], self.scale.shape[1]
        codes = codes.reshape(rows, blocks, 256)
        offsets = torch.bmm(sums.transpose(0, 1).float(), sub.permute(1, 2, 0).float()).to(torch.int32) * 32
        out = torch.empty((blocks, rows, self.out_features), dtype=torch.int32)
        for block in range(blocks):
            x = codes[:, block]
            out[block] = _int_mm(x, self.split[0, block].t()) * 64 + _int_mm(x, self.split[1, block].t()) - offsets[block]
        return out
