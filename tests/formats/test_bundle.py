"""Bundle reading: every malformed or unsafe input gets a BundleError that names the file and the problem."""

from __future__ import annotations

import json
import os
import stat
import zipfile
from pathlib import Path

import pytest

from tests.helpers.programs import TinyProgram
from pawfn import BundleError, PawError
from pawfn.formats import bundle as bundle_module
from pawfn.formats.bundle import PromptTemplate, open_bundle


def _copy_folder(program: TinyProgram, target: Path) -> Path:
    target.mkdir()
    for member in program.folder.iterdir():
        (target / member.name).write_bytes(member.read_bytes())
    return target


def _zip(path: Path, members: dict[str, bytes], modes: dict[str, int] | None = None) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            info = zipfile.ZipInfo(name)
            mode = (modes or {}).get(name)
            if mode is not None:
                info.external_attr = mode << 16
            archive.writestr(info, data)
    return path


def _members(program: TinyProgram) -> dict[str, bytes]:
    return {member.name: member.read_bytes() for member in program.folder.iterdir()}


def test_reads_folder_and_zip(qwen3_program: TinyProgram) -> None:
    for source in (qwen3_program.folder, qwen3_program.archive):
        with open_bundle(source) as bundle:
            assert bundle.meta.interpreter == "Qwen/Qwen3-0.6B"
            assert bundle.meta.program_id == "0123456789abcdef0123"
            assert isinstance(bundle.template, PromptTemplate)
            assert bundle.template.prefix + "{INPUT_PLACEHOLDER}" + bundle.template.suffix == qwen3_program.template
            assert bundle.adapter_path.read_bytes()[:4] == b"GGUF"


def test_zip_staging_is_removed(qwen3_program: TinyProgram) -> None:
    with open_bundle(qwen3_program.archive) as bundle:
        staging = bundle.adapter_path.parent
        assert staging.exists()
    assert not staging.exists()


def test_unknown_meta_fields_are_kept(qwen3_program: TinyProgram, tmp_path: Path) -> None:
    folder = _copy_folder(qwen3_program, tmp_path / "b")
    (folder / "meta.json").write_text(json.dumps({"interpreter": "gpt2", "version": 4, "runtime": {"x": 1}}))
    with open_bundle(folder) as bundle:
        assert bundle.meta.model_extra == {"version": 4, "runtime": {"x": 1}}
        assert bundle.meta.program_id is None


@pytest.mark.parametrize("missing", ["meta.json", "prompt_template.txt", "adapter.gguf"])
def test_missing_member(qwen3_program: TinyProgram, tmp_path: Path, missing: str) -> None:
    folder = _copy_folder(qwen3_program, tmp_path / "b")
    (folder / missing).unlink()
    with pytest.raises(BundleError, match=f"{missing} is missing") as info:
        with open_bundle(folder):
            pass
    assert info.value.path == folder


@pytest.mark.parametrize("member", ["meta.json", "prompt_template.txt", "adapter.gguf"])
def test_empty_member(qwen3_program: TinyProgram, tmp_path: Path, member: str) -> None:
    folder = _copy_folder(qwen3_program, tmp_path / "b")
    (folder / member).write_bytes(b"")
    with pytest.raises(BundleError, match=f"{member} is empty"):
        with open_bundle(folder):
            pass


def test_symlinked_member_is_refused(qwen3_program: TinyProgram, tmp_path: Path) -> None:
    folder = _copy_folder(qwen3_program, tmp_path / "b")
    (folder / "adapter.gguf").unlink()
    os.symlink(qwen3_program.adapter, folder / "adapter.gguf")
    with pytest.raises(BundleError, match="adapter.gguf is a symbolic link"):
        with open_bundle(folder):
            pass


def test_symlinked_bundle_is_refused(qwen3_program: TinyProgram, tmp_path: Path) -> None:
    link = tmp_path / "link"
    os.symlink(qwen3_program.folder, link)
    with pytest.raises(BundleError, match="symbolic link"):
        with open_bundle(link):
            pass


def test_missing_bundle(tmp_path: Path) -> None:
    with pytest.raises(BundleError, match="no such bundle"):
        with open_bundle(tmp_path / "nope.paw"):
            pass


@pytest.mark.parametrize(
    ("meta", "problem"),
    [
        (b"{not json", "meta.json is not valid JSON"),
        (b"[1, 2]", "meta.json must hold a JSON object"),
        (b'{"program_id": "abc"}', "meta.json is invalid: interpreter: Field required"),
        (b'{"interpreter": "  "}', "interpreter: Value error, must be a non-empty string"),
        (b'{"interpreter": 7}', "interpreter: Input should be a valid string"),
    ],
)
def test_bad_meta(qwen3_program: TinyProgram, tmp_path: Path, meta: bytes, problem: str) -> None:
    folder = _copy_folder(qwen3_program, tmp_path / "b")
    (folder / "meta.json").write_bytes(meta)
    with pytest.raises(BundleError, match=problem):
        with open_bundle(folder):
            pass


@pytest.mark.parametrize("template", ["no placeholder", "{INPUT_PLACEHOLDER} and {INPUT_PLACEHOLDER}"])
def test_template_needs_exactly_one_placeholder(qwen3_program: TinyProgram, tmp_path: Path, template: str) -> None:
    folder = _copy_folder(qwen3_program, tmp_path / "b")
    (folder / "prompt_template.txt").write_text(template)
    with pytest.raises(BundleError, match="exactly one {INPUT_PLACEHOLDER}, found"):
        with open_bundle(folder):
            pass


def test_template_must_be_utf8(qwen3_program: TinyProgram, tmp_path: Path) -> None:
    folder = _copy_folder(qwen3_program, tmp_path / "b")
    (folder / "prompt_template.txt").write_bytes(b"\xff\xfe{INPUT_PLACEHOLDER}")
    with pytest.raises(BundleError, match="prompt_template.txt is not UTF-8"):
        with open_bundle(folder):
            pass


def test_adapter_bad_magic(qwen3_program: TinyProgram, tmp_path: Path) -> None:
    folder = _copy_folder(qwen3_program, tmp_path / "b")
    (folder / "adapter.gguf").write_bytes(b"NOPE" + bytes(2000))
    with pytest.raises(BundleError, match="adapter.gguf is not a GGUF file"):
        with open_bundle(folder):
            pass


def test_adapter_truncated(qwen3_program: TinyProgram, tmp_path: Path) -> None:
    folder = _copy_folder(qwen3_program, tmp_path / "b")
    (folder / "adapter.gguf").write_bytes(b"GGUF" + bytes(100))
    with pytest.raises(BundleError, match="smaller than 1024 bytes"):
        with open_bundle(folder):
            pass


def test_template_split() -> None:
    template = PromptTemplate.parse("a{INPUT_PLACEHOLDER}b")
    assert (template.prefix, template.suffix) == ("a", "b")


@pytest.mark.parametrize("name", ["../evil.txt", "/etc/passwd", "a/../../evil", "a\\b", "C:/evil", "./meta.json", "a//b", ""])
def test_zip_unsafe_paths(qwen3_program: TinyProgram, tmp_path: Path, name: str) -> None:
    members = _members(qwen3_program) | {name: b"x"}
    archive = _zip(tmp_path / "evil.paw", members)
    with pytest.raises(BundleError, match="unsafe path in archive"):
        with open_bundle(archive):
            pass
    assert not (tmp_path / "evil.txt").exists()


def test_zip_symlink_member(qwen3_program: TinyProgram, tmp_path: Path) -> None:
    members = _members(qwen3_program) | {"link": b"/etc/passwd"}
    archive = _zip(tmp_path / "link.paw", members, modes={"link": stat.S_IFLNK | 0o777})
    with pytest.raises(BundleError, match="'link' is not a regular file"):
        with open_bundle(archive):
            pass


def test_zip_duplicate_member(qwen3_program: TinyProgram, tmp_path: Path) -> None:
    archive = tmp_path / "dup.paw"
    _zip(archive, _members(qwen3_program))
    with zipfile.ZipFile(archive, "a") as handle, pytest.warns(UserWarning, match="Duplicate name"):
        handle.writestr("meta.json", b"{}")
    with pytest.raises(BundleError, match="duplicate path"):
        with open_bundle(archive):
            pass


def test_zip_too_many_members(qwen3_program: TinyProgram, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bundle_module, "MAX_ARCHIVE_MEMBERS", 4)
    members = _members(qwen3_program) | {"a": b"1", "b": b"2"}
    with pytest.raises(BundleError, match="too many members"):
        with open_bundle(_zip(tmp_path / "many.paw", members)):
            pass


def test_zip_expands_too_far(qwen3_program: TinyProgram, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bundle_module, "MAX_EXPANDED_BYTES", 4096)
    members = _members(qwen3_program) | {"padding.bin": bytes(10_000)}
    with pytest.raises(BundleError, match="expands to"):
        with open_bundle(_zip(tmp_path / "big.paw", members)):
            pass


def test_zip_too_large(qwen3_program: TinyProgram, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bundle_module, "MAX_ARCHIVE_BYTES", 100)
    with pytest.raises(BundleError, match="archive is too large"):
        with open_bundle(qwen3_program.archive):
            pass


def test_not_a_zip(tmp_path: Path) -> None:
    junk = tmp_path / "junk.paw"
    junk.write_bytes(b"this is not a zip file")
    with pytest.raises(BundleError, match="not a .paw archive"):
        with open_bundle(junk):
            pass


def test_zip_with_folder_entries(qwen3_program: TinyProgram, tmp_path: Path) -> None:
    members = {"extra/": b"", "extra/notes.txt": b"hi"} | _members(qwen3_program)
    with open_bundle(_zip(tmp_path / "dirs.paw", members)) as bundle:
        assert (bundle.adapter_path.parent / "extra" / "notes.txt").read_bytes() == b"hi"


def test_bundle_errors_are_paw_errors() -> None:
    assert issubclass(BundleError, PawError) and issubclass(BundleError, ValueError)
