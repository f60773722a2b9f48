"""pawfn's pytest plugin (registered as the `pytest11` entry point `pawfn`): the real-programs switch for a whole
run (`--pawfn-no-real-programs`, or `pawfn_no_real_programs = true` in the ini), a marker that lets one test load real
programs, and the fixtures `no_real_programs` and `fake_program`."""

from __future__ import annotations

from collections.abc import Generator
from typing import TypeVar

import pytest

from ..api.function import PawFn
from ..core.backends import Backend
from ..core.guard import allowing_real_programs, blocking_real_programs
from ..core.models import InterpreterModel
from .fakes import Answers, fake

M = TypeVar("M", bound=InterpreterModel)
B = TypeVar("B", bound=Backend)

__all__ = ["FakeFactory", "fake_program", "no_real_programs", "pytest_addoption", "pytest_configure"]

_SWITCH = "pawfn's pytest switch (--pawfn-no-real-programs, or pawfn_no_real_programs in the ini)"
_MARKER = "pawfn_real_programs"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("pawfn")
    group.addoption(
        "--pawfn-no-real-programs",
        action="store_true",
        default=False,
        help="fail any real program load or hub/server request in a test (fakes answer); @pytest.mark.pawfn_real_programs lets one test through",
    )
    parser.addini("pawfn_no_real_programs", type="bool", default=False, help="the same as --pawfn-no-real-programs, for every run")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{_MARKER}: this test may load real programs and ask hubs and servers despite pawfn's switch")


@pytest.fixture(autouse=True)
def _pawfn_real_programs_switch(request: pytest.FixtureRequest) -> Generator[None, None, None]:
    """Every test under the switch when the run turns it on; a test marked `pawfn_real_programs` without it."""
    config = request.config
    on = bool(config.getoption("pawfn_no_real_programs")) or bool(config.getini("pawfn_no_real_programs"))
    if request.node.get_closest_marker(_MARKER) is not None:
        with allowing_real_programs():
            yield
    elif on:
        with blocking_real_programs(_SWITCH):
            yield
    else:
        yield


@pytest.fixture
def no_real_programs() -> Generator[None, None, None]:
    """Real programs blocked for this test (the fixture `no_real_programs`)."""
    with blocking_real_programs("the pytest fixture no_real_programs"):
        yield


class FakeFactory:
    """`pawfn.testing.fake` as the `fake_program` fixture gives it."""

    def __call__(self, kind: type[PawFn[M, B]], answers: Answers, *, spec: str | None = None, n_ctx: int = 2048) -> PawFn[M, B]:
        return fake(kind, answers, spec=spec, n_ctx=n_ctx)


@pytest.fixture
def fake_program() -> FakeFactory:
    """`fake_program(PawFn[Qwen3_0_6B, Torch], {"in": "out"})`: a fake program (`pawfn.testing.fake`)."""
    return FakeFactory()
