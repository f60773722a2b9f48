#!/usr/bin/env bash
# pawfn's development set-up in the active Python environment: pawfn with every extra, and llama-cpp-python
# (the official runtime, the parity tests' reference) built from source for this CPU.
#
# Why not a plain `pip install`: on a CPU with AMX (Intel Sapphire Rapids and later) llama.cpp's native build
# compiles its AMX backend, which segfaults on the first product with quantized weights
# (https://github.com/ggml-org/llama.cpp/issues/20824, open). There the build turns native detection off and
# names the CPU's other features (src/pawfn/llamacpp/cpu.py reads them from /proc/cpuinfo); elsewhere it is
# llama.cpp's usual native build.
set -euo pipefail
cd "$(dirname "$0")/.."

cmake_args="$(python src/pawfn/llamacpp/cpu.py cmake-args)"  # a standard-library script: pawfn is not installed yet
echo "llama-cpp-python CMAKE_ARGS: ${cmake_args:-none, the native build}"
CMAKE_ARGS="$cmake_args" python -m pip install -c constraints.txt -e ".[dev,llamacpp]"

# pip reuses a wheel it built earlier, whatever its CMAKE_ARGS were: when that one would crash here, drop it from
# pip's cache and build again (the new wheel is cached in its place).
if ! python -m pawfn.llamacpp check; then
    version="$(python -c 'import importlib.metadata as m; print(m.version("llama-cpp-python"))')"
    echo "rebuilding llama-cpp-python $version without AMX"
    python -m pip cache remove 'llama_cpp_python*' || true
    CMAKE_ARGS="$cmake_args" python -m pip install --force-reinstall --no-deps "llama-cpp-python==$version"
    python -m pawfn.llamacpp check
fi
