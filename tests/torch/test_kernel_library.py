"""The C kernels' shared library is code pawfn runs: it is loaded only while it is what pawfn's build wrote (its
sha256 recorded beside it), from a folder only this user can change; anything else is built again."""

from __future__ import annotations

import logging
import os
import re
import shutil
from pathlib import Path

import pytest

from pawfn.torch.ggml import build as ggml_build
from pawfn.torch.ggml.build import kernels_folder, trusted_library
from pawfn.torch.ggml.c_kernels import NativeKernels, native_kernels


@pytest.fixture
def built() -> NativeKernels:
    """The session's kernels (built by the system's compiler on first use), or a skip where none can be built."""
    kernels = native_kernels()
    if kernels is None:
        pytest.skip("the C kernels could not be built here (no C compiler?)")
    return kernels


def test_a_library_is_trusted_only_as_its_build_left_it(built: NativeKernels, tmp_path: Path) -> None:
    library = built.path
    assert trusted_library(library)  # the build recorded its sha256
    copy = tmp_path / library.name
    shutil.copy2(library, copy)
    assert not trusted_library(copy)  # no record of a build
    record = library.with_name(library.name + ".sha256")
    shutil.copy2(record, copy.with_name(copy.name + ".sha256"))
    copy.chmod(0o700)
    copy.with_name(copy.name + ".sha256").chmod(0o600)
    assert trusted_library(copy)
    copy.write_bytes(copy.read_bytes() + b"\0")  # changed after the build
    assert not trusted_library(copy)
    shutil.copy2(library, copy)
    copy.chmod(0o770)  # a group may change it
    assert not trusted_library(copy)


def test_a_kernels_folder_others_can_write_is_not_used(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with caplog.at_level(logging.WARNING, logger="pawfn"):
        chosen = kernels_folder(shared)
    assert chosen != shared and chosen.stat().st_mode & 0o077 == 0
    assert any(str(shared) in record.getMessage() and "chmod go-w" in record.getMessage() for record in caplog.records)
    private = kernels_folder(tmp_path / "cache" / "kernels")
    assert private == tmp_path / "cache" / "kernels" and private.stat().st_mode & 0o777 == 0o700


def test_a_library_changed_after_its_build_is_built_again_never_loaded(
    built: NativeKernels, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    """A compiler that counts its runs (and writes the session's real library): a fresh cache builds once, announced on
    stderr though it is no terminal; a library changed since, or one with no record of its build, is built again,
    with a warning, and the new one is loaded."""
    runs = tmp_path / "runs"
    wrapper = tmp_path / "counting-cc"
    wrapper.write_text(f'#!/bin/sh\nfor a; do [ "$prev" = "-o" ] && out="$a"; prev="$a"; done\necho run >> {runs}\ncp {built.path} "$out"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("PAW_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("PAW_KERNELS_DIR", raising=False)  # the session's shared folder: this test is about the cache's
    monkeypatch.setattr(ggml_build, "_compilers", lambda: [str(wrapper)])
    try:
        native_kernels.cache_clear()
        capfd.readouterr()
        first = native_kernels()
        assert first is not None and first.path.is_relative_to(tmp_path / "cache") and runs.read_text().count("run") == 1
        announced = capfd.readouterr().err.splitlines()
        assert len(announced) == 2 and announced[0].startswith("pawfn: compiling llama.cpp's arithmetic (C kernels)"), announced
        assert re.fullmatch(r"pawfn: C kernels done in \d+\.\d s", announced[1]), announced
        original = first.path.read_bytes()
        planted = first.path.with_name("planted.so")  # put in its place (the loaded one stays mapped: never written over)
        planted.write_bytes(original + b"planted")
        os.replace(planted, first.path)
        native_kernels.cache_clear()
        with caplog.at_level(logging.WARNING, logger="pawfn"):
            again = native_kernels()
        assert again is not None and runs.read_text().count("run") == 2 and again.path.read_bytes() == original
        assert any("does not match the sha256 its build recorded" in record.getMessage() for record in caplog.records)
        first.path.with_name(first.path.name + ".sha256").unlink()
        native_kernels.cache_clear()
        assert native_kernels() is not None and runs.read_text().count("run") == 3
        native_kernels.cache_clear()
        assert native_kernels() is not None and runs.read_text().count("run") == 3  # as built: loaded, not built again
    finally:
        native_kernels.cache_clear()


def test_paw_kernels_dir_holds_the_kernels_for_every_cache(built: NativeKernels, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """PAW_KERNELS_DIR (as torch's TORCH_EXTENSIONS_DIR): the kernels built there once serve any cache folder."""
    shared = tmp_path / "kernels"
    monkeypatch.setenv("PAW_KERNELS_DIR", str(shared))
    try:
        for cache in ("one", "two"):
            monkeypatch.setenv("PAW_CACHE_DIR", str(tmp_path / cache))
            native_kernels.cache_clear()
            kernels = native_kernels()
            assert kernels is not None and kernels.path.parent == shared
            assert not (tmp_path / cache / ".pawfn-derived" / "kernels").exists()
    finally:
        native_kernels.cache_clear()
