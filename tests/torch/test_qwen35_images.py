"""Image arguments on a tiny Qwen3.5 with a vision tower (its projector written as llama.cpp's converter writes it).
The LlamaCpp backend (llama.cpp's mtmd, as the official vision runtime drives it) against the official SDK's own
vision runtime run in a child process: the same text for images of several sizes, two images in one call, bare and
with a program's adapter. The Torch backend's tower against mtmd's embeddings, and its tokens against LlamaCpp's,
one call at a time and batched."""

from __future__ import annotations

import asyncio
import contextlib
import base64
import importlib.util
import json
import logging
import shutil
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gguf
import httpx
import numpy as np
import pytest

from pawfn import (
    Backend,
    ConfigError,
    Generation,
    Image,
    ImageError,
    LlamaCpp,
    PawConfig,
    PawFn,
    Positional,
    Qwen3_5_0_8B,
    Remote,
    RuntimeOptions,
    Torch,
)
from pawfn.cli import main
from tests.helpers.mtmd_reference import mtmd_context, mtmd_embeddings, random_png
from tests.helpers.programs import make_program, requires_llama_cpp
from tests.helpers.references import llama_quantize
from tests.helpers.servers import start_server
from tests.helpers.tiny_qwen35 import TinyVision

if TYPE_CHECKING:
    from llama_cpp.mtmd_cpp import mtmd_context_p

pytest.importorskip("PIL")
official = pytest.importorskip("programasweights._runtime_vision")
pytestmark = requires_llama_cpp

ONE_IMAGE = "<|im_start|>user\n{INPUT_0}<|vision_start|>{INPUT_1}<|vision_end|><|im_end|>\n<|im_start|>assistant\n"
TWO_IMAGES = "<|im_start|>user\nCompare {INPUT_0} with {INPUT_1}: {INPUT_2}<|im_end|>\n<|im_start|>assistant\n"
MAX_TOKENS = 12
N_CTX = 1024
TEXT_WIDTH = 64  # the tiny model's hidden size: the projector's output

_OFFICIAL = """
import hashlib, json, sys
from collections.abc import Generator
from pathlib import Path
from programasweights import Image
from programasweights._prompt_template import bind_template, parse_template
from programasweights._runtime_vision import _Runtime
from programasweights._vision_assets import VisionAssetPaths
request = json.loads(sys.stdin.read())
paths = VisionAssetPaths(Path(request["base"]), Path(request["projector"]))
runtime = _Runtime(paths, {"image_min_tokens": 1, "image_max_tokens": 512}, n_ctx=request["n_ctx"], n_gpu_layers=0, verbose=False)
adapter = None
if request["adapter"] is not None:
    path = Path(request["adapter"])
    adapter = (path, hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_size)
segments = parse_template(request["template"], "{INPUT_N}")
texts = []
for arguments in request["calls"]:
    values = [Image(bytes.fromhex(a["image"])) if "image" in a else a["text"] for a in arguments]
    texts.append(runtime.run(adapter, bind_template(segments, *values), max_tokens=request["max_tokens"], temperature=0.0))
runtime.close()
print(json.dumps(texts))
"""


def _official_texts(vision: TinyVision, template: str, calls: list[list[str | bytes]], adapter: Path | None = None) -> list[str]:
    request = {
        "base": str(vision.text.gguf_path),
        "projector": str(vision.projector),
        "adapter": None if adapter is None else str(adapter),
        "template": template,
        "n_ctx": N_CTX,
        "max_tokens": MAX_TOKENS,
        "calls": [[{"image": a.hex()} if isinstance(a, bytes) else {"text": a} for a in call] for call in calls],
    }
    done = subprocess.run([sys.executable, "-c", _OFFICIAL], input=json.dumps(request), capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    texts: list[str] = json.loads(done.stdout.strip().splitlines()[-1])
    return texts


def _agrees(got: Generation, official: str) -> bool:
    """pawfn's generation reads as the official runtime's text: llama-cpp-python's completion drops bytes that are
    not UTF-8 (pawfn shows U+FFFD) and, at max_tokens in the middle of a character, generates on to finish it, so
    the official text then runs past pawfn's."""
    text = got.text.replace("\ufffd", "").strip()
    return text == official or (got.stop_reason == "max_tokens" and official.startswith(text))


def _config() -> PawConfig:
    return PawConfig(n_ctx=N_CTX)  # LlamaCpp's defaults: the official vision runtime's f16 KV cache and threads


IMAGES = [random_png(100, 70, 1), random_png(40, 200, 2), random_png(64, 64, 3), random_png(333, 250, 4)]


def test_images_of_several_sizes_give_the_official_runtimes_text(qwen35_vision: TinyVision) -> None:
    calls: list[list[str | bytes]] = [["Describe the picture.", image] for image in IMAGES]
    expected = _official_texts(qwen35_vision, ONE_IMAGE, calls)
    options = RuntimeOptions(max_tokens=MAX_TOKENS)
    with PawFn[Qwen3_5_0_8B, LlamaCpp].bare(base=qwen35_vision.text.gguf_path, template=ONE_IMAGE, config=_config()) as bare:
        describe = Positional[str, Image](bare)
        got = [describe.generate("Describe the picture.", Image(image), options=options) for image in IMAGES]
    assert all(_agrees(g, official) for g, official in zip(got, expected, strict=True)), ([g.text for g in got], expected)
    assert sum(g.text.replace("\ufffd", "").strip() == official for g, official in zip(got, expected, strict=True)) >= 2  # most end together
    assert len({g.prompt_tokens for g in got}) > 1  # the images took different numbers of positions
    assert len(set(expected)) > 1  # the image changes the answer


def test_two_images_in_one_call_and_a_programs_adapter(qwen35_vision: TinyVision, tmp_path: Path) -> None:
    program = make_program(qwen35_vision.text, tmp_path, "vision-program", template=TWO_IMAGES, meta_extra={"runtime_manifest_version": 2})
    calls: list[tuple[bytes, bytes, str]] = [(IMAGES[0], IMAGES[1], "which is brighter?"), (IMAGES[2], IMAGES[2], "same?")]
    expected = _official_texts(qwen35_vision, TWO_IMAGES, [list(call) for call in calls], program.adapter)
    options = RuntimeOptions(max_tokens=MAX_TOKENS)
    with PawFn[Qwen3_5_0_8B, LlamaCpp].load_sync(program.folder, base=qwen35_vision.text.gguf_path, config=_config()) as function:
        compare = Positional[Image, Image, str](function)
        got = [compare.generate(Image(first), Image(second), question, options=options) for first, second, question in calls]
        assert all(_agrees(g, official) for g, official in zip(got, expected, strict=True)), ([g.text for g in got], expected)
    with PawFn[Qwen3_5_0_8B, Torch].load_sync(program.folder, base=qwen35_vision.text.gguf_path, config=PawConfig(n_ctx=N_CTX)) as on_torch:
        compare = Positional[Image, Image, str](on_torch)
        alone = [compare.generate(Image(first), Image(second), question, options=options) for first, second, question in calls]

        async def together() -> list[Generation]:
            return list(await asyncio.gather(*(compare.agenerate(Image(a), Image(b), q, options=options) for a, b, q in calls)))

        batched = asyncio.run(together())
    assert [g.token_ids for g in alone] == [g.token_ids for g in got]  # Torch's tokens are llama.cpp's
    assert [g.token_ids for g in batched] == [g.token_ids for g in alone]  # and the same when the calls share steps


@pytest.mark.parametrize("backend", [LlamaCpp, Torch])
def test_an_image_call_without_a_projector_says_where_to_put_it(qwen35_vision: TinyVision, tmp_path: Path, backend: type[Backend]) -> None:
    lone = tmp_path / "base.gguf"
    lone.write_bytes(qwen35_vision.text.gguf_path.read_bytes())
    with PawFn.specialize(Qwen3_5_0_8B, backend).bare(base=lone, template=ONE_IMAGE, config=_config()) as bare:
        with pytest.raises(ConfigError, match="mmproj"):
            Positional[str, Image](bare).run("Describe.", Image(IMAGES[0]))


TOWER_SIZES = [(100, 70), (40, 200), (64, 64), (128, 128), (7, 3), (2000, 30), (1000, 900)]
"""Resized and padded on both sides, shrunk more down than across (Pillow itself would filter down first there; mtmd
always across first), the position table's own size, below the smallest image, very wide, past the token limit."""


@pytest.mark.parametrize("matrices", ["F32", "F16", "BF16"])
def test_the_default_towers_embeddings_are_mtmds_bit_for_bit(qwen35_vision: TinyVision, matrices: str) -> None:
    """Where llama.cpp's arithmetic runs (the default on the CPU) the tower computes as mtmd does, on the C kernels
    and in their torch emulation alike: its grid and embeddings are mtmd's, bit for bit, for F32, F16 and BF16
    projectors (BF16 dotted as this CPU's llama.cpp dots it), through every path (one row, one-chunk and tiled
    attention, a resized position table)."""
    import torch

    from pawfn.torch.engine.vision import VisionTower
    from pawfn.torch.ggml.c_kernels import native_kernels
    from pawfn.torch.model.arithmetic import TorchArithmetic, llamacpp_arithmetic
    from pawfn.torch.model.arithmetic.choice import bf16_pairs, simd_width
    from pawfn.torch.model.arithmetic.tower import MtmdTower

    projector = qwen35_vision.projector if matrices == "F32" else qwen35_vision.typed_projectors[matrices]
    kernels = native_kernels()  # without them a base's tower is torch's float32 (the emulation takes minutes an image)
    arithmetics = [MtmdTower(simd_width(), bf16_pairs())] + (
        [] if kernels is None else [llamacpp_arithmetic(simd_width(), False, bf16_pairs()).tower()]
    )
    towers = [VisionTower.read(projector, torch.device("cpu"), Qwen3_5_0_8B.image_tokens, ops) for ops in arithmetics]
    float32 = VisionTower.read(projector, torch.device("cpu"), Qwen3_5_0_8B.image_tokens, TorchArithmetic().tower())
    with _mtmd_context(qwen35_vision, projector) as context:
        for index, (width, height) in enumerate(TOWER_SIZES):
            data = random_png(width, height, index)
            expected, grid = mtmd_embeddings(context, data, TEXT_WIDTH)
            for tower in towers:
                prepared = tower.prepare(Image(data))
                assert (prepared.rows, prepared.columns) == grid, (width, height)
                assert np.array_equal(tower.encode(prepared).numpy(), expected), (width, height, tower)
            if kernels is not None:  # the C kernels' paths for CPUs without AVX-512 (BF16 dots lane by lane) too
                kernels.use_avx512(False)
                try:
                    assert np.array_equal(towers[1].encode(towers[1].prepare(Image(data))).numpy(), expected), (width, height)
                finally:
                    kernels.use_avx512(True)
            close = float32.encode(float32.prepare(Image(data))).numpy()  # numerics="native": torch's float32 products
            assert np.abs(close - expected).max() <= (1e-2 if matrices == "BF16" else 1e-3) * np.abs(expected).max(), (width, height)


def _mtmd_context(vision: TinyVision, projector: Path | None = None) -> contextlib.AbstractContextManager[mtmd_context_p]:
    """mtmd's vision context for `projector` (`vision`'s F32 one unless named), set as the official vision runtime sets it."""
    assert Qwen3_5_0_8B.image_tokens is not None
    return mtmd_context(vision.text.gguf_path, projector or vision.projector, N_CTX, Qwen3_5_0_8B.image_tokens)


def test_images_of_odd_sizes_get_mtmds_token_grid(qwen35_vision: TinyVision) -> None:
    """mtmd's grid of merged tokens (rows, columns: the image's token count and its M-RoPE extent) for 40 sizes, from
    one pixel to past the token limit, odd, tall and wide: pawfn's preprocessing gives the same."""
    import torch

    from pawfn.torch.engine.vision import VisionTower
    from pawfn.torch.model.arithmetic import TorchArithmetic

    generator = np.random.default_rng(11)
    sizes = [(1, 1), (1, 900), (3000, 2), (31, 33), *((int(w), int(h)) for w, h in generator.integers(1, 1500, size=(36, 2)))]
    tower = VisionTower.read(qwen35_vision.projector, torch.device("cpu"), Qwen3_5_0_8B.image_tokens, TorchArithmetic().tower())
    with _mtmd_context(qwen35_vision) as context:
        for index, (width, height) in enumerate(sizes):
            data = random_png(width, height, index)
            prepared = tower.prepare(Image(data))
            assert (prepared.rows, prepared.columns) == mtmd_embeddings(context, data, TEXT_WIDTH, encode=False)[1], (width, height)


@pytest.mark.parametrize("matrices", ["F32", "BF16"])
def test_torch_images_give_llamacpps_tokens(qwen35_vision: TinyVision, matrices: str) -> None:
    """Each image's embeddings at their M-RoPE positions (time, row, column), the text after it advanced by the
    image's longer side: the Torch backend's greedy tokens are llama.cpp's for images of several sizes, with an F32
    projector and a BF16 one (found beside the base)."""
    options = RuntimeOptions(max_tokens=MAX_TOKENS)
    runs: dict[str, list[Generation]] = {}
    backends: list[tuple[type[Backend], PawConfig]] = [(LlamaCpp, _config()), (Torch, PawConfig(n_ctx=N_CTX))]
    projector = qwen35_vision.projector if matrices == "F32" else qwen35_vision.typed_projectors[matrices]
    base = projector.parent / qwen35_vision.text.gguf_path.name
    for backend, config in backends:
        with PawFn.specialize(Qwen3_5_0_8B, backend).bare(base=base, template=ONE_IMAGE, config=config) as bare:
            describe = Positional[str, Image](bare)
            runs[backend.__name__] = [describe.generate("Describe the picture.", Image(image), options=options) for image in IMAGES]
    assert [g.token_ids for g in runs["Torch"]] == [g.token_ids for g in runs["LlamaCpp"]], (runs["Torch"], runs["LlamaCpp"])
    assert [g.prompt_tokens for g in runs["Torch"]] == [g.prompt_tokens for g in runs["LlamaCpp"]]  # positions, counted alike
    if matrices == "F32":  # the images change the answer (random weights: with the BF16 copy's, all four agree here)
        assert len({g.token_ids for g in runs["Torch"]}) > 1


@pytest.mark.parametrize("backend", [LlamaCpp, Torch])
def test_the_cli_takes_image_arguments(qwen35_vision: TinyVision, tmp_path: Path, capsys: pytest.CaptureFixture[str], backend: type[Backend]) -> None:
    picture = tmp_path / "picture.png"
    picture.write_bytes(IMAGES[1])
    base = str(qwen35_vision.text.gguf_path)
    command = ["run", "--interpreter", "Qwen/Qwen3.5-0.8B", "--base", base, "--backend", backend.name, "--template", ONE_IMAGE]
    assert main([*command, "--arg", "Describe the picture.", "--image", str(picture), "--max-tokens", str(MAX_TOKENS), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    with PawFn.specialize(Qwen3_5_0_8B, backend).bare(base=base, template=ONE_IMAGE) as bare:
        expected = Positional[str, Image](bare).generate("Describe the picture.", Image(picture), options=RuntimeOptions(max_tokens=MAX_TOKENS))
    assert printed["tokens"] == list(expected.token_ids) and printed["input"][0] == "Describe the picture."
    with pytest.raises(SystemExit) as usage:
        main([*command, "--arg", "Describe.", "--image", str(tmp_path / "missing.png")])
    assert usage.value.code == 2 and "missing.png" in capsys.readouterr().err


@pytest.mark.skipif(importlib.util.find_spec("fastapi") is None, reason="pawfn serve needs the serve extra")
@pytest.mark.parametrize("backend", [LlamaCpp, Torch])
def test_a_server_takes_image_arguments(qwen35_vision: TinyVision, tmp_path: Path, backend: type[Backend]) -> None:
    """`Remote` sends an image as its normalized PNG in a data URL (`ImagePart`); the server's program runs it
    as a local one does; an image that does not decode is a 422."""
    program_id = "e6b454023d41ac9ca845"
    program = make_program(
        qwen35_vision.text, tmp_path, "served", template=ONE_IMAGE, program_id=program_id, meta_extra={"runtime_manifest_version": 2}
    )
    server = start_server("--program", str(program.archive), "--base", str(qwen35_vision.text.gguf_path), "--backend", backend.name)
    options = RuntimeOptions(max_tokens=MAX_TOKENS)
    try:
        with (
            PawFn.specialize(Qwen3_5_0_8B, backend).load_sync(program.folder, base=qwen35_vision.text.gguf_path) as local,
            PawFn[Qwen3_5_0_8B, Remote].load_sync(program_id, config=PawConfig.from_env(server_url=server.url, max_retries=0)) as remote,
        ):
            here, there = Positional[str, Image](local), Positional[str, Image](remote)
            for image in IMAGES[:2]:
                expected = here.generate("Describe the picture.", Image(image), options=options).token_ids
                assert there.generate("Describe the picture.", Image(image), options=options).token_ids == expected
        garbage = "data:image/png;base64," + base64.b64encode(b"not a picture at all").decode()
        for url in (garbage, "data:image/png;base64,abc"):  # not an image; base64 without its padding
            body = {"arguments": ["Describe.", {"type": "image_url", "image_url": {"url": url}}]}
            response = httpx.post(f"{server.url}/v1/programs/{program_id}/run", json=body, timeout=60)
            assert (response.status_code, response.json()["error"]) == (422, "invalid_image"), response.text
    finally:
        server.stop()


def test_programs_on_one_base_share_its_vision_tower(qwen35_vision: TinyVision) -> None:
    from pawfn.torch.engine.program import TorchProgram

    config = PawConfig(n_ctx=N_CTX)
    with (
        PawFn[Qwen3_5_0_8B, Torch].bare(base=qwen35_vision.text.gguf_path, template=ONE_IMAGE, config=config) as first,
        PawFn[Qwen3_5_0_8B, Torch].bare(base=qwen35_vision.text.gguf_path, template=TWO_IMAGES, config=config) as second,
    ):
        one, other = first.runtime, second.runtime
        assert isinstance(one, TorchProgram) and isinstance(other, TorchProgram)
        assert one.vision_tower is not None and one.vision_tower is other.vision_tower


@pytest.mark.llamacpp
def test_llamacpp_numerics_give_mtmds_tokens_with_a_q4_0_adapter(qwen35_vision: TinyVision, tmp_path: Path) -> None:
    """The official configuration with images: a Q8_0 base (llama.cpp's quantizer), a Q4_0 adapter (llama.cpp
    quantizes its inputs), the vision runtime's settings. `numerics="llamacpp"` follows llama.cpp's text layers
    op for op, each text run and image in its own batches as mtmd evaluates them, and mtmd's tower bit for bit (the
    test above); the plain mode parts from it. On a random tiny model with a Q8_0 base a tower within 1e-3 of mtmd's
    was enough to change the tokens on some CPUs (it did on an AVX2-only EPYC): here each mode runs its own tower."""
    folder = tmp_path / "official"
    folder.mkdir()
    base = llama_quantize(qwen35_vision.text.gguf_path, folder / "text-q8_0.gguf", "Q8_0")
    shutil.copy(qwen35_vision.projector, folder / qwen35_vision.projector.name)  # found beside the base
    q4_0, manifest = gguf.GGMLQuantizationType.Q4_0, dict[str, object](runtime_manifest_version=2)
    program = make_program(qwen35_vision.text, tmp_path, "vision-q4", q4_0, seed=2, template=TWO_IMAGES, meta_extra=manifest)
    calls = [(IMAGES[0], IMAGES[1], "which is brighter?"), (IMAGES[2], IMAGES[2], "same?"), (IMAGES[3], IMAGES[1], "x")]
    options = RuntimeOptions(max_tokens=MAX_TOKENS)
    runs: dict[str, list[tuple[int, ...]]] = {}
    counts: dict[str, list[tuple[int, int]]] = {}
    for name, backend, config in [
        ("llama.cpp", LlamaCpp, _config()),
        ("llamacpp numerics", Torch, PawConfig(n_ctx=N_CTX, numerics="llamacpp")),
        ("default", Torch, PawConfig(n_ctx=N_CTX)),  # auto: llama.cpp's arithmetic on the Q8_0 base
        ("plain", Torch, PawConfig(n_ctx=N_CTX, numerics="native")),
    ]:
        with PawFn.specialize(Qwen3_5_0_8B, backend).load_sync(program.folder, base=base, config=config) as function:
            compare = Positional[Image, Image, str](function)
            generations = [compare.generate(Image(a), Image(b), question, options=options) for a, b, question in calls]
            runs[name] = [generation.token_ids for generation in generations]
            counts[name] = [(generation.prefix_tokens, generation.prompt_tokens) for generation in generations]
    assert runs["llamacpp numerics"] == runs["default"] == runs["llama.cpp"]
    assert counts["llamacpp numerics"] == counts["plain"] == counts["llama.cpp"]  # counted alike, cached prefix or not
    assert runs["plain"] != runs["llama.cpp"]  # the case this mode is for
    assert len(set(runs["llama.cpp"])) > 1  # the images change the answer


def test_torch_refuses_a_damaged_image_and_runs_the_next_call(qwen35_vision: TinyVision) -> None:
    """A call whose image does not decode fails with `ImageError` before any work; the program runs on."""
    options = RuntimeOptions(max_tokens=4)
    with PawFn[Qwen3_5_0_8B, Torch].bare(base=qwen35_vision.text.gguf_path, template=ONE_IMAGE, config=PawConfig(n_ctx=N_CTX)) as bare:
        describe = Positional[str, Image](bare)
        for damaged in (IMAGES[0][:-40], b"not an image at all"):
            with pytest.raises(ImageError, match="could not be decoded"):
                describe.run("Describe.", Image(damaged), options=options)
        assert len(describe.generate("Describe.", Image(IMAGES[0]), options=options).token_ids) == 4


def test_torch_images_give_transformers_tokens(qwen35_vision: TinyVision) -> None:
    """transformers' Qwen3.5 on the same pixels (pawfn's preprocessing laid out as its processor's patches) places the
    image by its own M-RoPE rule: its greedy tokens are the Torch backend's."""
    import torch
    from transformers import Qwen3_5ForConditionalGeneration

    from pawfn.torch.engine.vision import PreparedImage, VisionTower
    from pawfn.torch.model.arithmetic import TorchArithmetic

    model: Any = Qwen3_5ForConditionalGeneration.from_pretrained(str(qwen35_vision.text.hf_dir), dtype=torch.float32)  # pyright: ignore[reportUnknownMemberType]  # Any: transformers' from_pretrained
    image_token: int = model.config.image_token_id
    tokenizer = qwen35_vision.text.tokenizer()
    tower = VisionTower.read(qwen35_vision.projector, torch.device("cpu"), Qwen3_5_0_8B.image_tokens, TorchArithmetic().tower())  # its preprocessing
    before = tokenizer.encode("<|im_start|>user\nDescribe the picture.<|vision_start|><|vision_start|>").ids  # mtmd adds its own pair
    after = tokenizer.encode("<|vision_end|><|vision_end|><|im_end|>\n<|im_start|>assistant\n").ids
    eos = tokenizer.token_to_id(qwen35_vision.text.eos_token)

    def patches(image: PreparedImage) -> tuple[torch.Tensor, torch.Tensor]:
        """The processor's layout: both temporal frames, patches of 2x2 merge blocks in row-major order."""
        channels, height, width = image.pixels.shape
        rows, columns = height // 16, width // 16
        frames = image.pixels.unsqueeze(0).repeat(2, 1, 1, 1).reshape(2, channels, rows // 2, 2, 16, columns // 2, 2, 16)
        return frames.permute(2, 5, 3, 6, 1, 0, 4, 7).reshape(rows * columns, -1), torch.tensor([[1, rows, columns]])

    def generate(image: PreparedImage) -> list[int]:
        pixels, grid = patches(image)
        ids = before + [image_token] * image.n_tokens + after
        out: list[int] = []
        with torch.no_grad():
            for _ in range(MAX_TOKENS):
                sequence = ids + out
                types = torch.tensor([[int(token == image_token) for token in sequence]])
                logits = model(input_ids=torch.tensor([sequence]), mm_token_type_ids=types, pixel_values=pixels, image_grid_thw=grid, use_cache=False)
                token = int(torch.argmax(logits.logits[0, -1]).item())
                if token == eos:
                    break
                out.append(token)
        return out

    expected = [generate(tower.prepare(Image(image))) for image in IMAGES]
    options = RuntimeOptions(max_tokens=MAX_TOKENS)
    with PawFn[Qwen3_5_0_8B, Torch].bare(base=qwen35_vision.text.gguf_path, template=ONE_IMAGE, config=PawConfig(n_ctx=N_CTX)) as bare:
        describe = Positional[str, Image](bare)
        assert [list(describe.generate("Describe the picture.", Image(image), options=options).token_ids) for image in IMAGES] == expected


def test_an_image_call_on_llamacpp_prints_nothing(
    qwen35_vision: TinyVision, capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """llama.cpp's and mtmd's messages go to the logger `pawfn.llamacpp` (an image call logs a dozen lines and a
    warning at each M-RoPE position jump; llama-cpp-python's callback printed that warning as an error)."""
    with PawFn[Qwen3_5_0_8B, LlamaCpp].bare(base=qwen35_vision.text.gguf_path, template=ONE_IMAGE, config=_config()) as bare:
        capfd.readouterr()
        with caplog.at_level(logging.DEBUG, logger="pawfn.llamacpp"):
            Positional[str, Image](bare).run("Describe.", Image(IMAGES[0]), options=RuntimeOptions(max_tokens=2))
        assert capfd.readouterr().err == ""
    logged = {(record.levelno, record.getMessage().split(":")[0]) for record in caplog.records if record.name == "pawfn.llamacpp"}
    assert (logging.INFO, "find_slot") in logged and (logging.DEBUG, "add_text") in logged
    assert not [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING]  # Python would print these
