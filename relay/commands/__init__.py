"""The bodies of the `relay` subcommands (relay/cli.py parses the arguments and dispatches here).

Each module is one command or a family of them, returns the exit code and
prints what the person who ran it reads: `transfer` (import, export),
`sync`, `status`, `key`, `backup`, `projectors` (verify, projectors,
query).  `relay serve` is the node's own `run` (relay/node.py).

The helpers here are the answers every command gives alike: a path that cannot be
opened (`path_error`), a database that must exist or whose folder must (`check_database_path`).
"""

from __future__ import annotations

import errno
import os
import sys
from pathlib import Path

from relay.config import DEFAULT_DB_PATH, Config
from relay.store.location import os_reason, require_database, require_directory

EXIT_USAGE = 2  # a path or argument the person who ran the command must fix
SERVED_DATABASE_HINT = "give the database the relay serves with --db or --config"


def path_error(command: str, exc: OSError) -> int:
    """Print `relay COMMAND: PATH: what the OS said` (e.g. "no such file or directory") on stderr, one line;
    returns EXIT_USAGE.  An OSError without a file name (a message of ours) is printed as it is."""
    print(f"relay {command}: {exc if exc.filename is None else f'{exc.filename}: {os_reason(exc)}'}", file=sys.stderr)
    return EXIT_USAGE


def no_such_file(path: Path | str) -> FileNotFoundError:
    """The error an `open` of the missing `path` raises (for `path_error`), found before trying."""
    return FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(path))


def check_database_path(config: Config, create: bool) -> None:
    """Without `create`, the database of `config` must exist; with it (`relay serve`, `relay import --create`,
    `relay sync --create`),
    its folder must, unless it is the default `data/relay.db` (the README's quick start, on a fresh clone).

    Raises:
        DatabaseUnusable: one line naming the absolute path and how to proceed.
    """
    if not create:
        require_database(config.store.path, SERVED_DATABASE_HINT + ", or --create to start a new one there")
    elif config.store.path != DEFAULT_DB_PATH:
        require_directory(config.store.path, "create it first, or check --db")
