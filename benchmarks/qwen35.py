"""pawfn beside llama.cpp on a Qwen3.5-0.8B-shaped program, in one run: a random base of Qwen3.5-0.8B's shape (24
layers, 18 of them Gated DeltaNet, hidden 1024, vocabulary 248,320), quantized to Q8_0 by llama.cpp as the official
runtime's base is, and a rank-64 Q4_0 adapter over every linear layer. Each configuration is one `pawfn bench
--json` process (load, a warm-up call, then --runs 10-token calls); --rounds rounds run every configuration in turn.
llama.cpp runs each call as the official vision runtime does (a cleared context, the whole prompt evaluated);
pawfn's Torch backend continues from the program's evaluated prefix (its recurrent states kept). Prints the median
call and peak RSS and the median of each round's ratios to llama.cpp.

    python benchmarks/qwen35.py [--workdir /tmp/pawfn-qwen35-shape] [--runs 5] [--rounds 3] [--threads N] [--llamacpp-numerics]

--llamacpp-numerics adds `numerics="llamacpp"` (llama.cpp's arithmetic, each call from the head's whole batches of
128, as the official runtime's batches fall): the official runtime's exact tokens.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import gguf
import numpy as np

from cpu_modes import bench
from load_cost import INPUT, TEMPLATE, llama_cpp_build, quantize, random_array, write_adapter, write_vocabulary

HIDDEN, LAYERS, FFN, VOCAB = 1024, 24, 3584, 248320
HEADS, KV_HEADS, HEAD_DIM = 8, 2, 256
KEY_HEADS, VALUE_HEADS, STATE, CONV = 16, 16, 128, 4
RECURRENT = {layer: (layer + 1) % 4 != 0 for layer in range(LAYERS)}
ATTENTION = {
    "attn_q": (2 * HEADS * HEAD_DIM, HIDDEN),
    "attn_k": (KV_HEADS * HEAD_DIM, HIDDEN),
    "attn_v": (KV_HEADS * HEAD_DIM, HIDDEN),
    "attn_output": (HIDDEN, HEADS * HEAD_DIM),
}
DELTA_NET = {
    "attn_qkv": ((2 * KEY_HEADS + VALUE_HEADS) * STATE, HIDDEN),
    "attn_gate": (VALUE_HEADS * STATE, HIDDEN),
    "ssm_alpha": (VALUE_HEADS, HIDDEN),
    "ssm_beta": (VALUE_HEADS, HIDDEN),
    "ssm_out": (HIDDEN, VALUE_HEADS * STATE),
}
FEED_FORWARD = {"ffn_gate": (FFN, HIDDEN), "ffn_up": (FFN, HIDDEN), "ffn_down": (HIDDEN, FFN)}
MODES: dict[str, list[str]] = {
    "llama.cpp": ["--backend", "llamacpp"],  # no setting named: the official vision runtime's settings
    "torch float32": ["--numerics", "native"],
    "torch int8 weights": ["--weight-dtype", "int8"],
}
"""The default (numerics auto) is llama.cpp's arithmetic on this Q8_0 base: --llamacpp-numerics times it."""


def _write_f16_base(path: Path) -> None:
    rng = np.random.default_rng(0)
    writer = gguf.GGUFWriter(str(path), "qwen35")
    writer.add_name("qwen3.5-0.8b-shape-random")
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    writer.add_context_length(262144)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_key_length(HEAD_DIM)
    writer.add_value_length(HEAD_DIM)
    writer.add_rope_freq_base(10000000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_ssm_conv_kernel(CONV)
    writer.add_ssm_state_size(STATE)
    writer.add_ssm_group_count(KEY_HEADS)
    writer.add_ssm_time_step_rank(VALUE_HEADS)
    writer.add_ssm_inner_size(VALUE_HEADS * STATE)
    writer.add_full_attention_interval(4)
    writer.add_rope_dimension_count(HEAD_DIM // 4)
    writer.add_rope_dimension_sections([11, 11, 10, 0])
    write_vocabulary(writer, VOCAB)
    writer.add_tensor("token_embd.weight", random_array(rng, (VOCAB, HIDDEN), np.float16))
    writer.add_tensor("output_norm.weight", np.ones(HIDDEN, dtype=np.float32))
    for layer in range(LAYERS):
        block = f"blk.{layer}."
        for norm in ("attn_norm", "post_attention_norm"):
            writer.add_tensor(f"{block}{norm}.weight", np.ones(HIDDEN, dtype=np.float32))
        if RECURRENT[layer]:
            writer.add_tensor(f"{block}ssm_conv1d.weight", random_array(rng, (DELTA_NET["attn_qkv"][0], CONV), np.float32, 0.3))
            writer.add_tensor(f"{block}ssm_dt.bias", np.ones(VALUE_HEADS, dtype=np.float32))
            writer.add_tensor(f"{block}ssm_a", -np.exp(rng.uniform(0.0, 2.7, VALUE_HEADS)).astype(np.float32))
            writer.add_tensor(f"{block}ssm_norm.weight", np.ones(STATE, dtype=np.float32))
        else:
            for norm in ("attn_q_norm", "attn_k_norm"):
                writer.add_tensor(f"{block}{norm}.weight", np.ones(HEAD_DIM, dtype=np.float32))
        for module, shape in ((DELTA_NET if RECURRENT[layer] else ATTENTION) | FEED_FORWARD).items():
            writer.add_tensor(f"{block}{module}.weight", random_array(rng, shape, np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def prepare(workdir: Path) -> tuple[Path, Path]:
    """The Q8_0 base and the bundle folder, written once into `workdir`."""
    workdir.mkdir(parents=True, exist_ok=True)
    base, bundle = workdir / "qwen3.5-0.8b-shape-q8_0.gguf", workdir / "bundle"
    if not base.is_file():
        f16 = workdir / "qwen3.5-0.8b-shape-f16.gguf"
        print(f"writing {f16} ...", flush=True)
        _write_f16_base(f16)
        print(f"quantizing to {base} ...", flush=True)
        quantize(f16, base, "Q8_0")  # as the official Qwen3.5 base was made
        f16.unlink()
    if not (bundle / "adapter.gguf").is_file():
        bundle.mkdir(exist_ok=True)
        meta = {"interpreter": "Qwen/Qwen3.5-0.8B", "program_id": "00000000000000000035", "spec": "benchmark program"}
        (bundle / "meta.json").write_text(json.dumps(meta), encoding="utf-8")
        (bundle / "prompt_template.txt").write_text(TEMPLATE.replace("<think>\n\n</think>\n\n", ""), encoding="utf-8")
        modules = [(DELTA_NET if RECURRENT[layer] else ATTENTION) | FEED_FORWARD for layer in range(LAYERS)]
        write_adapter(bundle / "adapter.gguf", "qwen35", modules)
    return base, bundle


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/pawfn-qwen35-shape"))
    parser.add_argument("--runs", type=int, default=5, help="timed calls per process, after a warm-up call")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--llamacpp-numerics", action="store_true", help="also time numerics='llamacpp' (slow)")
    args = parser.parse_args()
    base, bundle = prepare(args.workdir)
    modes = MODES | ({"torch llamacpp numerics": ["--numerics", "llamacpp"]} if args.llamacpp_numerics else {})
    rounds = [{mode: bench(base, bundle, flags, args.runs, args.threads) for mode, flags in modes.items()} for _ in range(args.rounds)]

    def value(figures: dict[str, object], key: str) -> float:
        return float(str(figures[key]))

    print(llama_cpp_build())
    print(f"input {INPUT!r}, 10 tokens a call, {args.runs} calls a process, {args.rounds} rounds")
    for mode in modes:
        call = statistics.median(value(r[mode], "median_ms") for r in rounds)
        ratio = statistics.median(value(r[mode], "median_ms") / value(r["llama.cpp"], "median_ms") for r in rounds)
        each = ", ".join(f"{value(r[mode], 'median_ms'):.0f}" for r in rounds)
        rss = statistics.median(value(r[mode], "peak_rss_mb") for r in rounds)
        rss_ratio = statistics.median(value(r[mode], "peak_rss_mb") / value(r["llama.cpp"], "peak_rss_mb") for r in rounds)
        print(f"{mode:24s} median call {call:8.1f} ms   {ratio:5.2f}x llama.cpp's   (rounds: {each} ms)   peak RSS {rss:6.0f} MiB {rss_ratio:5.2f}x")


if __name__ == "__main__":
    main()
