"""`PawFn[M, Remote]` against a real `pawfn serve` process: the typed API, checked against local runs."""

from __future__ import annotations

import asyncio

import pytest

from pawfn import (
    GPT2,
    AuthenticationError,
    ConfigError,
    InterpreterMismatchError,
    NotFoundError,
    PawConfig,
    PawFn,
    ProgramClosedError,
    Qwen3_0_6B,
    Remote,
    ProgramPool,
    RequestError,
    RuntimeOptions,
    Torch,
)
from pawfn.cli import escape_control
from tests.helpers.bounded import run_cli
from tests.helpers.servers import FIRST_ID, INPUTS, KEY, SECOND_ID, ServeProcess

LocalRuns = dict[str, PawFn[Qwen3_0_6B, Torch]]


def _config(server: ServeProcess, key: str | None = KEY) -> PawConfig:
    return PawConfig.from_env(server_url=server.url, server_api_key=key, max_retries=0)


def test_run_generate_batch_and_arun_equal_local_runs(server: ServeProcess, local_runs: LocalRuns) -> None:
    options = RuntimeOptions(max_tokens=10)
    with PawFn[Qwen3_0_6B, Remote].load_sync(FIRST_ID, config=_config(server)) as remote:
        local = local_runs[FIRST_ID]
        assert remote.program_id == FIRST_ID and remote.interpreter == "Qwen/Qwen3-0.6B"
        assert (remote.n_ctx, remote.prefix_tokens) == (local.n_ctx, local.prefix_tokens)
        generation = remote.generate(INPUTS[0], options)
        assert generation.token_ids == local.generate(INPUTS[0], options).token_ids
        assert remote.run_with(INPUTS[1], options) == local.run_with(INPUTS[1], options)
        assert remote.run_batch(INPUTS, options) == local.run_batch(INPUTS, options)
        assert remote.prompt_token_ids(INPUTS[0]) == local.prompt_token_ids(INPUTS[0])

        async def concurrently() -> list[str]:
            return list(await asyncio.gather(*(remote.arun(text, options) for text in INPUTS * 2)))

        assert asyncio.run(concurrently()) == [local.run_with(text, options) for text in INPUTS * 2]
        assert asyncio.run(remote.arun_batch(INPUTS, options)) == local.run_batch(INPUTS, options)  # one request
    with pytest.raises(ProgramClosedError):
        remote.run("x")


def test_a_slug_loads_with_the_interpreter_the_server_names(server: ServeProcess, local_runs: LocalRuns) -> None:
    program = PawFn.load_any_sync("tiny-second", Remote, config=_config(server))
    try:
        assert type(program) is PawFn[Qwen3_0_6B, Remote]
        narrowed = PawFn[Qwen3_0_6B, Remote].narrow(program)
        options = RuntimeOptions(max_tokens=8)
        assert narrowed.run_with(INPUTS[2], options) == local_runs[SECOND_ID].run_with(INPUTS[2], options)
    finally:
        program.close()


def test_a_pool_of_remote_programs_leaves_resolving_to_the_server(server: ServeProcess, local_runs: LocalRuns) -> None:
    """Served names (not hub references) work in a pool of `Remote` programs: nothing is resolved or downloaded here."""
    options = RuntimeOptions(max_tokens=8)

    async def scenario() -> tuple[str, str]:
        async with ProgramPool.of(PawFn[Qwen3_0_6B, Remote], config=_config(server), max_programs=1) as pool:
            first = await pool.run(FIRST_ID, INPUTS[0], options)
            second = await pool.run("tiny-second", INPUTS[2], options)
            assert len(pool) == 1 and pool.stats.evictions == 1
            return first, second

    assert asyncio.run(scenario()) == (local_runs[FIRST_ID].run_with(INPUTS[0], options), local_runs[SECOND_ID].run_with(INPUTS[2], options))


def test_a_wrong_interpreter_type_fails_before_any_run(server: ServeProcess) -> None:
    with pytest.raises(InterpreterMismatchError, match="Qwen3_0_6B"):
        PawFn[GPT2, Remote].load_sync(FIRST_ID, config=_config(server))


def test_server_refusals_are_typed_errors(server: ServeProcess) -> None:
    with pytest.raises(ConfigError, match="PAW_SERVER_URL"):
        PawFn[Qwen3_0_6B, Remote].load_sync(FIRST_ID, config=PawConfig.from_env(max_retries=0))
    with pytest.raises(AuthenticationError, match="PAW_SERVER_API_KEY"):
        PawFn[Qwen3_0_6B, Remote].load_sync(FIRST_ID, config=_config(server, key="wrong"))
    with pytest.raises(NotFoundError, match="not served here"):
        PawFn[Qwen3_0_6B, Remote].load_sync("c2c2c2c2c2c2c2c2c2c2", config=_config(server))
    with pytest.raises(ConfigError, match="the server's business on Remote: load without base="):
        PawFn[Qwen3_0_6B, Remote].load_sync("anything.paw", base="base.gguf")
    with PawFn[Qwen3_0_6B, Remote].load_sync(FIRST_ID, config=_config(server)) as remote:
        with pytest.raises(RequestError, match="max_tokens=99") as refused:
            remote.run_with("x", RuntimeOptions(max_tokens=99))
        assert (refused.value.code, refused.value.status) == ("max_tokens_too_large", 422)
        with pytest.raises(RequestError) as too_long:
            remote.run("x" * 301)
        assert too_long.value.code == "input_too_long"
        assert remote.run_with("still fine", RuntimeOptions(max_tokens=3)) is not None


def test_astream_follows_the_servers_stream(server: ServeProcess, local_runs: LocalRuns) -> None:
    options = RuntimeOptions(max_tokens=16)
    expected = local_runs[FIRST_ID].generate(INPUTS[2], options)

    async def follow() -> tuple[list[str], tuple[int, ...]]:
        with PawFn[Qwen3_0_6B, Remote].load_sync(FIRST_ID, config=_config(server)) as remote:
            async with await remote.astream(INPUTS[2], options) as stream:
                pieces = [piece async for piece in stream]
                return pieces, (await stream.generation()).token_ids

    pieces, token_ids = asyncio.run(follow())
    assert token_ids == expected.token_ids
    assert "".join(pieces) == local_runs[FIRST_ID].runtime.decode_tokens(expected.token_ids) and len(pieces) > 1


def test_the_cli_runs_on_a_server(server: ServeProcess, local_runs: LocalRuns) -> None:
    expected = local_runs[SECOND_ID].run_with("hello world", RuntimeOptions(max_tokens=6))
    done = run_cli(
        "run",
        "--backend",
        "remote",
        "--server-url",
        server.url,
        "--program",
        "tiny-second",
        "--input",
        "hello world",
        "--max-tokens",
        "6",
        environment={"PAW_SERVER_API_KEY": KEY},
    )
    assert (done.status, done.stdout) == (0, escape_control(expected) + "\n"), done.stderr
    run_cli("run", "--backend", "remote", "--program", "x", "--input", "y").assert_one_line_error(1, "PAW_SERVER_URL")
    run_cli(
        "run",
        "--backend",
        "remote",
        "--server-url",
        server.url,
        "--program",
        "tiny-second",
        "--input",
        "y",
        environment={"PAW_SERVER_API_KEY": "wrong"},
    ).assert_one_line_error(1, "PAW_SERVER_API_KEY")
    run_cli("serve", "--backend", "remote", "--program", "x").assert_one_line_error(2, "--backend remote")


def test_submit_returns_before_the_server_answers(server: ServeProcess, local_runs: LocalRuns) -> None:
    """`submit` sends the call from a worker and returns its future at once, as on every backend."""
    options = RuntimeOptions(max_tokens=24)  # the test server's limit
    with PawFn[Qwen3_0_6B, Remote].load_sync(FIRST_ID, config=_config(server)) as remote:
        pending = remote.submit(INPUTS[0], options)
        assert not pending.done()
        assert pending.result(timeout=120).token_ids == local_runs[FIRST_ID].generate(INPUTS[0], options).token_ids
