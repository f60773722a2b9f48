"""What a downloaded program may make pawfn fetch: only base weights its hub's runtime names with a sha256. A hub
bundle's embedded runtime manifest is never honoured (a local bundle the user names keeps it), and a reference
from a server's client never reaches the file system, however long or odd."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from pawfn import BaseModelError, ConfigError, IntegrityError, OfflineError, PawConfig, prepare_program
from pawfn.hub.refs import MAX_HUB_REFERENCE_CHARS, is_hub_reference, parse_hub_reference, parse_reference
from tests.helpers.hub_server import HubServer
from tests.helpers.programs import TinyProgram
from tests.helpers.tiny_models import write_bundle, zip_bundle

PROGRAM_ID = "d0d0d0d0d0d0d0d0d0d1"
RUNTIME_ID = "third-party-qwen3"
BASE_FILE = "tiny-qwen3.gguf"


@pytest.fixture
def servers() -> Iterator[tuple[HubServer, HubServer]]:
    """The configured hub, and a server of the attacker's choosing that must never be asked anything."""
    hub, elsewhere = HubServer(), HubServer()
    yield hub, elsewhere
    hub.close()
    elsewhere.close()


def _embedded_runtime(url: str, base: bytes, sha256: str | None) -> dict[str, object]:
    return {
        "runtime_id": RUNTIME_ID,
        "manifest_version": 1,
        "interpreter": "Qwen/Qwen3-0.6B",
        "local_sdk": {"supported": True, "n_ctx": 2048, "base_model": {"file": BASE_FILE, "url": url, "size_bytes": len(base), "sha256": sha256}},
    }


def _config(hub: HubServer, tmp_path: Path) -> PawConfig:
    return PawConfig.model_validate({"api_url": hub.api_url, "api_key": "k", "cache_dir": tmp_path / "cache", "progress": False})


def test_a_hub_programs_embedded_runtime_is_never_honoured(servers: tuple[HubServer, HubServer], qwen3_program: TinyProgram, tmp_path: Path) -> None:
    """A hub bundle whose meta.json embeds a runtime pointing at another server (pinned or not): the runtime comes
    from the hub (which does not know it here: the load stops), and the other server is never asked."""
    hub, elsewhere = servers
    base = qwen3_program.interpreter.gguf_path.read_bytes()
    elsewhere.state.files[BASE_FILE] = base
    for sha256 in (None, hashlib.sha256(base).hexdigest()):
        runtime = _embedded_runtime(f"{elsewhere.cdn_url}/files/{BASE_FILE}", base, sha256)
        meta: dict[str, object] = {"program_id": PROGRAM_ID, "runtime_id": RUNTIME_ID, "runtime": runtime}
        bundle = write_bundle(tmp_path / f"bundle-{sha256 is None}", qwen3_program.adapter, "Qwen/Qwen3-0.6B", qwen3_program.template, meta)
        hub.serve_program(PROGRAM_ID, zip_bundle(bundle, tmp_path / f"program-{sha256 is None}.paw").read_bytes())
        with pytest.raises(OfflineError, match=f"no runtime manifest for runtime '{RUNTIME_ID}'"):
            prepare_program(PROGRAM_ID, _config(hub, tmp_path / str(sha256)))
        assert hub.state.count(rf"/models/runtimes/{RUNTIME_ID}$") >= 1  # asked where the runtime belongs
    assert elsewhere.state.snapshot() == []


def test_a_local_bundle_the_user_names_keeps_its_embedded_runtime(
    servers: tuple[HubServer, HubServer], qwen3_program: TinyProgram, tmp_path: Path
) -> None:
    hub, _ = servers
    base = qwen3_program.interpreter.gguf_path.read_bytes()
    hub.state.files[BASE_FILE] = base
    runtime = _embedded_runtime(f"{hub.cdn_url}/files/{BASE_FILE}", base, hashlib.sha256(base).hexdigest())
    meta: dict[str, object] = {"program_id": PROGRAM_ID, "runtime_id": RUNTIME_ID, "runtime": runtime}
    bundle = write_bundle(tmp_path / "bundle", qwen3_program.adapter, "Qwen/Qwen3-0.6B", qwen3_program.template, meta)
    prepared = prepare_program(str(bundle), _config(hub, tmp_path))
    assert prepared.runtime is not None and prepared.runtime.runtime_id == RUNTIME_ID
    assert prepared.base is not None and prepared.base.read_bytes() == base
    assert hub.state.count(rf"/files/{BASE_FILE}$") == 1


def test_base_weights_without_a_sha256_are_never_downloaded(servers: tuple[HubServer, HubServer], qwen3_program: TinyProgram, tmp_path: Path) -> None:
    """The hub's own runtime manifest naming an unpinned base: refused before any download, naming the fix; the same
    for a local bundle's embedded runtime."""
    hub, _ = servers
    base = qwen3_program.interpreter.gguf_path.read_bytes()
    hub.serve_runtime(RUNTIME_ID, "Qwen/Qwen3-0.6B", base, BASE_FILE)
    local_sdk = hub.state.runtimes[RUNTIME_ID]["local_sdk"]
    assert isinstance(local_sdk, dict)
    local_sdk["base_model"]["sha256"] = None
    meta: dict[str, object] = {"program_id": PROGRAM_ID, "runtime_id": RUNTIME_ID}
    bundle = write_bundle(tmp_path / "bundle", qwen3_program.adapter, "Qwen/Qwen3-0.6B", qwen3_program.template, meta)
    hub.serve_program(PROGRAM_ID, zip_bundle(bundle, tmp_path / "program.paw").read_bytes())
    with pytest.raises(BaseModelError, match="without a sha256.*--base PATH"):
        prepare_program(PROGRAM_ID, _config(hub, tmp_path))
    embedded: dict[str, object] = {"runtime": _embedded_runtime(f"{hub.cdn_url}/files/{BASE_FILE}", base, None), **meta}
    local = write_bundle(tmp_path / "local", qwen3_program.adapter, "Qwen/Qwen3-0.6B", qwen3_program.template, embedded)
    with pytest.raises(BaseModelError, match="without a sha256"):
        prepare_program(str(local), _config(hub, tmp_path / "other"))
    assert hub.state.count(rf"/files/{BASE_FILE}$") == 0


def test_a_download_stops_at_its_pinned_size(servers: tuple[HubServer, HubServer], qwen3_program: TinyProgram, tmp_path: Path) -> None:
    """A server sending more than the pinned size: the download stops and the file is refused (not stored whole)."""
    hub, _ = servers
    base = qwen3_program.interpreter.gguf_path.read_bytes()
    hub.serve_runtime(RUNTIME_ID, "Qwen/Qwen3-0.6B", base, BASE_FILE)
    hub.state.files[BASE_FILE] = base + b"\0" * (4 << 20)  # 4 MiB past the pinned size
    bundle = write_bundle(
        tmp_path / "bundle", qwen3_program.adapter, "Qwen/Qwen3-0.6B", qwen3_program.template, {"program_id": PROGRAM_ID, "runtime_id": RUNTIME_ID}
    )
    hub.serve_program(PROGRAM_ID, zip_bundle(bundle, tmp_path / "program.paw").read_bytes())
    with pytest.raises(IntegrityError, match=f"expected {len(base)}") as caught:
        prepare_program(PROGRAM_ID, _config(hub, tmp_path))
    arrived = int(str(caught.value).split("downloaded ")[1].split(" ")[0])
    assert arrived < len(base) + (1 << 20)  # it stopped within a chunk of the pinned size, not at the 4 MiB more
    assert not list((tmp_path / "cache" / "base_models").glob("*.gguf"))


@pytest.mark.parametrize(
    "text",
    ["a" * 300, "x" * 5000, "/" + "y" * 300 + "/z", "../../etc/passwd", "~nobody-here-at-all/x", "evil/prog", "a\u202eb"],
    ids=["300", "5000", "long-component", "climb", "tilde-user", "slug-shaped", "bidi"],
)
def test_no_reference_reaches_the_file_system_from_a_client(text: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`parse_hub_reference` (a server's clients) never looks at files: a slug-shaped name whose folder exists is a
    slug; anything else is a ConfigError with the text cut short. `parse_reference` (the user's own) never raises
    OSError for a name the file system cannot hold."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "evil" / "prog").mkdir(parents=True)
    if is_hub_reference(text):
        assert parse_hub_reference(text).kind == "slug"
    else:
        with pytest.raises(ConfigError) as caught:
            parse_hub_reference(text)
        assert len(str(caught.value)) < 400
    assert parse_reference("evil/prog").kind == "path"  # the user's own reference still names the folder
    try:
        parse_reference(text)
    except ConfigError as refused:
        assert len(str(refused)) < 800


def test_hub_references_are_bounded() -> None:
    assert is_hub_reference("user/" + "s" * (MAX_HUB_REFERENCE_CHARS - 5))
    assert not is_hub_reference("user/" + "s" * MAX_HUB_REFERENCE_CHARS)
