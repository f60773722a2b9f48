"""mtmd (llama.cpp's vision runtime, through llama-cpp-python) as the reference for image embeddings: a vision
context set as the official vision runtime sets it, and one image's embeddings and token grid from it. Shared by the
image tests and `benchmarks/tower_fidelity.py` (which runs it on llama.cpp builds for other CPUs)."""

from __future__ import annotations

import contextlib
import ctypes
import io
from collections.abc import Generator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from llama_cpp.mtmd_cpp import mtmd_context_p


def random_png(width: int, height: int, seed: int) -> bytes:
    """A PNG of random pixels, the same for a seed."""
    from PIL import Image as PILImage

    pixels = (np.random.default_rng(seed).random((height, width, 3)) * 255).astype(np.uint8)
    buffer = io.BytesIO()
    PILImage.fromarray(pixels).save(buffer, "PNG")
    return buffer.getvalue()


@contextlib.contextmanager
def mtmd_context(text_model: Path, projector: Path, n_ctx: int, image_tokens: tuple[int, int]) -> Generator[mtmd_context_p]:
    """mtmd's vision context for `projector` beside the text model `text_model`, set as the official vision runtime
    sets it (CPU, 2 threads, flash attention, the interpreter's image token range)."""
    import llama_cpp
    from llama_cpp import mtmd_cpp as mtmd

    llm = llama_cpp.Llama(str(text_model), n_ctx=n_ctx, verbose=False)
    params = mtmd.mtmd_context_params_default()
    params.use_gpu, params.print_timings, params.n_threads = False, False, 2
    params.image_min_tokens, params.image_max_tokens = image_tokens
    params.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
    context = mtmd.mtmd_init_from_file(str(projector).encode(), llm.model, params)
    assert context
    try:
        yield context
    finally:
        mtmd.mtmd_free(context)
        llm.close()


def mtmd_embeddings(context: mtmd_context_p, data: bytes, width: int, encode: bool = True) -> tuple[npt.NDArray[np.float32], tuple[int, int]]:
    """mtmd's embeddings [tokens, width] of one image (empty unless `encode`) and its grid (rows, columns) of merged
    tokens; `width` is the text model's hidden size (the projector's output)."""
    from llama_cpp import mtmd_cpp as mtmd

    buffer = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
    bitmap = mtmd.mtmd_helper_bitmap_init_from_buf(context, buffer, len(data), False)
    chunks = mtmd.mtmd_input_chunks_init()
    assert bitmap is not None and chunks is not None
    try:
        marker = mtmd.mtmd_default_marker()
        given = mtmd.mtmd_input_text()
        given.text, given.text_len, given.add_special, given.parse_special = marker, len(marker), False, True
        assert mtmd.mtmd_tokenize(context, chunks, ctypes.byref(given), (mtmd.mtmd_bitmap_p_ctypes * 1)(bitmap), 1) == 0
        for index in range(mtmd.mtmd_input_chunks_size(chunks)):
            chunk = mtmd.mtmd_input_chunks_get(chunks, index)
            if mtmd.mtmd_input_chunk_get_type(chunk) == mtmd.MTMD_INPUT_CHUNK_TYPE_IMAGE:
                tokens = mtmd.mtmd_input_chunk_get_tokens_image(chunk)
                grid = (mtmd.mtmd_image_tokens_get_ny(tokens), mtmd.mtmd_image_tokens_get_nx(tokens))
                if not encode:
                    return np.zeros((0, width), dtype=np.float32), grid
                assert mtmd.mtmd_encode_chunk(context, chunk) == 0
                n = mtmd.mtmd_input_chunk_get_n_tokens(chunk)
                return np.ctypeslib.as_array(mtmd.mtmd_get_output_embd(context), shape=(n * width,)).reshape(n, width).copy(), grid
        raise AssertionError("mtmd made no image chunk")
    finally:
        mtmd.mtmd_input_chunks_free(chunks)
        mtmd.mtmd_bitmap_free(bitmap)
