"""Compiling `ggml/kernels.c` (llama.cpp's CPU arithmetic in C) into the shared library `numerics="llamacpp"` loads:
once per pawfn version, into the cache, saying so."""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ...core.files import write_atomically
from ...core.hashing import file_sha256
from ...core.progress import progress_enabled

__all__ = ["STRICT_FLAGS", "build_key", "build_kernels", "compile_command", "kernels_folder", "trusted_library"]

_SOURCE = Path(__file__).with_name("kernels.c")
_FLAGS = ["-O3", "-mavx2", "-mfma", "-mf16c", "-ffp-contract=off", "-fno-fast-math", "-fPIC", "-shared"]
STRICT_FLAGS = ["-Wall", "-Werror"]
"""What the project's tests compile the source with (it has no warnings); a user's build leaves them out, so a newer
compiler's new warning costs nothing (with -Werror it failed the fast builds and left the AVX2 ones)."""
_THREADED = ["-fopenmp"]
"""Tried first; a compiler without an OpenMP runtime (clang without libomp) builds the kernels single-threaded."""
_BASELINE = "-DPAW_BASELINE"
"""Leaves out the AMX and AVX-512 VNNI kernels, for compilers that do not know those instructions."""
_LOG = logging.getLogger("pawfn")


def _digest_path(library: Path) -> Path:
    """Where the build records the library's sha256: beside it (`ggml-KEY.so.sha256`)."""
    return library.with_name(library.name + ".sha256")


def _private(path: Path) -> bool:
    """Whether only this user can change `path`: it is theirs, no symbolic link, and no group or other may write it."""
    try:
        stat = path.lstat()
    except OSError:
        return False
    return not path.is_symlink() and stat.st_uid == os.geteuid() and not stat.st_mode & 0o022


def kernels_folder(preferred: Path) -> Path:
    """`preferred` (made private, 0700, where missing) if only this user can change it, else a private temporary
    folder of this process's own, with a warning naming the fix: a library someone else can replace is code they run."""
    try:
        preferred.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError:
        pass
    if _private(preferred):
        return preferred
    fallback = Path(tempfile.mkdtemp(prefix="pawfn-kernels-"))  # 0700, this user's
    _LOG.warning(
        "pawfn: %s is not this user's alone (another user could replace the C kernels it loads): built them "
        "in %s for this process instead; make it private with chmod go-w, or set PAW_CACHE_DIR to a folder of your own",
        preferred,
        fallback,
    )
    return fallback


def trusted_library(library: Path) -> bool:
    """Whether `library` is what a build of ours wrote: a private file whose sha256 is the one recorded beside it at
    build time (a file changed since, or copied in without its record, is built again, never loaded)."""
    digest = _digest_path(library)
    if not (_private(library) and _private(digest)):
        return False
    try:
        recorded = digest.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return False
    return hmac.compare_digest(file_sha256(library), recorded)


def build_key() -> str:
    """What names a build: the source and the flags (a new pawfn version with other kernels builds again)."""
    return hashlib.sha256(_SOURCE.read_bytes() + " ".join(_FLAGS + _THREADED).encode()).hexdigest()[:16]


def compile_command(compiler: str, extra: list[str], output: Path) -> list[str]:
    """The command line that compiles the kernels with `compiler` into `output`, with flags `extra` beside the build's own."""
    return [compiler, *_FLAGS, *extra, str(_SOURCE), "-o", str(output), "-lm"]


def _compilers() -> list[str]:
    named = os.environ.get("CC")
    candidates = ([named] if named else []) + ["cc", "gcc", "clang"]
    return [path for path in (shutil.which(c) for c in candidates) if path is not None]


class _BuildError(Exception):
    """A compiler's failure (internal: `native_kernels` tries the next one, then warns)."""


def build_kernels(target: Path) -> str | None:
    """`_build`, announced on stderr in every case (and in the `pawfn` log): the first call of `numerics="llamacpp"`
    after an install pauses for the compiler (~10 s), once per pawfn version; on a terminal the line ends when the
    build does, elsewhere (a CI log, a pipe) a second line says how it ended."""
    started = time.perf_counter()
    on_terminal = progress_enabled(None)
    what = "pawfn: compiling llama.cpp's arithmetic (C kernels) for numerics='llamacpp', once per pawfn version"
    print(f"{what}..." if on_terminal else f"{what} ({target.parent})", end="" if on_terminal else "\n", file=sys.stderr, flush=True)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        failure = _build(target)
    except (OSError, subprocess.SubprocessError) as error:
        failure = str(error)
    outcome = f"done in {time.perf_counter() - started:.1f} s" if failure is None else "failed"
    print(f" {outcome} ({target})" if on_terminal else f"pawfn: C kernels {outcome}", file=sys.stderr, flush=True)
    _LOG.info("%s: %s (%s)", what, outcome, target)
    return failure


def _build(target: Path) -> str | None:
    """Compile the kernels into `target`; None on success, else why not (the last compiler's error)."""
    failure = "no C compiler found (set CC, or install gcc or clang)"
    # without OpenMP where the compiler has no runtime for it; without the AMX and AVX-512 VNNI kernels where it
    # knows no such instructions (older compilers): the AVX2 ones give the same results
    attempts = [_THREADED, [], [*_THREADED, _BASELINE], [_BASELINE]]
    for compiler in _compilers():
        for attempt, extra in enumerate(attempts):

            def compile_to(path: Path, compiler: str = compiler, extra: list[str] = extra) -> None:
                result = subprocess.run(compile_command(compiler, extra, path), capture_output=True, text=True, check=False, timeout=300)
                if result.returncode != 0:
                    raise _BuildError(f"{compiler} failed: {result.stderr.strip()[-500:]}")
                path.chmod(0o700)  # the compiler's file follows the umask: only this user may change it

            try:
                write_atomically(target, compile_to)
            except _BuildError as error:
                failure = str(error)
                continue
            write_atomically(_digest_path(target), lambda path: path.write_text(file_sha256(target), encoding="ascii"))
            if attempt:  # a slower build than the first one: say what it lacks, and why (the failed build's words)
                left_out = [] if _THREADED[0] in extra else ["OpenMP (every kernel on one thread)"]
                left_out += ["the AVX-512 VNNI and AMX kernels (the AVX2 ones: the same results, slower)"] if _BASELINE in extra else []
                _LOG.warning(
                    "pawfn: the C kernels were built without %s, as %s. Another compiler (CC=...) may build them whole.",
                    " and ".join(left_out),
                    failure,
                )
            return None
    return failure
