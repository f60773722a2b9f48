"""Trained fixtures for judging numerics: a small Qwen3 and a small GPT-2 trained on real text until their
predictions are peaked like a real model's, each with a rank-32 LoRA program, written with llama.cpp's own
converters and quantizer as the official files are.

Random or barely trained weights flip on any rounding, so they cannot tell a faithful mode from a sloppy one; these
can. The text is Python's own documentation (`pydoc_data.topics`, shipped with Python); the tokenizer is a
byte-level BPE trained on it. Per family, under --out:

    base-f32.gguf, base-q8_0.gguf, base-q6_k.gguf   llama.cpp's convert_hf_to_gguf.py, then llama_model_quantize
    adapter-f32.gguf                                 llama.cpp's convert_lora_to_gguf.py from the peft adapter
    program/                                         a bundle whose adapter is that one in Q4_0 (as PAW ships)
and manifest.json: how they were made (versions, seeds, steps, losses, peakedness), the fidelity inputs and every
file's sha256. llama.cpp's converters come from the sdist of the installed llama-cpp-python (downloaded from PyPI
unless --llama-cpp-source names its vendor/llama.cpp folder). Another --seed makes a model the tests do not contain.

    python scripts/make_trained_fixtures.py [--out tests/fixtures/trained] [--seed 0] [--base-steps 2000]
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import math
import random
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch
from pydoc_data.topics import topics
from tokenizers import Tokenizer

REPOSITORY = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPOSITORY))
from pawfn.llamacpp.cpu import llama_cpp_system_info  # noqa: E402  (after the path is set)
from tests.helpers.references import llama_generate_each, llama_quantize  # noqa: E402
from tests.helpers.tiny_models import train_tokenizer, write_bundle  # noqa: E402

VOCAB_SIZE = 1536
WINDOW, BATCH = 128, 16
RANK, ALPHA = 32, 32
FIDELITY_INPUTS = 16
TEMPLATES = {
    "qwen3": (
        "<|im_start|>user\nContinue this passage of the Python documentation.\n\n[INPUT]\n{INPUT_PLACEHOLDER}\n"
        "[END_INPUT]<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    ),
    "gpt2": "Continue this passage of the Python documentation.\nInput: {INPUT_PLACEHOLDER}\nOutput:",
}
EOS = {"qwen3": "<|im_end|>", "gpt2": "<|endoftext|>"}
INTERPRETERS = {"qwen3": "Qwen/Qwen3-0.6B", "gpt2": "gpt2"}
PRE_TOKENIZERS = {"qwen3": "qwen2", "gpt2": "gpt-2"}  # llama.cpp's names for the two split rules


def corpus() -> tuple[list[str], list[str]]:
    """The documentation's topics: (training texts, held-out texts for the fidelity inputs), split by topic."""
    names = sorted(topics)
    held_out = set(names[3::13])
    return [topics[n] for n in names if n not in held_out], [topics[n] for n in names if n in held_out]


def new_model(family: str, tokenizer: Tokenizer) -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel, Qwen3Config, Qwen3ForCausalLM

    eos = tokenizer.token_to_id(EOS[family])
    if family == "qwen3":
        return Qwen3ForCausalLM(
            Qwen3Config(
                vocab_size=tokenizer.get_vocab_size(),
                hidden_size=256,
                intermediate_size=768,
                num_hidden_layers=4,
                num_attention_heads=4,
                num_key_value_heads=2,
                head_dim=64,
                max_position_embeddings=2048,
                rms_norm_eps=1e-6,
                rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                tie_word_embeddings=True,
                bos_token_id=tokenizer.token_to_id("<|endoftext|>"),
                eos_token_id=eos,
            )
        )
    return GPT2LMHeadModel(
        GPT2Config(
            vocab_size=tokenizer.get_vocab_size(), n_embd=256, n_layer=4, n_head=4, n_positions=1024, n_ctx=1024, bos_token_id=eos, eos_token_id=eos
        )
    )


def _schedule(step: int, steps: int, peak: float) -> float:
    """Linear warm-up over 100 steps, then cosine decay to a tenth of `peak`."""
    if step < 100:
        return peak * (step + 1) / 100
    progress = (step - 100) / max(1, steps - 100)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def train_base(model: torch.nn.Module, ids: list[int], steps: int, seed: int) -> list[float]:
    """AdamW on random windows of the corpus; the loss every 100 steps."""
    data = torch.tensor(ids, dtype=torch.long)
    rng = random.Random(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    losses: list[float] = []
    model.train()
    for step in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = _schedule(step, steps, 1e-3)
        starts = [rng.randrange(0, len(ids) - WINDOW - 1) for _ in range(BATCH)]
        batch = torch.stack([data[s : s + WINDOW] for s in starts])
        loss = model(input_ids=batch, labels=batch).loss
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step % 100 == 99 or step == steps - 1:
            losses.append(round(loss.item(), 4))
            print(f"  base step {step + 1}/{steps}: loss {loss.item():.3f}", flush=True)
    model.eval()
    return losses


def task_examples(tokenizer: Tokenizer, family: str, texts: list[str], count: int, seed: int) -> list[tuple[str, str]]:
    """(input, continuation) pairs: a passage of 12-40 words and the ~32 tokens that follow it."""
    rng = random.Random(seed)
    pairs: list[tuple[str, str]] = []
    while len(pairs) < count:
        words = rng.choice(texts).split()
        if len(words) < 120:
            continue
        start = rng.randrange(0, len(words) - 100)
        length = rng.randrange(12, 40)
        passage = " ".join(words[start : start + length])
        follow = tokenizer.encode(" " + " ".join(words[start + length : start + length + 60])).ids[:32]
        pairs.append((passage, tokenizer.decode(follow).strip()))
    return pairs


def _prompt_ids(tokenizer: Tokenizer, family: str, text: str) -> list[int]:
    """The official runtime's ids: prefix, then input + suffix, each tokenized with special tokens parsed."""
    prefix, suffix = TEMPLATES[family].split("{INPUT_PLACEHOLDER}")
    return tokenizer.encode(prefix, add_special_tokens=False).ids + tokenizer.encode(text + suffix, add_special_tokens=False).ids


def train_program(
    model: torch.nn.Module, tokenizer: Tokenizer, family: str, pairs: list[tuple[str, str]], steps: int, seed: int
) -> tuple[torch.nn.Module, list[float]]:
    """A rank-32 LoRA on every projection, trained to continue the passage after the template (loss on the answer)."""
    from peft import LoraConfig, get_peft_model

    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"] if family == "qwen3" else ["c_attn", "c_proj", "c_fc"]
    config = LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=targets, lora_dropout=0.0, fan_in_fan_out=family == "gpt2")
    program = get_peft_model(model, config)
    eos = tokenizer.token_to_id(EOS[family])
    rows = []
    for passage, follow in pairs:
        prompt = _prompt_ids(tokenizer, family, passage)
        answer = tokenizer.encode((" " if family == "gpt2" else "") + follow).ids + [eos]
        rows.append((prompt + answer, len(prompt)))
    rng = random.Random(seed)
    optimizer = torch.optim.AdamW([p for p in program.parameters() if p.requires_grad], lr=2e-3)
    losses: list[float] = []
    program.train()
    for step in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = _schedule(step, steps, 2e-3)
        chosen = [rng.choice(rows) for _ in range(BATCH)]
        width = max(len(ids) for ids, _ in chosen)
        inputs = torch.full((BATCH, width), eos, dtype=torch.long)
        labels = torch.full((BATCH, width), -100, dtype=torch.long)
        for row, (ids, answer_start) in enumerate(chosen):
            inputs[row, : len(ids)] = torch.tensor(ids)
            labels[row, answer_start : len(ids)] = torch.tensor(ids[answer_start:])
        loss = program(input_ids=inputs, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 50 == 49 or step == steps - 1:
            losses.append(round(loss.item(), 4))
            print(f"  program step {step + 1}/{steps}: loss {loss.item():.3f}", flush=True)
    program.eval()
    return program, losses


@torch.no_grad()
def greedy(program: torch.nn.Module, tokenizer: Tokenizer, family: str, inputs: list[str]) -> tuple[list[list[int]], float]:
    """32 greedy tokens per input (float32, transformers + peft) and the mean probability of the tokens taken."""
    eos = tokenizer.token_to_id(EOS[family])
    tops: list[float] = []
    sequences: list[list[int]] = []
    for text in inputs:
        ids = _prompt_ids(tokenizer, family, text)
        sequence: list[int] = []
        for _ in range(32):
            probabilities = torch.softmax(program(input_ids=torch.tensor([ids])).logits[0, -1].float(), dim=-1)
            top = int(probabilities.argmax())
            tops.append(float(probabilities[top]))
            if top == eos:
                break
            ids.append(top)
            sequence.append(top)
        sequences.append(sequence)
    return sequences, round(float(np.mean(tops)), 4)


def llama_cpp_source(given: Path | None, workdir: Path) -> Path:
    """llama.cpp's sources (for its converters): `given`, else the installed llama-cpp-python's sdist from PyPI."""
    if given is not None:
        return given
    version = importlib.metadata.version("llama-cpp-python")
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:", f"llama-cpp-python=={version}", "-d", str(workdir)],
        check=True,
    )
    archive = next(workdir.glob("llama_cpp_python-*.tar.gz"))
    with tarfile.open(archive) as tar:
        tar.extractall(workdir, filter="data")
    return workdir / archive.name.removesuffix(".tar.gz") / "vendor" / "llama.cpp"


# Three fixes to llama.cpp's converters, applied by this bootstrap: they recognize a BPE pre-tokenizer by hashing
# its output on a probe text, and a tokenizer trained here is in no table, so it names the split rule the tokenizer
# was trained with; it skips Qwen's SentencePiece attempt (which needs the sentencepiece package for nothing); and
# GPT-2's tensor hook transposes HF's Conv1D weights, which convert_lora_to_gguf.py also applies to peft's LoRA
# matrices, already in Linear orientation ([r, in], [out, r]): those pass through as they are.
_CONVERT = """
import sys
source, pre_tokenizer = sys.argv[1], sys.argv[2]
sys.path.insert(0, source)
import conversion
from conversion.base import TextModel
TextModel.get_vocab_base_pre = lambda self, tokenizer: pre_tokenizer
from conversion.qwen import Qwen2Model
Qwen2Model.set_vocab = lambda self: self._set_vocab_gpt2()
from conversion.gpt2 import GPT2Model
conv1d_hook = GPT2Model.modify_tensors
def gpt2_tensors(self, data_torch, name, bid):
    if type(data_torch).__name__ != "LoraTorchTensor":
        return conv1d_hook(self, data_torch, name, bid)
    return TextModel.modify_tensors(self, data_torch, self.map_tensor_name(name), bid)
GPT2Model.modify_tensors = gpt2_tensors
import runpy
sys.argv = [sys.argv[3], *sys.argv[4:]]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def convert(source: Path, family: str, script: str, arguments: list[str]) -> None:
    subprocess.run([sys.executable, "-c", _CONVERT, str(source), PRE_TOKENIZERS[family], str(source / script), *arguments], check=True)


def requantize_adapter(source: Path, destination: Path, qtype: gguf.GGMLQuantizationType) -> None:
    """The F32 adapter with every LoRA matrix in `qtype` (gguf-py's port of llama.cpp's reference quantizer) and
    its metadata as the converter wrote it."""
    reader = gguf.GGUFReader(source)
    architecture = reader.get_field("general.architecture")
    assert architecture is not None
    writer = gguf.GGUFWriter(str(destination), str(architecture.contents()))
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        sub_type = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), field.types[0], sub_type=sub_type)
    for tensor in reader.tensors:
        array = np.asarray(tensor.data, dtype=np.float32).reshape([int(d) for d in reversed(tensor.shape)])
        writer.add_tensor(tensor.name, gguf.quants.quantize(array, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def make_family(
    family: str, out: Path, source: Path, seed: int, base_steps: int, program_steps: int, work: Path
) -> dict[str, Any]:  # Any: the manifest's JSON facts (numbers, lists, strings)
    started = time.perf_counter()
    train_texts, held_out = corpus()
    torch.manual_seed(seed)
    tokenizer = train_tokenizer(family, train_texts, VOCAB_SIZE - (2 if family == "qwen3" else 0))  # + 2 think tags
    ids = tokenizer.encode("\n\n".join(train_texts)).ids  # held-out topics stay unseen: inputs are new text
    model = new_model(family, tokenizer)
    parameters = sum(p.numel() for p in model.parameters())
    print(f"{family}: {parameters} parameters, {len(ids)} tokens of text", flush=True)
    base_losses = train_base(model, ids, base_steps, seed)
    hf_dir = work / f"{family}-hf"
    model.save_pretrained(str(hf_dir))
    tokenizer.save(str(hf_dir / "tokenizer.json"))
    (hf_dir / "tokenizer_config.json").write_text(json.dumps({"eos_token": EOS[family], "tokenizer_class": "PreTrainedTokenizerFast"}))
    pairs = task_examples(tokenizer, family, train_texts, 2000, seed + 1)
    inputs = [passage for passage, _ in task_examples(tokenizer, family, held_out, FIDELITY_INPUTS, seed + 2)]
    program, program_losses = train_program(model, tokenizer, family, pairs, program_steps, seed + 3)
    reference, peak = greedy(program, tokenizer, family, inputs)
    lora_dir = work / f"{family}-lora"
    program.save_pretrained(str(lora_dir))

    folder = out / family
    folder.mkdir(parents=True, exist_ok=True)
    convert(source, family, "convert_hf_to_gguf.py", [str(hf_dir), "--outfile", str(folder / "base-f32.gguf"), "--outtype", "f32"])
    for ftype in ("Q8_0", "Q6_K"):
        llama_quantize(folder / "base-f32.gguf", folder / f"base-{ftype.lower()}.gguf", ftype)
    convert(
        source,
        family,
        "convert_lora_to_gguf.py",
        ["--base", str(hf_dir), "--outfile", str(folder / "adapter-f32.gguf"), "--outtype", "f32", str(lora_dir)],
    )
    adapter_q4 = work / f"{family}-adapter-q4_0.gguf"
    requantize_adapter(folder / "adapter-f32.gguf", adapter_q4, gguf.GGMLQuantizationType.Q4_0)
    # The converted files hold the trained model: llama.cpp on them gives transformers + peft's tokens.
    converted = llama_generate_each(folder / "base-f32.gguf", folder / "adapter-f32.gguf", TEMPLATES[family], inputs, 32, kv="f32")
    agreeing = sum(a == b for a, b in zip(converted, reference, strict=True))
    print(f"  llama.cpp on the F32 files: {agreeing}/{len(inputs)} sequences equal to transformers + peft", flush=True)
    write_bundle(
        folder / "program",
        adapter_q4,
        INTERPRETERS[family],
        TEMPLATES[family],
        {"program_id": f"trained{family}{seed:04d}".ljust(20, "0")[:20], "spec": "Continue a passage of the Python documentation."},
    )
    return {
        "parameters": parameters,
        "vocab_size": tokenizer.get_vocab_size(),
        "corpus_tokens": len(ids),
        "base_steps": base_steps,
        "base_losses_every_100_steps": base_losses,
        "program_steps": program_steps,
        "program_losses_every_50_steps": program_losses,
        "lora_rank": RANK,
        "lora_alpha": ALPHA,
        "mean_greedy_probability": peak,
        "llama_cpp_f32_equal_to_peft": f"{agreeing}/{len(inputs)}",
        "inputs": inputs,
        "template": TEMPLATES[family],
        "seconds": round(time.perf_counter() - started),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=REPOSITORY / "tests" / "fixtures" / "trained")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--base-steps", type=int, default=2000)
    parser.add_argument("--program-steps", type=int, default=300)
    parser.add_argument("--families", nargs="+", default=["qwen3", "gpt2"], choices=["qwen3", "gpt2"])
    parser.add_argument("--llama-cpp-source", type=Path, help="llama.cpp's source folder (vendor/llama.cpp of the sdist)")
    args = parser.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    with tempfile.TemporaryDirectory(prefix="pawfn-fixtures-") as temporary:
        work = Path(temporary)
        source = llama_cpp_source(args.llama_cpp_source, work)
        families = {family: make_family(family, args.out, source, args.seed, args.base_steps, args.program_steps, work) for family in args.families}
    files = sorted(path for path in args.out.rglob("*") if path.is_file() and path.name != "manifest.json")
    manifest = {
        "made_by": f"python scripts/make_trained_fixtures.py --seed {args.seed} --base-steps {args.base_steps} --program-steps {args.program_steps}",
        "seed": args.seed,
        "text": "pydoc_data.topics (Python's documentation topics); the fidelity inputs come from topics held out of all training",
        "versions": {name: importlib.metadata.version(name) for name in ("torch", "transformers", "peft", "tokenizers", "gguf", "llama-cpp-python")},
        "llama_cpp": llama_cpp_system_info(),
        "families": families,
        "sha256": {str(path.relative_to(args.out)): hashlib.sha256(path.read_bytes()).hexdigest() for path in files},
    }
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    print(f"wrote {args.out}: {sum(p.stat().st_size for p in files) / 1e6:.1f} MB in {len(files)} files")


if __name__ == "__main__":
    main()
