"""The `pawfn` command line: run, bench, eval, compile, info, cache, prepare, lock, login and serve, one module a
command (`register` adds its parser, `command` runs it) over `shared`; `console` assembles them."""

from .console import entry, main
from .shared import escape_control

__all__ = ["entry", "escape_control", "main"]
