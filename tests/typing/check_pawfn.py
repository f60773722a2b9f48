"""Typing tests: what users see (assert_type) and what the checkers must refuse (# expect-error lines)."""

from __future__ import annotations

from typing import TypeVar

from typing_extensions import assert_type

from pawfn import (
    GPT2,
    Backend,
    Generation,
    InterpreterModel,
    LlamaCpp,
    PawFn,
    PawFnBuilder,
    Qwen3_0_6B,
    Remote,
    RuntimeOptions,
    TextIterator,
    TextStream,
    Torch,
)
from pawfn.api.builder import ProgramLoader, SpecCompiler

B = TypeVar("B", bound=Backend)
M = TypeVar("M", bound=InterpreterModel)


def triage(program: PawFn[Qwen3_0_6B, B], text: str) -> str:
    """Any Qwen3 program on any backend."""
    return program.run(text)


def any_program(program: PawFn[M, B], text: str) -> str:
    """Any program at all."""
    return program.run(text)


def loads(qwen: PawFn[Qwen3_0_6B, Torch], gpt2: PawFn[GPT2, Torch]) -> None:
    assert_type(PawFn[Qwen3_0_6B, Torch].load_sync("p.paw", base="b.gguf"), PawFn[Qwen3_0_6B, Torch])
    assert_type(PawFn[GPT2, Torch].load_slug_sync("user/slug"), PawFn[GPT2, Torch])
    assert_type(PawFn[Qwen3_0_6B, Torch].load_sync("0123456789abcdef"), PawFn[Qwen3_0_6B, Torch])
    assert_type(PawFn[Qwen3_0_6B, Torch].compile_spec_sync("Classify sentiment"), PawFn[Qwen3_0_6B, Torch])
    assert_type(qwen.run("text"), str)
    assert_type(triage(qwen, "text"), str)
    assert_type(any_program(gpt2, "text"), str)
    on_llama = PawFn[Qwen3_0_6B, LlamaCpp].load_sync("p.paw", base="b.gguf")
    assert_type(on_llama, PawFn[Qwen3_0_6B, LlamaCpp])
    assert_type(triage(on_llama, "text"), str)  # any backend
    qwen = on_llama  # expect-error: assignment; reportAssignmentType
    triage(gpt2, "text")  # expect-error: arg-type; reportArgumentType
    qwen.run(42)  # expect-error: arg-type; reportArgumentType
    qwen.run_with("text", {"max_tokens": 3})  # expect-error: arg-type; reportArgumentType


def model_parameter_is_invariant(gpt2: PawFn[GPT2, Torch]) -> PawFn[Qwen3_0_6B, Torch]:
    return gpt2  # expect-error: return-value; reportReturnType


def to_base(qwen: PawFn[Qwen3_0_6B, Torch]) -> PawFn[InterpreterModel, Torch]:
    return qwen  # expect-error: return-value; reportReturnType


async def async_loads() -> None:
    assert_type(await PawFn[Qwen3_0_6B, Torch].load_slug("email-triage"), PawFn[Qwen3_0_6B, Torch])
    assert_type(await PawFn[GPT2, Torch].load("0123456789abcdef"), PawFn[GPT2, Torch])
    assert_type(await PawFn[Qwen3_0_6B, Torch].compile_spec("Classify sentiment", compiler="paw-4b-qwen3-0.6b"), PawFn[Qwen3_0_6B, Torch])
    function = await PawFn[Qwen3_0_6B, Torch].load_slug("email-triage")
    assert_type(await function.arun("text"), str)
    assert_type(await function.agenerate("text"), Generation)


def type_arguments() -> None:
    PawFn[int, Torch]  # expect-error: type-var; reportInvalidTypeArguments
    PawFn[Qwen3_0_6B, str]  # expect-error: type-var; reportInvalidTypeArguments


async def builder() -> None:
    loader = PawFnBuilder.builder().slug("email-triage")
    assert_type(loader, ProgramLoader[Torch])
    assert_type(await loader.load(), PawFn[InterpreterModel, Torch])
    assert_type(PawFnBuilder.builder().id("0123456789abcdef").load_sync(), PawFn[InterpreterModel, Torch])
    compiler = PawFnBuilder.builder().compiler("paw-4b-qwen3-0.6b").spec("Classify sentiment")
    assert_type(compiler, SpecCompiler[Torch])
    assert_type(await compiler.compile(), PawFn[InterpreterModel, Torch])
    on_llamacpp = PawFnBuilder.builder().backend(LlamaCpp).slug("email-triage")
    assert_type(on_llamacpp, ProgramLoader[LlamaCpp])
    assert_type(on_llamacpp.load_sync(), PawFn[InterpreterModel, LlamaCpp])
    assert_type(await PawFnBuilder.builder().backend(Remote).spec("Classify").compile(), PawFn[InterpreterModel, Remote])
    PawFnBuilder.builder().backend(str)  # expect-error: type-var; reportArgumentType
    await PawFnBuilder.builder().slug("email-triage").compile()  # expect-error: attr-defined; reportAttributeAccessIssue
    await PawFnBuilder.builder().spec("Classify sentiment").load()  # expect-error: attr-defined; reportAttributeAccessIssue
    PawFnBuilder.builder().load_sync()  # expect-error: attr-defined; reportAttributeAccessIssue


def options() -> None:
    assert_type(RuntimeOptions(max_tokens=3, temperature=0.5).max_tokens, int | None)
    RuntimeOptions(max_tokens="5")  # expect-error: arg-type; reportArgumentType
    RuntimeOptions(temperature="hot")  # expect-error: arg-type; reportArgumentType
    RuntimeOptions(max_token=5)  # expect-error: call-arg; reportCallIssue


def narrowing(loaded: PawFn[InterpreterModel, Torch]) -> None:
    qwen = PawFn[Qwen3_0_6B, Torch].narrow(loaded)
    assert_type(qwen, PawFn[Qwen3_0_6B, Torch])
    assert_type(triage(qwen, "text"), str)
    assert_type(PawFn[GPT2, LlamaCpp].narrow(loaded), PawFn[GPT2, LlamaCpp])
    assert_type(PawFn.load_any_sync("email-triage", Torch), PawFn[InterpreterModel, Torch])
    assert_type(PawFn.load_any_sync("email-triage", LlamaCpp), PawFn[InterpreterModel, LlamaCpp])
    triage(loaded, "text")  # expect-error: arg-type; reportArgumentType
    PawFn[Qwen3_0_6B, Torch].narrow("a program")  # expect-error: arg-type; reportArgumentType


async def on_a_server(local: PawFn[Qwen3_0_6B, Torch]) -> None:
    """`Remote` is a backend like the others: the same calls, the same interpreter checks."""
    remote = PawFn[Qwen3_0_6B, Remote].load_sync("user/slug")
    assert_type(remote, PawFn[Qwen3_0_6B, Remote])
    assert_type(remote.run("text"), str)
    assert_type(await remote.arun("text"), str)
    assert_type(remote.run_batch(["a", "b"]), list[str])
    assert_type(triage(remote, "text"), str)
    assert_type(await local.astream("text"), TextStream)
    assert_type(remote.stream("text"), TextIterator)
    assert_type([piece for piece in local.stream("text")], list[str])
    assert_type(local.returning(int).stream("text").generation(), Generation)
    local.stream(3)  # expect-error: arg-type; reportArgumentType
    local = remote  # expect-error: assignment; reportAssignmentType
    gpt2_remote: PawFn[GPT2, Remote] = remote  # expect-error: assignment; reportAssignmentType


def setting_groups() -> None:
    from pawfn import EngineSettings, HubSettings, PawConfig

    def engine(settings: EngineSettings) -> int:
        return settings.n_ctx

    engine(PawConfig(n_ctx=512))  # a whole config is an EngineSettings
    assert_type(PawConfig(device="cpu", offline=True).offline, bool)
    device = HubSettings().device  # expect-error: attr-defined; reportAttributeAccessIssue
