"""Session fixtures: tiny Qwen3, Qwen3.5 and GPT-2 interpreters, adapters and bundles generated on the fly."""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

import gguf
import pytest

from pawfn import ModelRegistry, PawFn, Qwen3_0_6B, Torch
from tests.helpers.programs import TinyProgram, make_program
from tests.helpers.servers import FIRST_ID, KEY, SECOND_ID, ServeProcess, start_server
from tests.helpers.tiny_models import TinyInterpreter, build_interpreter
from tests.helpers.tiny_qwen35 import TinyVision, build_qwen35, build_qwen35_vision
from tests.helpers.trained import TrainedProgram, load_trained


_HOME = Path(tempfile.mkdtemp(prefix="pawfn-tests-home-"))
"""The session's home folder: the user's own (and its cache, the official SDK's too) is out of every test's reach."""
_DEFAULT_CACHE = _HOME / ".cache" / "programasweights"
"""Where pawfn's cache would be if a code path ignored PAW_CACHE_DIR: the guard keeps it empty."""


def _snapshot(folder: Path) -> set[tuple[str, int, int]]:
    if not folder.is_dir():
        return set()
    return {(str(path.relative_to(folder)), path.stat().st_size, path.stat().st_mtime_ns) for path in folder.rglob("*") if path.is_file()}


def pytest_configure(config: pytest.Config) -> None:
    """Before any fixture runs (session- and module-scoped ones too): HOME and the XDG folders point into a temporary
    home, so no test can reach the user's files (and other processes using the user's cache cannot fail a run); the
    session's default cache is a temporary folder (each test still gets its own, `private_cache`). pip keeps its own
    cache (the llama.cpp sources come through it)."""
    real_home = Path.home()
    os.environ.setdefault("PIP_CACHE_DIR", str(real_home / ".cache" / "pip"))
    os.environ["HOME"] = str(_HOME)
    os.environ["XDG_CACHE_HOME"] = str(_HOME / ".cache")
    os.environ["XDG_CONFIG_HOME"] = str(_HOME / ".config")
    config.stash[_CACHE_SNAPSHOT] = _snapshot(_DEFAULT_CACHE)
    if "PAW_CACHE_DIR" not in os.environ:
        os.environ["PAW_CACHE_DIR"] = tempfile.mkdtemp(prefix="pawfn-tests-cache-")
    # one build of the C kernels for the session, its processes and every test's own cache (each built them again),
    # made before any test captures stderr (a build is announced there)
    os.environ.setdefault("PAW_KERNELS_DIR", tempfile.mkdtemp(prefix="pawfn-tests-kernels-"))
    from pawfn.torch.ggml.c_kernels import native_kernels

    native_kernels()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The guard: the run fails if anything was written to the default cache location (a path ignoring PAW_CACHE_DIR)."""
    empty: set[tuple[str, int, int]] = set()
    before = session.config.stash.get(_CACHE_SNAPSHOT, empty)
    changed = sorted({entry[0] for entry in _snapshot(_DEFAULT_CACHE) ^ before})
    if changed:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        message = f"tests wrote to the default cache location {_DEFAULT_CACHE} instead of PAW_CACHE_DIR: {', '.join(changed[:10])}"
        if reporter is not None:
            reporter.write_line(f"ERROR: {message}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    shutil.rmtree(_HOME, ignore_errors=True)


_CACHE_SNAPSHOT = pytest.StashKey[set[tuple[str, int, int]]]()


@pytest.fixture(scope="session")
def llamacpp_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """llama.cpp's converter and test vocabularies, from the installed llama-cpp-python's sdist (skips without it)."""
    from tests.helpers.llamacpp_source import fetch_llamacpp_source

    source = fetch_llamacpp_source(tmp_path_factory.mktemp("sdist"))
    if isinstance(source, str):
        pytest.skip(source)
    return source


@pytest.fixture(scope="session")
def tiny_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tiny")


@pytest.fixture(scope="session")
def qwen3(tiny_root: Path) -> TinyInterpreter:
    return build_interpreter("qwen3", tiny_root)


@pytest.fixture(scope="session")
def gpt2(tiny_root: Path) -> TinyInterpreter:
    return build_interpreter("gpt2", tiny_root)


@pytest.fixture(scope="session")
def qwen35(tiny_root: Path) -> TinyInterpreter:
    return build_qwen35(tiny_root)


@pytest.fixture(scope="session")
def qwen35_vision(tiny_root: Path) -> TinyVision:
    return build_qwen35_vision(tiny_root)


@pytest.fixture(scope="session")
def qwen35_program(qwen35: TinyInterpreter, tiny_root: Path) -> TinyProgram:
    return make_program(qwen35, tiny_root, "qwen35-program")


@pytest.fixture(scope="session")
def qwen35_program_q4(qwen35: TinyInterpreter, tiny_root: Path) -> TinyProgram:
    return make_program(qwen35, tiny_root, "qwen35-program-q4", gguf.GGMLQuantizationType.Q4_0, seed=2)


@pytest.fixture(scope="session")
def qwen35_q8_0(qwen35: TinyInterpreter, tiny_root: Path) -> Path:
    """The tiny Qwen3.5 quantized to Q8_0 by llama.cpp's own quantizer (the official Qwen3.5 base's type)."""
    from tests.helpers.references import llama_quantize

    return llama_quantize(qwen35.gguf_path, tiny_root / "qwen35-q8_0.gguf", "Q8_0")


@pytest.fixture(scope="session")
def qwen3_program(qwen3: TinyInterpreter, tiny_root: Path) -> TinyProgram:
    return make_program(qwen3, tiny_root, "qwen3-program")


@pytest.fixture(scope="session")
def gpt2_program(gpt2: TinyInterpreter, tiny_root: Path) -> TinyProgram:
    return make_program(gpt2, tiny_root, "gpt2-program")


@pytest.fixture(scope="session")
def qwen3_program_q4(qwen3: TinyInterpreter, tiny_root: Path) -> TinyProgram:
    return make_program(qwen3, tiny_root, "qwen3-program-q4", qtype=gguf.GGMLQuantizationType.Q4_0, seed=2)


@pytest.fixture(scope="session")
def gpt2_program_q4(gpt2: TinyInterpreter, tiny_root: Path) -> TinyProgram:
    return make_program(gpt2, tiny_root, "gpt2-program-q4", qtype=gguf.GGMLQuantizationType.Q4_0, seed=2)


@pytest.fixture(scope="session")
def wide_qwen3(tiny_root: Path) -> TinyInterpreter:
    """A Qwen3 whose rows are whole K-quant blocks (hidden 256), so llama.cpp's quantizer makes real Q6_K."""
    return build_interpreter("qwen3", tiny_root / "wide", width=256)


@pytest.fixture(scope="session")
def wide_qwen3_program_q4(wide_qwen3: TinyInterpreter, tiny_root: Path) -> TinyProgram:
    """A Q4_0 adapter on the wide Qwen3, as the hosted compiler ships programs."""
    return make_program(wide_qwen3, tiny_root / "wide", "program-q4", qtype=gguf.GGMLQuantizationType.Q4_0, seed=3, lora_std=0.05)


@pytest.fixture(scope="session")
def quantized_bases(wide_qwen3: TinyInterpreter, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The wide Qwen3 quantized by llama.cpp's own quantizer, as the official bases were made."""
    from tests.helpers.references import OFFICIAL_BASE_TYPES, llama_quantize

    folder = tmp_path_factory.mktemp("quantized")
    return {ftype: llama_quantize(wide_qwen3.gguf_path, folder / f"{ftype.lower()}.gguf", ftype) for ftype in OFFICIAL_BASE_TYPES}


@pytest.fixture(autouse=True)
def fresh_registry() -> Iterator[None]:
    """Each test starts with no base loaded, so load counts are the test's own."""
    ModelRegistry.clear()
    yield
    ModelRegistry.clear()


@pytest.fixture(autouse=True)
def private_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cache of each test's own (PAW_CACHE_DIR), so no test writes to the user's and none sees another's files."""
    monkeypatch.setenv("PAW_CACHE_DIR", str(tmp_path_factory.mktemp("paw-cache")))


@pytest.fixture(scope="session")
def trained_qwen3_program() -> TrainedProgram:
    """The committed trained Qwen3 and its program (tests/fixtures/trained): peaked predictions, for fidelity."""
    return load_trained("qwen3")


@pytest.fixture(scope="session")
def trained_gpt2_program() -> TrainedProgram:
    """The committed trained GPT-2 and its program (tests/fixtures/trained): peaked predictions, for fidelity."""
    return load_trained("gpt2")


@pytest.fixture(scope="session")
def served_programs(qwen3: TinyInterpreter, tiny_root: Path) -> tuple[TinyProgram, TinyProgram]:
    """Two tiny Qwen3 programs with ids of their own (FIRST_ID, SECOND_ID), for the servers' tests."""
    return (
        make_program(qwen3, tiny_root, "serve-first", seed=11, program_id=FIRST_ID),
        make_program(qwen3, tiny_root, "serve-second", seed=12, program_id=SECOND_ID),
    )


@pytest.fixture(scope="session")
def server(
    served_programs: tuple[TinyProgram, TinyProgram], qwen3: TinyInterpreter, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServeProcess]:
    """One `pawfn serve` process for the session: both programs, a key, small limits."""
    if importlib.util.find_spec("fastapi") is None:
        pytest.skip("pawfn serve needs the serve extra")
    first, second = served_programs
    process = start_server(
        "--program",
        str(first.archive),
        "--program",
        f"tiny-second={second.archive}",
        "--base",
        str(qwen3.hf_dir),
        "--api-key-env",
        "PAWFN_TEST_KEY",
        "--max-queue",
        "16",
        "--max-body-bytes",
        "4096",
        "--max-input-chars",
        "300",
        "--max-tokens-limit",
        "24",
        "--max-batch-inputs",
        "8",
        environment={"PAWFN_TEST_KEY": KEY, "PAW_CACHE_DIR": str(tmp_path_factory.mktemp("serve-cache"))},
    )
    yield process
    assert process.stop() == -signal.SIGTERM, process.output()


@pytest.fixture(scope="module")
def local_runs(served_programs: tuple[TinyProgram, TinyProgram], qwen3: TinyInterpreter) -> Iterator[dict[str, PawFn[Qwen3_0_6B, Torch]]]:
    """The served programs loaded in this process: what the servers' answers must equal."""
    loaded = {
        FIRST_ID: PawFn[Qwen3_0_6B, Torch].load_sync(served_programs[0].archive, base=qwen3.hf_dir),
        SECOND_ID: PawFn[Qwen3_0_6B, Torch].load_sync(served_programs[1].archive, base=qwen3.hf_dir),
    }
    yield loaded
    for program in loaded.values():
        program.close()


@pytest.fixture
def prefills(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Lengths of the prefixes the Torch backend evaluated during the test."""
    from pawfn.torch.model.kvcache import KVCache, PrefixState
    from pawfn.torch.weights.lora import DeviceAdapter
    from pawfn.torch.engine.network import TorchInterpreter

    evaluated: list[int] = []
    original = TorchInterpreter.prefill_prefix

    def counting(self: TorchInterpreter, ids: list[int], adapter: DeviceAdapter, cache: KVCache) -> PrefixState:
        evaluated.append(len(ids))
        return original(self, ids, adapter, cache)

    monkeypatch.setattr(TorchInterpreter, "prefill_prefix", counting)
    return evaluated


@pytest.fixture(scope="module")
def long_calls_server(
    served_programs: tuple[TinyProgram, TinyProgram], qwen3: TinyInterpreter, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServeProcess]:
    """A server whose calls may run to the end of the context (~2,000 steps each), one at a time, with 1 s of grace."""
    server = start_server(
        "--program",
        str(served_programs[0].archive),
        "--base",
        str(qwen3.hf_dir),
        "--max-model-copies",
        "1",
        "--max-tokens-limit",
        "2048",
        "--graceful-timeout",
        "1",
        "--api-key-env",
        "PAWFN_TEST_KEY",
        "--max-queue-per-client",  # its tests' clients share one address
        "64",
        environment={"PAW_CACHE_DIR": str(tmp_path_factory.mktemp("long-calls")), "PAWFN_TEST_KEY": KEY},
    )
    yield server
    server.stop()
