"""Bounds on one read job (a REQ's or COUNT's statements): wall time on the database, rows held.

SQLite calls a progress handler every `PROGRESS_STEPS` virtual-machine
instructions of any statement on the connection; ours aborts the statement
once the job's deadline has passed (SQLite then raises "interrupted"), so a
filter that scans too much costs at most about `timeout_seconds` of a read
connection.  Statements shorter than `PROGRESS_STEPS` instructions (an id or
coordinate lookup, a REQ of fewer than about 1,000 events) never pay for a
clock read.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from typing import Any, TypeVar

from relay.protocol.rejection import Rejection

T = TypeVar("T")

PROGRESS_STEPS = 10_000
"""SQLite VM instructions between two deadline checks: about 1,000 rows of a REQ, a millisecond or so.

Each check takes the GIL from the reader's thread, so fewer checks cost the
event loop less; a 5,000-event REQ makes about five."""


def run_with_deadline(conn: sqlite3.Connection, timeout_seconds: float, fn: Callable[..., T], *args: Any) -> T:
    """`fn(conn, *args)`, its statements aborted once `timeout_seconds` have passed (0: no bound).

    Raises:
        Rejection: "error: query took too long" when the deadline aborted a statement.
    """
    if not timeout_seconds:
        return fn(conn, *args)
    deadline = time.monotonic() + timeout_seconds
    conn.set_progress_handler(lambda: time.monotonic() > deadline, PROGRESS_STEPS)
    try:
        return fn(conn, *args)
    except sqlite3.OperationalError as exc:
        if str(exc) != "interrupted":  # SQLite's message for a statement aborted by the handler
            raise
        raise Rejection("error", f"query took too long (max {timeout_seconds:g} s)") from None
    finally:
        conn.set_progress_handler(None, 0)
