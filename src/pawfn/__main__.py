"""`python -m pawfn` runs the command line."""

from .cli import entry

entry()
