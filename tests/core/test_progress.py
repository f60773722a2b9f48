"""Progress bars: shown when asked (or on a terminal), silent otherwise, and they never change what is counted."""

from __future__ import annotations

import logging
import re
import time

import pytest

from pawfn.core.progress import LoadSteps, download_progress, load_step, loading, progress_enabled, track
from tests.helpers.programs import TinyProgram


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


def test_a_loads_steps_show_on_its_bar_once_past_the_delay(capsys: pytest.CaptureFixture[str]) -> None:
    """On a terminal (progress on): nothing while the load is young, then a line naming the step it is on."""
    quick = LoadSteps("quick.paw", True, delay_s=0.5)
    quick.step("the Torch backend")
    quick.close(True)
    assert capsys.readouterr().err == ""  # done within the delay: no line at all
    steps = LoadSteps("triage.paw", True, delay_s=0.2)
    steps.step("the Torch backend")
    steps.step("reading base q6_k.gguf onto cpu")
    time.sleep(0.6)  # one long step, no call from the load meanwhile: the line comes anyway
    err = capsys.readouterr().err
    steps.close(True)
    assert "loading triage.paw: reading base q6_k.gguf onto cpu" in err and "the Torch backend" not in err, err


def test_elsewhere_a_loads_steps_are_info_lines(capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    """Progress off (a pipe, CI): no bar, each step and the whole load's time in the `pawfn` log at INFO."""
    with caplog.at_level(logging.INFO, logger="pawfn"), loading("triage.paw", False):
        load_step("the Torch backend")
        load_step("its 29-token prefix")
    load_step("after the load: no one listens")
    messages = [record.getMessage() for record in caplog.records]
    assert messages[:2] == ["loading triage.paw: the Torch backend", "loading triage.paw: its 29-token prefix"]
    assert re.fullmatch(r"loaded triage\.paw in \d+\.\d\d s", messages[2]) and len(messages) == 3
    assert capsys.readouterr().err == ""


def test_a_real_load_reports_its_steps(qwen3_program: TinyProgram, caplog: pytest.LogCaptureFixture) -> None:
    """Loading a program on Torch names the backend, the base it reads (once per base), the adapter and the prefix."""
    from pawfn import PawConfig, PawFn, Qwen3_0_6B, Torch

    base = qwen3_program.interpreter.gguf_path
    with caplog.at_level(logging.INFO, logger="pawfn"):
        with PawFn[Qwen3_0_6B, Torch].load_sync(qwen3_program.folder, base=base, config=PawConfig(progress=False)):
            pass
    steps = [record.getMessage().split(": ", 1)[1] for record in caplog.records if record.getMessage().startswith("loading ")]
    assert steps == ["the Torch backend", f"reading base {base.name} onto cpu", "attaching the program's adapter", "its 29-token prefix"]
