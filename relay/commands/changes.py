"""`relay changes [--since CURSOR] [--follow] [--kinds K,...]`: the change feed (relay/store/feed.py) as JSON lines.

Reads the database read-only, in short read transactions, so it runs beside
`relay serve` (or any writer) and never holds a WAL snapshot between polls.
"""

from __future__ import annotations

import sqlite3
import sys
import time

from relay.commands.projectors import open_readonly
from relay.config import Config
from relay.store import feed
from relay.store.db import read_transaction

PAGE = 1000  # changes read per read transaction
POLL_SECONDS = 0.25  # with --follow, time between reads once the feed is caught up
STALE_EXIT = 3


def _page(conn: sqlite3.Connection, since: int, kinds: frozenset[int] | None) -> tuple[list[feed.Change], int]:
    """(the next changes after `since`, the cursor to read on from) in one snapshot.

    A short page means that snapshot had nothing more: the cursor moves to its head, so that with `kinds` the
    next poll does not scan again the changes of other kinds.
    """
    with read_transaction(conn):
        changes = feed.read(conn, since, PAGE, kinds)
        if len(changes) < PAGE:
            return changes, max(since, feed.head(conn))
    return changes, changes[-1].cursor


def run_changes(config: Config, since: int | None, follow: bool, kinds: frozenset[int] | None) -> int:
    """Print every change after `since` (default: the oldest kept), one JSON object a line; with `follow`, keep
    polling for new ones until interrupted.

    Exit 0 when done, 1 when there is no readable relay database, 3 (`cursor N is older than the oldest kept,
    M` on stderr) when changes after `since` are no longer kept.
    """
    conn = open_readonly(config.store.path)
    if conn is None:
        return 1
    out = sys.stdout.buffer
    try:
        cursor = feed.oldest(conn) if since is None else since
        while True:
            changes, cursor = _page(conn, cursor, kinds)
            out.write(b"".join(change.as_json() + b"\n" for change in changes))
            out.flush()
            if len(changes) < PAGE:
                if not follow:
                    return 0
                time.sleep(POLL_SECONDS)
    except feed.StaleCursor as exc:
        print(exc, file=sys.stderr)
        return STALE_EXIT
    except sqlite3.OperationalError as exc:  # e.g. a database not yet migrated to the change feed
        print(f"relay changes: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        conn.close()
