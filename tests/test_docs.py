"""The documentation site builds with `mkdocs build --strict` (no broken link, no unknown page, no docstring the
API reference cannot render), its API reference names every public name, its layout page names every module, and
the README stays the user's short path into it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pawfn

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PACKAGE = ROOT / "src" / "pawfn"
README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_the_site_builds_strict(tmp_path: Path) -> None:
    env = os.environ | {"NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env=env,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    api = (tmp_path / "site" / "api" / "index.html").read_text(encoding="utf-8")
    assert 'id="pawfn.PawFn.load_sync"' in api  # members rendered from the docstrings, not only the headings


def test_the_api_reference_names_every_public_name() -> None:
    page = (DOCS / "api.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"^::: pawfn\.([A-Za-z_0-9]+)$", page, flags=re.MULTILINE))
    public = set(pawfn.__all__) - {"__version__"}
    assert public - documented == set(), f"missing from docs/api.md: {sorted(public - documented)}"
    assert documented - public == set(), f"in docs/api.md but not public: {sorted(documented - public)}"


def test_the_layout_page_matches_the_tree() -> None:
    page = (DOCS / "contributing.md").read_text(encoding="utf-8")
    section = page.split("What `duplicates", 1)[0]
    named = set(re.findall(r"`([a-z_0-9]+)/?`", section))
    modules = {path.stem for path in PACKAGE.rglob("*.py") if path.stem not in ("__init__", "__main__")}
    packages = {path.parent.name for path in PACKAGE.rglob("__init__.py") if path.parent != PACKAGE}
    assert modules | packages <= named, f"not in docs/contributing.md's layout: {sorted(modules | packages - named)}"
    unknown = {name for name in named - modules - packages if name.islower() and "_" not in name[:1]}
    assert unknown <= {"context_window", "tests", "helpers", "typing"}, f"in the layout but not in the tree: {sorted(unknown)}"


def test_the_readme_is_the_short_path() -> None:
    assert len(README.splitlines()) <= 350, "the README keeps the user's path; details go to docs/"
    for target in re.findall(r"\]\((docs/[^)#]+)", README):
        assert (ROOT / target).is_file(), f"the README links to {target}, which does not exist"


def test_performance_figures_have_one_source() -> None:
    """Every ratio the README and the front page state (0.61x, 2.19x ...) is one that docs/performance.md's Summary
    states with its machine, date and command: the pages cite one source, so they cannot disagree (they once said
    0.6x, ~0.9-1.0x and "about half" of the same thing)."""
    performance = (ROOT / "docs" / "performance.md").read_text(encoding="utf-8")
    summary = performance.split("\n## Summary\n", 1)[1].split("\n## ", 1)[0]
    kept = set(re.findall(r"\b\d+\.\d+x\b", summary))
    assert {"0.61x", "2.19x"} <= kept, sorted(kept)
    for page in (ROOT / "README.md", ROOT / "docs" / "index.md"):
        stated = set(re.findall(r"\b\d+\.\d+x\b", page.read_text(encoding="utf-8")))
        assert stated, f"{page.name} states no figure"
        assert stated <= kept, f"{page.name} states {sorted(stated - kept)}, which docs/performance.md's Summary does not"
        assert "performance.md#summary" in page.read_text(encoding="utf-8"), f"{page.name} does not cite the Summary"


_ELSEWHERE = frozenset({"convert_hf_to_gguf.py", "convert_lora_to_gguf.py", "triage.py", "test_triage.py"})
"""Files named in the docs that live outside this repository: llama.cpp's converters, and the guide's example app."""


def _written() -> list[Path]:
    """The code, docs and scripts whose words name files and functions."""
    roots = [PACKAGE, DOCS, ROOT / "benchmarks", ROOT / "scripts"]
    return [ROOT / "README.md"] + [path for root in roots for path in root.rglob("*") if path.suffix in {".py", ".c", ".md", ".sh"}]


def test_every_file_named_in_code_and_docs_exists() -> None:
    """A module moved or renamed leaves no comment, docstring or page naming its old file."""
    present = {path.name for path in ROOT.rglob("*") if ".venv" not in path.parts and ".git" not in path.parts}
    stale = [
        f"{path.relative_to(ROOT)}: {name}"
        for path in _written()
        for name in re.findall(r"\b([A-Za-z_]\w*\.(?:py|c))\b", path.read_text(encoding="utf-8"))
        if name not in present and name not in _ELSEWHERE
    ]
    assert stale == []


def test_every_name_of_the_arithmetic_modules_in_code_and_docs_exists() -> None:
    """`float_ops.ggml_rope`, `hybrid._online` ...: a function named by module in a docstring is still there."""
    ggml = PACKAGE / "torch" / "ggml"
    definition = re.compile(r"^(?:def|class|async def) (\w+)|^(\w+)(?: *:[^=]*)? =", re.MULTILINE)
    defined = {path.stem: set(definition.findall(path.read_text())) for path in ggml.glob("*.py")}
    names = {module: {a or b for a, b in found} for module, found in defined.items()}
    names["ggml"] = set()  # the package: its functions are named by their modules
    stale = [
        f"{path.relative_to(ROOT)}: {module}.{name}"
        for path in _written()
        for module, name in re.findall(r"`(\w+)\.(\w+)", path.read_text(encoding="utf-8"))
        if module in names and name not in names[module] and name not in {"py", "c"}
    ]
    assert stale == []
