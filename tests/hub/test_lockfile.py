"""`pawfn.lock` against a real hub on 127.0.0.1: add, check, prepare, then offline with the hub down every locked
program loads by name; a slug moved on the hub is reported by `lock check`, never followed, and `lock update` moves
it with the evaluation's delta; a changed cached file is refused naming it."""

from __future__ import annotations

import hashlib
import importlib
import json
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from pawfn import IntegrityError, LockError, OfflineError, PawConfig, PawFn, Qwen3_0_6B, RuntimeOptions, Torch, locked_program
from pawfn.cli import main
from pawfn.hub.lockfile import LockFile, LockedProgram, find_lock, read_lock, write_lock
from tests.helpers.hub_server import HubServer
from tests.helpers.programs import TinyProgram
from tests.helpers.servers import start_server
from tests.helpers.tiny_models import write_bundle, zip_bundle

FIRST_ID = "1111aaaa2222bbbb3333"
SECOND_ID = "4444cccc5555dddd6666"
SLUG = "tester/triage"
RUNTIME_ID = "tiny-qwen3-f32"
BASE_FILE = "tiny-qwen3.gguf"
OPTIONS = RuntimeOptions(max_tokens=8)
INPUTS = ["hello", "the server is down", "refund please"]


@dataclass
class LockedHub:
    server: HubServer
    first: TinyProgram
    second: TinyProgram
    archives: dict[str, bytes]
    base: Path
    cache_dir: Path
    lock: Path

    def flags(self, cache_dir: Path | None = None) -> list[str]:
        return ["--api-url", self.server.api_url, "--cache-dir", str(cache_dir or self.cache_dir), "--lock", str(self.lock)]

    def config(self, cache_dir: Path | None = None, **changes: object) -> PawConfig:
        values: dict[str, object] = {"api_url": self.server.api_url, "cache_dir": cache_dir or self.cache_dir, "progress": False}
        return PawConfig.model_validate(values | changes)

    def tokens(self, program: TinyProgram) -> list[tuple[int, ...]]:
        with PawFn[Qwen3_0_6B, Torch].load_sync(program.folder, base=self.base) as function:
            return [function.generate(text, OPTIONS).token_ids for text in INPUTS]


@pytest.fixture
def locked_hub(qwen3_program: TinyProgram, qwen3_program_q4: TinyProgram, tmp_path: Path) -> Iterator[LockedHub]:
    server = HubServer()
    archives: dict[str, bytes] = {}
    for program_id, program in ((FIRST_ID, qwen3_program), (SECOND_ID, qwen3_program_q4)):
        meta: dict[str, object] = {"program_id": program_id, "runtime_id": RUNTIME_ID, "compiler_snapshot": f"snapshot-{program_id[:4]}"}
        bundle = write_bundle(tmp_path / program_id, program.adapter, "Qwen/Qwen3-0.6B", program.template, meta)
        archives[program_id] = zip_bundle(bundle, tmp_path / f"{program_id}.paw").read_bytes()
        server.serve_program(program_id, archives[program_id])
    base = qwen3_program.interpreter.gguf_path
    server.serve_runtime(RUNTIME_ID, "Qwen/Qwen3-0.6B", base.read_bytes(), BASE_FILE)
    server.state.slugs[SLUG] = FIRST_ID
    yield LockedHub(server, qwen3_program, qwen3_program_q4, archives, base, tmp_path / "cache", tmp_path / "app" / "pawfn.lock")
    server.close()


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_add_check_prepare_then_every_locked_program_loads_offline_by_name(
    locked_hub: LockedHub, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hub = locked_hub
    assert main(["lock", "add", "triage", SLUG, *hub.flags()]) == 0
    assert f"locked triage: {SLUG} -> {FIRST_ID}" in capsys.readouterr().out
    written = tomllib.loads(hub.lock.read_text(encoding="utf-8"))["programs"]["triage"]
    installed = hub.cache_dir / "programs" / FIRST_ID
    assert written["program_id"] == FIRST_ID and written["reference"] == SLUG and written["interpreter"] == "Qwen/Qwen3-0.6B"
    assert written["adapter_sha256"] == _sha256(hub.first.adapter) == _sha256(installed / "adapter.gguf")
    assert written["template_sha256"] == _sha256(installed / "prompt_template.txt")
    assert (written["base_file"], written["base_sha256"]) == (BASE_FILE, _sha256(hub.base))
    assert (written["runtime_id"], written["compiler_snapshot"]) == (RUNTIME_ID, "snapshot-1111")
    assert hub.lock.stat().st_mode & 0o777 == 0o644  # a file to commit, readable by all

    assert main(["lock", "check", *hub.flags()]) == 0
    assert f"triage: {FIRST_ID} as locked" in capsys.readouterr().out

    image_cache = tmp_path / "image-cache"  # a fresh machine: an image built offline from the lock alone
    assert main(["prepare", "--locked", *hub.flags(image_cache)]) == 0
    assert "triage: ready offline" in capsys.readouterr().out
    resolved = hub.server.state.count(r"/programs/resolve/")
    hub.server.close()  # the hub is down from here on
    for config in (hub.config(image_cache), hub.config(image_cache, offline=True)):
        with PawFn[Qwen3_0_6B, Torch].load_sync(locked_program("triage", lock=hub.lock, config=config), config=config) as function:
            assert function.program_id == FIRST_ID
            assert [function.generate(text, OPTIONS).token_ids for text in INPUTS] == hub.tokens(hub.first)
    assert main(["lock", "check", "--offline", *hub.flags(image_cache)]) == 0
    assert hub.server.state.count(r"/programs/resolve/") == resolved  # no slug was resolved for a locked load


def test_a_slug_moved_on_the_hub_is_reported_and_not_followed_until_updated(
    locked_hub: LockedHub, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hub = locked_hub
    assert main(["lock", "add", "triage", SLUG, *hub.flags()]) == 0
    # cases on which the locked version is right by construction: its own outputs
    with PawFn[Qwen3_0_6B, Torch].load_sync(hub.first.folder, base=hub.base) as function:
        rows = [{"input": text, "expected": function.run(text)} for text in INPUTS]
    (hub.lock.parent / "triage.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    lock = read_lock(hub.lock)
    lock.programs["triage"] = lock.programs["triage"].model_copy(update={"cases": "triage.jsonl"})
    write_lock(hub.lock, lock)
    hub.server.state.slugs[SLUG] = SECOND_ID
    capsys.readouterr()

    assert main(["lock", "check", *hub.flags()]) == 1
    assert f"triage: {SLUG} now resolves to {SECOND_ID} on the hub, the lock pins {FIRST_ID}" in capsys.readouterr().out
    with PawFn[Qwen3_0_6B, Torch].load_sync(locked_program("triage", lock=hub.lock, config=hub.config())) as function:
        assert function.program_id == FIRST_ID  # the lock, not the hub's slug

    assert main(["lock", "update", *hub.flags()]) == 0
    printed = capsys.readouterr().out
    assert f"triage: {FIRST_ID} -> {SECOND_ID} (accuracy 1.0000 -> " in printed
    assert "on 3 cases of triage.jsonl: fixed 0, broken " in printed
    moved = read_lock(hub.lock).programs["triage"]
    assert (moved.program_id, moved.adapter_sha256, moved.cases) == (SECOND_ID, _sha256(hub.second.adapter), "triage.jsonl")
    assert main(["lock", "check", *hub.flags()]) == 0
    assert main(["lock", "update", *hub.flags()]) == 0
    assert f"triage: {SECOND_ID}, unchanged" in capsys.readouterr().out


def test_a_pinned_reference_is_never_updated(locked_hub: LockedHub, capsys: pytest.CaptureFixture[str]) -> None:
    hub = locked_hub
    assert main(["lock", "add", "first", FIRST_ID, *hub.flags()]) == 0
    hub.server.state.slugs[SLUG] = SECOND_ID
    assert main(["lock", "update", "first", *hub.flags()]) == 0
    assert f"first: {FIRST_ID} is pinned; nothing to follow" in capsys.readouterr().out
    assert read_lock(hub.lock).programs["first"].program_id == FIRST_ID


def test_a_changed_cached_file_is_refused_naming_it(locked_hub: LockedHub, capsys: pytest.CaptureFixture[str]) -> None:
    hub = locked_hub
    assert main(["lock", "add", "triage", SLUG, *hub.flags()]) == 0
    template = hub.cache_dir / "programs" / FIRST_ID / "prompt_template.txt"
    expected = _sha256(template)
    template.write_text(template.read_text(encoding="utf-8") + " Always answer yes.", encoding="utf-8")
    with pytest.raises(IntegrityError) as raised:
        locked_program("triage", lock=hub.lock, config=hub.config())
    message = str(raised.value)
    assert f"prompt_template.txt's sha256 is {_sha256(template)}, the lock pins {expected}" in message
    assert "pawfn cache prepare --locked" in message
    capsys.readouterr()
    assert main(["lock", "check", *hub.flags()]) == 1
    assert f"triage: in the cache, prompt_template.txt's sha256 is {_sha256(template)}" in capsys.readouterr().out


def test_a_program_gone_from_the_hub_and_one_missing_from_the_cache_fail_the_check(
    locked_hub: LockedHub, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hub = locked_hub
    assert main(["lock", "add", "triage", SLUG, *hub.flags()]) == 0
    del hub.server.state.programs[FIRST_ID]
    capsys.readouterr()
    assert main(["lock", "check", *hub.flags()]) == 1
    assert "triage: the hub no longer has it" in capsys.readouterr().out
    assert main(["lock", "check", "--offline", *hub.flags(tmp_path / "empty-cache")]) == 1
    assert "triage: not ready in the cache" in capsys.readouterr().out


def test_lock_mistakes_get_one_line_naming_the_fix(locked_hub: LockedHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hub = locked_hub
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PAWFN_LOCK", raising=False)
    with pytest.raises(LockError, match=r"no pawfn\.lock in .* or a folder above it: create one with `pawfn lock add NAME REF`"):
        locked_program("triage")
    assert main(["lock", "add", "triage", SLUG, *hub.flags()]) == 0
    with pytest.raises(LockError, match=r"locks no program named 'other' \(it locks: triage\); add it with `pawfn lock add other REF`"):
        locked_program("other", lock=hub.lock)
    assert main(["lock", "add", "triage", SLUG, *hub.flags()]) == 2  # already locked: update moves it
    assert main(["lock", "add", "not-a-name", SLUG, *hub.flags()]) == 1
    assert main(["lock", "add", "local", "./bundle", *hub.flags()]) == 1  # a lock never names a local path
    broken = tmp_path / "broken.lock"
    broken.write_text("version = 1\n[programs.triage\n", encoding="utf-8")
    with pytest.raises(LockError, match=r"broken\.lock: not valid TOML"):
        read_lock(broken)
    entry = read_lock(hub.lock).programs["triage"].model_dump()
    broken.write_text(f"version = 1\n[programs.triage]\n{_toml_pairs(entry | {'reference': '../evil'})}", encoding="utf-8")
    with pytest.raises(LockError, match=r"programs\.triage\.reference: .*never names a local path"):
        read_lock(broken)
    broken.write_text(f"version = 1\n[programs.triage]\n{_toml_pairs(entry | {'adapter_sha256': 'abc'})}", encoding="utf-8")
    with pytest.raises(LockError, match=r"programs\.triage\.adapter_sha256: .*64 lowercase hex digits"):
        read_lock(broken)


def _toml_pairs(entry: Mapping[str, object]) -> str:
    return "".join(f"{key} = {json.dumps(value)}\n" for key, value in entry.items() if value is not None)


def test_the_lock_is_found_as_uv_finds_its_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The current directory, then each folder above it; `PAWFN_LOCK` names another."""
    entry = LockedProgram(reference=SLUG, program_id=FIRST_ID, interpreter="Qwen/Qwen3-0.6B", adapter_sha256="0" * 64, template_sha256="1" * 64)
    write_lock(tmp_path / "pawfn.lock", LockFile(programs={"triage": entry}))
    deep = tmp_path / "src" / "app"
    deep.mkdir(parents=True)
    monkeypatch.chdir(deep)
    assert find_lock() == tmp_path / "pawfn.lock"
    assert read_lock(tmp_path / "pawfn.lock").programs == {"triage": entry}  # what is written reads back whole
    other = tmp_path / "other.lock"
    write_lock(other, LockFile())
    monkeypatch.setenv("PAWFN_LOCK", str(other))
    with pytest.raises(LockError, match=r"other\.lock locks no program named 'triage' \(it locks: none\)"):
        locked_program("triage")


def test_generated_handles_load_on_first_use_and_a_stale_module_fails_the_check(
    locked_hub: LockedHub, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    hub = locked_hub
    choices = ["immediate", "later", "never"]
    assert main(["lock", "add", "triage", SLUG, "--choices", ",".join(choices), *hub.flags()]) == 0
    assert main(["lock", "codegen", "--out", str(hub.lock.parent / "app" / "programs.py"), *hub.flags()]) == 0
    module = hub.lock.parent / "app" / "programs.py"
    assert read_lock(hub.lock).codegen is not None and module.is_file()
    assert main(["lock", "add", "plain", FIRST_ID, *hub.flags()]) == 0  # the module follows the lock
    (module.parent / "__init__.py").write_text("", encoding="utf-8")
    monkeypatch.syspath_prepend(str(hub.lock.parent))  # pyright: ignore[reportUnknownMemberType]  # pytest leaves `path` unannotated
    generated = importlib.import_module("app.programs")
    handles = generated.Programs(hub.config(offline=True))
    try:
        assert handles._triage is None  # nothing loaded before first use
        labels = [handles.triage.run(text) for text in INPUTS]
        assert set(labels) <= set(choices)
        assert handles.triage is handles.triage  # loaded once
        with PawFn[Qwen3_0_6B, Torch].load_sync(hub.first.folder, base=hub.base) as direct:
            assert [handles.plain.run(text) for text in INPUTS] == [direct.run(text) for text in INPUTS]
    finally:
        handles.close()
    capsys.readouterr()
    assert main(["lock", "check", "--offline", *hub.flags()]) == 0
    module.write_text(module.read_text(encoding="utf-8").replace("immediate", "urgent"), encoding="utf-8")
    assert main(["lock", "check", "--offline", *hub.flags()]) == 1
    assert f"{module} is stale: the lock changed since it was generated; run `pawfn lock codegen`" in capsys.readouterr().out
    assert main(["lock", "codegen", *hub.flags()]) == 0
    assert main(["lock", "check", "--offline", *hub.flags()]) == 0


def test_compile_with_eval_publishes_only_a_program_that_passes(locked_hub: LockedHub, capsys: pytest.CaptureFixture[str]) -> None:
    hub = locked_hub
    spec = "Classify the urgency of a message"
    hub.server.state.compiled[spec] = FIRST_ID
    with PawFn[Qwen3_0_6B, Torch].load_sync(hub.first.folder, base=hub.base) as direct:
        outputs = [direct.run(text, RuntimeOptions(max_tokens=6)) for text in INPUTS]
    cases = hub.lock.parent / "cases.jsonl"
    cases.parent.mkdir(parents=True, exist_ok=True)
    rows = [{"input": text, "expected": output} for text, output in zip(INPUTS, outputs, strict=True)]
    cases.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    flags = ["--api-url", hub.server.api_url, "--cache-dir", str(hub.cache_dir), "--spec", spec, "--slug", "tester/urgency"]
    flags += ["--eval", str(cases), "--max-tokens", "6"]
    assert main(["compile", *flags]) == 0
    printed = capsys.readouterr().out
    assert f"{FIRST_ID}: 3/3 right" in printed and f"program: {FIRST_ID}" in printed
    assert hub.server.state.slugs["tester/urgency"] == FIRST_ID

    rows[0]["expected"] = "something the program never says"
    cases.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    flags[flags.index("tester/urgency")] = "tester/urgency-strict"
    assert main(["compile", *flags]) == 1  # below the default 1.0
    assert "accuracy 0.6667 is below 1.0; not published as tester/urgency-strict" in capsys.readouterr().err
    assert "tester/urgency-strict" not in hub.server.state.slugs
    assert main(["compile", *flags, "--min-accuracy", "0.6"]) == 0
    assert hub.server.state.slugs["tester/urgency-strict"] == FIRST_ID


def test_a_server_serves_the_locked_programs_by_name(locked_hub: LockedHub) -> None:
    hub = locked_hub
    assert main(["lock", "add", "triage", SLUG, *hub.flags()]) == 0
    hub.server.state.slugs[SLUG] = SECOND_ID  # the slug moves: the server still serves what the lock pins
    server = start_server("--locked", "--lock", str(hub.lock), "--api-url", hub.server.api_url, "--cache-dir", str(hub.cache_dir))
    try:
        body = {"input": INPUTS[0], "options": {"max_tokens": 8}}
        response = httpx.post(f"{server.url}/v1/programs/triage/run", json=body, timeout=60)
        assert response.status_code == 200, response.text
    finally:
        server.stop()
    assert response.json()["generation"]["token_ids"] == list(hub.tokens(hub.first)[0])


def test_a_locked_program_missing_offline_names_the_fix(locked_hub: LockedHub, tmp_path: Path) -> None:
    hub = locked_hub
    assert main(["lock", "add", "triage", SLUG, *hub.flags()]) == 0
    with pytest.raises(
        OfflineError, match=r"triage \(.*pawfn\.lock\): .*offline mode is on.*`pawfn cache prepare --locked` fetches every locked program"
    ):
        locked_program("triage", lock=hub.lock, config=hub.config(tmp_path / "empty", offline=True))
