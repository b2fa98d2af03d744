"""Whether this process can keep a database at a path: checked before the store opens it.

SQLite's own answer comes late and says little: "unable to open database
file" names no path, and a database file this user may only read opens
without complaint, then refuses every write (and every WAL checkpoint) for
as long as the relay runs.  `check_location` asks the file system first and
names the path and what is wrong with it, in one line an operator can act on.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

SIDE_FILES = ("-wal", "-shm")  # WAL mode: SQLite creates and writes both beside the database


class DatabaseUnusable(RuntimeError):
    """The database at `path` cannot be opened for writing by this process; `reason` says why (one line)."""

    def __init__(self, path: Path | str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = str(path)
        self.reason = reason


def _who() -> str:
    return f"uid {os.geteuid()}" if hasattr(os, "geteuid") else "this user"


def _owner(info: os.stat_result) -> str:
    return f"owner uid {info.st_uid}, mode {stat.S_IMODE(info.st_mode):04o}"


def check_location(path: Path) -> None:
    """Check that `path` can be a database this process reads and writes, with its -wal and -shm files.

    A missing database is fine when its directory can be created or written
    (`Store.open` creates both).

    Raises:
        DatabaseUnusable: `path` is a directory; its directory cannot be created, entered or written;
        the file, its -wal or its -shm exists and cannot be read and written by this user.
    """
    if path.is_dir():
        raise DatabaseUnusable(path, "is a directory (give a database file, e.g. DIR/relay.db)")
    directory = path.parent
    existing = next((d for d in (directory, *directory.parents) if d.exists()), None)
    if existing is not None and not existing.is_dir():
        raise DatabaseUnusable(path, f"{existing} is not a directory")
    if existing is not None and not os.access(existing, os.W_OK | os.X_OK):
        what = "directory" if existing == directory else f"directory cannot be created: {existing}"
        raise DatabaseUnusable(path, f"{what} is not writable by {_who()} ({_owner(existing.stat())}); "
                                     "SQLite writes the -wal and -shm files beside the database")
    for file in (path, *(Path(f"{path}{suffix}") for suffix in SIDE_FILES)):
        if file.exists() and not os.access(file, os.R_OK | os.W_OK):
            raise DatabaseUnusable(path, f"{file.name} is not readable and writable by {_who()} "
                                         f"({_owner(file.stat())})")


def require_database(path: Path | str, hint: str) -> None:
    """Refuse a database that does not exist: a mistyped path (or a relative default read from another folder)
    would otherwise become a new, empty database that no running relay reads.

    Raises:
        DatabaseUnusable: nothing at `path`; the message names its absolute path and `hint` (how to proceed).
    """
    if not Path(path).exists():
        raise DatabaseUnusable(Path(path).absolute(), f"no such database ({hint})")


def require_directory(path: Path | str, hint: str) -> None:
    """Refuse a new database whose directory does not exist (`Store.open` would create it, typo and all).

    Raises:
        DatabaseUnusable: the directory of `path` is missing; the message names it and `hint`.
    """
    directory = Path(path).absolute().parent
    if not directory.exists():
        raise DatabaseUnusable(Path(path).absolute(), f"no such directory {directory} ({hint})")


def os_reason(exc: OSError) -> str:
    """What the OS said of a failed path operation, as a clause: "no such file or directory", "is a directory"."""
    reason = exc.strerror or str(exc)
    return reason[:1].lower() + reason[1:]
