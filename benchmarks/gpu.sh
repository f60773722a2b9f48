#!/usr/bin/env bash
# On a lent CUDA machine, from the repository root: pawfn's GPU table (bfloat16, float16, float32 on the
# Qwen3-0.6B-shaped program) in under 5 minutes. It installs nothing: the machine has no internet, so it uses
# the Python it finds (with torch built for CUDA and pawfn's dependencies) and pawfn from src/.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src:$PWD/benchmarks${PYTHONPATH:+:$PYTHONPATH}"
PYTHON="${PYTHON:-python3}"
"$PYTHON" - <<'PY'
import importlib.util, sys
missing = [m for m in ("torch", "gguf", "tokenizers", "pydantic", "httpx", "safetensors", "tqdm") if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"missing Python packages: {', '.join(missing)}; install pawfn's dependencies first")
import torch
if not torch.cuda.is_available():
    sys.exit(f"torch {torch.__version__} sees no CUDA device; run this on a GPU machine")
print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}")
PY
timeout 280 "$PYTHON" benchmarks/gpu_modes.py --workdir "${WORKDIR:-/tmp/pawfn-qwen3-shape}" "$@"
