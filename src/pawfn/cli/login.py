"""`pawfn login`: store an API key in the official config file."""

from __future__ import annotations


import argparse
import getpass
from collections.abc import Callable


from ..core.config import save_api_key

from .shared import CliError, config_of


def register(add: Callable[..., argparse.ArgumentParser], common: argparse.ArgumentParser) -> None:
    """Add the command's parser by `add` (`add_parser` of pawfn's subcommands), its common options from `common`."""
    login = add("login", parents=[common], help="store an API key in the official config file")
    login.add_argument("key", nargs="?", help="the key (prompted for when omitted)")


def command(args: argparse.Namespace) -> int:
    config = config_of(args)
    key = args.key
    if key is None:
        print(f"Create an API key at {config.api_url}/settings")
        key = getpass.getpass("API key: ").strip()
    if not key:
        raise CliError("no key given; nothing saved")
    path = save_api_key(key)
    print(f"saved the API key to {path}")
    return 0
