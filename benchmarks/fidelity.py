"""How often each pawfn mode gives the official runtime's tokens, on the trained fixtures (tests/fixtures/trained,
made by scripts/make_trained_fixtures.py): 16 held-out inputs, 32 greedy tokens each.

The official runtime is llama.cpp driven as the official SDK drives it: the official base type (Q6_K for Qwen3,
Q8_0 for GPT-2), the program's Q4_0 adapter, an f16 KV cache. Each pawfn mode loads those same files. More rows
for scale: llama.cpp itself on another base type; pawfn's default on the F32 base against the official runtime on
it (Q4_0 adapter, f16 KV); and pawfn float32 against llama.cpp on the F32 files with an f32 KV cache (exact
arithmetic on both sides: should be every sequence).

    python benchmarks/fidelity.py [--families qwen3 gpt2] [--fixtures DIR]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPOSITORY))

from pawfn import PawConfig  # noqa: E402
from pawfn.llamacpp.cpu import llama_cpp_system_info  # noqa: E402
from tests.helpers.trained import (  # noqa: E402
    FIXTURES,
    MAX_TOKENS,
    OFFICIAL_BASE,
    BaseType,
    first_difference,
    llama_tokens,
    load_trained,
    pawfn_tokens,
)

OTHER_BASE: dict[str, BaseType] = {"qwen3": "q8_0", "gpt2": "q6_k"}
MODES: dict[str, PawConfig] = {
    "pawfn default (numerics auto)": PawConfig(),
    "pawfn --numerics native (float32)": PawConfig(numerics="native"),
    "pawfn --weight-dtype float16": PawConfig(weight_dtype="float16", numerics="native"),
    "pawfn --weight-dtype int8": PawConfig(weight_dtype="int8", numerics="native"),
    "pawfn --numerics llamacpp": PawConfig(numerics="llamacpp"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--families", nargs="+", default=["qwen3", "gpt2"], choices=["qwen3", "gpt2"])
    parser.add_argument("--fixtures", type=Path, default=FIXTURES, help="another fixtures folder (e.g. made with another --seed)")
    args = parser.parse_args()
    print(f"llama.cpp build: {llama_cpp_system_info()}")
    for family in args.families:
        fixture = load_trained(family, args.fixtures)
        inputs, official_base = fixture.inputs, OFFICIAL_BASE[family]
        official = llama_tokens(fixture, official_base, fixture.adapter_q4_0)
        rows = [(name, official, pawfn_tokens(fixture, fixture.program, official_base, config)) for name, config in MODES.items()]
        rows.append((f"llama.cpp on a {OTHER_BASE[family].upper()} base", official, llama_tokens(fixture, OTHER_BASE[family], fixture.adapter_q4_0)))
        on_f32 = llama_tokens(fixture, "f32", fixture.adapter_q4_0)
        rows.append(("pawfn default vs official, F32 base", on_f32, pawfn_tokens(fixture, fixture.program, "f32", PawConfig())))
        with tempfile.TemporaryDirectory() as scratch:
            exact = llama_tokens(fixture, "f32", fixture.adapter_f32, kv="f32")
            f32_program = fixture.program_with_f32_adapter(Path(scratch))
            float32 = PawConfig(numerics="native")
            rows.append(("pawfn float32 vs llama.cpp, F32 files", exact, pawfn_tokens(fixture, f32_program, "f32", float32)))
        print(
            f"\n{family}: official runtime = llama.cpp, {official_base.upper()} base, Q4_0 adapter, f16 KV; "
            f"{len(inputs)} inputs x {MAX_TOKENS} tokens"
        )
        print(f"{'mode':40} {'sequences equal':>16}   first differences (step)")
        for name, expected, found in rows:
            equal = sum(a == b for a, b in zip(expected, found, strict=True))
            steps = [first_difference(a, b) for a, b in zip(expected, found, strict=True)]
            print(f"{name:40} {equal:>9} of {len(inputs):<4}   {sorted(s for s in steps if s is not None)}")


if __name__ == "__main__":
    main()
