"""Bundle round trip: fetch a program (a reference, or a local .paw), save it as a .paw, reopen it and compare.

    python examples/download_and_save.py --program email-triage --out email-triage.paw
    python examples/download_and_save.py --program triage.paw --out copy.paw

With a reference the program is downloaded into the shared cache first (base weights are not fetched).
"""

from __future__ import annotations

import argparse
import sys
import zipfile
from pathlib import Path

from pawfn import PawConfig, PawError
from pawfn.formats.bundle import open_bundle
from pawfn.hub import prepare_program


def main() -> int:
    parser = argparse.ArgumentParser(description="Save a program as a .paw file and check the copy.")
    parser.add_argument("--program", required=True, help="id, slug, .paw file or bundle folder")
    parser.add_argument("--out", required=True, type=Path, help="the .paw file to write")
    args = parser.parse_args()
    try:
        prepared = prepare_program(args.program, PawConfig.from_env(), fetch_base=False)
        with open_bundle(prepared.bundle) as original:
            folder = original.adapter_path.parent  # the bundle's files, extracted when it was a .paw
            files = {name: (folder / name).read_bytes() for name in ("meta.json", "prompt_template.txt", "adapter.gguf")}
            with zipfile.ZipFile(args.out, "w", zipfile.ZIP_DEFLATED) as archive:
                for name, data in files.items():
                    archive.writestr(name, data)
            with open_bundle(args.out) as copy:
                same = all((copy.adapter_path.parent / name).read_bytes() == data for name, data in files.items())
                same = same and copy.meta == original.meta and copy.template == original.template
    except (PawError, OSError) as exc:
        print(f"download_and_save: {exc}", file=sys.stderr)
        return 1
    print(f"saved {args.out} ({args.out.stat().st_size} bytes); round trip {'identical' if same else 'DIFFERS'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
