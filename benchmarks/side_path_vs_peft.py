"""pawfn's LoRA side path vs transformers + peft, on random weights with Qwen3-0.6B's exact shapes (CPU).

Prints per-token decode times and their ratio, measured in one run. Speed does not depend on weight values.

    python benchmarks/side_path_vs_peft.py [--threads 1] [--rank 64] [--prefix 289] [--prompt 25] [--tokens 16]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer, models

from pawfn.formats.adapter import LoraAdapter, LoraPair
from pawfn.formats.tokenizer import TextCodec
from pawfn.torch.model.families import Architecture
from pawfn.torch.model.families.qwen3 import Qwen3Family
from pawfn.torch.engine.network import TorchInterpreter
from pawfn.torch.weights.reader import BaseWeights

QWEN3_0_6B = Architecture(
    family="qwen3",
    vocab_size=151936,
    hidden_size=1024,
    n_layers=28,
    n_heads=16,
    n_kv_heads=8,
    head_dim=128,
    ffn_size=3072,
    norm_eps=1e-6,
    rope_theta=1000000.0,
    max_positions=40960,
)


def _best_ms_per_token(step: Callable[[int], None], tokens: int, repeats: int = 2) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        for index in range(tokens):
            step(index)
        best = min(best, (time.perf_counter() - started) * 1e3 / tokens)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rank", type=int, default=64)
    parser.add_argument("--prefix", type=int, default=289, help="cached prefix length in tokens")
    parser.add_argument("--prompt", type=int, default=25, help="input + suffix length in tokens")
    parser.add_argument("--tokens", type=int, default=16, help="decode steps timed")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from peft import LoraConfig, get_peft_model
    from transformers import DynamicCache, Qwen3Config, Qwen3ForCausalLM

    arch = QWEN3_0_6B
    config = Qwen3Config(
        vocab_size=arch.vocab_size,
        hidden_size=arch.hidden_size,
        intermediate_size=arch.ffn_size,
        num_hidden_layers=arch.n_layers,
        num_attention_heads=arch.n_heads,
        num_key_value_heads=arch.n_kv_heads,
        head_dim=arch.head_dim,
        max_position_embeddings=arch.max_positions,
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": arch.rope_theta},
    )
    torch.manual_seed(0)  # pyright: ignore[reportUnknownMemberType]  # torch leaves `seed` unannotated
    hf = Qwen3ForCausalLM(config).eval()
    state = {name: tensor.detach().float().numpy() for name, tensor in hf.state_dict().items()}

    def tensors() -> Iterator[tuple[str, np.ndarray]]:
        for name, array in state.items():
            gguf_name = Qwen3Family().gguf_name(name)
            if gguf_name:
                yield gguf_name, array

    codec = TextCodec(Tokenizer(models.BPE()), {}, 0, "benchmark")
    weights = BaseWeights(source=Path("random"), architecture=arch, family=Qwen3Family(), codec=codec, tensors=tensors)
    engine = TorchInterpreter.load(weights, torch.device("cpu"), torch.float32)

    rng = np.random.default_rng(0)
    pairs: dict[str, LoraPair] = {}
    shapes = {
        "attn_q": (2048, 1024),
        "attn_k": (1024, 1024),
        "attn_v": (1024, 1024),
        "attn_output": (1024, 2048),
        "ffn_gate": (3072, 1024),
        "ffn_up": (3072, 1024),
        "ffn_down": (1024, 3072),
    }
    for layer in range(arch.n_layers):
        for module, (out_f, in_f) in shapes.items():
            a = rng.normal(0, 0.02, (args.rank, in_f)).astype(np.float32)
            b = rng.normal(0, 0.02, (out_f, args.rank)).astype(np.float32)
            pairs[f"blk.{layer}.{module}.weight"] = LoraPair(a=a, b=b, scale=16.0 / args.rank)
    adapter = engine.attach(LoraAdapter(path=__import__("pathlib").Path("random"), alpha=16.0, pairs=pairs, tensor_types=frozenset({"F32"})))

    prefix = rng.integers(0, 1000, args.prefix).tolist()
    prompt = rng.integers(0, 1000, args.prompt).tolist()

    # pawfn: prefix evaluated once, then each call copies it in, evaluates the prompt and decodes.
    cache = engine.new_cache()
    with torch.inference_mode():
        state_prefix = engine.prefill_prefix(prefix, adapter, cache)
        cache.begin(state_prefix)
        engine.forward(prompt, args.prefix, cache, adapter)
        position = args.prefix + args.prompt

        def pawfn_step(index: int) -> None:
            engine.forward([7], position + index, cache, adapter)

        pawfn_ms = _best_ms_per_token(pawfn_step, args.tokens)
        started = time.perf_counter()
        cache.begin(state_prefix)
        engine.forward(prompt, args.prefix, cache, adapter)
        pawfn_prompt_ms = (time.perf_counter() - started) * 1e3

    # transformers + peft: the same adapter as an unmerged peft LoRA.
    lora = LoraConfig(r=args.rank, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    peft_model = get_peft_model(hf, lora)
    hf_names = {
        "attn_q": "self_attn.q_proj",
        "attn_k": "self_attn.k_proj",
        "attn_v": "self_attn.v_proj",
        "attn_output": "self_attn.o_proj",
        "ffn_gate": "mlp.gate_proj",
        "ffn_up": "mlp.up_proj",
        "ffn_down": "mlp.down_proj",
    }
    with torch.no_grad():
        for target, pair in pairs.items():
            _, layer_text, module, _ = target.split(".")
            path = f"base_model.model.model.layers.{layer_text}.{hf_names[module]}"
            peft_model.get_submodule(f"{path}.lora_A.default").weight.copy_(torch.as_tensor(pair.a))
            peft_model.get_submodule(f"{path}.lora_B.default").weight.copy_(torch.as_tensor(pair.b))
    with torch.inference_mode():
        hf_cache = DynamicCache(config=config)
        peft_model(input_ids=torch.tensor([prefix + prompt]), cache=hf_cache, use_cache=True)
        length = args.prefix + args.prompt

        def peft_step(index: int) -> None:
            peft_model(input_ids=torch.tensor([[7]]), cache=hf_cache, use_cache=True, position_ids=torch.tensor([[length + index]]))

        peft_ms = _best_ms_per_token(peft_step, args.tokens)

    print(f"threads={args.threads} rank={args.rank} prefix={args.prefix} prompt={args.prompt} decode steps={args.tokens}")
    print(f"pawfn side path     decode {pawfn_ms:8.1f} ms/token   prompt after cached prefix {pawfn_prompt_ms:7.1f} ms")
    print(f"transformers + peft decode {peft_ms:8.1f} ms/token")
    print(f"ratio peft / pawfn  {peft_ms / pawfn_ms:.2f}x")


if __name__ == "__main__":
    main()
