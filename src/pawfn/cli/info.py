"""`pawfn info`: a program's facts."""

from __future__ import annotations


import argparse
from collections.abc import Callable


from pydantic import BaseModel

from ..formats.bundle import open_bundle
from ..core.errors import PawError
from ..hub.cache import PawCache
from ..hub.client import PawClient
from ..hub.refs import parse_reference

from .shared import config_of, print_json


def register(add: Callable[..., argparse.ArgumentParser], common: argparse.ArgumentParser) -> None:
    """Add the command's parser by `add` (`add_parser` of pawfn's subcommands), its common options from `common`."""
    info = add("info", parents=[common], help="show a program's facts")
    info.add_argument("program", metavar="REF", help="program id, slug or local bundle")
    info.add_argument("--json", action="store_true", help="print JSON")


def _dump(model: BaseModel) -> dict[str, object]:
    return model.model_dump(mode="json")


def command(args: argparse.Namespace) -> int:
    config = config_of(args)
    reference = parse_reference(args.program)
    data: dict[str, object]
    if reference.kind == "path":
        with open_bundle(reference.path) as bundle:
            data = _dump(bundle.meta) | {"source": str(reference.path)}
    elif config.offline:
        cache = PawCache(config.cache_dir, config.lock_timeout_s)
        program_id = reference.text if reference.kind == "id" else cache.cached_slug(reference.text)
        bundle_meta = None if program_id is None else cache.read_program(program_id)
        if bundle_meta is None:
            raise PawError(f"program {args.program} is not in the cache (offline); run `pawfn cache prepare {args.program}` online")
        data = _dump(bundle_meta.meta) | {"source": str(bundle_meta.source)}
    else:
        with PawClient(config) as client:
            data = _dump(client.program_info(reference.text))
    if args.json:
        print_json(data)
    else:
        for key in ("id", "program_id", "name", "spec", "interpreter", "compiler_snapshot", "aliases", "downloads", "source"):
            if data.get(key) not in (None, [], ""):
                print(f"{key}: {data[key]}")
    return 0
