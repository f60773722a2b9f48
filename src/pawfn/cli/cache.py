"""`pawfn cache` (list, clear, prune, prepare) and `pawfn prepare`."""

from __future__ import annotations


import argparse
import sys
from collections.abc import Callable
from pathlib import Path


from ..hub.cache import PawCache
from ..hub.usage import cache_files, clear_derived, prune_derived
from ..hub import lockfile
from ..hub.prepare import prepare_program

from .shared import CliError, config_of, print_json


def register(add: Callable[..., argparse.ArgumentParser], common: argparse.ArgumentParser) -> None:
    """Add the command's parser by `add` (`add_parser` of pawfn's subcommands), its common options from `common`."""
    cache = add("cache", help="list, clear or fill the cache shared with the official SDK")
    cache_commands = cache.add_subparsers(dest="cache_command", required=True, metavar="ACTION")
    listing = cache_commands.add_parser("list", parents=[common], help="list cached programs, base models and pawfn's derived files with their sizes")
    listing.add_argument("--json", action="store_true", help='print JSON Lines, each with a "kind"')
    clear = cache_commands.add_parser("clear", parents=[common], help="delete every cached program and base model")
    clear.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    clear.add_argument(
        "--derived", action="store_true", help="delete only pawfn's derived files (converted bases, stored prefixes, kernels), which it rebuilds"
    )
    prune = cache_commands.add_parser(
        "prune", parents=[common], help="delete pawfn's least recently used derived files until they fit a size (programs and bases stay)"
    )
    prune.add_argument(
        "--max-bytes", type=int, metavar="N", help="the size to fit, in bytes (default: derived_cache_max_bytes, PAW_DERIVED_CACHE_MAX_BYTES, 8 GiB)"
    )
    for add_to in (cache_commands.add_parser, add):  # `pawfn prepare` and `pawfn cache prepare`: one command
        prepare_parser = add_to("prepare", parents=[common], help="download a program and its base for offline use")
        chosen = prepare_parser.add_mutually_exclusive_group(required=True)
        chosen.add_argument("program", nargs="?", metavar="REF", help="program id or slug")
        chosen.add_argument("--locked", action="store_true", help="every program of pawfn.lock, by id, its files checked against the lock")
        prepare_parser.add_argument("--lock", metavar="PATH", help="the lock file (default: PAWFN_LOCK, else the nearest pawfn.lock upward)")
        prepare_parser.add_argument(
            "--base",
            type=Path,
            metavar="FILE",
            help="a local copy of the base weights the program's runtime pins (checked by sha256), recorded in the cache instead "
            "of downloaded: later commands need no --base, offline too",
        )
        prepare_parser.add_argument("--json", action="store_true", help="print JSON")


def command(args: argparse.Namespace) -> int:
    config = config_of(args)
    cache = PawCache(config.cache_dir, config.lock_timeout_s)
    if args.cache_command == "list":
        _list_cache(cache, args.json)
        return 0
    if args.cache_command == "prune":
        bound = config.derived_cache_max_bytes if args.max_bytes is None else args.max_bytes
        if bound < 0:
            raise CliError(f"--max-bytes must be 0 or more, not {bound}")
        removed = prune_derived(cache, bound)
        left = sum(item.size_bytes for item in cache_files(cache) if item.derived)
        print(f"removed {len(removed)} derived files ({_size(sum(item.size_bytes for item in removed))}); {_size(left)} left in {cache.root}")
        return 0
    if args.cache_command == "clear" and args.derived:
        removed = clear_derived(cache)
        print(f"removed {len(removed)} derived files ({_size(sum(item.size_bytes for item in removed))}) from {cache.root}")
        return 0
    if args.cache_command == "clear":
        if not args.yes:
            if not sys.stdin.isatty():
                raise CliError(
                    "`pawfn cache clear` deletes every cached program and base model; add --yes to confirm "
                    "(or --derived to delete only pawfn's derived files)"
                )
            if input(f"delete everything in {cache.root}? [y/N] ").strip().lower() not in ("y", "yes"):
                print("nothing deleted")
                return 0
        cache.clear()
        print(f"cleared {cache.root}")
        return 0
    return prepare(args)


def prepare(args: argparse.Namespace) -> int:
    config = config_of(args)
    if args.locked and args.base is not None:
        raise CliError("--base records one program's base; give the program (`pawfn cache prepare REF --base FILE`), then --locked")
    if args.locked:
        path = lockfile.lock_path(args.lock)
        names = sorted(lockfile.read_lock(path).programs)
        ready = [(name, lockfile.locked_program(name, lock=path, config=config)) for name in names]
    else:
        ready = [(args.program, prepare_program(args.program, config, base_file=args.base))]
    for name, prepared in ready:
        if args.json:
            runtime_id = None if prepared.runtime is None else prepared.runtime.runtime_id
            print_json(
                {
                    "program": name,
                    "program_id": prepared.program_id,
                    "path": str(prepared.bundle),
                    "runtime_id": runtime_id,
                    "base": str(prepared.base),
                }
            )
        else:
            print(f"{name}: ready offline ({prepared.bundle}; base {prepared.base})")
    return 0


def _list_cache(cache: PawCache, as_json: bool) -> None:
    """Programs, then base models and pawfn's derived files with their sizes (JSON Lines with ``kind``)."""
    programs = cache.list_programs()
    files = cache_files(cache)
    if as_json:
        for program in programs:
            print_json(
                {
                    "kind": "program",
                    "program_id": program.program_id,
                    "slugs": list(program.slugs),
                    "interpreter": program.interpreter,
                    "spec": program.spec,
                    "runtime_id": program.runtime_id,
                    "path": str(program.path),
                }
            )
        for item in files:
            print_json({"kind": item.kind, "path": str(item.path), "size_bytes": item.size_bytes, "detail": item.detail})
        return
    if not programs:
        print(f"no programs in the cache ({cache.root}); `pawfn cache prepare REF` fetches one")
    for program in programs:
        names = f" ({', '.join(program.slugs)})" if program.slugs else ""
        print(f"{program.program_id}{names}  {program.interpreter}  {(program.spec or '')[:60]}")
    bases = [item for item in files if item.kind == "base_model"]
    if bases:
        print("base models:")
        for item in bases:
            print(f"  {_size(item.size_bytes):>9}  {item.path.name}")
    derived = [item for item in files if item.derived]
    if derived:
        print("derived by pawfn (rebuilt when missing; `pawfn cache clear --derived` deletes them):")
        for item in derived:
            if item.kind == "converted_base":
                print(f"  {_size(item.size_bytes):>9}  converted base: {item.detail or item.path.name}")
        for kind, name in (("prefix", "stored prefixes"), ("kernel", "compiled kernel libraries")):
            group = [item for item in derived if item.kind == kind]
            if group:
                print(f"  {_size(sum(item.size_bytes for item in group)):>9}  {len(group)} {name}")
    if files:
        print(f"total {_size(sum(item.size_bytes for item in files))} besides programs, in {cache.root}")


def _size(size_bytes: int) -> str:
    """`size_bytes` in decimal units: ``598.3 MB``, ``1.19 GB``."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if size_bytes >= scale:
            value = size_bytes / scale
            return f"{value:.2f} {unit}" if value < 10 else f"{value:.1f} {unit}"
    return f"{size_bytes} B"
