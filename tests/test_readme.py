"""The README holds when tried: its Python snippets are valid scripts (no top-level await). (Its commands and
examples run in tests/hub/test_hub.py and tests/serve/test_serve.py; the layout moved to docs/contributing.md, tests/test_docs.py.)"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README, flags=re.DOTALL)


def test_python_snippets_are_plain_scripts() -> None:
    blocks = _python_blocks()
    assert len(blocks) >= 5
    for block in blocks:
        ast.parse(block)  # a top-level await, or any other syntax error, fails here
