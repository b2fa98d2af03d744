"""The bodies of the `relay` subcommands (relay/cli.py parses the arguments and dispatches here).

Each module is one command or a family of them, returns the exit code and
prints what the person who ran it reads: `transfer` (import, export),
`sync`, `status`, `key`, `backup`, `projectors` (verify, projectors,
query).  `relay serve` is the node's own `run` (relay/assembly.py).

The helpers here are the answers every command gives alike: a path that cannot be
opened (`path_error`), a database that must exist or whose folder must (`check_database_path`),
an output that would overwrite the database or a file beside it (`refuse_store_file`), a read-only
connection to a relay database that says in one line why there is none (`open_readonly`).
"""

from __future__ import annotations

import errno
import os
import sqlite3
import sys
import time
from pathlib import Path

from relay.config import DEFAULT_DB_PATH, Config
from relay.store import db
from relay.keys import KEY_SUFFIX
from relay.locks import LOCK_SUFFIX
from relay.store.location import SIDE_FILES, DatabaseUnusable, os_reason, require_directory

EXIT_USAGE = 2  # a path or argument the person who ran the command must fix
SERVED_DATABASE_HINT = "give the database the relay serves with --db or --config"


def utc_time(seconds: int, none: str = "") -> str:
    """Unix `seconds` as ISO 8601 UTC (`2024-05-01T12:00:00Z`), as the commands print times; 0 as `none`."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds)) if seconds else none


def path_error(command: str, exc: OSError) -> int:
    """Print `relay COMMAND: PATH: what the OS said` (e.g. "no such file or directory") on stderr, one line;
    returns EXIT_USAGE.  An OSError without a file name (a message of ours) is printed as it is."""
    print(f"relay {command}: {exc if exc.filename is None else f'{exc.filename}: {os_reason(exc)}'}", file=sys.stderr)
    return EXIT_USAGE


def no_such_file(path: Path | str) -> FileNotFoundError:
    """The error an `open` of the missing `path` raises (for `path_error`), found before trying."""
    return FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(path))


def check_database_path(config: Config, create: bool) -> None:
    """Without `create`, the database of `config` must exist and hold a relay's schema; with it (`relay serve`,
    `relay import --create`, `relay sync --create`), a file already there must be a relay's database or empty (what
    an interrupted first import leaves), and its folder must exist unless it is the default `data/relay.db` (the
    README's quick start, on a fresh clone).  Nothing is written to a file that is refused.

    Raises:
        DatabaseUnusable: one line naming the absolute path and how to proceed.
    """
    existing = Path(config.store.path)
    if not create:
        db.require_relay_database(existing, SERVED_DATABASE_HINT + ", or --create to start a new one there")
    elif existing.is_file() and existing.stat().st_size > 0 and not db.in_wal_mode(existing):
        # (a database in WAL mode meets the instance lock first; Store.open refuses another program's tables)
        db.require_relay_database(existing, SERVED_DATABASE_HINT)
    elif config.store.path != DEFAULT_DB_PATH:
        require_directory(config.store.path, "create it first, or check --db")


# What lives beside a database `relay.db` (SQLite's WAL and shared memory, the instance lock, the node key):
# writing any of them as a command's output destroys the store or the node's identity.
STORE_FILE_SUFFIXES = ("", *SIDE_FILES, "-journal", LOCK_SUFFIX, KEY_SUFFIX)


def refuse_store_file(config: Config, path: Path, option: str) -> None:
    """Refuse `path` as an output (`option`, e.g. "--output") when it is the database of `config` or a file
    beside it (`STORE_FILE_SUFFIXES`), by any name: opening it for writing would empty it first.

    Raises:
        OSError: naming `option`, the path and the database (`path_error` prints it as one line).
    """
    database = Path(config.store.path).resolve()
    target = path.resolve()
    for suffix in STORE_FILE_SUFFIXES:
        store_file = database.with_name(database.name + suffix)
        same_file = target.exists() and store_file.exists() and os.path.samefile(target, store_file)  # hard links
        if target == store_file or same_file:
            raise OSError(f"{option} {path} is {'the database' if not suffix else f'its {suffix} file'} "
                          f"({database}): writing it would destroy the store")


def open_readonly(path: str, command: str) -> sqlite3.Connection | None:
    """A read-only autocommit connection to the database at `path` (a running relay is not disturbed); None, with
    a line on stderr naming `command` ("verify", "record get"...), when there is no such file or it holds no
    relay's schema (an empty file an interrupted first import left, another program's database)."""
    file = Path(path)
    if not file.exists():
        print(f"relay {command}: no database at {file}", file=sys.stderr)
        return None
    try:
        conn = db.connect_readonly(file)
    except sqlite3.Error as exc:
        print(f"relay {command}: {file}: {exc}", file=sys.stderr)
        return None
    try:
        db.relay_schema_version(conn, file)
    except DatabaseUnusable as exc:
        conn.close()
        print(f"relay {command}: {exc}", file=sys.stderr)
        return None
    return conn
