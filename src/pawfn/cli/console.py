"""The `pawfn` command: its parser from each command's module, `main` and `entry`."""

from __future__ import annotations


import argparse
import atexit
import contextlib
import logging
import os
import signal
import sys
import threading
import traceback
from collections.abc import Generator, Sequence
from types import FrameType
from typing import NoReturn


from ..core.errors import PawError

from . import bench, cache, compilation, evaluation, info, lock, login, run, serve
from .shared import CliError, common_options, version_text


_interrupted = False
"""The first Ctrl-C came: its line is printed and the calls are stopping."""


@contextlib.contextmanager
def _stopping_on_ctrl_c() -> Generator[None]:
    """The first Ctrl-C prints one line at once and raises KeyboardInterrupt, which cancels the running calls (they stop
    within a layer of one prompt pass, or at their next token); a second one quits without waiting for them."""
    global _interrupted
    _interrupted = False
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: FrameType | None) -> None:
        global _interrupted
        if _interrupted:
            sys.stderr.flush()
            os._exit(130)
        _interrupted = True
        print("pawfn: interrupted; stopping (Ctrl-C again quits at once)", file=sys.stderr, flush=True)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _parser() -> argparse.ArgumentParser:
    """pawfn's parser: its own flags, then each command's parser from its module."""
    common = common_options()
    parser = argparse.ArgumentParser(prog="pawfn", description="Run ProgramAsWeights neural programs locally.")
    parser.add_argument("--debug", action="store_true", help="print tracebacks on errors")
    parser.add_argument("--verbose", "-v", action="store_true", help="print pawfn's INFO log lines (what a load does, and how long it takes)")
    parser.add_argument("--version", action="version", version=version_text())
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in (run, bench, evaluation, compilation, info, cache, lock, serve, login):
        module.register(commands.add_parser, common)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `pawfn`; returns the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.verbose:
        logging.basicConfig(level=logging.INFO, format="%(levelname)s:     %(message)s")
    handlers = {"run": run.command, "bench": bench.command, "eval": evaluation.command, "compile": compilation.command, "info": info.command}
    handlers |= {"cache": cache.command, "prepare": cache.prepare, "lock": lock.command, "login": login.command, "serve": serve.command}
    try:
        with contextlib.ExitStack() as stack:
            if args.command != "serve":  # the server stops gracefully on its own signal handlers
                stack.enter_context(_stopping_on_ctrl_c())
            return handlers[args.command](args)
    except CliError as exc:
        if args.debug:
            traceback.print_exc()
        print(f"pawfn: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # a reader that left early (`pawfn cache list | head -1`): stop quietly, as `cat` would
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit's flush finds no pipe
        return 141  # 128 + SIGPIPE, what a shell reports for a program the pipe stopped
    except (PawError, OSError) as exc:
        if args.debug:
            traceback.print_exc()
        print(f"pawfn: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        if not _interrupted:  # a KeyboardInterrupt our handler did not raise (before it was set): say it here
            print("pawfn: interrupted", file=sys.stderr)
        return 130


def entry() -> NoReturn:
    """The `pawfn` command: `main`, then an exit that skips the interpreter's teardown (half a second of freeing
    torch's operator registry here), once stdout and stderr are flushed and the atexit handlers have run."""
    status = main()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BrokenPipeError:  # a reader that left early (`pawfn run ... | head -1`) is not an error of ours
        pass
    atexit._run_exitfuncs()  # pyright: ignore[reportPrivateUsage]  # what a normal exit runs first (logging, tqdm)
    os._exit(status)
