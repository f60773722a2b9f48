"""The C interface as `kernels.c` declares it: Python's kernel enum in the C enum's order, each kernel's named
arguments filling exactly the `paw_args` slots its `run_range` case reads, and every exported function's argument
and return types as its C prototype has them. Adding or reordering a kernel on one side fails here."""

from __future__ import annotations

import ctypes
import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import pytest

from pawfn.torch.ggml import interface
from pawfn.torch.ggml.interface import BLOCK_PRODUCTS, EXPORTS, FloatKind, Kernel, KernelCall, LibmOp, Pointer, Value, kernel_calls

SOURCE = (Path(interface.__file__).parent / "kernels.c").read_text()


def _body(signature: str) -> str:
    """The text of the C function that starts with `signature`, to its closing brace at the start of a line."""
    start = SOURCE.index(signature)
    return SOURCE[start : SOURCE.index("\n}\n", start)]


def _case_groups() -> list[tuple[list[str], str]]:
    """`run_range`'s cases: the labels that share a body (fall-through), and that body."""
    groups: list[tuple[list[str], str]] = []
    labels: list[str] = []
    pieces = re.split(r"^\s*case (KERNEL_\w+):", _body("static void run_range("), flags=re.MULTILINE)
    for label, body in zip(pieces[1::2], pieces[2::2], strict=True):
        labels.append(label.removeprefix("KERNEL_"))
        if body.strip():
            groups.append((labels, body))
            labels = []
    return groups


def _slots(body: str) -> tuple[set[int], set[int], bool]:
    """The pointer and integer slots of `paw_args` a C body reads, and whether it reads the float."""
    pointers = {int(index) for index in re.findall(r"a->p\[(\d+)\]", body)}
    integers = {int(index) for index in re.findall(r"a->i\[(\d+)\]", body)}
    return pointers, integers, "a->f" in body


def _c_enum(prefix: str) -> list[str]:
    """The names of `kernels.c`'s enum whose names start with `prefix`, in order, the prefix dropped."""
    enum_body = re.search(r"enum \{(\s*" + prefix + r"[^}]*)\}", SOURCE)
    assert enum_body is not None, prefix
    return [name.strip().removeprefix(prefix) for name in enum_body.group(1).split(",") if name.strip()]


def test_the_kernel_enum_is_the_c_enum_in_order() -> None:
    assert _c_enum("KERNEL_") == [kernel.name for kernel in Kernel]


def test_the_float_kinds_are_the_c_enum_in_order() -> None:
    assert _c_enum("FLOAT_") == [kind.name for kind in FloatKind]


def test_every_kernel_reads_exactly_the_arguments_python_names() -> None:
    calls = kernel_calls()
    cased: set[str] = set()
    for labels, body in _case_groups():
        pointers, integers, value = _slots(body)
        for label in labels:
            cased.add(label)
            kernel = Kernel[label]
            if kernel in BLOCK_PRODUCTS:
                assert kernel not in calls, f"{label}: paw_block_product makes its arguments; Python declares none"
                continue
            call = calls[kernel]
            hints = {field.name: field.type for field in fields(call)}
            named = [name for name, kind in hints.items() if "Pointer" in str(kind)], [name for name, kind in hints.items() if "Integer" in str(kind)]
            assert pointers == set(range(len(named[0]))), f"{label}: C reads pointers {sorted(pointers)}; Python names {named[0]}"
            assert integers == set(range(len(named[1]))), f"{label}: C reads integers {sorted(integers)}; Python names {named[1]}"
            assert value == any("Value" in str(kind) for kind in hints.values()), f"{label}: the float slot"
    assert cased == {kernel.name for kernel in Kernel}, "every kernel has a case in run_range"
    assert set(calls) | BLOCK_PRODUCTS == set(Kernel)


def test_block_products_read_only_what_paw_block_product_makes() -> None:
    made = re.search(r"paw_args args = \{\{([^}]*)\},\s*\{([^}]*)\}", _body("int paw_block_product("))
    assert made is not None
    pointer_count, integer_count = len(made.group(1).split(",")), len(made.group(2).split(","))
    for labels, body in _case_groups():
        if any(Kernel[label] in BLOCK_PRODUCTS for label in labels):
            pointers, integers, _ = _slots(body)
            assert max(pointers) < pointer_count and max(integers) < integer_count, labels


def test_a_call_packs_its_named_arguments_into_their_slots() -> None:
    call = interface.RmsNormCall(x=11, weight=22, y=33, stride=4, per_row=5, n=6, eps=0.5)
    packed = call.packed()
    assert list(packed.p)[:3] == [11, 22, 33] and list(packed.p)[3:] == [None] * 7
    assert list(packed.i)[:4] == [4, 5, 6, 0] and packed.f == 0.5
    assert call.kernel is Kernel.RMS_NORM


_C_TYPES: dict[str, type[Any]] = {"int64_t": ctypes.c_int64, "int": ctypes.c_int, "float": ctypes.c_float}


def _c_type(declaration: str) -> type[Any]:
    """The ctypes type a C parameter or return declaration passes as: pointers by address, structs by pointer."""
    declaration = declaration.replace("const ", "").strip()
    if "*" in declaration:
        named = declaration.split("*")[0].strip()
        return {"paw_args": ctypes.POINTER(interface._Args), "paw_out": ctypes.POINTER(interface.Out)}.get(named, ctypes.c_void_p)  # noqa: SLF001  # pyright: ignore[reportPrivateUsage]
    return _C_TYPES[declaration.rsplit(" ", 1)[0] if " " in declaration else declaration]


@pytest.mark.parametrize("name", sorted(EXPORTS))
def test_each_export_is_declared_as_its_c_prototype(name: str) -> None:
    prototype = re.search(rf"^(void|int) {name}\(([^)]*)\)", SOURCE, flags=re.MULTILINE)
    assert prototype is not None, f"{name} is not exported by kernels.c"
    parameters = [parameter for parameter in prototype.group(2).split(",") if parameter.strip() not in ("", "void")]
    arguments, result = EXPORTS[name]
    assert [_c_type(parameter) for parameter in parameters] == list(arguments), name
    assert result == (None if prototype.group(1) == "void" else ctypes.c_int), name


def test_the_libm_ops_are_its_switch_in_order() -> None:
    cases = dict(re.findall(r"(case \d+|default): y\[i\] = ([^;]*);", _body("void paw_libm(")))
    expected = {
        LibmOp.EXPF: "expf(v)",
        LibmOp.LOGF: "logf(v)",
        LibmOp.SIGMOID: "1.0f / (1.0f + expf(-v))",
        LibmOp.SOFTPLUS: "v > 20.0f ? v : logf(1.0f + expf(v))",
    }
    last = max(LibmOp)
    assert {op: cases[f"case {op.value}" if op is not last else "default"] for op in LibmOp} == expected
    assert len(cases) == len(LibmOp)


def test_a_call_past_paw_args_slots_is_refused() -> None:
    @dataclass(slots=True)
    class TooMany(KernelCall):
        kernel = Kernel.GELU
        a: Pointer
        b: Value
        c: Value

    with pytest.raises(TypeError, match="one float"):
        TooMany(1, 0.5, 0.25).packed()
