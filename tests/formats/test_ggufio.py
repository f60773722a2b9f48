"""pawfn's GGUF header parser: the values and tensors gguf's own reader sees, and a clear error (fast, with no
large allocation) for files whose counts or offsets do not fit their size."""

from __future__ import annotations

import struct
from pathlib import Path

import gguf
import numpy as np
import pytest

from pawfn.formats.ggufio import GGUFFile, GGUFFormatError
from tests.helpers.programs import TinyProgram
from tests.helpers.tiny_models import TinyInterpreter


@pytest.mark.parametrize("which", ["qwen3-base", "gpt2-base", "q4-adapter"])
def test_values_and_tensors_match_ggufs_reader(which: str, qwen3: TinyInterpreter, gpt2: TinyInterpreter, qwen3_program_q4: TinyProgram) -> None:
    path = {"qwen3-base": qwen3.gguf_path, "gpt2-base": gpt2.gguf_path, "q4-adapter": qwen3_program_q4.folder / "adapter.gguf"}[which]
    ours, theirs = GGUFFile(path), gguf.GGUFReader(path)
    for key, field in theirs.fields.items():
        if key.startswith("GGUF."):
            continue  # the reader's own header pseudo-fields
        expected: object = field.contents()
        assert ours.value(key) == expected, key
        assert type(ours.value(key)) is type(expected), key
    assert list(ours.tensor_names()) == [t.name for t in theirs.tensors]
    for tensor in theirs.tensors:
        expected_values = gguf.quants.dequantize(tensor.data, tensor.tensor_type).reshape(ours.tensor_shape(tensor.name))
        np.testing.assert_array_equal(ours.read_f32(tensor.name), expected_values)
        assert ours.tensor_type_name(tensor.name) == tensor.tensor_type.name


def _header(n_tensors: int, n_metadata: int) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, n_tensors, n_metadata)


def _key(name: str) -> bytes:
    return struct.pack("<Q", len(name)) + name.encode()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (_header(0, 1) + _key("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, 2**40), "runs past the end"),
        (_header(0, 1) + _key("general.counts") + struct.pack("<IIQ", 9, 4, 2**40), "runs past the end"),
        (_header(0, 10**12) + bytes(64), "the metadata runs past the end"),
        (_header(10**12, 0) + bytes(64), "the tensor table runs past the end"),
        (_header(0, 1) + struct.pack("<Q", 2**62), "runs past the end"),
        (_header(1, 0) + _key("w") + struct.pack("<I", 9) + bytes(64), "has 9 dimensions"),
        (_header(1, 0) + _key("w") + struct.pack("<IQQIQ", 2, 4096, 4096, 0, 0) + bytes(64), "runs past the end of the file"),
        (b"GGUF" + struct.pack("<IQQ", 1, 0, 0) + bytes(8), "version 1"),
        (b"GGML" + bytes(60), "bad magic"),
        (_header(0, 1) + _key("k") + struct.pack("<I", 77) + bytes(16), "unknown value type 77"),
    ],
)
def test_counts_and_offsets_that_do_not_fit_are_refused(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "hostile.gguf"
    path.write_bytes(content)
    with pytest.raises(GGUFFormatError, match=message):
        GGUFFile(path)


def test_a_truncated_base_is_refused(qwen3: TinyInterpreter, tmp_path: Path) -> None:
    data = qwen3.gguf_path.read_bytes()
    for cut in (30, len(data) // 3, len(data) - 1):
        path = tmp_path / f"cut-{cut}.gguf"
        path.write_bytes(data[:cut])
        with pytest.raises(GGUFFormatError, match="past the end"):
            GGUFFile(path)


def _resident_kb(path: Path) -> int:
    """This process's resident kB of the mappings of `path` (/proc/self/smaps)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        if line[:1].isdigit() or line[:1] in "abcdef":  # a mapping's header line: address range, ..., path
            inside = line.endswith(str(path))
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1])
    return total


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="reads Linux's /proc/self/smaps")
def test_release_drops_a_copied_tensors_pages_and_keeps_its_bytes(tmp_path: Path) -> None:
    """A loader releases a tensor once copied: its pages leave the process's resident memory; reading it again gives
    the same bytes (faulted back in from the page cache)."""
    path = tmp_path / "big.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    values = np.arange(4 * 1024 * 1024, dtype=np.float32).reshape(1024, 4096)  # 16 MiB
    writer.add_tensor("big.weight", values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    file = GGUFFile(path)
    raw, _ = file.raw("big.weight")
    copied = raw.copy()  # touches every page
    assert _resident_kb(path) >= 15 * 1024
    file.release("big.weight")
    assert _resident_kb(path) < 1024
    again, _ = file.raw("big.weight")
    assert np.array_equal(again, copied) and np.array_equal(again.view(np.float32).reshape(1024, 4096), values)
