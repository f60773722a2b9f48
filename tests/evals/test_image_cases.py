"""Cases with several arguments and images (Qwen3.5 programs): read from a file with image paths relative to it, run
in slot order, shown in reports; a case whose image is missing or whose argument count is wrong is that case's error."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest

from pawfn import Image, PawConfig, PawFn, Positional, Qwen3_5_0_8B, RuntimeOptions, Torch
from pawfn.evals import CaseImage, CasesError, EvalCase, read_cases
from pawfn.testing import calls_of, fake
from tests.helpers.tiny_qwen35 import TinyVision

pytest.importorskip("PIL")
ONE_IMAGE = "<|im_start|>user\n{INPUT_0}<|vision_start|>{INPUT_1}<|vision_end|><|im_end|>\n<|im_start|>assistant\n"


def _png(path: Path, width: int, height: int, seed: int) -> Path:
    from PIL import Image as PILImage

    pixels = (np.random.default_rng(seed).random((height, width, 3)) * 255).astype(np.uint8)
    buffer = io.BytesIO()
    PILImage.fromarray(pixels).save(buffer, format="PNG")
    path.write_bytes(buffer.getvalue())
    return path


def _write(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def test_image_arguments_are_read_relative_to_their_file_and_run_in_slot_order(tmp_path: Path) -> None:
    (tmp_path / "photos").mkdir()
    _png(tmp_path / "photos" / "a.png", 8, 8, 1)
    cases_file = _write(
        tmp_path / "cases.jsonl",
        [
            {"id": "pair", "arguments": ["brighter?", {"image": "photos/a.png"}, {"image": "photos/a.png"}], "expected": "same"},
            {"id": "missing", "arguments": ["brighter?", {"image": "photos/gone.png"}, {"image": "photos/a.png"}], "expected": "same"},
            {"id": "count", "arguments": ["brighter?"], "expected": "same"},
        ],
    )
    cases = read_cases(cases_file)
    assert cases[0].input == "brighter? | [image photos/a.png] | [image photos/a.png]"  # what reports show
    assert cases[0].arguments == (
        "brighter?",
        CaseImage(image=str(tmp_path / "photos" / "a.png")),
        CaseImage(image=str(tmp_path / "photos" / "a.png")),
    )
    program = fake(PawFn[Qwen3_5_0_8B, Torch], {"brighter?\n<image>\n<image>": "same"}, arity=3)
    report = program.evaluate(cases)
    results = {result.case.id: result for result in report.results}
    assert results["pair"].correct and report.correct == 1 and report.errors == 2
    assert results["missing"].error is not None and "gone.png" in results["missing"].error
    assert results["count"].error is not None and "ArityError" in results["count"].error
    called = calls_of(program)[0].input
    assert isinstance(called, tuple) and called[0] == "brighter?" and all(isinstance(argument, Image) for argument in called[1:])
    with pytest.raises(CasesError, match=r'line 1: .*a case needs "input", or "arguments"'):
        read_cases(_write(tmp_path / "bad.jsonl", [{"expected": "x"}]))
    assert EvalCase(id="x", input="shown", expected="y", arguments=("a",)).input == "shown"


def test_a_vision_program_is_evaluated_on_image_cases(qwen35_vision: TinyVision, tmp_path: Path) -> None:
    images = [_png(tmp_path / f"{index}.png", width, height, index) for index, (width, height) in enumerate([(64, 64), (100, 70), (40, 200)])]
    options = RuntimeOptions(max_tokens=6)
    config = PawConfig(n_ctx=1024)
    with PawFn[Qwen3_5_0_8B, Torch].bare(base=qwen35_vision.text.gguf_path, template=ONE_IMAGE, config=config) as bare:
        describe = Positional[str, Image](bare)
        outputs = [describe.generate("Describe it.", Image(path), options=options).text for path in images]
        rows: list[dict[str, object]] = [
            {"id": path.stem, "arguments": ["Describe it.", {"image": path.name}], "expected": output}
            for path, output in zip(images, outputs, strict=True)
        ]
        rows[2]["expected"] = "not what it says"
        report = bare.evaluate(_write(tmp_path / "cases.jsonl", rows), options=options)
    assert (report.correct, report.total, report.errors) == (2, 3, 0)
    assert [result.output for result in report.results] == outputs  # each call alone gives what the batch gave
