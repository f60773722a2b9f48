"""Programs of the official vision runtime (runtime manifest version 2) through a real HTTP hub on 127.0.0.1: pawfn
downloads the base and the projector by sha256 into the cache layout the official SDK uses, and each SDK runs
offline from what the other installed (the official SDK's own code, run in a child process, checks pawfn's)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest

from pawfn import HubError, OfflineError, PawConfig, PawFn, Qwen3_5_0_8B, RuntimeOptions, Torch
from pawfn.hub.cache import PawCache
from pawfn.hub.runtimes import builtin_runtime, canonical
from pawfn.hub.usage import cache_files
from pawfn.hub.types import RuntimeManifest
from tests.helpers.hub_server import HubServer
from tests.helpers.official_layout import write_official_cache
from tests.helpers.programs import TinyProgram
from tests.helpers.tiny_models import write_bundle, zip_bundle

PROGRAM_ID = "c6b454023d41ac9ca845"
RUNTIME_ID = "tiny-qwen3.5-q8"
REPO = "tiny/Qwen3.5-GGUF"
BASE_FILE, PROJECTOR_FILE = "tiny-qwen3.5.gguf", "mmproj-tiny.gguf"
TEMPLATE = "<|im_start|>user\nClassify the urgency of the message.\n{INPUT_0}<|im_end|>\n<|im_start|>assistant\n"
OPTIONS = RuntimeOptions(max_tokens=12)
requires_official = pytest.mark.skipif(importlib.util.find_spec("programasweights") is None, reason="the official SDK (dev extra) is not installed")


def _projector(path: Path) -> bytes:
    """A small GGUF standing in for the projector: downloaded and verified, never run here."""
    writer = gguf.GGUFWriter(str(path), "clip")
    writer.add_tensor("v.patch_embd.weight", np.linspace(-1.0, 1.0, 4096, dtype=np.float32).reshape(64, 64))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path.read_bytes()


def _asset(file: str, data: bytes) -> dict[str, object]:
    return {"provider": "huggingface", "repo": REPO, "file": file, "size_bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


@dataclass
class VisionHub:
    server: HubServer
    bundle: Path
    base: Path
    runtime: dict[str, object]
    cache_dir: Path
    files: dict[str, bytes]

    def config(self, **changes: object) -> PawConfig:
        values: dict[str, object] = {"api_url": self.server.api_url, "api_key": "key", "cache_dir": self.cache_dir, "progress": False}
        return PawConfig.model_validate(values | changes)

    def content_path(self, file: str) -> Path:
        return self.cache_dir / "base_models" / "sha256" / f"{hashlib.sha256(self.files[file]).hexdigest()}.gguf"

    def expected(self, text: str) -> tuple[int, ...]:
        with PawFn[Qwen3_5_0_8B, Torch].load_sync(self.bundle, base=self.base) as function:
            return function.generate(text, OPTIONS).token_ids


@pytest.fixture
def hub(qwen35_program: TinyProgram, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[VisionHub]:
    server = HubServer()
    meta: dict[str, object] = {"program_id": PROGRAM_ID, "runtime_id": RUNTIME_ID, "runtime_manifest_version": 2}
    bundle = write_bundle(tmp_path / "bundle", qwen35_program.adapter, "Qwen/Qwen3.5-0.8B", TEMPLATE, meta)
    archive = zip_bundle(bundle, tmp_path / "program.paw")
    base = qwen35_program.interpreter.gguf_path
    files = {BASE_FILE: base.read_bytes(), PROJECTOR_FILE: _projector(tmp_path / PROJECTOR_FILE)}
    official = builtin_runtime("qwen3.5-0.8b-q8_0")
    assert official is not None
    runtime = official.model_dump(mode="json", exclude_none=True)
    runtime["runtime_id"] = RUNTIME_ID
    runtime["local_sdk"] = {
        "supported": True,
        "n_ctx": 512,
        "base_model": _asset(BASE_FILE, files[BASE_FILE]),
        "vision": {"projector": _asset(PROJECTOR_FILE, files[PROJECTOR_FILE]), "preprocessing": runtime["local_sdk"]["vision"]["preprocessing"]},
    }
    state = server.state
    state.programs[PROGRAM_ID] = archive.read_bytes()
    state.files |= files
    state.runtimes[RUNTIME_ID] = runtime
    monkeypatch.setenv("HF_ENDPOINT", server.cdn_url)  # the manifest names Hugging Face repos, as the official one does
    yield VisionHub(server, bundle, base, runtime, tmp_path / "cache", files)
    server.close()


def _official(cache: Path, script: str, *arguments: str, extra_env: dict[str, str] | None = None) -> str:
    """Run `script` with the official SDK on `cache` in a child process (its module state stays out of the tests)."""
    env = os.environ | {"PAW_CACHE_DIR": str(cache)} | (extra_env or {})
    done = subprocess.run([sys.executable, "-c", script, *arguments], capture_output=True, text=True, env=env, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


_OFFICIAL_READS = """
import json, sys
from pathlib import Path
from programasweights import cache
from programasweights._vision_assets import get_cached_vision_asset_paths
from programasweights._vision_contract import declares_vision
folder = Path(sys.argv[1]) / "programs" / sys.argv[2]
meta = json.loads((folder / "meta.json").read_text())
assert cache.validate_program_assets_dir(folder, sys.argv[2]), "program assets"
assert declares_vision(meta), "not a vision program"
manifest = cache.resolve_runtime_manifest(meta, offline=True)
assert manifest is not None, "no runtime manifest offline"
paths = get_cached_vision_asset_paths(manifest)
assert paths is not None, "assets not cached"
print(json.dumps([str(paths.base_model), str(paths.projector)]))
"""


@requires_official
def test_pawfn_installs_what_the_official_sdk_then_runs_offline(hub: VisionHub) -> None:
    with PawFn[Qwen3_5_0_8B, Torch].load_sync(PROGRAM_ID, config=hub.config()) as function:
        assert function.generate("Server down!", OPTIONS).token_ids == hub.expected("Server down!")
    assert hub.server.state.count(r"/resolve/main/") == 2  # the base and the projector, once each
    for file in (BASE_FILE, PROJECTOR_FILE):
        assert hub.content_path(file).read_bytes() == hub.files[file]
    assert not (hub.cache_dir / "base_models" / BASE_FILE).exists()  # by content only, as the official SDK keeps them
    listed = {item.path for item in cache_files(PawCache(hub.cache_dir)) if item.kind == "base_model"}
    assert listed == {hub.content_path(BASE_FILE), hub.content_path(PROJECTOR_FILE)}  # what `pawfn cache list` shows
    paths = json.loads(_official(hub.cache_dir, _OFFICIAL_READS, str(hub.cache_dir), PROGRAM_ID, extra_env={"PAW_OFFLINE": "1"}))
    assert paths == [str(hub.content_path(BASE_FILE)), str(hub.content_path(PROJECTOR_FILE))]
    with PawFn[Qwen3_5_0_8B, Torch].load_sync(PROGRAM_ID, config=hub.config(offline=True)) as again:
        assert again.generate("Server down!", OPTIONS).token_ids == hub.expected("Server down!")


_OFFICIAL_DOWNLOADS = """
import json, sys
from programasweights import cache
from programasweights._vision_assets import get_vision_asset_paths
cache._build_hf_url = lambda repo, file: f"{sys.argv[2]}/{repo}/resolve/main/{file}"  # the loopback hub, not huggingface.co
manifest = json.loads(sys.argv[1])
paths = get_vision_asset_paths(manifest)
cache.save_runtime_manifest(manifest)
print(json.dumps([str(paths.base_model), str(paths.projector)]))
"""


@requires_official
def test_what_the_official_sdk_installs_runs_offline_in_pawfn(hub: VisionHub) -> None:
    paths = json.loads(_official(hub.cache_dir, _OFFICIAL_DOWNLOADS, json.dumps(hub.runtime), hub.server.cdn_url))
    assert paths == [str(hub.content_path(BASE_FILE)), str(hub.content_path(PROJECTOR_FILE))]
    write_official_cache(hub.cache_dir, PROGRAM_ID, hub.bundle, hub.runtime, None, {}, manifest_version=2)
    requests = len(hub.server.state.snapshot())
    with PawFn[Qwen3_5_0_8B, Torch].load_sync(PROGRAM_ID, config=hub.config(offline=True)) as function:
        assert function.generate("Server down!", OPTIONS).token_ids == hub.expected("Server down!")
    assert len(hub.server.state.snapshot()) == requests  # nothing fetched


def test_a_base_cached_under_its_name_is_adopted_not_downloaded(hub: VisionHub) -> None:
    """A base that a text runtime cached as base_models/<file> gets its content address by a hard link."""
    legacy = hub.cache_dir / "base_models" / BASE_FILE
    legacy.parent.mkdir(parents=True)
    legacy.write_bytes(hub.files[BASE_FILE])
    with PawFn[Qwen3_5_0_8B, Torch].load_sync(PROGRAM_ID, config=hub.config()) as function:
        function.generate("hello", OPTIONS)
    assert hub.server.state.count(rf"/resolve/main/{BASE_FILE}$") == 0
    assert hub.server.state.count(rf"/resolve/main/{PROJECTOR_FILE}$") == 1
    assert hub.content_path(BASE_FILE).stat().st_ino == legacy.stat().st_ino


def test_offline_without_the_projector_names_it(hub: VisionHub) -> None:
    with PawFn[Qwen3_5_0_8B, Torch].load_sync(PROGRAM_ID, config=hub.config()):
        pass
    hub.content_path(PROJECTOR_FILE).unlink()
    with pytest.raises(OfflineError, match=f"projector {PROJECTOR_FILE}"):
        PawFn[Qwen3_5_0_8B, Torch].load_sync(PROGRAM_ID, config=hub.config(offline=True))


def test_the_builtin_vision_runtime_is_the_official_one_and_cannot_be_weakened() -> None:
    official: Any = pytest.importorskip("programasweights._vision_contract")  # Any: the official SDK ships no types
    BUILTIN_VISION_RUNTIMES: dict[str, Any] = official.BUILTIN_VISION_RUNTIMES  # noqa: N806 - the official SDK's name
    pinned = builtin_runtime("qwen3.5-0.8b-q8_0")
    assert pinned is not None
    assert pinned.model_dump(mode="json", exclude_none=True) == BUILTIN_VISION_RUNTIMES["qwen3.5-0.8b-q8_0"]
    served = json.loads(json.dumps(BUILTIN_VISION_RUNTIMES["qwen3.5-0.8b-q8_0"]))
    served["local_sdk"]["vision"]["projector"]["sha256"] = "0" * 64
    with pytest.raises(HubError, match="sha256 of mmproj-BF16.gguf differs"):
        canonical(RuntimeManifest.model_validate(served))


def test_a_version_2_runtime_needs_its_files_pinned() -> None:
    official = builtin_runtime("qwen3.5-0.8b-q8_0")
    assert official is not None
    unpinned = official.model_dump(mode="json", exclude_none=True)
    del unpinned["local_sdk"]["vision"]["projector"]["sha256"]
    with pytest.raises(ValueError, match="size_bytes and sha256"):
        RuntimeManifest.model_validate(unpinned)
