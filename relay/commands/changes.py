"""`relay changes [--since CURSOR] [--follow] [--kinds K,... | --table NAME]`: the change feed (relay/store/feed.py),
or the row changes of one projected table (relay/store/projectors/rowfeed.py), as JSON lines.

Reads the database read-only, in short read transactions, so it runs beside
`relay serve` (or any writer) and never holds a WAL snapshot between polls.
"""

from __future__ import annotations

import sqlite3
import sys
import time
from dataclasses import dataclass
from typing import Protocol

from relay.commands import open_readonly
from relay.config import Config
from relay.store import feed
from relay.store.projectors import rowfeed
from relay.store.db import read_transaction
from relay.store.projectors.tables import table_exists

PAGE = 1000  # changes read per read transaction
POLL_SECONDS = 0.25  # with --follow, time between reads once the feed is caught up
STALE_EXIT = 3
NOW = "now"  # `--since now`: from the newest position


class _Feed(Protocol):
    """The event feed (relay/store/feed.py) or one table's row feed (relay/store/projectors/rowfeed.py)."""

    def oldest(self, conn: sqlite3.Connection) -> int: ...

    def head(self, conn: sqlite3.Connection) -> int: ...

    def read(self, conn: sqlite3.Connection, since: int, limit: int) -> list: ...


@dataclass(frozen=True)
class _Events:
    kinds: frozenset[int] | None

    def oldest(self, conn: sqlite3.Connection) -> int:
        return feed.oldest(conn)

    def head(self, conn: sqlite3.Connection) -> int:
        return feed.head(conn)

    def read(self, conn: sqlite3.Connection, since: int, limit: int) -> list[feed.Change]:
        return feed.read(conn, since, limit, self.kinds)


@dataclass(frozen=True)
class _Rows:
    table: str

    def oldest(self, conn: sqlite3.Connection) -> int:
        return rowfeed.oldest(conn, self.table)

    def head(self, conn: sqlite3.Connection) -> int:
        return rowfeed.head(conn)

    def read(self, conn: sqlite3.Connection, since: int, limit: int) -> list[rowfeed.RowChange]:
        return rowfeed.read(conn, self.table, since, limit)


def _page(conn: sqlite3.Connection, since: int, source: _Feed) -> tuple[list, int]:
    """(the next changes after `since`, the cursor to read on from) in one snapshot.

    A short page means that snapshot had nothing more: the cursor moves to its head, so that with `kinds` (or a
    table) the next poll does not scan again the changes of other kinds (or tables).
    """
    with read_transaction(conn):
        changes = source.read(conn, since, PAGE)
        if len(changes) < PAGE:
            return changes, max(since, source.head(conn))
    return changes, changes[-1].cursor


def run_changes(config: Config, since: int | str | None, follow: bool, kinds: frozenset[int] | None,
                table: str | None = None) -> int:
    """Print every change after `since` (default: the oldest kept; "now": the newest position, so nothing
    already there), one JSON object a line; with `follow`, keep polling for new ones until interrupted.
    For a table, `since` 0 (nothing read yet) is its start, as the default.  With `table`, the changes of that projected table's rows
    (`{"cursor", "op": "insert"|"replace"|"remove", "table", "key", "row"?}`, relay/store/projectors/rowfeed.py)
    instead of events.

    Exit 0 when done, 2 when there is no relay database at the path (missing, or another file) or `since` is
    past the newest position or `table`'s row changes are not logged (`[store] row_change_tables`; or no such table), 3 (`cursor N is older than the oldest kept, M` on stderr) when
    changes after `since` are no longer kept (for a table: also when it was built again from empty since, and,
    with no `since`, when the start of its log was dropped: the message gives the position to follow from after
    reading the rows with `relay query`).
    """
    conn = open_readonly(config.store.path, "changes")
    if conn is None:
        return 2
    out = sys.stdout.buffer
    source: _Feed = _Events(kinds) if table is None else _Rows(table)
    if table is not None and since == 0:  # a reader with nothing: the log's start rebuilds the table
        since = None
    try:
        if since is None and table is not None and rowfeed.trimmed(conn, table):
            position = rowfeed.head(conn)  # read before the rows: what changes after them is not missed
            print(f"relay changes: the start of {table}'s row changes is no longer kept ([store] "
                  f"change_log_max_entries), so they no longer rebuild the table: read the rows (relay query "
                  f"{table} --json), then follow with --since {position} (changes after it may repeat what the "
                  "rows show)", file=sys.stderr)
            return STALE_EXIT
        newest = source.head(conn)
        if since == NOW:
            since = newest
        if since is not None and since > newest:  # a cursor of another database, or a typo: never a silent wait
            print(f"relay changes: cursor {since} is past the newest position, {newest}", file=sys.stderr)
            return 2
        cursor = source.oldest(conn) if since is None else since
        while True:
            changes, cursor = _page(conn, cursor, source)
            out.write(b"".join(change.as_json() + b"\n" for change in changes))
            out.flush()
            if len(changes) < PAGE:
                if not follow:
                    return 0
                time.sleep(POLL_SECONDS)
    except feed.StaleCursor as exc:
        if table is not None and not rowfeed.trimmed(conn, table):  # only the start of its log passed it
            why = (f"{table} was built again from empty (a changed spec, relay projectors rebuild)"
                   if rowfeed.rebuilt(conn, table) else
                   f"{table}' row changes were logged (its log starts with an insert of every row it had)")
            print(f"relay changes: cursor {exc.cursor} is from before {why}: read it again from the start "
                  f"(--since {exc.oldest})", file=sys.stderr)
        else:
            print(exc, file=sys.stderr)
        return STALE_EXIT
    except rowfeed.NotLogged as exc:
        print(f"relay changes: {exc if table_exists(conn, table) else f'no such table: {table!r}'}", file=sys.stderr)
        return 2
    except sqlite3.OperationalError as exc:  # e.g. a database not yet migrated to the change feed
        print(f"relay changes: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        conn.close()
