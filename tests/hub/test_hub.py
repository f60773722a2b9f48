"""End to end against a real HTTP server on 127.0.0.1: load by slug or id, retries, redirects, resume, offline."""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from pawfn import (
    GPT2,
    AsyncPawClient,
    CompileError,
    ConfigError,
    IntegrityError,
    InterpreterMismatchError,
    LlamaCpp,
    NotFoundError,
    OfflineError,
    PawCache,
    PawClient,
    PawConfig,
    PawFn,
    PawFnBuilder,
    Qwen3_0_6B,
    Remote,
    RuntimeOptions,
    Torch,
    prepare_program,
)
from pawfn.cli import main
from tests.helpers.bounded import CliRun, run_cli
from tests.helpers.hub_server import HubServer
from tests.helpers.locks import lock_held_elsewhere
from tests.helpers.official_layout import official_base_ok, official_program_problems, official_slug_cache, write_official_cache
from tests.helpers.programs import TinyProgram
from tests.helpers.servers import start_server
from tests.helpers.tiny_models import write_bundle, zip_bundle
from tests.helpers.tiny_qwen35 import TinyVision

PROGRAM_ID = "a6b454023d41ac9ca845"
SLUG = "tester/triage"
RUNTIME_ID = "tiny-qwen3-f32"
BASE_FILE = "tiny-qwen3.gguf"
OPTIONS = RuntimeOptions(max_tokens=12)


@dataclass
class Hub:
    server: HubServer
    program: TinyProgram
    archive: Path
    base: Path
    runtime: dict[str, object]
    cache_dir: Path

    def config(self, **changes: object) -> PawConfig:
        values: dict[str, object] = {"api_url": self.server.api_url, "api_key": "secret-key", "cache_dir": self.cache_dir, "progress": False}
        return PawConfig.model_validate(values | changes)

    def expected(self, text: str) -> tuple[int, ...]:
        with PawFn[Qwen3_0_6B, Torch].load_sync(self.program.folder, base=self.base) as function:
            return function.generate(text, OPTIONS).token_ids


@pytest.fixture
def hub(qwen3_program: TinyProgram, tmp_path: Path) -> Iterator[Hub]:
    server = HubServer()
    bundle = write_bundle(
        tmp_path / "bundle", qwen3_program.adapter, "Qwen/Qwen3-0.6B", qwen3_program.template, {"program_id": PROGRAM_ID, "runtime_id": RUNTIME_ID}
    )
    archive = zip_bundle(bundle, tmp_path / "program.paw")
    base = qwen3_program.interpreter.gguf_path
    data = base.read_bytes()
    runtime: dict[str, object] = {
        "runtime_id": RUNTIME_ID,
        "manifest_version": 1,
        "interpreter": "Qwen/Qwen3-0.6B",
        "adapter_format": "gguf_lora",
        "local_sdk": {
            "supported": True,
            "n_ctx": 2048,
            "base_model": {
                "provider": None,
                "repo": None,
                "file": BASE_FILE,
                "url": f"{server.cdn_url}/files/{BASE_FILE}",
                "size_bytes": len(data),
                "sha256": hashlib.sha256(data).hexdigest(),
            },
        },
    }
    state = server.state
    state.programs[PROGRAM_ID] = archive.read_bytes()
    state.files[f"{PROGRAM_ID}.paw"] = archive.read_bytes()
    state.files[BASE_FILE] = data
    state.slugs[SLUG] = PROGRAM_ID
    state.slugs[f"{SLUG}@v1"] = PROGRAM_ID
    state.runtimes[RUNTIME_ID] = runtime
    state.compiled["Classify the urgency of a message"] = PROGRAM_ID
    yield Hub(server, qwen3_program, archive, base, runtime, tmp_path / "cache")
    server.close()


def test_load_slug_end_to_end_in_the_official_layout(hub: Hub) -> None:
    hub.server.state.pending_202.add(PROGRAM_ID)  # the first download attempt says "still generating"
    function = asyncio.run(PawFn[Qwen3_0_6B, Torch].load_slug(SLUG, config=hub.config()))
    with function:
        assert type(function) is PawFn[Qwen3_0_6B, Torch]
        assert function.program_id == PROGRAM_ID
        assert function.generate("hello", OPTIONS).token_ids == hub.expected("hello")
    state = hub.server.state
    assert state.count(r"/programs/a6b454023d41ac9ca845/download$") == 2  # 202, then the archive
    assert official_program_problems(hub.cache_dir, PROGRAM_ID) == []
    assert official_slug_cache(hub.cache_dir) == {SLUG: PROGRAM_ID}
    size, sha = len(hub.base.read_bytes()), hashlib.sha256(hub.base.read_bytes()).hexdigest()
    assert official_base_ok(hub.cache_dir, BASE_FILE, size, sha)
    meta = json.loads((hub.cache_dir / "programs" / PROGRAM_ID / "meta.json").read_text())
    assert meta["runtime"]["runtime_id"] == RUNTIME_ID and meta["runtime_id"] == RUNTIME_ID
    assert (hub.cache_dir / "runtimes" / f"{RUNTIME_ID}.json").is_file()
    assert (hub.cache_dir / "runtimes" / f"{RUNTIME_ID}.v1.json").is_file()
    assert not list((hub.cache_dir / "programs" / ".staging").iterdir())  # no half-installed leftovers


def test_second_load_is_served_from_the_cache(hub: Hub) -> None:
    PawFn[Qwen3_0_6B, Torch].load_sync(PROGRAM_ID, config=hub.config()).close()
    before = len(hub.server.state.snapshot())
    PawFn[Qwen3_0_6B, Torch].load_sync(PROGRAM_ID, config=hub.config()).close()
    assert len(hub.server.state.snapshot()) == before  # an id needs no request once cached


def test_a_prepared_program_loads_without_a_request(hub: Hub) -> None:
    """`prepare_program` resolves and downloads; `load_sync` of its result opens those files and asks nothing."""
    prepared = prepare_program(SLUG, hub.config())
    before = len(hub.server.state.snapshot())
    with PawFn[Qwen3_0_6B, Torch].load_sync(prepared, config=hub.config()) as function:
        assert function.program_id == PROGRAM_ID
        assert function.generate("hello", OPTIONS).token_ids == hub.expected("hello")
    with PawFn.load_any_sync(prepared, Torch, config=hub.config()) as function:
        assert type(function) is PawFn[Qwen3_0_6B, Torch]
    assert len(hub.server.state.snapshot()) == before
    with pytest.raises(InterpreterMismatchError):
        PawFn[GPT2, Torch].load_sync(prepared, config=hub.config())
    with pytest.raises(ConfigError, match="give base= to prepare_program"):
        PawFn[Qwen3_0_6B, Torch].load_sync(prepared, base=hub.base, config=hub.config())
    with pytest.raises(ConfigError, match="Remote loads by reference"):
        PawFn[Qwen3_0_6B, Remote].load_sync(prepared, config=hub.config())


def test_retries_429_and_500(hub: Hub) -> None:
    hub.server.state.fail_once["/api/v1/programs/resolve"] = 429
    hub.server.state.fail_once[f"/api/v1/programs/{PROGRAM_ID}/download"] = 500
    PawFn[Qwen3_0_6B, Torch].load_slug_sync(SLUG, config=hub.config()).close()
    assert hub.server.state.count("/programs/resolve/") == 2
    assert hub.server.state.count("/download$") == 2


def test_retries_run_out(hub: Hub) -> None:
    from pawfn import ServerError

    hub.server.state.fail_once["/api/v1/programs/resolve"] = 500
    with pytest.raises(ServerError, match=r"server error \(HTTP 500\): injected 500") as info:
        PawFn[Qwen3_0_6B, Torch].load_slug_sync(SLUG, config=hub.config(max_retries=0))
    assert info.value.status == 500


def test_api_key_never_reaches_another_origin(hub: Hub) -> None:
    hub.server.state.redirect_downloads_to = hub.server.cdn_url
    PawFn[Qwen3_0_6B, Torch].load_sync(PROGRAM_ID, config=hub.config()).close()
    requests = hub.server.state.snapshot()
    cdn = [r for r in requests if r.origin == "cdn"]
    api = [r for r in requests if r.origin == "api"]
    assert any(r.path == f"/files/{PROGRAM_ID}.paw" for r in cdn)  # the redirect was followed
    assert all("x-api-key" not in r.headers for r in cdn)
    assert api and all(r.headers.get("x-api-key") == "secret-key" for r in api)


def test_base_download_resumes_after_a_dropped_connection(hub: Hub) -> None:
    hub.server.state.drop_file_after[BASE_FILE] = 4096
    PawFn[Qwen3_0_6B, Torch].load_sync(PROGRAM_ID, config=hub.config()).close()
    base_requests = [r for r in hub.server.state.snapshot() if r.path == f"/files/{BASE_FILE}"]
    assert len(base_requests) == 2
    assert "range" not in base_requests[0].headers
    assert base_requests[1].headers["range"] == "bytes=4096-"
    assert (hub.cache_dir / "base_models" / BASE_FILE).read_bytes() == hub.base.read_bytes()


def test_partial_base_file_is_resumed_by_the_next_run(hub: Hub) -> None:
    folder = hub.cache_dir / "base_models"
    folder.mkdir(parents=True)
    (folder / f".{BASE_FILE}.pawfn-partial").write_bytes(hub.base.read_bytes()[:10_000])
    PawFn[Qwen3_0_6B, Torch].load_sync(PROGRAM_ID, config=hub.config()).close()
    base_requests = [r for r in hub.server.state.snapshot() if r.path == f"/files/{BASE_FILE}"]
    assert [r.headers.get("range") for r in base_requests] == ["bytes=10000-"]
    assert (folder / BASE_FILE).read_bytes() == hub.base.read_bytes()


def test_sha256_mismatch_is_refused(hub: Hub) -> None:
    local = hub.runtime["local_sdk"]
    assert isinstance(local, dict)
    local["base_model"]["sha256"] = "0" * 64
    with pytest.raises(IntegrityError, match=f"{BASE_FILE}: sha256 .* does not match the expected 0000"):
        PawFn[Qwen3_0_6B, Torch].load_sync(PROGRAM_ID, config=hub.config())
    folder = hub.cache_dir / "base_models"
    assert not (folder / BASE_FILE).exists() and not (folder / f".{BASE_FILE}.pawfn-partial").exists()


def test_offline_mode_makes_no_request(hub: Hub, monkeypatch: pytest.MonkeyPatch) -> None:
    PawFn[Qwen3_0_6B, Torch].load_slug_sync(SLUG, config=hub.config()).close()
    before = len(hub.server.state.snapshot())
    offline = hub.config(offline=True)
    with PawFn[Qwen3_0_6B, Torch].load_slug_sync(SLUG, config=offline) as function:
        assert function.generate("hello", OPTIONS).token_ids == hub.expected("hello")
    PawFn[Qwen3_0_6B, Torch].load_sync(PROGRAM_ID, config=offline).close()
    monkeypatch.setenv("PAW_OFFLINE", "1")
    monkeypatch.setenv("PAW_API_URL", hub.server.api_url)
    monkeypatch.setenv("PAW_CACHE_DIR", str(hub.cache_dir))
    PawFn[Qwen3_0_6B, Torch].load_slug_sync(SLUG).close()
    with pytest.raises(OfflineError, match=r"program tester/other is not in the cache.*pawfn cache prepare tester/other"):
        PawFn[Qwen3_0_6B, Torch].load_slug_sync("tester/other")
    assert len(hub.server.state.snapshot()) == before


def test_offline_error_names_the_missing_base(hub: Hub) -> None:
    PawFn[Qwen3_0_6B, Torch].load_sync(PROGRAM_ID, config=hub.config()).close()
    (hub.cache_dir / "base_models" / BASE_FILE).unlink()
    with pytest.raises(OfflineError, match=f"base model {BASE_FILE} .* `pawfn cache prepare {PROGRAM_ID}`"):
        PawFn[Qwen3_0_6B, Torch].load_sync(PROGRAM_ID, config=hub.config(offline=True))


def test_a_cache_written_by_the_official_sdk_is_used_without_requests(hub: Hub) -> None:
    bundle = hub.archive.parent / "bundle"
    write_official_cache(hub.cache_dir, PROGRAM_ID, bundle, hub.runtime, hub.base, {f"{SLUG}@v1": PROGRAM_ID})
    config = hub.config()
    with PawFn[Qwen3_0_6B, Torch].load_sync(PROGRAM_ID, config=config) as by_id:
        assert by_id.generate("hello", OPTIONS).token_ids == hub.expected("hello")
    PawFn[Qwen3_0_6B, Torch].load_slug_sync(f"{SLUG}@v1", config=config).close()  # pinned: no resolve
    assert hub.server.state.snapshot() == []


def test_two_processes_install_once(hub: Hub) -> None:
    command = [
        sys.executable,
        "-m",
        "pawfn",
        "cache",
        "prepare",
        PROGRAM_ID,
        "--api-url",
        hub.server.api_url,
        "--cache-dir",
        str(hub.cache_dir),
        "--json",
    ]
    env = dict(os.environ, PAW_API_KEY="secret-key", PYTHONWARNINGS="ignore")
    processes = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env) for _ in range(2)]
    outputs = [process.communicate(timeout=300) for process in processes]
    assert [process.returncode for process in processes] == [0, 0], outputs
    assert hub.server.state.count("/download$") == 1
    assert hub.server.state.count(f"/files/{BASE_FILE}$") == 1
    assert official_program_problems(hub.cache_dir, PROGRAM_ID) == []
    assert [json.loads(out)["program_id"] for out, _ in outputs] == [PROGRAM_ID, PROGRAM_ID]


def test_unknown_slug_is_a_typed_not_found(hub: Hub) -> None:
    with pytest.raises(NotFoundError, match="program tester/nope not found") as info:
        PawFn[Qwen3_0_6B, Torch].load_slug_sync("tester/nope", config=hub.config())
    assert info.value.status == 404 and info.value.server_message == "program tester/nope not found"


def test_slugs_are_url_encoded(hub: Hub) -> None:
    with PawClient(hub.config()) as client:
        assert client.resolve(f"{SLUG}@v1") == PROGRAM_ID
    assert hub.server.state.count(r"/programs/resolve/tester%2Ftriage%40v1$") == 1


def test_interpreter_mismatch_is_refused_before_the_base_downloads(hub: Hub) -> None:
    with pytest.raises(InterpreterMismatchError, match="compiled for interpreter 'Qwen/Qwen3-0.6B'"):
        PawFn[GPT2, Torch].load_slug_sync(SLUG, config=hub.config())
    assert hub.server.state.count(f"/files/{BASE_FILE}") == 0


def test_compile_spec(hub: Hub) -> None:
    function = asyncio.run(
        PawFn[Qwen3_0_6B, Torch].compile_spec("Classify the urgency of a message", compiler="paw-4b-qwen3-0.6b", config=hub.config())
    )
    with function:
        assert function.program_id == PROGRAM_ID
    body_seen = hub.server.state.count("/api/v1/compile$", method="POST")
    assert body_seen == 1
    with pytest.raises(CompileError, match="HTTP 422: spec is too short"):
        PawFn[Qwen3_0_6B, Torch].compile_spec_sync("short", config=hub.config())


def test_builder(hub: Hub) -> None:
    config = hub.config()
    loaded = PawFnBuilder.builder().config(config).slug(SLUG).load_sync()
    with loaded:
        assert type(loaded) is PawFn[Qwen3_0_6B, Torch]  # the interpreter came from the bundle
        assert loaded.generate("hello", OPTIONS).token_ids == hub.expected("hello")
    compiled = asyncio.run(PawFnBuilder.builder().config(config).spec("Classify the urgency of a message").compile())
    with compiled:
        assert compiled.program_id == PROGRAM_ID
    by_id = asyncio.run(PawFnBuilder.builder().config(config).id(PROGRAM_ID).load())
    by_id.close()
    if importlib.util.find_spec("llama_cpp") is not None:  # the same path on another backend
        with PawFnBuilder.builder().backend(LlamaCpp).config(config).slug(SLUG).load_sync() as on_llamacpp:
            assert type(on_llamacpp) is PawFn[Qwen3_0_6B, LlamaCpp]
            assert on_llamacpp.generate("hello", OPTIONS).token_ids == hub.expected("hello")


def test_async_client(hub: Hub) -> None:
    async def main() -> tuple[str, list[str | None]]:
        async with AsyncPawClient(hub.config()) as client:
            resolved = await client.resolve(SLUG)
            compilers = [c.name for c in await client.compilers()]
        return resolved, compilers

    assert asyncio.run(main()) == (PROGRAM_ID, ["paw-4b-qwen3-0.6b", "paw-4b-gpt2"])


def test_cli_against_the_hub(hub: Hub, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PAW_API_KEY", "secret-key")
    common = ["--api-url", hub.server.api_url, "--cache-dir", str(hub.cache_dir)]
    assert main(["run", "--program", SLUG, "--input", "hello", "--max-tokens", "12", "--json", *common]) == 0
    record = json.loads(capsys.readouterr().out)
    assert tuple(record["tokens"]) == hub.expected("hello") and record["program"] == PROGRAM_ID
    assert main(["cache", "list", "--json", *common]) == 0
    listed, *others = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert listed["kind"] == "program" and listed["program_id"] == PROGRAM_ID and listed["slugs"] == [SLUG]
    assert {other["kind"] for other in others} == {"base_model", "prefix"}  # the downloaded base, the stored prefix
    assert main(["info", SLUG, "--json", *common]) == 0
    assert json.loads(capsys.readouterr().out)["id"] == PROGRAM_ID
    assert main(["compile", "--spec", "Classify the urgency of a message", "--json", *common]) == 0
    assert json.loads(capsys.readouterr().out)["program_id"] == PROGRAM_ID
    assert main(["run", "--program", SLUG, "--input", "hello", "--offline", *common]) == 0
    capsys.readouterr()
    assert main(["run", "--program", "tester/nope", "--input", "x", *common]) == 1
    assert capsys.readouterr().err.startswith("pawfn: error: program tester/nope not found")
    assert main(["cache", "clear", "--yes", *common]) == 0
    assert PawCache(hub.cache_dir).list_programs() == []


def test_login_writes_the_official_config_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    config_file = tmp_path / "config" / "config.json"
    monkeypatch.setenv("PAW_CONFIG_FILE", str(config_file))
    monkeypatch.delenv("PAW_API_KEY", raising=False)
    assert main(["login", "paw_sk_test"]) == 0
    assert json.loads(config_file.read_text()) == {"api_key": "paw_sk_test"}
    assert stat.S_IMODE(config_file.stat().st_mode) == 0o600
    config = PawConfig.from_env()
    assert config.key_value() == "paw_sk_test"
    assert "paw_sk_test" not in repr(config)  # the key is a secret in reprs and logs
    capsys.readouterr()


def test_config_from_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PAW_CONFIG_FILE", str(tmp_path / "none.json"))
    monkeypatch.setenv("PAW_API_URL", "http://127.0.0.1:9/")
    monkeypatch.setenv("PAW_CACHE_DIR", str(tmp_path / "c"))
    monkeypatch.setenv("PAW_OFFLINE", "yes")
    monkeypatch.setenv("PAW_N_CTX", "512")
    config = PawConfig.from_env(max_model_copies=2)
    assert (config.api_url, config.cache_dir, config.offline, config.n_ctx, config.max_model_copies) == (
        "http://127.0.0.1:9",
        tmp_path / "c",
        True,
        512,
        2,
    )
    monkeypatch.setenv("PAW_N_CTX", "lots")

    with pytest.raises(ConfigError, match="invalid PAW_N_CTX='lots': expected an integer > 0"):
        PawConfig.from_env()


def test_download_wait_is_bounded(hub: Hub) -> None:
    from pawfn import ServerError

    hub.server.state.always_202 = True
    with pytest.raises(ServerError, match="still being generated"):
        PawFn[Qwen3_0_6B, Torch].load_sync(PROGRAM_ID, config=hub.config(max_wait_s=0.0))


def test_a_broken_program_download_leaves_nothing_installed(hub: Hub) -> None:
    from pawfn import HubConnectionError

    hub.server.state.drop_file_after[f"{PROGRAM_ID}.paw"] = 200
    with pytest.raises(HubConnectionError, match="connection lost during the download"):
        PawFn[Qwen3_0_6B, Torch].load_sync(PROGRAM_ID, config=hub.config(max_retries=0))
    programs = hub.cache_dir / "programs"
    assert not (programs / PROGRAM_ID).exists()
    assert not (programs / ".staging").exists() or not any((programs / ".staging").iterdir())
    hub.server.state.drop_file_after[f"{PROGRAM_ID}.paw"] = 200  # with retries the next attempt succeeds
    PawFn[Qwen3_0_6B, Torch].load_sync(PROGRAM_ID, config=hub.config(max_retries=1)).close()
    assert official_program_problems(hub.cache_dir, PROGRAM_ID) == []


def test_client_endpoints(hub: Hub) -> None:
    from pawfn import AuthenticationError
    from pawfn.hub.types import CompileRequest

    with PawClient(hub.config()) as client:
        assert client.precheck("Classify the urgency of a message").program_id == PROGRAM_ID
        job = client.compile_async(CompileRequest(spec="Classify the urgency of a message", compiler="paw-ft-bs48"))
        assert (job.status, job.program_id) == ("queued", PROGRAM_ID)
        assert client.compile_status(job.job_id).status == "queued"
        assert client.cancel_compile(job.job_id).status == "cancelled"
        versions = client.versions(SLUG)
        assert (versions.main_version, [v.program_id for v in versions.versions]) == (1, [PROGRAM_ID])
        assert [p.id for p in client.my_programs().programs] == [PROGRAM_ID]
        info = client.program_info(SLUG)
        assert info.id == PROGRAM_ID and SLUG in info.aliases
    with PawClient(hub.config(api_key=None)) as anonymous, pytest.raises(AuthenticationError, match="HTTP 401") as error:
        anonymous.my_programs()
    assert error.value.status == 401


def test_a_program_folder_finds_the_base_its_runtime_names_in_the_cache(hub: Hub) -> None:
    PawFn[Qwen3_0_6B, Torch].load_sync(PROGRAM_ID, config=hub.config()).close()
    folder = hub.cache_dir / "programs" / PROGRAM_ID
    with PawFn[Qwen3_0_6B, Torch].load_sync(folder, config=hub.config(offline=True)) as function:
        assert function.generate("hello", OPTIONS).token_ids == hub.expected("hello")


def test_prefix_kv_is_stored_beside_a_cached_program(hub: Hub, monkeypatch: pytest.MonkeyPatch) -> None:
    from pawfn.torch.model.kvcache import KVCache, PrefixState
    from pawfn.torch.weights.lora import DeviceAdapter
    from pawfn.torch.engine.network import TorchInterpreter

    reference = hub.expected("hello")
    prefills: list[int] = []
    original = TorchInterpreter.prefill_prefix

    def counting(self: TorchInterpreter, ids: list[int], adapter: DeviceAdapter, cache: KVCache) -> PrefixState:
        prefills.append(len(ids))
        return original(self, ids, adapter, cache)

    monkeypatch.setattr(TorchInterpreter, "prefill_prefix", counting)
    with PawFn[Qwen3_0_6B, Torch].load_sync(PROGRAM_ID, config=hub.config()) as first:
        expected = first.generate("hello", OPTIONS).token_ids
    folder = hub.cache_dir / "programs" / PROGRAM_ID
    stored = list(folder.glob(".pawfn-prefix-*.pt"))
    assert len(stored) == 1 and len(prefills) == 1
    with PawFn[Qwen3_0_6B, Torch].load_sync(PROGRAM_ID, config=hub.config()) as second:
        assert second.generate("hello", OPTIONS).token_ids == expected == reference
    assert len(prefills) == 1  # the second load read the stored prefix
    stored[0].write_bytes(b"not a torch file")
    with PawFn[Qwen3_0_6B, Torch].load_sync(PROGRAM_ID, config=hub.config()) as third:
        assert third.generate("hello", OPTIONS).token_ids == expected
    assert len(prefills) == 2 and stored[0].read_bytes() != b"not a torch file"  # re-evaluated and rewritten
    with PawFn[Qwen3_0_6B, Torch].load_sync(PROGRAM_ID, config=hub.config(dtype="bfloat16")):
        pass
    assert len(list(folder.glob(".pawfn-prefix-*.pt"))) == 2  # one per dtype
    assert official_program_problems(hub.cache_dir, PROGRAM_ID) == []


def test_no_prefix_file_in_a_users_own_folder(hub: Hub) -> None:
    folder = hub.archive.parent / "bundle"
    PawFn[Qwen3_0_6B, Torch].load_sync(folder, base=hub.base, config=hub.config()).close()
    assert not list(folder.glob(".pawfn-*"))


def test_unreachable_resolve_falls_back_to_the_cached_slug(hub: Hub) -> None:
    PawFn[Qwen3_0_6B, Torch].load_slug_sync(SLUG, config=hub.config()).close()
    hub.server.state.fail_once["/api/v1/programs/resolve"] = 503
    with (
        pytest.warns(RuntimeWarning, match=f"using the cached {SLUG} -> {PROGRAM_ID}"),
        PawFn[Qwen3_0_6B, Torch].load_slug_sync(SLUG, config=hub.config(max_retries=0)) as function,
    ):
        assert function.program_id == PROGRAM_ID
    with pytest.raises(NotFoundError):  # a definite "no" from the server is not papered over
        PawFn[Qwen3_0_6B, Torch].load_slug_sync("tester/gone", config=hub.config())


def test_waits_for_the_official_sdk_installing_the_same_program(hub: Hub, tmp_path: Path) -> None:
    """The official SDK holds .locks/programs/<id>.lock while it installs; pawfn waits and then uses its install."""
    staged = tmp_path / "official"
    write_official_cache(staged, PROGRAM_ID, hub.archive.parent / "bundle", hub.runtime, hub.base, {})
    script = (
        "import fcntl, shutil, sys, time\n"
        "from pathlib import Path\n"
        "cache, staged, pid = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]\n"
        "lock = cache / '.locks' / 'programs' / (pid + '.lock')\n"
        "lock.parent.mkdir(parents=True, exist_ok=True)\n"
        "with lock.open('a+b') as handle:\n"
        "    fcntl.flock(handle.fileno(), fcntl.LOCK_EX)\n"
        "    print('locked', flush=True)\n"
        "    time.sleep(1.0)\n"
        "    shutil.copytree(staged, cache, dirs_exist_ok=True)\n"
    )
    official = subprocess.Popen([sys.executable, "-c", script, str(hub.cache_dir), str(staged), PROGRAM_ID], stdout=subprocess.PIPE, text=True)
    assert official.stdout is not None and official.stdout.readline().strip() == "locked"
    with PawFn[Qwen3_0_6B, Torch].load_sync(PROGRAM_ID, config=hub.config()) as function:
        assert function.generate("hello", OPTIONS).token_ids == hub.expected("hello")
    assert official.wait(timeout=60) == 0
    assert hub.server.state.count("/download$") == 0  # the official SDK's install was used


def test_a_failed_base_download_suggests_base_and_base_skips_it(
    hub: Hub, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PAW_API_KEY", "secret-key")
    common = ["--api-url", hub.server.api_url, "--cache-dir", str(hub.cache_dir)]
    hub.server.state.files.pop(BASE_FILE)  # the CDN answers 404 for the base weights
    assert main(["run", "--program", SLUG, "--input", "hello", *common]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"pawfn: error: cannot download base model {BASE_FILE}") and err.count("\n") == 1
    assert "pass it with --base PATH" in err
    assert main(["run", "--program", SLUG, "--input", "hello", "--max-tokens", "12", "--json", "--base", str(hub.base), *common]) == 0
    assert tuple(json.loads(capsys.readouterr().out)["tokens"]) == hub.expected("hello")
    assert hub.server.state.count(f"/files/{BASE_FILE}$") == 1  # with --base, no second attempt


def test_a_lock_wait_says_what_it_waits_for_and_gives_up(hub: Hub, caplog: pytest.LogCaptureFixture) -> None:
    """The wait was silent and endless; now it is logged and ends in a CacheLockError after lock_timeout_s."""
    from pawfn import CacheLockError

    with lock_held_elsewhere(hub.cache_dir / ".locks" / "programs" / f"{PROGRAM_ID}.lock", 30.0):
        started = time.perf_counter()
        with caplog.at_level("WARNING", logger="pawfn"), pytest.raises(CacheLockError, match=f"programs/{PROGRAM_ID}"):
            PawFn[Qwen3_0_6B, Torch].load_sync(PROGRAM_ID, config=hub.config(lock_timeout_s=1.0))
        assert time.perf_counter() - started < 10
        assert any(f"waiting for the cache lock on programs/{PROGRAM_ID}" in record.getMessage() for record in caplog.records)
        run = run_cli(
            "run",
            "--program",
            PROGRAM_ID,
            "--input",
            "hello",
            "--api-url",
            hub.server.api_url,
            "--cache-dir",
            str(hub.cache_dir),
            environment={"PAW_LOCK_TIMEOUT_S": "1"},
        )
        assert f"waiting for the cache lock on programs/{PROGRAM_ID}" in run.stderr.splitlines()[0]
        CliRun(run.status, run.stdout, run.stderr.splitlines()[-1] + "\n", run.seconds, run.peak_rss_mb).assert_one_line_error(
            1, "gave up after 1 s waiting for the cache lock"
        )


def test_slug_cache_entries_pawfn_does_not_understand_are_kept(hub: Hub) -> None:
    """pawfn rewrote slug_cache.json with only the entries it understood, dropping the official SDK's others."""
    hub.cache_dir.mkdir(parents=True, exist_ok=True)
    foreign = {"some/other@v2": {"id": "x", "at": 3}, " spaced ": "0123456789abcdef0123"}
    (hub.cache_dir / "slug_cache.json").write_text(json.dumps(foreign))
    asyncio.run(PawFn[Qwen3_0_6B, Torch].load_slug(SLUG, config=hub.config())).close()
    assert json.loads((hub.cache_dir / "slug_cache.json").read_text()) == foreign | {SLUG: PROGRAM_ID}


def test_downloads_are_staged_in_the_cache_and_a_killed_runs_leftovers_removed(hub: Hub) -> None:
    """Downloads were staged in the system temp dir (a kill -9 left pawfn-download-* there for good)."""
    leftover = hub.cache_dir / ".staging" / f"download-{PROGRAM_ID}"
    leftover.mkdir(parents=True)
    (leftover / f"{PROGRAM_ID}.paw").write_bytes(b"half a download")
    temp_before = set(Path(tempfile.gettempdir()).glob("pawfn-download-*"))
    PawFn[Qwen3_0_6B, Torch].load_sync(PROGRAM_ID, config=hub.config()).close()
    assert not leftover.exists()
    assert set(Path(tempfile.gettempdir()).glob("pawfn-download-*")) == temp_before
    assert official_program_problems(hub.cache_dir, PROGRAM_ID) == []


def test_a_runtime_naming_another_runtimes_base_file_gets_a_file_of_its_own(hub: Hub, tmp_path: Path) -> None:
    """Two runtimes whose base files share a name: the second download replaced the first runtime's verified
    file, and the first program then failed offline."""
    other_program, other_runtime = "b6b454023d41ac9ca846", "tiny-qwen3-other"
    other_base = hub.base.read_bytes() + bytes(64)  # the same weights, other bytes: another sha256
    bundle = write_bundle(
        tmp_path / "other-bundle",
        hub.program.adapter,
        "Qwen/Qwen3-0.6B",
        hub.program.template,
        {"program_id": other_program, "runtime_id": other_runtime},
    )
    state = hub.server.state
    state.programs[other_program] = zip_bundle(bundle, tmp_path / "other.paw").read_bytes()
    state.files["other-base.gguf"] = other_base
    state.runtimes[other_runtime] = {
        **hub.runtime,
        "runtime_id": other_runtime,
        "local_sdk": {
            "supported": True,
            "n_ctx": 2048,
            "base_model": {
                "provider": None,
                "repo": None,
                "file": BASE_FILE,
                "url": f"{hub.server.cdn_url}/files/other-base.gguf",
                "size_bytes": len(other_base),
                "sha256": hashlib.sha256(other_base).hexdigest(),
            },
        },
    }
    PawFn[Qwen3_0_6B, Torch].load_sync(PROGRAM_ID, config=hub.config()).close()
    PawFn[Qwen3_0_6B, Torch].load_sync(other_program, config=hub.config()).close()
    base_models = hub.cache_dir / "base_models"
    assert (base_models / BASE_FILE).read_bytes() == hub.base.read_bytes()  # the first runtime's file, untouched
    assert [path.read_bytes() for path in base_models.glob("tiny-qwen3.sha256-*.gguf")] == [other_base]
    for program_id in (PROGRAM_ID, other_program):  # both load offline
        with PawFn[Qwen3_0_6B, Torch].load_sync(program_id, config=hub.config(offline=True)) as function:
            assert function.generate("hello", OPTIONS).token_ids == hub.expected("hello")


def test_a_damaged_installed_program_is_fetched_again_online_and_named_offline(hub: Hub) -> None:
    """A cached adapter cut short (its magic intact) failed every run and was never fetched again."""
    PawFn[Qwen3_0_6B, Torch].load_sync(PROGRAM_ID, config=hub.config()).close()
    adapter = hub.cache_dir / "programs" / PROGRAM_ID / "adapter.gguf"
    adapter.write_bytes(adapter.read_bytes()[: adapter.stat().st_size // 2])
    with pytest.raises(OfflineError, match=f"the cached program {PROGRAM_ID} is damaged \\(adapter.gguf: .*past the end"):
        PawFn[Qwen3_0_6B, Torch].load_sync(PROGRAM_ID, config=hub.config(offline=True))
    run_cli("run", "--program", PROGRAM_ID, "--input", "hello", "--offline", "--cache-dir", str(hub.cache_dir)).assert_one_line_error(
        1, f"the cached program {PROGRAM_ID} is damaged"
    )
    downloads = hub.server.state.count("/download$")
    with PawFn[Qwen3_0_6B, Torch].load_sync(PROGRAM_ID, config=hub.config()) as function:
        assert function.generate("hello", OPTIONS).token_ids == hub.expected("hello")
    assert hub.server.state.count("/download$") == downloads + 1
    assert official_program_problems(hub.cache_dir, PROGRAM_ID) == []


def test_pawfn_serve_allow_load_loads_a_hub_program_once_on_its_first_requests(hub: Hub, tmp_path: Path) -> None:
    """--allow-load: concurrent first requests for a slug load it once (its download too); paths stay refused."""
    if importlib.util.find_spec("fastapi") is None:
        pytest.skip("pawfn serve needs the serve extra")
    server = start_server(
        "--allow-load", "--api-url", hub.server.api_url, "--cache-dir", str(hub.cache_dir), environment={"PAW_API_KEY": "secret-key"}
    )
    try:

        def run(text: str) -> httpx.Response:
            return httpx.post(f"{server.url}/v1/programs/{SLUG}/run", json={"input": text, "options": {"max_tokens": 12}}, timeout=120)

        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(run, ["hello", "hello", "Server down!", "hello"]))
        assert [answer.status_code for answer in answers] == [200] * 4, answers[0].text
        assert tuple(answers[2].json()["generation"]["token_ids"]) == hub.expected("Server down!")
        assert answers[0].json()["program"] == PROGRAM_ID
        assert hub.server.state.count(rf"/programs/{PROGRAM_ID}/download$") == 1
        by_id = httpx.post(f"{server.url}/v1/programs/{PROGRAM_ID}/run", json={"input": "hello"}, timeout=60)
        assert by_id.status_code == 200  # the same program, by its id: not loaded again
        assert hub.server.state.count(rf"/programs/{PROGRAM_ID}/download$") == 1
        refused = httpx.post(f"{server.url}/v1/programs/{hub.archive}/run", json={"input": "x"}, timeout=60)
        assert refused.status_code == 404 and "only program ids and slugs" in refused.json()["message"]
    finally:
        assert server.stop() == -signal.SIGTERM, server.output()


def _readme_command_lines() -> list[str]:
    """The README's `pawfn` command lines (its Command line block), optional parts filled in, alternatives split."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    block = readme.split("## Command line", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    commands: list[str] = []
    for line in block.splitlines():
        line = line.split("   #", 1)[0].strip()
        line = re.sub(r"\[([^\]]*)\]", r"\1", line)  # [--runs 10] -> --runs 10
        commands += line.split(" | ") if line.startswith("pawfn cache") else [line]
    return commands


def test_the_readmes_command_lines_work_as_written(hub: Hub, tmp_path: Path) -> None:
    """Each line of the README's Command line block, run by a shell against the test hub: its official slug, file
    names and placeholders put in (`email-triage` is the hub's slug, `triage.paw` its program, the base the tiny
    Qwen3's GGUF); every line exits 0."""
    hub.server.state.compiled["Classify sentiment: POSITIVE or NEGATIVE"] = PROGRAM_ID
    work = tmp_path / "work"
    work.mkdir()
    shutil.copyfile(hub.archive, work / "triage.paw")
    shutil.copyfile(hub.base, work / "qwen3-0.6b-q6_k.gguf")
    (work / "inputs.txt").write_text("Server down!\nLunch?\n")
    (work / "inputs.jsonl").write_text('"Server down!"\n{"input": "Lunch?"}\n')
    names = {
        "email-triage": SLUG,
        "--compiler NAME": "--compiler paw-4b-qwen3-0.6b",
        "--slug SLUG": "--slug tester/s",
        "--concurrency N": "--concurrency 2",
        "prepare REF": f"prepare {SLUG}",
        "login KEY": "login secret-key",
    }
    env = dict(
        os.environ,
        PAW_API_URL=hub.server.api_url,
        PAW_CACHE_DIR=str(hub.cache_dir),
        PYTHONWARNINGS="ignore",
        PAW_CONFIG_FILE=str(tmp_path / "config.json"),
        PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}",
    )
    commands = _readme_command_lines()
    assert len(commands) >= 14
    for command in commands:
        if "--backend llamacpp" in command and importlib.util.find_spec("llama_cpp") is None:
            continue
        for name, value in names.items():
            command = command.replace(name, value)
        result = subprocess.run(
            ["bash", "-c", command + " --max-tokens 4" * ("run " in command and "--max-tokens" not in command)],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert result.returncode == 0, (command, result.stderr[-2000:])
        assert "Traceback" not in result.stderr, (command, result.stderr[-2000:])
    assert json.loads((tmp_path / "config.json").read_text())["api_key"] == "secret-key"


def test_the_readmes_python_examples_run_as_written(hub: Hub, gpt2_program: TinyProgram, qwen35_vision: TinyVision, tmp_path: Path) -> None:
    """Each Python block of the README and the docs' guide and typed outputs page but the server ones (tests/serve runs the
    OpenAI one), as a script against the test hub, in
    a folder holding the files it names (the tiny Qwen3 program and base under the README's names, the tiny GPT-2 as the haiku, the tiny
    Qwen3.5 with its projector and a photo)."""
    hub.server.state.slugs["email-triage"] = PROGRAM_ID
    for spec in ("Classify sentiment", "Classify sentiment: POSITIVE or NEGATIVE"):
        hub.server.state.compiled[spec] = PROGRAM_ID
    work = tmp_path / "work"
    work.mkdir()
    for name in ("triage.paw", "email-triage.paw"):
        shutil.copyfile(hub.archive, work / name)
    shutil.copyfile(hub.base, work / "qwen3-0.6b-q6_k.gguf")
    shutil.copyfile(gpt2_program.archive, work / "haiku.paw")
    shutil.copyfile(gpt2_program.interpreter.gguf_path, work / "gpt2-q8_0.gguf")
    shutil.copyfile(qwen35_vision.text.gguf_path, work / "Qwen3.5-0.8B-Q8_0.gguf")
    shutil.copyfile(qwen35_vision.projector, work / "mmproj-BF16.gguf")
    from PIL import Image as PILImage

    PILImage.new("RGB", (48, 40), (200, 120, 40)).save(work / "photo.jpg")
    root = Path(__file__).resolve().parents[2]
    blocks: list[str] = []
    for page in (root / "README.md", root / "docs" / "guide.md", root / "docs" / "index.md", root / "docs" / "typed-outputs.md"):
        text = page.read_text(encoding="utf-8")
        found = re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)
        blocks += [block for block in found if "Remote" not in block and "OpenAI(" not in block and block not in blocks]
    assert len(blocks) >= 7
    env = dict(
        os.environ,
        PAW_API_URL=hub.server.api_url,
        PAW_CACHE_DIR=str(hub.cache_dir),
        PYTHONWARNINGS="ignore",
        PAW_API_KEY="secret-key",
        PAW_CONFIG_FILE=str(tmp_path / "config.json"),
    )
    for block in blocks:
        result = subprocess.run([sys.executable, "-c", block], cwd=work, env=env, capture_output=True, text=True, timeout=300, check=False)
        assert result.returncode == 0, (block, result.stderr[-2000:])


def test_cache_prepare_records_a_local_base_so_offline_runs_need_no_base(
    hub: Hub, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`pawfn cache prepare REF --base FILE` (the hub serving the program but not its base) puts the file where a
    download would, checked against the runtime's sha256: later offline commands run with no --base, and the official
    SDK's layout holds it. A file that is not the pinned base is refused in one line, and nothing is recorded."""
    del hub.server.state.files[BASE_FILE]
    common = ["--api-url", hub.server.api_url, "--cache-dir", str(hub.cache_dir)]
    monkeypatch.setenv("PAW_API_KEY", "secret-key")
    wrong = tmp_path / "other.gguf"
    wrong.write_bytes(hub.base.read_bytes()[:-1] + b"\0")
    assert main(["cache", "prepare", SLUG, "--base", str(wrong), *common]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is not the base runtime tiny-qwen3-f32 pins" in err and "--base PATH" in err, err
    assert not (hub.cache_dir / "base_models" / BASE_FILE).exists()
    copy = tmp_path / "downloaded-by-hand.gguf"
    shutil.copyfile(hub.base, copy)
    assert main(["cache", "prepare", SLUG, "--base", str(copy), *common]) == 0
    assert "ready offline" in capsys.readouterr().out
    size, sha = len(hub.base.read_bytes()), hashlib.sha256(hub.base.read_bytes()).hexdigest()
    assert official_base_ok(hub.cache_dir, BASE_FILE, size, sha)
    hub.server.close()  # nothing reachable from here on
    assert main(["run", "--program", SLUG, "--input", "hello", "--max-tokens", "12", "--json", "--offline", "--cache-dir", str(hub.cache_dir)]) == 0
    assert tuple(json.loads(capsys.readouterr().out)["tokens"]) == hub.expected("hello")
