"""Inspect a program bundle without base weights: meta.json, the template split and the LoRA adapter.

python examples/verify_bundle.py --program triage.paw
"""

from __future__ import annotations

import argparse
import sys

from pawfn import PawError
from pawfn.formats.adapter import read_lora_adapter
from pawfn.formats.bundle import PromptTemplate, open_bundle
from pawfn.core.models import model_for_interpreter


def main() -> int:
    parser = argparse.ArgumentParser(description="Check a .paw file or bundle folder and describe its adapter.")
    parser.add_argument("--program", required=True, help=".paw file or bundle folder")
    args = parser.parse_args()
    try:
        with open_bundle(args.program) as bundle:
            model = model_for_interpreter(bundle.meta.interpreter)
            if model is None:
                print(f"verify_bundle: interpreter {bundle.meta.interpreter!r} is not one pawfn runs", file=sys.stderr)
                return 1
            adapter = read_lora_adapter(bundle.adapter_path, model)
            print(f"program {bundle.meta.program_id} for {bundle.meta.interpreter} ({model.__name__})")
            template = bundle.template
            if isinstance(template, PromptTemplate):
                print(f"template: prefix {len(template.prefix)} chars, suffix {len(template.suffix)} chars")
            else:  # a program of the official vision runtime
                print(f"template: numbered, {template.arity} argument{'s' * (template.arity != 1)}")
            modules = sorted({name.split(".")[2] for name in adapter.pairs})
            print(
                f"adapter: rank {adapter.rank}, alpha {adapter.alpha}, {len(adapter.pairs)} weights "
                f"({', '.join(modules)}), {adapter.n_parameters} parameters, types {', '.join(sorted(adapter.tensor_types))}"
            )
    except PawError as exc:
        print(f"verify_bundle: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
