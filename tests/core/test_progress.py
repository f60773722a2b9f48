"""Progress bars: shown when asked (or on a terminal), silent otherwise, and they never change what is counted."""

from __future__ import annotations

import pytest

from pawfn.core.progress import download_progress, progress_enabled, track


def test_off_means_no_bar(capsys: pytest.CaptureFixture[str]) -> None:
    assert download_progress("file", False) is None
    assert list(track(range(5), "items", 5, False)) == [0, 1, 2, 3, 4]
    assert capsys.readouterr().err == ""
    assert progress_enabled(None) is False  # pytest's stderr is not a terminal


def test_a_download_bar_counts_bytes_to_the_total(capsys: pytest.CaptureFixture[str]) -> None:
    update = download_progress("base model x.gguf", True)
    assert update is not None
    for done in (1024, 4096, 8192):
        update(done, 8192)
    err = capsys.readouterr().err
    assert "base model x.gguf" in err and "100%" in err and "8.00k" in err


def test_track_yields_every_item_with_a_bar(capsys: pytest.CaptureFixture[str]) -> None:
    assert list(track(iter("abc"), "loading weights", None, True)) == ["a", "b", "c"]
    assert "loading weights" in capsys.readouterr().err
