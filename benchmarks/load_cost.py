"""Load time and memory of one Qwen3-0.6B-shaped program: pawfn's Torch backend vs llama.cpp, side by side.

Writes (once, into --workdir) random weights with Qwen3-0.6B's exact shapes as a Q6_K GGUF made by llama.cpp's
own quantizer, a rank-64 Q4_0 adapter on all seven projections and a bundle with a ~290-token prefix. Then each
backend loads the program in fresh processes (base, adapter and prefix: ready to run), runs one 10-token
call, and reports its load time and the process's peak RSS: one first process (it may store derived files in
a fresh shared cache: the evaluated prefix, a compact mode's converted weights), then the median of --runs
later ones. Modes: llama.cpp as the official SDK runs it (pawfn's LlamaCpp backend with no setting named: an f16 KV
cache, llama-cpp-python's thread counts), Torch by default (numerics auto: llama.cpp's arithmetic on this Q6_K base),
and torch's own arithmetic in float32, float16 and int8 weights. Prints the figures and the ratios.

    python benchmarks/load_cost.py [--workdir /tmp/pawfn-qwen3-shape] [--runs 2] [--threads N]
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import json
import statistics
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import numpy.typing as npt

HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM, FFN, VOCAB = 1024, 28, 16, 8, 128, 3072, 151936
PROJECTIONS = {
    "attn_q": (HEADS * HEAD_DIM, HIDDEN),
    "attn_k": (KV_HEADS * HEAD_DIM, HIDDEN),
    "attn_v": (KV_HEADS * HEAD_DIM, HIDDEN),
    "attn_output": (HIDDEN, HEADS * HEAD_DIM),
    "ffn_gate": (FFN, HIDDEN),
    "ffn_up": (FFN, HIDDEN),
    "ffn_down": (HIDDEN, FFN),
}
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# The benchmark vocabulary has only a few merges, so a character is about a token: ~290 tokens of prefix.
PREFIX = (
    "<|im_start|>system\nYou are an email triage function. Answer with one word: immediate, today, later or "
    "ignore. Weigh urgency, sender, deadlines, outages, customers, money and security; when unsure, say today. "
    "Invoices and contracts are today, newsletters and adverts are ignore, a locked account is immediate. "
    "Never explain.<|im_end|>\n<|im_start|>user\n[INPUT]\n"
)
TEMPLATE = PREFIX + "{INPUT_PLACEHOLDER}\n[END_INPUT]<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
INPUT = "Urgent: the server is down! Customers wait."  # ~46 tokens with the suffix

_MEASURE = """
import json, resource, sys, time
from pawfn import LlamaCpp, PawConfig, PawFn, Qwen3_0_6B, RuntimeOptions, Torch
backend = {"torch": Torch, "llamacpp": LlamaCpp}[sys.argv[1]]
threads = int(sys.argv[4]) if sys.argv[4] != "0" else None
weight_dtype = sys.argv[6] or None
started = time.perf_counter()
config = PawConfig(threads=threads, weight_dtype=weight_dtype, numerics=sys.argv[7])
program = PawFn[Qwen3_0_6B, backend].load_sync(sys.argv[2], base=sys.argv[3], config=config)
loaded = time.perf_counter()
result = program.generate(sys.argv[5], RuntimeOptions(max_tokens=10))
print(json.dumps({"load_s": loaded - started, "call_ms": result.timings.total_ms, "prefix": result.prefix_tokens,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def vocabulary(size: int = VOCAB) -> tuple[list[str], list[int], list[str]]:
    """A byte-level BPE vocabulary of `size` tokens (Qwen3's by default): the 256 byte symbols, a few merges,
    specials, then filler."""
    from tokenizers import pre_tokenizers

    tokens = sorted(pre_tokenizers.ByteLevel.alphabet())
    merges = ["Ġ t", "Ġ a", "t h", "i n", "e r"]
    tokens += [merge.replace(" ", "") for merge in merges]
    tokens += SPECIALS
    types = [int(gguf.TokenType.NORMAL)] * (len(tokens) - len(SPECIALS)) + [int(gguf.TokenType.CONTROL)] * len(SPECIALS)
    filler = size - len(tokens)
    tokens += [f"zzfill{i}" for i in range(filler)]
    types += [int(gguf.TokenType.NORMAL)] * filler
    return tokens, types, merges


def write_vocabulary(writer: gguf.GGUFWriter, size: int = VOCAB) -> None:
    """`vocabulary(size)` as a base GGUF's tokenizer keys (Qwen's pre-tokenizer, no BOS added)."""
    tokens, types, merges = vocabulary(size)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_eos_token_id(tokens.index("<|im_end|>"))
    writer.add_bos_token_id(tokens.index("<|endoftext|>"))
    writer.add_add_bos_token(False)


def random_array(rng: np.random.Generator, shape: tuple[int, ...], dtype: npt.DTypeLike, scale: float = 0.02) -> npt.NDArray[np.generic]:
    return (rng.standard_normal(shape, dtype=np.float32) * scale).astype(dtype)


def _write_f16_base(path: Path) -> None:
    rng = np.random.default_rng(0)
    writer = gguf.GGUFWriter(str(path), "qwen3")
    writer.add_name("qwen3-0.6b-shape-random")
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    writer.add_context_length(40960)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_key_length(HEAD_DIM)
    writer.add_value_length(HEAD_DIM)
    writer.add_rope_freq_base(1000000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    write_vocabulary(writer)
    writer.add_tensor("token_embd.weight", random_array(rng, (VOCAB, HIDDEN), np.float16))
    writer.add_tensor("output_norm.weight", np.ones(HIDDEN, dtype=np.float32))
    for layer in range(LAYERS):
        block = f"blk.{layer}."
        for norm, size in (("attn_norm", HIDDEN), ("ffn_norm", HIDDEN), ("attn_q_norm", HEAD_DIM), ("attn_k_norm", HEAD_DIM)):
            writer.add_tensor(f"{block}{norm}.weight", np.ones(size, dtype=np.float32))
        for module, shape in PROJECTIONS.items():
            writer.add_tensor(f"{block}{module}.weight", random_array(rng, shape, np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def quantize(source: Path, destination: Path, ftype: str = "Q6_K") -> None:
    """`source` quantized to `ftype` (a LLAMA_FTYPE_MOSTLY_* suffix) with llama.cpp's own quantizer, as the official
    bases were made (Qwen3: Q6_K)."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{ftype}")
    params.nthread = 2
    if llama_cpp.llama_model_quantize(str(source).encode(), str(destination).encode(), ctypes.byref(params)):
        raise SystemExit(f"llama.cpp could not quantize {source}")


def write_adapter(path: Path, architecture: str, layers: list[dict[str, tuple[int, int]]], rank: int = 64) -> None:
    """A random rank-`rank` Q4_0 LoRA, alpha 16, over each layer's modules (`layers[i]`: module -> (out, in))."""
    rng = np.random.default_rng(1)
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_string("general.type", "adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", 16.0)
    q4 = gguf.GGMLQuantizationType.Q4_0
    for layer, modules in enumerate(layers):
        for module, (out_features, in_features) in modules.items():
            name = f"blk.{layer}.{module}.weight"
            for half, shape in (("lora_a", (rank, in_features)), ("lora_b", (out_features, rank))):
                writer.add_tensor(f"{name}.{half}", gguf.quants.quantize(random_array(rng, shape, np.float32), q4), raw_dtype=q4)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def prepare(workdir: Path) -> tuple[Path, Path]:
    """The Q6_K base and the bundle folder, written once into `workdir`."""
    workdir.mkdir(parents=True, exist_ok=True)
    base, bundle = workdir / "qwen3-0.6b-shape-q6_k.gguf", workdir / "bundle"
    if not base.is_file() and importlib.util.find_spec("llama_cpp") is None:  # e.g. a lent GPU machine
        base = workdir / "qwen3-0.6b-shape-f16.gguf"
        if not base.is_file():
            print(f"llama-cpp-python is not installed, so no Q6_K: writing {base} ...", file=sys.stderr)
            _write_f16_base(base)
    if not base.is_file():
        f16 = workdir / "qwen3-0.6b-shape-f16.gguf"
        print(f"writing {f16} ...", file=sys.stderr)
        _write_f16_base(f16)
        print(f"quantizing to {base} ...", file=sys.stderr)
        quantize(f16, base)
        f16.unlink()
    if (bundle / "prompt_template.txt").is_file() and (bundle / "prompt_template.txt").read_text(encoding="utf-8") != TEMPLATE:
        (bundle / "prompt_template.txt").write_text(TEMPLATE, encoding="utf-8")
    if not (bundle / "adapter.gguf").is_file():
        bundle.mkdir(exist_ok=True)
        meta = {"interpreter": "Qwen/Qwen3-0.6B", "program_id": "00000000000000000000", "spec": "benchmark program"}
        (bundle / "meta.json").write_text(json.dumps(meta), encoding="utf-8")
        (bundle / "prompt_template.txt").write_text(TEMPLATE, encoding="utf-8")
        write_adapter(bundle / "adapter.gguf", "qwen3", [PROJECTIONS] * LAYERS)
    return base, bundle


def many_bundles(folder: Path, tiny: bool, workdir: Path, count: int, first_id: int, meta: dict[str, object]) -> tuple[Path, list[tuple[str, Path]]]:
    """A base and `count` bundles on it under `folder`, ids from `first_id` on, each its own template (so its own
    prefix) and adapter file: the benchmark's Qwen3-0.6B-shaped program (`prepare(workdir)`), or with `tiny` a tiny
    generated Qwen3 interpreter (the test suite's generators, so a checkout with the dev extras)."""
    if tiny:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from tests.helpers.programs import make_program
        from tests.helpers.tiny_models import build_interpreter

        interpreter = build_interpreter("qwen3", folder / "interpreter")
        model = make_program(interpreter, folder, "model", seed=1)
        base, adapter, template = interpreter.gguf_path, model.adapter, model.template
    else:
        base, bundle = prepare(workdir)
        adapter, template = bundle / "adapter.gguf", (bundle / "prompt_template.txt").read_text(encoding="utf-8")
    bundles = []
    for index in range(count):
        program_id = f"{first_id + index:020x}"
        program = folder / program_id
        program.mkdir(parents=True)
        fields = {"interpreter": "Qwen/Qwen3-0.6B", "program_id": program_id, "spec": f"benchmark program {index}"} | meta
        (program / "meta.json").write_text(json.dumps(fields), encoding="utf-8")
        (program / "prompt_template.txt").write_text(f"Program {index}. " + template, encoding="utf-8")
        shutil.copyfile(adapter, program / "adapter.gguf")
        bundles.append((program_id, program))
    return base, bundles


def llama_cpp_build() -> str:
    """Which llama.cpp the benchmark's processes load: its system info line and whether pawfn repacks weights on it."""
    from pawfn import PawConfig
    from pawfn.llamacpp.cpu import llama_cpp_system_info
    from pawfn.llamacpp.program import uses_repack

    info = llama_cpp_system_info()
    if info is None:
        return "llama.cpp: not installed"
    return f"llama.cpp build: {info}; weight repacking {'on' if uses_repack(PawConfig()) else 'off'}"


MODES = {
    "llama.cpp": ("llamacpp", "", "auto"),
    "torch default": ("torch", "", "auto"),
    "torch float32": ("torch", "", "native"),
    "torch float16": ("torch", "float16", "native"),
    "torch int8": ("torch", "int8", "native"),
}
"""Label -> (backend, weight dtype, numerics); the llama.cpp row names no setting, so it runs as the official SDK."""


def run_json(label: str, script: str, arguments: list[str], environment: dict[str, str] | None = None) -> Any:  # noqa: ANN401 - whatever JSON the script printed
    """Run `script` in a fresh Python process with `arguments`; the JSON on its last line of output, parsed."""
    command = [sys.executable, "-c", script, *arguments]
    result = subprocess.run(command, capture_output=True, text=True, check=False, timeout=1800, env=environment)
    if result.returncode != 0:
        raise SystemExit(f"{label} failed:\n{result.stderr}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def run_script(label: str, script: str, arguments: list[str], environment: dict[str, str] | None = None) -> dict[str, float]:
    """`run_json` for a script that prints an object of numbers."""
    figures: dict[str, float] = run_json(label, script, arguments, environment)
    return figures


def measure(mode: str, base: Path, bundle: Path, threads: int | None, cache: Path) -> dict[str, float]:
    """One fresh process: load the program in `mode` (see MODES), run one call; its figures."""
    backend, weight_dtype, numerics = MODES[mode]
    arguments = [backend, str(bundle), str(base), str(threads or 0), INPUT, weight_dtype, numerics]
    return run_script(backend, _MEASURE, arguments, {**os.environ, "PAW_CACHE_DIR": str(cache)})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/pawfn-qwen3-shape"))
    parser.add_argument("--runs", type=int, default=2, help="fresh processes per backend (the median is shown)")
    parser.add_argument("--threads", type=int, help="CPU threads for both backends (default: each one's own)")
    args = parser.parse_args()
    base, bundle = prepare(args.workdir)
    print(f"base {base.name}: {base.stat().st_size / 1e6:.0f} MB; adapter {(bundle / 'adapter.gguf').stat().st_size / 1e6:.1f} MB")
    print(llama_cpp_build())
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="pawfn-load-cost-") as cache:  # a fresh cache: the first process is first
        for mode in MODES:
            first = measure(mode, base, bundle, args.threads, Path(cache))  # it may store what later ones reuse
            runs = [measure(mode, base, bundle, args.threads, Path(cache)) for _ in range(args.runs)]
            results[mode] = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
            results[mode] |= {"first_load_s": first["load_s"], "first_peak_rss_mb": first["peak_rss_mb"]}
    reference = results["llama.cpp"]
    print(
        f"{'mode':14} {'load':>7} {'first load':>10} {'peak RSS':>9} {'first RSS':>9} {'first call':>10}   "
        "ratios to llama.cpp (load, first load, RSS, call)"
    )
    for mode, figures in results.items():
        ratios = [figures[key] / reference[key] for key in ("load_s", "first_load_s", "peak_rss_mb", "call_ms")]
        print(
            f"{mode:14} {figures['load_s']:5.2f} s {figures['first_load_s']:8.2f} s {figures['peak_rss_mb']:5.0f} MB "
            f"{figures['first_peak_rss_mb']:6.0f} MB {figures['call_ms']:7.0f} ms   " + ", ".join(f"{r:.2f}x" for r in ratios)
        )


if __name__ == "__main__":
    main()
