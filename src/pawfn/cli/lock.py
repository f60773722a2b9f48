"""`pawfn lock`: pin the programs an application runs (add, codegen, update, check)."""

from __future__ import annotations


import argparse
import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import get_args


from pydantic import ValidationError

from .. import evals
from ..core.config import PawConfig
from ..core.errors import describe_validation_error
from ..api.function import PawFn
from ..core.grammar import ChoicesFormat, JsonSchemaFormat, PatternFormat
from ..hub.client import PawClient
from ..hub import lockfile
from ..hub.lockcode import generate_module
from ..hub.prepare import PreparedProgram, prepare_program
from ..hub.refs import parse_hub_reference
from ..core.options import RuntimeOptions

from .shared import BACKENDS, CliError, engine_options, config_of, response_format


def register(add: Callable[..., argparse.ArgumentParser], common: argparse.ArgumentParser) -> None:
    """Add the command's parser by `add` (`add_parser` of pawfn's subcommands), its common options from `common`."""
    lock = add("lock", help="pin the programs an application runs in pawfn.lock: add, update, check")
    lock_commands = lock.add_subparsers(dest="lock_command", required=True, metavar="ACTION")
    where = argparse.ArgumentParser(add_help=False)
    where.add_argument("--lock", metavar="PATH", help="the lock file (default: PAWFN_LOCK, else the nearest pawfn.lock upward; add: ./pawfn.lock)")
    adding = lock_commands.add_parser("add", parents=[common, where], help="lock a hub program under a name (downloads it and its base)")
    adding.add_argument("name", metavar="NAME", help="the name the application loads it by (a Python identifier)")
    adding.add_argument("program", metavar="REF", help="program id, user/slug or user/slug@vN")
    adding.add_argument("--cases", metavar="FILE", help="its cases file (relative to the lock): `pawfn lock update` evaluates both versions on it")
    returns = adding.add_mutually_exclusive_group()
    returns.add_argument("--choices", metavar="A,B,C", help="its output is one of these texts (codegen: a TypedFn of a Literal)")
    returns.add_argument("--pattern", metavar="REGEX", help="its output matches this regular expression (codegen: a TypedFn of a Pattern)")
    returns.add_argument("--returns", choices=get_args(lockfile.Scalar), help="its output is a value of this type (codegen: TypedFn[int], ...)")
    returns.add_argument("--json-schema", type=Path, metavar="FILE", help="its output is JSON of the schema in FILE (codegen: pydantic models)")
    codegen = lock_commands.add_parser("codegen", parents=[common, where], help="write a module of typed handles, one per locked program")
    codegen.add_argument("--out", type=Path, metavar="PATH", help="the module to write (kept in the lock; later runs, add and update rewrite it)")
    codegen.add_argument("--backend", choices=sorted(BACKENDS), help="the handles' backend (default: the lock's, else torch)")
    update = lock_commands.add_parser(
        "update", parents=[common, where, engine_options()], help="move names to what their slugs now resolve to, printing each change"
    )
    update.add_argument("names", nargs="*", metavar="NAME", help="the names to update (default: all)")
    update.add_argument("--max-tokens", type=int, metavar="N", help="most tokens a call generates when evaluating (default: to EOS)")
    check = lock_commands.add_parser("check", parents=[common, where], help="exit 1 on any drift between the lock, the cache and the hub")
    check.add_argument("names", nargs="*", metavar="NAME", help="the names to check (default: all)")


def command(args: argparse.Namespace) -> int:
    """`pawfn lock ACTION`: add, codegen, check or update."""
    config = config_of(args)
    if args.lock_command == "add":
        return _add(args, config)
    path = lockfile.lock_path(args.lock)
    lock = lockfile.read_lock(path)
    if args.lock_command == "codegen":
        return _codegen(args, path, lock)
    entries = {name: lock.entry(name, path) for name in args.names or sorted(lock.programs)}
    if args.lock_command == "check":
        return _check(path, lock, entries, config)
    return _update(args, path, lock, entries, config)


def _add(args: argparse.Namespace, config: PawConfig) -> int:
    path = Path(args.lock) if args.lock else lockfile.find_lock() or Path(lockfile.LOCK_FILE_NAME)
    lock = lockfile.read_lock(path) if path.exists() else lockfile.LockFile()
    name = lockfile.check_name(args.name)
    if name in lock.programs:
        raise CliError(f"{path} already locks {name} (program {lock.programs[name].program_id}); `pawfn lock update {name}` moves it")
    prepared = prepare_program(parse_hub_reference(args.program).text, config, local_paths=False)
    entry = lockfile.lock_entry(args.program, prepared, cases=args.cases, returns=_declared_returns(args))
    lock.programs[name] = entry
    _write_lock(path, lock)
    print(f"locked {name}: {args.program} -> {entry.program_id} ({entry.interpreter}) in {path}")
    return 0


def _codegen(args: argparse.Namespace, path: Path, lock: lockfile.LockFile) -> int:
    target = lock.codegen
    if args.out is not None:
        out = args.out.resolve()
        if not out.is_relative_to(path.parent.resolve()):
            raise CliError(f"--out {args.out}: the module must be inside the lock's folder {path.parent}")
        target = lockfile.CodegenTarget(path=out.relative_to(path.parent.resolve()).as_posix(), backend=args.backend or "torch")
    elif target is None:
        raise CliError(f"{path} names no module yet: give --out PATH (for example --out programs.py) the first time")
    elif args.backend is not None:
        target = target.model_copy(update={"backend": args.backend})
    lock.codegen = target
    _write_lock(path, lock)
    print(f"wrote {path.parent / target.path}: {len(lock.programs)} typed handles on {target.backend}")
    return 0


def _check(path: Path, lock: lockfile.LockFile, entries: dict[str, lockfile.LockedProgram], config: PawConfig) -> int:
    problems: list[str] = []
    with contextlib.ExitStack() as stack:
        client = None if config.offline else stack.enter_context(PawClient(config))
        for name, entry in entries.items():
            found = lockfile.check_locked(name, entry, config, client)
            problems += found
            if not found:
                print(f"{name}: {entry.program_id} as locked")
    if lock.codegen is not None:
        module = path.parent / lock.codegen.path
        current = module.read_text(encoding="utf-8") if module.is_file() else None
        if current != generate_module(lock, path, module, lock.codegen.backend):
            problems.append(
                f"{module} is {'missing' if current is None else 'stale'}: the lock changed since it was generated; run `pawfn lock codegen`"
            )
    for problem in problems:
        print(problem)
    return 1 if problems else 0


def _update(args: argparse.Namespace, path: Path, lock: lockfile.LockFile, entries: dict[str, lockfile.LockedProgram], config: PawConfig) -> int:
    moved = 0
    for name, entry in entries.items():
        if entry.pinned:
            print(f"{name}: {entry.reference} is pinned; nothing to follow")
            continue
        prepared = prepare_program(entry.reference, config, local_paths=False)
        if prepared.program_id == entry.program_id:
            print(f"{name}: {entry.program_id}, unchanged")
            continue
        newer = lockfile.lock_entry(entry.reference, prepared, cases=entry.cases, returns=entry.returns)
        print(f"{name}: {entry.program_id} -> {newer.program_id}" + _eval_delta(args, path, entry, prepared, config))
        lock.programs[name] = newer
        moved += 1
    if moved:
        _write_lock(path, lock)
    return 0


def _write_lock(path: Path, lock: lockfile.LockFile) -> None:
    """Write `lock`, and the handles module it names (so the two never disagree)."""
    if lock.codegen is not None:
        module = path.parent / lock.codegen.path
        text = generate_module(lock, path, module, lock.codegen.backend)  # before the lock: a refused lock writes nothing
        lockfile.write_lock(path, lock)
        module.parent.mkdir(parents=True, exist_ok=True)
        module.write_text(text, encoding="utf-8")
        return
    lockfile.write_lock(path, lock)


def _declared_returns(args: argparse.Namespace) -> lockfile.Returns | None:
    """The output type `pawfn lock add` was told of (--choices, --pattern and --json-schema read as `pawfn run` reads
    them, or --returns); None for text."""
    declared = response_format(args)
    try:
        if isinstance(declared, ChoicesFormat):
            if len(set(declared.choices)) != len(declared.choices):
                raise CliError(f"--choices {args.choices}: give each choice once")
            return list(declared.choices)
        if isinstance(declared, PatternFormat):
            return lockfile.ReturnsPattern(pattern=declared.pattern)
        if isinstance(declared, JsonSchemaFormat):
            return lockfile.ReturnsSchema(json_schema=dict(declared.json_schema.schema_))
    except ValidationError as exc:
        raise CliError(f"the declared output: {describe_validation_error(exc)}") from exc
    returns: lockfile.Returns | None = args.returns
    return returns


def _eval_delta(args: argparse.Namespace, path: Path, entry: lockfile.LockedProgram, newer: PreparedProgram, config: PawConfig) -> str:
    """`' (accuracy ...)'`: both versions evaluated on the entry's cases; '' for an entry without cases."""
    if entry.cases is None:
        return ""
    cases = evals.read_cases(path.parent / entry.cases)
    options = RuntimeOptions(max_tokens=args.max_tokens)
    base = None if args.base is None else Path(args.base)
    reports: list[evals.EvalReport] = []
    versions: tuple[str | PreparedProgram, ...] = (entry.program_id, newer)
    for version in versions:
        with PawFn.load_any_sync(version, BACKENDS[args.backend], base=base, config=config) as program:
            reports.append(evals.evaluate(program, cases, options=options, name=program.program_id, progress=False))
    comparison = evals.compare(reports[0], reports[1])
    return (
        f" (accuracy {reports[0].accuracy:.4f} -> {reports[1].accuracy:.4f} on {len(cases)} cases of {entry.cases}: "
        f"fixed {comparison.fixed}, broken {comparison.broken}, McNemar p={comparison.p_value:.3g})"
    )
