"""`pawfn run`: text and JSON Lines output, one-line errors with a non-zero exit, tracebacks only with --debug."""

from __future__ import annotations

import ctypes
import json
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.helpers.programs import TinyProgram
from pawfn import PawConfig, PawFn, Positional, Qwen3_0_6B, RuntimeOptions, Torch
from pawfn.torch.engine.compute import on_compute_thread, set_threads
from pawfn.cli import escape_control, main
from tests.helpers.programs import requires_llama_cpp
from tests.helpers.tiny_models import TinyInterpreter


def _expected(program: TinyProgram, text: str, max_tokens: int) -> tuple[str, tuple[int, ...]]:
    with PawFn[Qwen3_0_6B, Torch].load_sync(program.folder, base=program.interpreter.gguf_path, config=PawConfig()) as f:
        generation = f.generate(text, RuntimeOptions(max_tokens=max_tokens))
    return generation.text, generation.token_ids


def test_text_output(qwen3_program: TinyProgram, capsys: pytest.CaptureFixture[str]) -> None:
    base = str(qwen3_program.interpreter.gguf_path)
    status = main(
        [
            "run",
            "--program",
            str(qwen3_program.archive),
            "--base",
            base,
            "--input",
            "hello",
            "--input",
            "Urgent: the server is down!",
            "--max-tokens",
            "8",
        ]
    )
    out = capsys.readouterr().out
    assert status == 0
    expected = [_expected(qwen3_program, text, 8)[0] for text in ("hello", "Urgent: the server is down!")]
    assert out.split("\n")[:3] == [escape_control(text) for text in expected] + [""]


def test_json_lines(gpt2_program: TinyProgram, capsys: pytest.CaptureFixture[str]) -> None:
    base = str(gpt2_program.interpreter.hf_dir)
    threads = on_compute_thread(torch.get_num_threads)
    status = main(
        [
            "run",
            "--program",
            str(gpt2_program.folder),
            "--base",
            base,
            "--input",
            "a",
            "--input",
            "b c",
            "--max-tokens",
            "6",
            "--json",
            "--threads",
            "1",
        ]
    )
    assert on_compute_thread(torch.get_num_threads) == 1  # the thread that computes
    set_threads(threads)
    lines = capsys.readouterr().out.strip().split("\n")
    assert status == 0 and len(lines) == 2
    records = [json.loads(line) for line in lines]
    assert [r["input"] for r in records] == ["a", "b c"]
    for record in records:
        assert record["program"] == "0123456789abcdef0123"
        assert record["interpreter"] == "gpt2"
        assert len(record["tokens"]) == 6 and record["stop_reason"] == "max_tokens"
        assert record["numerics"] == "native"  # a Hugging Face folder: torch's float32 arithmetic
        assert isinstance(record["output"], str)
        assert set(record["timings"]) == {"tokenize_ms", "prompt_ms", "generate_ms", "total_ms"}


def test_batch_size_decodes_inputs_together_in_input_order(qwen3_program: TinyProgram, capsys: pytest.CaptureFixture[str]) -> None:
    texts = ["hello", "Urgent: the server is down!", "a", "numbers 1 2 3", "x"]
    argv = [
        "run",
        "--program",
        str(qwen3_program.folder),
        "--base",
        str(qwen3_program.interpreter.gguf_path),
        "--max-tokens",
        "6",
        "--json",
        "--batch-size",
        "2",
    ]
    for text in texts:
        argv += ["--input", text]
    assert main(argv) == 0
    records = _records(capsys)
    assert [record["input"] for record in records] == texts
    assert [tuple(record["tokens"]) for record in records] == [_expected(qwen3_program, text, 6)[1] for text in texts]  # type: ignore[arg-type]  # JSON list of ints


@pytest.mark.parametrize(
    ("args", "message", "status"),
    [
        (["--program", "{missing}"], "no such bundle", 1),
        (["--program", "./missing"], "no such bundle: ./missing; pass a .paw file, a bundle folder", 1),
        (["--program", "../missing-folder"], "no such bundle: ../missing-folder", 1),
        (["--program", "{program}", "--base", "{missing}"], "base weights not found", 1),
        (["--program", "{program}", "--temperature", "-1"], "invalid --temperature=-1.0: expected a finite number >= 0", 2),
        (["--program", "{program}", "--device", "tpu"], "invalid --device='tpu': expected one of 'cpu', 'mps', 'cuda'", 2),
        (["--program", "{program}", "--input-file", "{missing}"], "--input-file {missing}: cannot read it", 2),
        (["--program", "{program}", "--n-ctx", "8"], "context overflow", 1),
        (["--program", "{program}", "--batch-size", "0"], "invalid --batch-size=0: expected an integer >= 1", 2),
    ],
)
def test_errors_are_one_line(
    qwen3_program: TinyProgram, tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str, status: int
) -> None:
    values = {"program": str(qwen3_program.folder), "missing": str(tmp_path / "missing.paw")}
    argv = ["run", "--input", "x", "--base", str(qwen3_program.interpreter.gguf_path)]
    argv += [a.format(**values) for a in args]
    assert main(argv) == status
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and captured.err.startswith("pawfn: error: ")
    assert message.format(**values) in captured.err
    assert "Traceback" not in captured.err


def test_debug_prints_the_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--debug", "run", "--program", str(tmp_path / "missing"), "--input", "x"]) == 1
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and err.rstrip().endswith("pass a .paw file, a bundle folder, a program id or a slug")


def test_console_script_runs(qwen3_program: TinyProgram) -> None:
    """The installed `pawfn` entry point (python -m pawfn) works end to end in a fresh process."""
    base = str(qwen3_program.interpreter.gguf_path)
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pawfn",
            "run",
            "--program",
            str(qwen3_program.folder),
            "--base",
            base,
            "--input",
            "hello",
            "--max-tokens",
            "5",
            "--json",
        ],
        capture_output=True,
        text=True,
        check=False,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout)
    assert tuple(record["tokens"]) == _expected(qwen3_program, "hello", 5)[1]


def test_usage_error_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["run", "--input", "x"])
    assert info.value.code == 2
    assert "--program" in capsys.readouterr().err


def test_escape_control_keeps_each_output_on_one_line() -> None:
    assert escape_control("a\nb\tc\x1b[31m\u202eevil\\n") == "a\\nb\\tc\\x1b[31m\\u202eevil\\\\n"
    assert escape_control("café ✓ \"q\" 'q'") == "café ✓ \"q\" 'q'"


def _records(capsys: pytest.CaptureFixture[str]) -> list[dict[str, object]]:
    return [json.loads(line) for line in capsys.readouterr().out.strip().split("\n")]


def test_input_file_lines_and_jsonl(qwen3_program: TinyProgram, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = str(qwen3_program.interpreter.gguf_path)
    lines = tmp_path / "inputs.txt"
    lines.write_text("hello\n\nUrgent: the server is down!\n", encoding="utf-8")
    jsonl = tmp_path / "inputs.jsonl"
    jsonl.write_text('"hello"\n{"input": "Urgent: the server is down!", "id": 7}\n', encoding="utf-8")
    for path in (lines, jsonl):
        argv = ["run", "--program", str(qwen3_program.folder), "--base", base, "--input-file", str(path)]
        assert main([*argv, "--max-tokens", "4", "--json"]) == 0
        records = _records(capsys)
        assert [r["input"] for r in records] == ["hello", "Urgent: the server is down!"]
        assert records[0]["tokens"] == list(_expected(qwen3_program, "hello", 4)[1])


def test_input_from_stdin(qwen3_program: TinyProgram, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO("a b\nhello\n".encode())))
    argv = ["run", "--program", str(qwen3_program.folder), "--base", str(qwen3_program.interpreter.gguf_path)]
    assert main([*argv, "--input", "first", "--input-file", "-", "--max-tokens", "3", "--json"]) == 0
    assert [r["input"] for r in _records(capsys)] == ["first", "a b", "hello"]


@pytest.mark.parametrize(
    ("content", "message"), [(b'"ok"\n42\n', "stdin: line 2 is not a JSON string or an object"), (b"\xff\xfe", "stdin: not UTF-8 text")]
)
def test_bad_input_files_are_usage_errors(
    qwen3_program: TinyProgram, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, content: bytes, message: str
) -> None:
    import io

    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(content)))
    argv = ["run", "--program", str(qwen3_program.folder), "--base", str(qwen3_program.interpreter.gguf_path)]
    assert main([*argv, "--input-file", "-", "--input-format", "jsonl"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pawfn: error: ") and message in err and err.count("\n") == 1


def test_no_input_is_a_usage_error(qwen3_program: TinyProgram, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--program", str(qwen3_program.folder)]) == 2
    assert "no input: give --input TEXT" in capsys.readouterr().err


@requires_llama_cpp
def test_backend_llamacpp_gives_the_torch_tokens(gpt2_program: TinyProgram, capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "run",
        "--program",
        str(gpt2_program.folder),
        "--base",
        str(gpt2_program.interpreter.gguf_path),
        "--input",
        "hello",
        "--max-tokens",
        "6",
        "--json",
    ]
    assert main([*argv, "--backend", "llamacpp"]) == 0
    llama = _records(capsys)
    assert main([*argv, "--backend", "torch"]) == 0
    assert llama[0]["tokens"] == _records(capsys)[0]["tokens"] and llama[0]["stop_reason"] == "max_tokens"


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("PAW_DTYPE", "fp16", "invalid PAW_DTYPE='fp16': expected one of 'float32', 'bfloat16', 'float16'"),
        ("PAW_N_CTX", "big", "invalid PAW_N_CTX='big': expected an integer > 0"),
        ("PAW_API_URL", "ftp://x", "invalid PAW_API_URL='ftp://x': api_url must be an http(s) URL"),
    ],
)
def test_option_errors_name_the_environment_variable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, variable: str, value: str, message: str
) -> None:
    monkeypatch.setenv(variable, value)
    assert main(["cache", "list", "--cache-dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"pawfn: error: {message}\n"


def test_cache_list_says_when_empty(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cache", "list", "--cache-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out == f"no programs in the cache ({tmp_path}); `pawfn cache prepare REF` fetches one\n"


def test_mismatch_names_the_model_class(gpt2_program: TinyProgram) -> None:
    from pawfn import InterpreterMismatchError

    with pytest.raises(InterpreterMismatchError, match=r"load it as PawFn\[GPT2, \.\.\.\] instead"):
        PawFn[Qwen3_0_6B, Torch].load_sync(gpt2_program.folder, base=gpt2_program.interpreter.gguf_path)


STOPPING = "pawfn: interrupted; stopping (Ctrl-C again quits at once)"
"""The one line the first Ctrl-C prints, at once."""


def _send_sigint_to_a_worker_thread(pid: int) -> None:
    """SIGINT to one of `pid`'s threads other than the main one, as the kernel may choose for a process's signal."""
    tids = sorted(int(task) for task in os.listdir(f"/proc/{pid}/task") if int(task) != pid)
    tgkill = {"x86_64": 234, "aarch64": 131}[platform.machine()]
    if ctypes.CDLL(None, use_errno=True).syscall(tgkill, pid, tids[0], signal.SIGINT) != 0:
        raise OSError(ctypes.get_errno(), "tgkill failed")


@pytest.mark.parametrize("receiver", ["process", "worker thread"])
def test_ctrl_c_stops_the_running_call_at_its_next_token(qwen3_program: TinyProgram, tmp_path: Path, receiver: str) -> None:
    """SIGINT while a call decodes: exit 130 with one line, the call cancelled rather than decoded to its end. Two
    inputs one at a time, each to the end of the context (~2,000 tokens): the signal comes as soon as the first is
    printed, so the second has just started; it must end in a fraction of the first one's time. The kernel may hand a
    process's signal to any thread (CI's did: the main thread saw it only when the call had ended), so the signal
    also goes to a worker thread."""
    if receiver == "worker thread" and (not Path("/proc/self/task").is_dir() or platform.machine() not in ("x86_64", "aarch64")):
        pytest.skip("sending a signal to one thread needs Linux's tgkill")
    inputs = tmp_path / "inputs.txt"
    inputs.write_text("hello\nUrgent: the server is down!\n")
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pawfn",
            "run",
            "--program",
            str(qwen3_program.folder),
            "--base",
            str(qwen3_program.interpreter.gguf_path),
            "--input-file",
            str(inputs),
            "--batch-size",
            "1",
            "--json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert process.stdout is not None
    first = json.loads(process.stdout.readline())
    if receiver == "process":
        process.send_signal(signal.SIGINT)
    else:
        _send_sigint_to_a_worker_thread(process.pid)
    sent = time.monotonic()
    out, err = process.communicate(timeout=300)
    stopped_s = time.monotonic() - sent
    first_call_s = first["timings"]["total_ms"] / 1000
    assert process.returncode == 130 and err.strip().splitlines()[-1] == STOPPING, err
    assert "Traceback" not in err and out == ""
    assert len(first["tokens"]) > 1000  # the call the signal cut short would have been as long
    assert stopped_s < max(0.5, first_call_s / 3), (stopped_s, first_call_s)


def test_ctrl_c_stops_a_long_prompt_within_one_pass(qwen3_program: TinyProgram, tmp_path: Path) -> None:
    """SIGINT a second into a ~24k-token prompt (16 s alone on this tiny model here): one line at once, and exit 130
    within a second, or half the time the process took to start, load and answer the short input first where the
    machine is busy (the process once waited for the whole prompt). That short input marks the load's end: the long
    prompt starts as soon as its line is printed."""
    words = ["alpha", "beta", "gamma", "server", "down", "urgent", "hello", "word"]
    long_text = " ".join(words[(i * 7 + i // 3) % len(words)] for i in range(6500))
    inputs = tmp_path / "inputs.txt"
    inputs.write_text(f"hello\n{long_text}\n")
    base = str(qwen3_program.interpreter.gguf_path)
    command = [sys.executable, "-m", "pawfn", "run", "--program", str(qwen3_program.folder), "--base", base, "--input-file", str(inputs)]
    command += ["--batch-size", "1", "--n-ctx", "32768", "--max-tokens", "1"]
    started = time.monotonic()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONWARNINGS="ignore"))
    assert process.stdout is not None
    process.stdout.readline()
    ready_s = time.monotonic() - started  # the machine's pace in this run: a process's start, a load and a short call
    time.sleep(1.0)
    process.send_signal(signal.SIGINT)
    sent = time.monotonic()
    out, err = process.communicate(timeout=300)
    stopped_s = time.monotonic() - sent
    assert process.returncode == 130 and err.strip().splitlines() == [STOPPING], err
    assert out == ""
    assert stopped_s < max(1.0, ready_s / 2), (stopped_s, ready_s)  # a busy machine slows both


def test_option_errors_read_the_same_from_the_api_and_the_cli(qwen3_program: TinyProgram, capsys: pytest.CaptureFixture[str]) -> None:
    from pawfn import OptionError, RuntimeOptions

    with pytest.raises(OptionError) as raised:
        RuntimeOptions(top_p=2.0, seed=-1)
    argv = ["run", "--program", str(qwen3_program.folder), "--input", "x", "--top-p", "2", "--seed", "-1"]
    assert main(argv) == 2
    expected = raised.value.labeled({"top_p": "--top-p", "seed": "--seed"})
    assert capsys.readouterr().err == f"pawfn: error: {expected}\n"
    assert str(expected) == ("invalid --top-p=2.0: expected a finite number in (0, 1]; invalid --seed=-1: expected an integer in [0, 2**64), or None")


def test_typed_output_flags(qwen3_program: TinyProgram, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--choices`, `--pattern` and `--json-schema` constrain the output; one that cannot finish is a one-line error."""
    run = ["run", "--program", str(qwen3_program.archive), "--base", str(qwen3_program.interpreter.gguf_path), "--input", "hello", "--input", "x"]
    assert main([*run, "--choices", "yes, no,maybe"]) == 0
    assert set(capsys.readouterr().out.split()) <= {"yes", "no", "maybe"}
    assert main([*run, "--pattern", "[0-9]{3}"]) == 0
    assert all(len(line) == 3 and line.isdigit() for line in capsys.readouterr().out.split())
    schema = tmp_path / "answer.json"
    schema.write_text(
        json.dumps({"type": "object", "properties": {"kind": {"enum": ["a", "b"]}, "n": {"type": "integer"}}, "required": ["kind", "n"]})
    )
    assert main([*run, "--json-schema", str(schema), "--max-tokens", "64", "--json"]) == 0
    for line in capsys.readouterr().out.strip().split("\n"):
        value = json.loads(json.loads(line)["output"])
        assert value["kind"] in ("a", "b") and isinstance(value["n"], int)
    assert main([*run, "--json-schema", str(schema), "--max-tokens", "2"]) == 1
    assert capsys.readouterr().err.startswith("pawfn: error: the output is not a JSON value of the schema 'answer': no value finished within 2")
    assert main([*run, "--json-schema", str(tmp_path / "missing.json")]) == 2
    assert "--json-schema" in capsys.readouterr().err
    schema.write_text(json.dumps({"type": "object", "additionalProperties": True}))
    assert main([*run, "--json-schema", str(schema)]) == 1
    assert "additional properties" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("schema", "problem"),
    [
        ({"type": "integer", "enum": ["a"]}, 'enum at \'root\' holds "a", which is no "integer"'),
        ({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["b"]}, "requires 'b', which its properties do not list"),
        ({"type": "number", "maximum": -1e300}, "the value breaks the schema's maximum"),
    ],
    ids=["enum-outside-type", "required-not-listed", "value-out-of-bounds"],
)
def test_a_json_schemas_output_never_breaks_it(
    qwen3_program: TinyProgram, tmp_path: Path, capsys: pytest.CaptureFixture[str], schema: dict[str, object], problem: str
) -> None:
    """An output under `--json-schema` is a value of the whole schema or a one-line error (exit 1), never a value
    the schema refuses: impossible schemas are refused up front, keywords no grammar enforces are checked after."""
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(schema))
    run = ["run", "--program", str(qwen3_program.archive), "--base", str(qwen3_program.interpreter.gguf_path), "--input", "hello"]
    assert main([*run, "--json-schema", str(path), "--max-tokens", "48"]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and problem in captured.err and captured.err.count("\n") == 1, captured.err


def test_a_bare_interpreter_with_a_numbered_template(qwen3: TinyInterpreter, capsys: pytest.CaptureFixture[str]) -> None:
    """`--interpreter` instead of `--program`: the interpreter alone, on its official template (`--input`) or on
    `--template` with one call's `--arg`s, printed as `Positional` gives them; mistakes are one-line errors."""
    bare = ["run", "--interpreter", "Qwen/Qwen3-0.6B", "--base", str(qwen3.gguf_path), "--max-tokens", "5"]
    template = "Context: {INPUT_0}. Question: {INPUT_1}. Answer:"
    assert main([*bare, "--template", template, "--arg", "the sky", "--arg", "what colour?", "--json"]) == 0
    line = json.loads(capsys.readouterr().out)
    with PawFn[Qwen3_0_6B, Torch].bare(base=qwen3.gguf_path, template=template) as program:
        expected = Positional[str, str](program).generate("the sky", "what colour?", options=RuntimeOptions(max_tokens=5))
    assert line["input"] == ["the sky", "what colour?"] and line["tokens"] == list(expected.token_ids)
    assert main([*bare, "--input", "hello"]) == 0
    with PawFn[Qwen3_0_6B, Torch].bare(base=qwen3.gguf_path) as program:
        assert capsys.readouterr().out.strip() == escape_control(program.run_with("hello", RuntimeOptions(max_tokens=5)))
    assert main([*bare, "--template", template, "--arg", "only one"]) == 1
    assert capsys.readouterr().err.startswith("pawfn: error: the template takes 2 positional arguments")
    assert main([*bare, "--template", "{INPUT_1}", "--arg", "x"]) == 1
    assert "without gaps" in capsys.readouterr().err
    assert main(["run", "--interpreter", "nope", "--input", "x"]) == 2
    assert "--interpreter 'nope'" in capsys.readouterr().err


def test_a_reader_that_leaves_early_is_no_error(qwen3_program: TinyProgram, tmp_path: Path) -> None:
    """`pawfn run ... | head -1`: once the reader has gone, pawfn stops quietly (141, as a program a pipe stopped),
    with no `Broken pipe` error line."""
    inputs = tmp_path / "inputs.txt"
    inputs.write_text("\n".join(f"input {i}" for i in range(40)) + "\n")
    command = [sys.executable, "-m", "pawfn", "run", "--program", str(qwen3_program.folder), "--base", str(qwen3_program.interpreter.gguf_path)]
    pipeline = subprocess.list2cmdline([*command, "--input-file", str(inputs), "--max-tokens", "24", "--json"])
    script = f"{pipeline} | head -c 1 >/dev/null; echo ${{PIPESTATUS[0]}}"
    quiet = dict(os.environ, PYTHONWARNINGS="ignore")
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=False, timeout=300, env=quiet)
    assert done.stdout.strip() == "141" and "Broken pipe" not in done.stderr and "error" not in done.stderr, done.stderr


def test_empty_choices_and_patterns_name_the_flag(qwen3_program: TinyProgram, capsys: pytest.CaptureFixture[str]) -> None:
    run = ["run", "--program", str(qwen3_program.archive), "--base", str(qwen3_program.interpreter.gguf_path), "--input", "x"]
    assert main([*run, "--choices", " , "]) == 2
    assert (
        capsys.readouterr().err
        == "pawfn: error: --choices ' , ': no choice in it; give the texts the output may be, comma-separated (--choices yes,no)\n"
    )
    assert main([*run, "--pattern", ""]) == 2
    assert capsys.readouterr().err.startswith("pawfn: error: --pattern '': give the regular expression")


def test_an_unreachable_hub_names_the_ways_around_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The first network failure a new user meets says how to go on without the hub: --base, --offline, --api-url."""
    status = main(["run", "--program", "tester/triage", "--api-url", "http://127.0.0.1:9", "--cache-dir", str(tmp_path), "--input", "hi"])
    error = capsys.readouterr().err
    assert status == 1 and error.count("\n") == 1 and error.startswith("pawfn: error: ")
    assert "cannot reach http://127.0.0.1:9" in error
    assert "--base PATH (base=PATH in Python) brings your own base weights, --offline (PAW_OFFLINE=1) runs what the cache holds" in error
    assert "--api-url URL (PAW_API_URL) names another hub" in error
