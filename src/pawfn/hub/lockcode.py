"""`pawfn lock codegen`: a Python module of typed handles, one per name in `pawfn.lock`, that mypy and pyright check
strictly: `PawFn[Qwen3_0_6B, Torch]` by interpreter, or `TypedFn[...]` of the output the lock declares (choices as a
`Literal`, a pattern, a scalar, a JSON schema as generated pydantic models). Programs load on first use.

Every text from the lock reaches the code through `repr` (a valid literal whatever it holds), names are identifiers
(checked when the lock is read), and a schema keyword the generator does not know is refused, never guessed.
"""

from __future__ import annotations

import keyword
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

from ..core.models import model_for_interpreter
from .lockfile import LockedProgram, LockError, LockFile, ReturnsPattern, ReturnsSchema

__all__ = ["generate_module"]

_BACKEND_CLASSES = {"torch": "Torch", "llamacpp": "LlamaCpp", "remote": "Remote"}
_JSON_SCALARS = {"string": "str", "integer": "int", "number": "float", "boolean": "bool"}
_SCHEMA_KEYS = frozenset({"type", "properties", "required", "items", "enum", "title", "description", "additionalProperties"})
_MAX_DEPTH = 8
_RESERVED = frozenset(
    {"Annotated", "BaseModel", "Callable", "GPT2", "LOCK", "Literal", "LlamaCpp", "Path", "Pattern", "PawConfig", "PawFn", "Programs"}
    | {"Qwen3_0_6B", "Qwen3_5_0_8B", "Remote", "Torch", "TypedFn", "locked_program", "programs", "threading"}
)
"""Names the generated module defines or imports: a generated model never takes one."""


@dataclass
class _Module:
    """What the generated module needs beyond its handles: typing names, pawfn names, model classes."""

    typing: set[str] = field(default_factory=set[str])
    pawfn: set[str] = field(default_factory=lambda: {"PawConfig", "PawFn", "locked_program"})
    pydantic: bool = False
    models: list[str] = field(default_factory=list[str])
    models_defined: list[str] = field(default_factory=list[str])
    model_names: set[str] = field(default_factory=lambda: set(_RESERVED))


def _class_name(text: str) -> str:
    words = re.findall(r"[A-Za-z0-9]+", text)
    name = "".join(word[:1].upper() + word[1:] for word in words) or "Model"
    return name if name[0].isalpha() else "M" + name


def _table(value: object, where: str, what: str) -> dict[str, object]:
    """`value` as a TOML table / JSON object (string keys, as both formats have), else a `LockError`."""
    if not isinstance(value, dict):
        raise LockError(f"{where}: {what} must be a table (a JSON object), not {type(value).__name__}")
    return cast("dict[str, object]", value)  # cast: TOML and JSON keys are strings


def _texts(value: object, where: str, what: str) -> list[str]:
    """`value` as a non-empty list of texts, else a `LockError`."""
    if not isinstance(value, list):
        raise LockError(f"{where}: {what} must be a list of texts")
    items = cast("list[object]", value)  # cast: a list from TOML or JSON
    texts = [item for item in items if isinstance(item, str)]
    if len(texts) != len(items):
        raise LockError(f"{where}: {what} must be a list of texts")
    return texts


def _schema_type(value: object, title: str, where: str, module: _Module, depth: int) -> str:
    """The Python type of JSON schema `value` (object schemas become pydantic models in `module`)."""
    if depth > _MAX_DEPTH:
        raise LockError(f"{where}: nested deeper than {_MAX_DEPTH} levels; declare the type in Python and call returning(YourModel)")
    schema = _table(value, where, "a JSON schema")
    unknown = sorted(key for key in schema if key not in _SCHEMA_KEYS)
    if unknown:
        raise LockError(
            f"{where}: pawfn lock codegen does not generate {', '.join(unknown)}; keep to type, properties, required, items and "
            "enum, or declare the type in Python and call returning(YourModel)"
        )
    if "enum" in schema:
        values = _texts(schema["enum"], where, "enum")
        if not values:
            raise LockError(f"{where}: enum must list at least one text")
        module.typing.add("Literal")
        return f"Literal[{', '.join(repr(value) for value in values)}]"
    kind = schema.get("type")
    if isinstance(kind, str) and kind in _JSON_SCALARS:
        return _JSON_SCALARS[kind]
    if kind == "array":
        return f"list[{_schema_type(schema.get('items'), title + 'Item', where + '.items', module, depth + 1)}]"
    if kind == "object":
        return _model(schema, title, where, module, depth)
    raise LockError(f"{where}: type {kind!r} is not one codegen generates (string, integer, number, boolean, array, object)")


def _model(schema: dict[str, object], title: str, where: str, module: _Module, depth: int) -> str:
    properties = _table(schema.get("properties"), where, "an object's properties")
    required = _texts(schema.get("required", []), where, "required")
    if not properties:
        raise LockError(f"{where}: an object needs at least one property")
    name = _class_name(str(schema.get("title") or title))
    while name in module.model_names:
        name += "_"
    module.model_names.add(name)
    module.models_defined.append(name)
    lines = [f"class {name}(BaseModel):", f"    {repr('Generated from ' + where)}", ""]
    for key, value in properties.items():
        if not key.isidentifier() or keyword.iskeyword(key) or key.startswith(("_", "model_")):
            raise LockError(f"{where}: property {key!r} cannot be a pydantic field name; declare the type in Python and call returning(YourModel)")
        annotation = _schema_type(value, name + _class_name(key), f"{where}.{key}", module, depth + 1)
        lines.append(f"    {key}: {annotation}" if key in required else f"    {key}: {annotation} | None = None")
    module.pydantic = True
    module.models.append("\n".join(lines))
    return name


def _output_type(entry: LockedProgram, name: str, module: _Module) -> str | None:
    """The Python type of `entry`'s declared output; None for text."""
    returns = entry.returns
    if returns is None:
        return None
    if isinstance(returns, list):
        module.typing.add("Literal")
        return f"Literal[{', '.join(repr(choice) for choice in returns)}]"
    if isinstance(returns, ReturnsPattern):
        module.typing.add("Annotated")
        module.pawfn.add("Pattern")
        return f"Annotated[str, Pattern({returns.pattern!r})]"
    if isinstance(returns, ReturnsSchema):
        return _schema_type(returns.json_schema, _class_name(name), f"programs.{name}.returns.json_schema", module, 0)
    return returns


def _handle(name: str, entry: LockedProgram, backend: str, module: _Module) -> tuple[str, str, str]:
    """(the attribute's type, its slot's declaration, its property) for locked program `name`."""
    if name == "close" or name.startswith("_"):
        raise LockError(
            f"programs.{name}: the generated handles keep that name for themselves; rename it in the lock (`pawfn lock add` another name)"
        )
    model = model_for_interpreter(entry.interpreter)
    if model is None:
        raise LockError(f"programs.{name}: interpreter {entry.interpreter!r} is none that pawfn runs; lock a program for a built-in interpreter")
    module.pawfn |= {model.__name__, backend}
    program_type = f"PawFn[{model.__name__}, {backend}]"
    output = _output_type(entry, name, module)
    if output is not None:
        module.pawfn.add("TypedFn")
    handle = program_type if output is None else f"TypedFn[{output}]"
    opened = f"{program_type}.load_sync(locked_program({name!r}, lock=LOCK, config=self._config), config=self._config)"
    made = f"program.returning({output})"
    body = [
        "    @property",
        f"    def {name}(self) -> {handle}:",
        f"        {repr(f'{entry.reference}: program {entry.program_id} on {entry.interpreter}, loaded on first use.')}",
        "        with self._guard:",
        f"            if self._{name} is None:",
    ]
    if output is None:
        body += [
            f"                program = {opened}",
            "                self._opened.append(program.close)",
            f"                self._{name} = program",
        ]
    else:
        body += [
            f"                program = {opened}",
            "                self._opened.append(program.close)",
            f"                self._{name} = {made}",
        ]
    body.append(f"            return self._{name}")
    return handle, f"        self._{name}: {handle} | None = None", "\n".join(body)


def generate_module(lock: LockFile, lock_path: Path, module_path: Path, backend: str) -> str:
    """The text of the handles module for `lock` (at `lock_path`), to be written at `module_path`, on `backend`."""
    backend_class = _BACKEND_CLASSES[backend]
    module = _Module()
    handles = [_handle(name, lock.programs[name], backend_class, module) for name in sorted(lock.programs)]
    relative = Path(os.path.relpath(lock_path.resolve(), module_path.resolve().parent)).as_posix()
    imports = ["from __future__ import annotations", "", "import threading", "from collections.abc import Callable", "from pathlib import Path"]
    if module.typing:
        imports.append(f"from typing import {', '.join(sorted(module.typing))}")
    imports.append("")
    if module.pydantic:
        imports += ["from pydantic import BaseModel", ""]
    imports.append(f"from pawfn import {', '.join(sorted(module.pawfn))}")
    header = [
        f'"""The programs of {lock_path.name} as typed handles. Generated by `pawfn lock codegen`: do not edit. After the',
        'lock changes, run it again (`pawfn lock check` reports this file when it is stale)."""',
        "",
        *imports,
        "",
        f'__all__ = ["Programs", "programs"{"".join(f", {name!r}" for name in module.models_defined)}]'.replace("'", '"'),
        "",
        f"LOCK = Path(__file__).resolve().parent / {relative!r}",
        '"""The lock these handles load from."""',
    ]
    slots = "\n".join(slot for _, slot, _ in handles)
    properties = "\n\n".join(prop for _, _, prop in handles)
    programs = [
        "class Programs:",
        '    """Each locked program, loaded on first use (by its id, its files checked against the lock); `close()` frees them."""',
        "",
        "    def __init__(self, config: PawConfig | None = None) -> None:",
        "        self._config = config",
        "        self._guard = threading.Lock()",
        "        self._opened: list[Callable[[], None]] = []",
        *([slots] if slots else []),
        "",
        *([properties, ""] if properties else []),
        "    def close(self) -> None:",
        '        """Close every program loaded so far (a later use loads it again)."""',
        "        with self._guard:",
        "            opened, self._opened = self._opened, []",
        *[f"            self._{name} = None" for name in sorted(lock.programs)],
        "        for close in opened:",
        "            close()",
        "",
        "",
        "programs = Programs()",
        '"""The handles with the default configuration (`PawConfig.from_env()`)."""',
    ]
    blocks = ["\n".join(header), *module.models, "\n".join(programs)]
    return "\n\n\n".join(blocks) + "\n"
