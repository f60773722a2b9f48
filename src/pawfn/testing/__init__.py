"""Programs in an application's unit tests, with no model: `fake(PawFn[Qwen3_0_6B, Torch], {"in": "out"})` is a
program of that very type that answers from a mapping or a function and records its calls (`calls_of`);
`block_real_programs()` (and the pytest plugin's `--pawfn-no-real-programs`) makes any real load or hub request fail,
naming the switch; `replay(PawFn[...], cassette)` answers from a call log of real calls."""

from ..core.errors import RealProgramsBlockedError
from .fakes import Answers, FakeCall, FakeMissError, calls_of, fake
from .replay import replay
from .switch import allow_real_programs, block_real_programs

__all__ = [
    "Answers",
    "FakeCall",
    "FakeMissError",
    "RealProgramsBlockedError",
    "allow_real_programs",
    "block_real_programs",
    "calls_of",
    "fake",
    "replay",
]
