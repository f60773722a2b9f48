"""What every command shares: the options, the configuration and call options they make, inputs, output."""

from __future__ import annotations


import argparse
import json
import sys
import unicodedata
from importlib import metadata
from pathlib import Path
from typing import get_args


from pydantic import ValidationError

from ..core.backends import Backend, LlamaCpp, Remote, Torch
from ..core.config import PawConfig
from ..core.errors import OptionError, OptionProblem, describe_validation_error
from ..core.images import Image, ImageError
from ..api.function import PawFn
from ..core.grammar import ChoicesFormat, JsonSchemaFormat, JsonSchemaSpec, PatternFormat
from ..core.jsonio import parse_json_object
from ..core.models import InterpreterModel, builtin_models, model_for_interpreter
from ..core.options import DType, Numerics, RuntimeOptions, WeightDType


BACKENDS: dict[str, type[Backend]] = {Torch.name: Torch, LlamaCpp.name: LlamaCpp, Remote.name: Remote}


OPTION_FLAGS = {
    name: "--" + name.replace("_", "-")
    for name in (
        "offline",
        "api_url",
        "cache_dir",
        "device",
        "dtype",
        "n_ctx",
        "threads",
        "max_tokens",
        "temperature",
        "top_p",
        "seed",
        "max_model_copies",
        "max_batch_rows",
        "weight_dtype",
        "numerics",
        "llamacpp_kv_dtype",
        "batch_invariant",
        "server_url",
        "call_log",
    )
} | {"parse_special_in_input": "--parse-special"}


_BIDI_CONTROLS = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


class CliError(Exception):
    """A usage problem found after parsing (printed as one line, exit 2)."""


def escape_control(text: str) -> str:
    """`text` on one line: backslashes, control characters and bidi overrides as Python escapes (`\\n`, `\\x1b`)."""
    out: list[str] = []
    for char in text:
        if char == "\\":
            out.append("\\\\")
        elif unicodedata.category(char) == "Cc" or char in _BIDI_CONTROLS:
            out.append(repr(char)[1:-1] if char not in "\"'" else char)
        else:
            out.append(char)
    return "".join(out)


def common_options() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="print tracebacks on errors")
    common.add_argument(
        "--verbose",
        "-v",
        action="store_true",
        default=argparse.SUPPRESS,
        help="print pawfn's INFO log lines (what a load does, and how long it takes)",
    )
    common.add_argument("--offline", action="store_true", default=None, help="make no network request (PAW_OFFLINE)")
    common.add_argument("--api-url", metavar="URL", help="PAW API root (PAW_API_URL)")
    common.add_argument("--cache-dir", metavar="PATH", help="cache shared with the official SDK (PAW_CACHE_DIR)")
    return common


def engine_options() -> argparse.ArgumentParser:
    """Where and how programs run: what `run`, `bench` and `serve` share."""
    options = argparse.ArgumentParser(add_help=False)
    options.add_argument(
        "--backend",
        choices=sorted(BACKENDS),
        default="torch",
        help="torch (default), llamacpp, or remote (a pawfn server: --server-url, key in PAW_SERVER_API_KEY)",
    )
    options.add_argument("--server-url", metavar="URL", help="the server of --backend remote (PAW_SERVER_URL)")
    options.add_argument("--base", metavar="PATH", help="base weights: a GGUF file or a Hugging Face model folder")
    options.add_argument("--device", help="cpu, cuda, cuda:N or mps (default: cpu)")
    options.add_argument("--dtype", choices=get_args(DType), help="compute dtype (default: float32)")
    options.add_argument(
        "--weight-dtype",
        choices=get_args(WeightDType),
        help="compact base matrices on the CPU (Torch, torch's arithmetic): float16 (near-exact) or int8 (lossy; see docs/performance.md)",
    )
    options.add_argument(
        "--numerics",
        choices=get_args(Numerics),
        help="Torch: auto (default: llama.cpp's arithmetic on GGUF bases on the CPU, the official runtime's "
        "tokens; torch's elsewhere), llamacpp, or native (torch's arithmetic)",
    )
    options.add_argument(
        "--batch-invariant",
        choices=("auto", "on", "off"),
        help="Torch: calls decoded together each get their tokens alone (on: row-exact steps) or share batched "
        "products (off: faster on GPUs; tokens may differ); auto (default): on for the CPU, off for CUDA and MPS",
    )
    options.add_argument(
        "--llamacpp-kv-dtype", choices=get_args(DType), help="LlamaCpp: the KV cache's type (default: the official runtime's, float16)"
    )
    options.add_argument("--call-log", metavar="PATH", help="append one JSON line per call to PATH (PAW_CALL_LOG; docs/call-log.md)")
    options.add_argument("--n-ctx", type=int, metavar="N", help="context window in tokens (default: 2048)")
    options.add_argument(
        "--threads",
        type=int,
        metavar="N",
        help="CPU threads (default: Torch takes the cores other processes leave idle; LlamaCpp the official runtime's)",
    )
    return options


def program_options() -> argparse.ArgumentParser:
    """What `run` and `bench` share: the program, its inputs, and every option that changes how it runs."""
    options = argparse.ArgumentParser(add_help=False, parents=[engine_options()])
    what = options.add_mutually_exclusive_group(required=True)
    what.add_argument("--program", metavar="REF", help="program id, user/slug, slug@vN, .paw file or folder")
    what.add_argument("--interpreter", metavar="ID", help="no program: the bare interpreter (Qwen/Qwen3-0.6B, gpt2, Qwen/Qwen3.5-0.8B)")
    options.add_argument("--template", metavar="TEXT", help="with --interpreter: a numbered template ({INPUT_0}, {INPUT_1}, ...)")
    options.add_argument(
        "--arg",
        action="append",
        metavar="TEXT",
        help="one call's arguments, in slot order (repeatable; a numbered template: --template, or a program of the vision runtime)",
    )
    options.add_argument(
        "--image",
        action="append",
        dest="arg",
        type=_image_argument,
        metavar="PATH",
        help="an image argument, in slot order among the --arg values (an interpreter that takes images: Qwen3.5; Torch and LlamaCpp)",
    )
    options.add_argument("--input", action="append", default=[], metavar="TEXT", help="input text (repeatable)")
    options.add_argument("--input-file", metavar="PATH", help="inputs from a file, one per line (blank lines skipped); - reads stdin")
    options.add_argument(
        "--input-format",
        choices=("lines", "jsonl"),
        help='lines, or JSON Lines (each a JSON string or an object with an "input" string); default: jsonl for *.jsonl files, else lines',
    )
    options.add_argument("--temperature", type=float, default=0.0, metavar="T", help="0 is greedy (default: 0)")
    options.add_argument("--top-p", type=float, default=1.0, metavar="P", help="nucleus mass in (0, 1] (default: 1)")
    options.add_argument("--seed", type=int, metavar="S", help="sampling seed")
    options.add_argument("--parse-special", action="store_true", help="parse special-token text in inputs (the official SDK's behaviour)")
    return options


def version_text() -> str:
    return f"pawfn {metadata.version('pawfn')}"


def config_of(args: argparse.Namespace) -> PawConfig:
    overrides: dict[str, object] = {}
    names = (
        "offline",
        "api_url",
        "cache_dir",
        "device",
        "dtype",
        "weight_dtype",
        "numerics",
        "llamacpp_kv_dtype",
        "n_ctx",
        "threads",
        "max_model_copies",
        "max_batch_rows",
        "server_url",
        "call_log",
    )
    for name in names:
        value = getattr(args, name, None)
        if value is not None:
            overrides[name] = Path(value) if name in ("cache_dir", "call_log") else value
    invariant = getattr(args, "batch_invariant", None)
    if invariant in ("on", "off"):
        overrides["batch_invariant"] = invariant == "on"
    try:
        return PawConfig.from_sources(overrides, OPTION_FLAGS)
    except OptionError as exc:
        raise CliError(str(exc)) from exc


def options_of(args: argparse.Namespace) -> RuntimeOptions:
    try:
        return RuntimeOptions(
            max_tokens=args.max_tokens,
            temperature=args.temperature,
            top_p=args.top_p,
            seed=args.seed,
            parse_special_in_input=args.parse_special,
            response_format=response_format(args),
        )
    except OptionError as exc:
        raise CliError(str(exc.labeled(OPTION_FLAGS))) from exc


def response_format(args: argparse.Namespace) -> ChoicesFormat | PatternFormat | JsonSchemaFormat | None:
    """The output format `--choices`, `--pattern` or `--json-schema` asks for (at most one: argparse sees to that)."""
    choices: str | None = getattr(args, "choices", None)
    pattern: str | None = getattr(args, "pattern", None)
    schema_file: Path | None = getattr(args, "json_schema", None)
    try:
        if choices is not None:
            listed = tuple(choice.strip() for choice in choices.split(",") if choice.strip())
            if not listed:
                raise CliError(f"--choices {choices!r}: no choice in it; give the texts the output may be, comma-separated (--choices yes,no)")
            return ChoicesFormat(choices=listed)
        if pattern is not None:
            if not pattern:
                raise CliError("--pattern '': give the regular expression the output must match (--pattern '[0-9]+')")
            return PatternFormat(pattern=pattern)
        if schema_file is None:
            return None
        try:
            schema = json.loads(schema_file.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CliError(f"--json-schema {schema_file}: cannot read a JSON schema there ({exc})") from None
        if not isinstance(schema, dict):
            raise CliError(f"--json-schema {schema_file}: a JSON schema is an object, not {type(schema).__name__}")
        return JsonSchemaFormat(json_schema=JsonSchemaSpec.model_validate({"name": schema_file.stem, "schema": schema}))
    except ValidationError as exc:
        raise CliError(f"--choices/--pattern/--json-schema: {describe_validation_error(exc)}") from None


def positive(flag: str, value: int) -> None:
    """Refuse a count below 1 in the wording of every option error."""
    if value < 1:
        raise CliError(str(OptionError([OptionProblem.outside(flag, value, "an integer >= 1")])))


def _input_line(line: str, number: int, source: str, jsonl: bool) -> str:
    if not jsonl:
        return line
    parsed = parse_json_object(line) if line.lstrip().startswith("{") else None
    text: object = parsed.get("input") if parsed is not None else None
    if parsed is None:
        try:
            text = json.loads(line)
        except json.JSONDecodeError:
            text = None
    if not isinstance(text, str):
        raise CliError(f'{source}: line {number} is not a JSON string or an object with an "input" string')
    return text


def inputs_of(args: argparse.Namespace) -> list[str]:
    """--input values, then the lines of --input-file (or stdin for -), each checked to be valid text."""
    inputs: list[str] = list(args.input)
    if args.input_file is not None:
        source = "stdin" if args.input_file == "-" else args.input_file
        try:
            raw = sys.stdin.buffer.read() if args.input_file == "-" else Path(args.input_file).read_bytes()
            text = raw.decode("utf-8")
        except OSError as exc:
            raise CliError(f"--input-file {source}: cannot read it ({exc.strerror or exc})") from exc
        except UnicodeDecodeError as exc:
            raise CliError(f"--input-file {source}: not UTF-8 text (byte {exc.start}); convert it to UTF-8") from exc
        jsonl = (args.input_format or ("jsonl" if source.endswith(".jsonl") else "lines")) == "jsonl"
        for number, line in enumerate(text.splitlines(), start=1):
            if line.strip():
                inputs.append(_input_line(line, number, source, jsonl))
    if not inputs:
        raise CliError("no input: give --input TEXT (repeatable) or --input-file PATH (- for stdin)")
    for number, item in enumerate(inputs, start=1):
        try:
            item.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise CliError(f"input {number} is not valid text (undecodable bytes or a lone surrogate)") from exc
    return inputs


def print_json(data: object) -> None:
    print(json.dumps(data, ensure_ascii=False, default=str), flush=True)


def load_program(args: argparse.Namespace, config: PawConfig) -> PawFn[InterpreterModel, Backend]:
    """`--program` (with `--base`, if given) on `--backend`, with the interpreter its bundle names; or the bare
    `--interpreter` on its official template or `--template`."""
    base = None if args.base is None else Path(args.base)
    if args.interpreter is None:
        if args.template is not None:
            raise CliError("--template is for a bare interpreter: give --interpreter ID instead of --program (a program keeps its template)")
        return PawFn.load_any_sync(args.program, BACKENDS[args.backend], base=base, config=config)
    model = model_for_interpreter(args.interpreter)
    if model is None:
        raise CliError(f"--interpreter {args.interpreter!r}: pawfn knows {', '.join(m.interpreter_id for m in builtin_models())}")
    return PawFn.specialize(model, BACKENDS[args.backend]).bare(base=base, template=args.template, config=config)


def _image_argument(path: str) -> Image:
    """`--image PATH` as an image argument (read now: a missing or special file is a usage error)."""
    try:
        return Image(path)
    except ImageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
