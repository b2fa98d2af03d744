"""`relay backup PATH`: a consistent copy of the database, taken while the relay serves.

How this works: SQLite's `VACUUM INTO` writes a compacted copy of one
snapshot of the database.  It runs on a read-only connection of its own,
i.e. inside one read transaction: in WAL mode the writer never waits for it
(checkpoints cannot pass its snapshot meanwhile, so the WAL may grow while
it runs).  The copy goes to a temporary file beside PATH, is fsynced, and is
then hard-linked to PATH, which fails if PATH exists: an existing file is
never overwritten, and PATH never holds a partial copy.
"""

from __future__ import annotations

import os
import sqlite3
import sys
import time
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

from relay.commands import SERVED_DATABASE_HINT, no_such_file, path_error
from relay.config import Config
from relay.store import db


@dataclass(frozen=True)
class BackupReport:
    """What `backup` wrote: the copy's size in bytes, its events, and the seconds it took."""

    path: Path
    bytes: int
    events: int
    seconds: float


def backup(source: Path, target: Path) -> BackupReport:
    """Copy the relay database at `source` to `target` (which must not exist) with `VACUUM INTO`.

    Raises:
        DatabaseUnusable: there is no database at `source`, or it is not a relay's (exit 2, as for every command).
        FileExistsError: `target` exists (it is left as it is).
        FileNotFoundError: there is no directory to hold `target` (naming `target`).
        sqlite3.Error: the copy failed (nothing is left at `target`).
    """
    started = time.monotonic()
    db.require_relay_database(source, SERVED_DATABASE_HINT)
    if target.exists():
        raise FileExistsError(f"{target} exists; refusing to overwrite it")
    if not target.parent.is_dir():  # else the error would name the temporary file, not PATH
        raise no_such_file(target)
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    try:
        with closing(sqlite3.connect(source.resolve().as_uri() + "?mode=ro", uri=True, isolation_level=None)) as conn:
            conn.execute("PRAGMA busy_timeout = 5000")
            db.relay_schema_version(conn, source.absolute())
            conn.execute("VACUUM INTO ?", (str(partial),))
        # immutable: the copy is ours alone, so no locks, no -wal or -shm files beside it
        with closing(sqlite3.connect(partial.resolve().as_uri() + "?immutable=1", uri=True)) as copy:
            events = copy.execute("SELECT count(*) FROM events").fetchone()[0]
        fd = os.open(partial, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.link(partial, target)  # atomic, and refuses an existing target (even one created meanwhile)
    finally:
        partial.unlink(missing_ok=True)
    return BackupReport(target, target.stat().st_size, events, time.monotonic() - started)


def run_backup(config: Config, target: Path) -> int:
    """`relay backup PATH`: print what was written; exit 1 (message on stderr) if PATH exists or the copy fails,
    2 if PATH's folder does not exist.

    Raises:
        DatabaseUnusable: no relay database at `store.path` (the command line's exit 2).
    """
    try:
        report = backup(Path(config.store.path), target)
    except FileNotFoundError as exc:
        return path_error("backup", exc)
    except (OSError, sqlite3.Error) as exc:
        print(f"relay backup: {exc}", file=sys.stderr)
        return 1
    print(f"relay backup: wrote {report.path}: {report.bytes} bytes, {report.events} events, "
          f"in {report.seconds:.1f} s")
    return 0
