"""The WAL checkpoint policy, run on the store's checkpoint connection, never on the writer's.

How this works: each round first runs a PASSIVE checkpoint, which copies
what it can back into the database file and takes no lock the writer needs.
A stronger mode, the configured `checkpoint_mode` (full | restart |
truncate), or TRUNCATE once the WAL file is larger than
`checkpoint_truncate_wal_bytes`, is attempted only when that PASSIVE round
backfilled the whole WAL: it then has (almost) nothing left to copy and holds
the write lock only for the instant it resets or truncates the WAL.  The
checkpoint connection's busy timeout is 0, so while a reader still uses the
WAL or the writer is inside a transaction the attempt gives up at once and
the next round tries again.  The writer never waits for pages to be copied.
"""

from __future__ import annotations

import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path

CHECKPOINT_MODES = ("passive", "full", "restart", "truncate")


@dataclass(frozen=True, slots=True)
class CheckpointResult:
    """One round: the strongest mode run and SQLite's answer to it (counts of WAL frames)."""

    mode: str
    busy: bool  # the mode could not finish: a reader or the writer was in the way
    wal_frames: int  # frames in the WAL (-1: the database is not in WAL mode)
    checkpointed_frames: int  # frames of it now copied back into the database file


def file_bytes(path: Path | str) -> int:
    """Size of the file at `path` in bytes (0 when there is none)."""
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0


def wal_bytes(database: Path | str) -> int:
    """Size in bytes of the `-wal` file beside `database` (0 when there is none)."""
    return file_bytes(f"{database}-wal")


def checkpoint(conn: sqlite3.Connection, database: Path, mode: str, truncate_wal_bytes: int) -> CheckpointResult:
    """Run one round of the policy (module docstring) on `conn`, a connection to `database` of its own.

    `mode`: one of `CHECKPOINT_MODES`; `truncate_wal_bytes`: WAL size past
    which TRUNCATE is attempted (0: never on size alone).
    """
    conn.execute("PRAGMA busy_timeout = 0")  # give up at once rather than make anyone wait
    result = _run(conn, "passive")
    stronger = None if mode == "passive" else mode
    if truncate_wal_bytes and wal_bytes(database) > truncate_wal_bytes:
        stronger = "truncate"
    if stronger is not None and not result.busy and result.wal_frames == result.checkpointed_frames:
        result = _run(conn, stronger)
    return result


def _run(conn: sqlite3.Connection, mode: str) -> CheckpointResult:
    busy, frames, copied = conn.execute(f"PRAGMA wal_checkpoint({mode.upper()})").fetchone()
    return CheckpointResult(mode, bool(busy), frames, copied)
