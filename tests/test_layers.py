"""The import graph of src/pawfn: layers only point down, sibling backends and the hub stay apart, no cycle,
and no pawfn import hidden inside a function.

Layers, lowest first, each a folder (docs/contributing.md draws the same picture):
core/ <- formats/ <- calls/ <- the backends (torch/, llamacpp/) and hub/ <- remote/ <- evals/ <- api/ (PawFn, the
builder) <- testing/ <- serve/ <- cli <- the package's own `__init__`; inside torch/: ggml/ <- model/ <- weights/ <- engine/.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"

LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"core"}),
    frozenset({"formats"}),
    frozenset({"calls"}),
    frozenset({"torch", "llamacpp", "hub"}),
    frozenset({"remote"}),
    frozenset({"evals"}),
    frozenset({"api"}),
    frozenset({"testing"}),
    frozenset({"serve"}),
    frozenset({"cli", "__main__"}),
    frozenset({"__init__"}),
)
"""The package's layers, each a folder (but the entry points `cli`, `__main__` and the package's `__init__`)."""
SEPARATE = frozenset({"torch", "llamacpp", "hub"})
"""Units of one layer that must not import each other."""
TORCH_LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"ggml"}),
    frozenset({"model"}),
    frozenset({"weights"}),
    frozenset({"engine"}),
    frozenset({"__init__"}),
)
"""The Torch backend's own layers, each a folder: llama.cpp's arithmetic pieces, the model (families, arithmetic,
attention, KV), the weights on the device, the engine that runs calls."""
OPTIONAL = frozenset({"pawfn.serve.app", "pawfn.serve.connections", "pawfn.serve.ray", "pawfn.torch"})
"""Modules imported inside the function that uses them: those that need an optional extra (fastapi, uvicorn, ray), so
`import pawfn` and the CLI work without the extra, and the Torch backend (torch takes 1-2 s to import), so `import
pawfn`, `pawfn --help` and a Remote client do without it."""


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, module: str) -> list[tuple[str, bool]]:
    """(absolute module imported, whether the import sits inside a function) for every import in `path`."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[tuple[str, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            nested = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                found.extend((alias.name, in_function) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")
                    base = base[: len(base) - (child.level - 1)]
                    target = ".".join(base + ([child.module] if child.module else []))
                else:
                    target = child.module or ""
                if child.module is None:  # `from . import x`: x is a module of the package
                    found.extend((f"{target}.{alias.name}", in_function) for alias in child.names)
                else:
                    found.append((target, in_function))
            visit(child, nested)

    visit(tree, False)
    return found


def _unit(module: str, top: str) -> str:
    """The layer unit of a module: its first part under the package (`hub`, `torch`, `core`, ...)."""
    rest = module.removeprefix(top).lstrip(".")
    return rest.split(".")[0] if rest else "__init__"


def check_layers(
    root: Path, top: str, layers: tuple[frozenset[str], ...], separate: frozenset[str], optional: frozenset[str] = frozenset()
) -> list[str]:
    """Every violation of the layering in the package `root / top`, as readable lines."""
    layer_of: Mapping[str, int] = {unit: index for index, units in enumerate(layers) for unit in units}
    modules = {_module_name(path, root): path for path in sorted(root.joinpath(*top.split(".")).rglob("*.py"))}
    problems: list[str] = []
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        unit = _unit(name, top)
        if unit not in layer_of:
            problems.append(f"{name}: unit {unit!r} has no layer; add it to LAYERS (and to docs/contributing.md's layout)")
            continue
        for target, in_function in _imports(path, name):
            if target != top and not target.startswith(top + "."):
                continue
            target_unit = _unit(target, top)
            if target_unit == "__init__" and unit != "__init__":
                problems.append(f"{name} imports the package root {top}; import the module that defines the name")
                continue
            if in_function and target not in optional:
                problems.append(f"{name} imports {target} inside a function; import it at the top (or fix the cycle)")
            if target_unit != unit and layer_of.get(target_unit, -1) > layer_of[unit]:
                problems.append(f"{name} (layer {layer_of[unit]}) imports {target} from a layer above")
            if target_unit != unit and {unit, target_unit} <= separate:
                problems.append(f"{name} imports {target}: {unit} and {target_unit} must stay independent")
            resolved = target if target in modules else target.rpartition(".")[0]
            if resolved in modules and resolved != name:
                graph[name].add(resolved)
    problems += [f"import cycle: {' -> '.join(cycle)}" for cycle in _cycles(graph)]
    return problems


def _cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected group of modules that import each other."""
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                cycles.append([*path[path.index(target) :], target])
            elif target not in state:
                visit(target)
        path.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return cycles


def test_pawfn_layers_point_down_without_cycles() -> None:
    assert check_layers(SRC, "pawfn", LAYERS, SEPARATE, OPTIONAL) == []


def test_the_torch_backends_folders_point_down_without_cycles() -> None:
    assert check_layers(SRC, "pawfn.torch", TORCH_LAYERS, frozenset()) == []


def test_every_module_sits_in_its_layers_folder() -> None:
    """The folders are the layers: no module lies loose beside them but the entry points."""
    package = SRC / "pawfn"
    loose = {path.name for path in package.glob("*.py")} - {"__init__.py", "__main__.py"}
    assert loose == set(), f"modules outside a layer's folder: {sorted(loose)}"
    assert {path.name for path in (package / "torch").glob("*.py")} == {"__init__.py"}


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({"low.py": "from .high import x\n", "high.py": ""}, "pkg.low (layer 0) imports pkg.high from a layer above"),
        ({"low.py": "def f():\n    from . import other\n", "other.py": ""}, "pkg.low imports pkg.other inside a function"),
        (
            {"a/__init__.py": "", "a/m.py": "from ..b import m\n", "b/__init__.py": "", "b/m.py": ""},
            "pkg.a.m imports pkg.b: a and b must stay independent",
        ),
        ({"low.py": "from .other import y\n", "other.py": "from .low import z\n"}, "import cycle: pkg.low -> pkg.other -> pkg.low"),
    ],
)
def test_the_checker_reports_each_kind_of_violation(tmp_path: Path, files: dict[str, str], expected: str) -> None:
    _write(tmp_path / "pkg", {"__init__.py": "", **files})
    layers = (frozenset({"low", "other", "a", "b"}), frozenset({"high"}), frozenset({"__init__"}))
    problems = check_layers(tmp_path, "pkg", layers, frozenset({"a", "b"}))
    assert any(expected in problem for problem in problems), problems


def test_an_optional_module_may_be_imported_inside_a_function_and_only_it(tmp_path: Path) -> None:
    _write(tmp_path / "pkg", {"__init__.py": "", "low.py": "def f():\n    from . import extra, other\n", "extra.py": "", "other.py": ""})
    layers = (frozenset({"low", "extra", "other"}), frozenset({"__init__"}))
    problems = check_layers(tmp_path, "pkg", layers, frozenset(), frozenset({"pkg.extra"}))
    assert problems == ["pkg.low imports pkg.other inside a function; import it at the top (or fix the cycle)"]


@pytest.mark.parametrize("statement", ["import pawfn", "import pawfn.cli", "from pawfn import PawFn, Remote, Qwen3_0_6B"])
def test_importing_pawfn_does_not_import_torch(statement: str) -> None:
    """torch comes with the first Torch load (`pawfn --help`: 2.0 s -> 0.5 s here)."""
    code = f"import sys; {statement}; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert result.stdout.strip() == "False"
    loaded = "import sys, pawfn; pawfn.ModelRegistry; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", loaded], capture_output=True, text=True, check=True, timeout=120).stdout.strip() == "True"


SIZE_LIMIT = 400
"""Lines a module may have (the command line too: one module a command)."""
CORE_LIMIT = 350
"""Lines of the modules a reader starts from: the network, the runtime contract and `PawFn`."""
CORE = ("torch/engine/network.py", "calls/runtime.py", "api/function.py")


FUNCTION_LIMIT = 60
"""Lines a function may have, its nested functions included (a router or parser factory adds its routes in parts)."""


def test_functions_stay_short() -> None:
    package = SRC / "pawfn"
    too_long: list[str] = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno is not None:
                lines = node.end_lineno - node.lineno + 1
                if lines > FUNCTION_LIMIT:
                    too_long.append(f"{path.relative_to(package)}:{node.lineno} {node.name} ({lines} lines)")
    assert too_long == [], f"functions over {FUNCTION_LIMIT} lines: split them by step ({too_long})"


def test_modules_stay_small() -> None:
    package = SRC / "pawfn"
    sizes = {path.relative_to(package).as_posix(): len(path.read_text(encoding="utf-8").splitlines()) for path in package.rglob("*.py")}
    too_long = {name: size for name, size in sizes.items() if size > SIZE_LIMIT}
    assert too_long == {}, f"modules over {SIZE_LIMIT} lines: cut them by job ({too_long})"
    core = {name: sizes[name] for name in CORE if sizes[name] > CORE_LIMIT}
    assert core == {}, f"over {CORE_LIMIT} lines: {core}"


def test_each_backend_drives_its_calls_in_one_place() -> None:
    """A call's tokens are taken (`Decoding.take`: EOS, budget, listener) in one place per backend: Torch's scheduler
    and llama.cpp's worker; the runtime contract holds no decode loop of its own, and Remote decodes nothing."""
    package = SRC / "pawfn"
    drivers = {path.relative_to(package).as_posix() for path in package.rglob("*.py") if "decoding.take(" in path.read_text(encoding="utf-8")}
    assert drivers == {"torch/engine/scheduler.py", "llamacpp/program.py"}


def test_only_the_backend_dispatch_reaches_into_the_torch_backend() -> None:
    """Above the backends nothing imports `pawfn.torch` but the place that opens a program on it and the package's
    lazy `ModelRegistry`: a service reads its batching through the runtime contract (`decode_counters`)."""
    package = SRC / "pawfn"
    reaching: set[str] = set()
    for path in sorted(package.rglob("*.py")):
        module = _module_name(path, SRC)
        if module.startswith("pawfn.torch"):
            continue
        if any(target == "pawfn.torch" or target.startswith("pawfn.torch.") for target, _ in _imports(path, module)):
            reaching.add(module)
    assert reaching == {"pawfn", "pawfn.api.opening"}
