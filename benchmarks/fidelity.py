"""How often each pawfn mode gives the official runtime's tokens, on the trained fixtures (tests/fixtures/trained,
made by scripts/make_trained_fixtures.py): 16 held-out inputs, 32 greedy tokens each.

The official runtime is llama.cpp driven as the official SDK drives it: the official base type (Q6_K for Qwen3,
Q8_0 for GPT-2), the program's Q4_0 adapter, an f16 KV cache. Each pawfn mode loads those same files. Two more
rows for scale: llama.cpp itself on another base type, and pawfn float32 against llama.cpp on the F32 files with
an f32 KV cache (exact arithmetic on both sides: should be every sequence).

    python benchmarks/fidelity.py [--families qwen3 gpt2] [--fixtures DIR]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPOSITORY))

from pawfn import GPT2, InterpreterModel, PawConfig, PawFn, Qwen3_0_6B, RuntimeOptions, Torch  # noqa: E402
from tests.helpers import trained  # noqa: E402
from tests.helpers.references import llama_generate_each  # noqa: E402

OFFICIAL_BASE: dict[str, trained.BaseType] = {"qwen3": "q6_k", "gpt2": "q8_0"}
OTHER_BASE: dict[str, trained.BaseType] = {"qwen3": "q8_0", "gpt2": "q6_k"}
MODES: dict[str, PawConfig] = {
    "pawfn float32 (exact)": PawConfig(),
    "pawfn --weight-dtype float16": PawConfig(weight_dtype="float16"),
    "pawfn --weight-dtype int8": PawConfig(weight_dtype="int8"),
}
MAX_TOKENS = 32


def pawfn_tokens(model: type[InterpreterModel], program: Path, base: Path, config: PawConfig, inputs: tuple[str, ...]) -> list[list[int]]:
    with PawFn.specialize(model, Torch).from_path(program, base=base, config=config) as function:
        return [list(function.generate(text, RuntimeOptions(max_tokens=MAX_TOKENS)).token_ids) for text in inputs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--families", nargs="+", default=["qwen3", "gpt2"], choices=["qwen3", "gpt2"])
    parser.add_argument("--fixtures", type=Path, help="another fixtures folder (e.g. made with another --seed)")
    args = parser.parse_args()
    if args.fixtures is not None:
        trained.FIXTURES = args.fixtures
    from pawfn.llamacpp.cpu import llama_cpp_system_info

    print(f"llama.cpp build: {llama_cpp_system_info()}")
    for family in args.families:
        fixture = trained.load_trained(family)
        model: type[InterpreterModel] = Qwen3_0_6B if family == "qwen3" else GPT2
        inputs, official_base = fixture.inputs, fixture.base(OFFICIAL_BASE[family])
        official = llama_generate_each(official_base, fixture.adapter_q4_0, fixture.template, inputs, MAX_TOKENS, n_ctx=2048, kv="f16")
        rows: list[tuple[str, list[list[int]], list[list[int]]]] = []
        for name, config in MODES.items():
            rows.append((name, official, pawfn_tokens(model, fixture.program, official_base, config, inputs)))
        other = llama_generate_each(fixture.base(OTHER_BASE[family]), fixture.adapter_q4_0, fixture.template, inputs, MAX_TOKENS, n_ctx=2048, kv="f16")
        rows.append((f"llama.cpp on a {OTHER_BASE[family].upper()} base", official, other))
        with tempfile.TemporaryDirectory() as scratch:
            f32_program = fixture.program_with_f32_adapter(Path(scratch))
            exact = llama_generate_each(fixture.base("f32"), fixture.adapter_f32, fixture.template, inputs, MAX_TOKENS, n_ctx=2048, kv="f32")
            rows.append(("pawfn float32 vs llama.cpp, F32 files", exact, pawfn_tokens(model, f32_program, fixture.base("f32"), PawConfig(), inputs)))
        print(f"\n{family}: official runtime = llama.cpp, {OFFICIAL_BASE[family].upper()} base, Q4_0 adapter, f16 KV; "
              f"{len(inputs)} inputs x {MAX_TOKENS} tokens")
        print(f"{'mode':40} {'sequences equal':>16}   first differences (step)")
        for name, expected, found in rows:
            equal = sum(a == b for a, b in zip(expected, found, strict=True))
            steps = [trained.first_difference(a, b) for a, b in zip(expected, found, strict=True)]
            print(f"{name:40} {equal:>9} of {len(inputs):<4}   {sorted(s for s in steps if s is not None)}")


if __name__ == "__main__":
    main()
