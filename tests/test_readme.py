"""The README holds when tried: its Python snippets are valid scripts (no top-level await), and its layout
section names every module of src/pawfn and no module that is not there."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
PACKAGE = ROOT / "src" / "pawfn"


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README, flags=re.DOTALL)


def test_python_snippets_are_plain_scripts() -> None:
    blocks = _python_blocks()
    assert len(blocks) >= 5
    for block in blocks:
        ast.parse(block)  # a top-level await, or any other syntax error, fails here


def test_layout_section_matches_the_tree() -> None:
    section = README.split("## Layout", 1)[1].split("\n## ", 1)[0].split("What `duplicates", 1)[0]
    named = set(re.findall(r"`([a-z_0-9]+)/?`", section))
    modules = {path.stem for path in PACKAGE.rglob("*.py") if path.stem not in ("__init__", "__main__")}
    packages = {path.parent.name for path in PACKAGE.rglob("__init__.py") if path.parent != PACKAGE}
    assert modules | packages <= named, f"not in the README's layout: {sorted(modules | packages - named)}"
    unknown = {name for name in named - modules - packages if name.islower() and "_" not in name[:1]}
    assert unknown <= {"context_window", "tests", "helpers", "typing"}, f"in the layout but not in the tree: {sorted(unknown)}"
