"""The official SDK's cache rules (reference/official-python-sdk.md, sections 3 and 5), written out independently.

Used to check that what pawfn writes is what `programasweights` 0.4.4 accepts, and to lay out a cache as it does.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

from pawfn.core.jsonio import parse_json_object

PROGRAM_ID = re.compile(r"^[a-f0-9]{16,64}$")


def _regular(path: Path, min_size: int = 1) -> bool:
    return not path.is_symlink() and path.is_file() and path.stat().st_size >= min_size


def official_program_problems(cache: Path, program_id: str) -> list[str]:
    """Why the official SDK would not accept `programs/<id>` (empty list: it would)."""
    problems: list[str] = []
    folder = cache / "programs" / program_id
    if folder.is_symlink() or not folder.is_dir():
        return [f"{folder} is not a folder"]
    adapter, template, meta_path = folder / "adapter.gguf", folder / "prompt_template.txt", folder / "meta.json"
    if not _regular(adapter, 1024) or adapter.read_bytes()[:4] != b"GGUF":
        problems.append("adapter.gguf is not a regular GGUF file of at least 1024 bytes")
    if not _regular(template) or template.read_text(encoding="utf-8").count("{INPUT_PLACEHOLDER}") != 1:
        problems.append("prompt_template.txt is not UTF-8 with exactly one placeholder")
    if not _regular(meta_path):
        return problems + ["meta.json is missing"]
    meta = parse_json_object(meta_path.read_bytes())
    if meta is None or meta.get("program_id") != program_id:
        return problems + ["meta.json does not name the program id"]
    interpreter = meta.get("interpreter")
    if not isinstance(interpreter, str) or not interpreter:
        problems.append("meta.json has no interpreter")
    runtime = meta.get("runtime")
    if runtime not in (None, {}):
        manifest = parse_json_object(json.dumps(runtime))
        local = None if manifest is None else parse_json_object(json.dumps(manifest.get("local_sdk")))
        if manifest is None or manifest.get("manifest_version") != 1 or manifest.get("adapter_format") != "gguf_lora":
            problems.append("embedded runtime manifest has the wrong shape")
        elif meta.get("runtime_id") not in (None, manifest.get("runtime_id")):
            problems.append("runtime_id and the embedded runtime disagree")
        elif local is None or not isinstance(local.get("supported"), bool):
            problems.append("embedded runtime has no local_sdk.supported")
    return problems


def official_slug_cache(cache: Path) -> dict[str, str]:
    """`slug_cache.json` as the official SDK reads it (bad entries dropped)."""
    try:
        data: dict[str, Any] = json.loads((cache / "slug_cache.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in data.items() if isinstance(v, str) and PROGRAM_ID.match(v)}


def official_base_ok(cache: Path, file: str, size: int, sha256: str) -> bool:
    """The official base-model check: regular file, exact size, GGUF magic, sha256."""
    path = cache / "base_models" / file
    if not _regular(path) or path.stat().st_size != size or path.read_bytes()[:4] != b"GGUF":
        return False
    return hashlib.sha256(path.read_bytes()).hexdigest() == sha256


def write_official_cache(
    cache: Path, program_id: str, bundle: Path, runtime: dict[str, object], base: Path | None, slugs: dict[str, str], manifest_version: int = 1
) -> None:
    """Lay out a cache as `programasweights` writes it: hydrated meta.json, base GGUF (None: already placed, as the
    vision runtime places its files by sha256), runtimes, slug cache."""
    folder = cache / "programs" / program_id
    folder.mkdir(parents=True)
    for name in ("adapter.gguf", "prompt_template.txt"):
        (folder / name).write_bytes((bundle / name).read_bytes())
    meta: dict[str, Any] = json.loads((bundle / "meta.json").read_text())
    meta["runtime"] = runtime
    meta.setdefault("runtime_id", runtime["runtime_id"])
    meta.setdefault("runtime_manifest_version", manifest_version)
    (folder / "meta.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    local: Any = runtime["local_sdk"]
    if base is not None:
        (cache / "base_models").mkdir(parents=True, exist_ok=True)
        (cache / "base_models" / local["base_model"]["file"]).write_bytes(base.read_bytes())
    (cache / "runtimes").mkdir(parents=True, exist_ok=True)
    for name in (f"{runtime['runtime_id']}.json", f"{runtime['runtime_id']}.v{manifest_version}.json"):
        (cache / "runtimes" / name).write_text(json.dumps(runtime, indent=2, sort_keys=True) + "\n")
    (cache / "slug_cache.json").write_text(json.dumps(slugs, indent=2, sort_keys=True) + "\n")
