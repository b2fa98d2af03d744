"""The change feed of projected rows: what `relay changes --table NAME` reads.

How this works.  For a table of `[store] row_change_tables`, the projector
hook logs each row it puts or removes in `row_changes` (migration 0014) in
the transaction that changes the row, so each change has one position, in
commit order.  In one transaction, a key removed and put again is one
"replace", a row put where none was an "insert", a key removed and not put
again a "remove" (the key only).  The log of a table starts (`enable`) with
an "insert" of every row it has then, and when a build empties the table
(`reset`) its older changes are dropped with it: replaying a table's changes
from its oldest cursor gives the table, and an older cursor is refused
(`feed.StaleCursor`), never skipped silently.  At most the event feed's
`max_entries` changes are kept (oldest dropped first, `oldest` moved past them); once that drops changes of
a table, its log no longer starts with the table (`trimmed`, a `meta` mark cleared when its log starts again),
so reading it from its oldest cursor no longer rebuilds the table.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import orjson

from relay.store.feed import StaleCursor
from relay.store.projectors.spec import ProjectorSpec
from relay.store.projectors.tables import quote

INSERT, REPLACE, REMOVE = "insert", "replace", "remove"
_TRIMMED = "row_feed_trimmed:"  # `meta` key prefix: the table's log lost changes to the bound
_REBUILT = "row_feed_rebuilt:"  # `meta` key prefix: the table's log started again (`reset`) since `enable`


@dataclass(frozen=True, slots=True)
class RowChange:
    """One row change at `cursor`: `op` (insert, replace, remove) of the row of `table` whose key is `key`
    (JSON object, bytes); `row` (JSON object of every column, bytes) for insert and replace, else None."""

    cursor: int
    op: str
    table: str
    key: bytes
    row: bytes | None

    def as_json(self) -> bytes:
        """One JSON line of `relay changes --table`: {"cursor", "op", "table", "key", "row"?}."""
        obj = {"cursor": self.cursor, "op": self.op, "table": self.table, "key": orjson.Fragment(self.key)}
        if self.row is not None:
            obj["row"] = orjson.Fragment(self.row)
        return orjson.dumps(obj)


class NotLogged(LookupError):
    """The table's row changes are not logged (not in `[store] row_change_tables`, or no such table)."""


class RowEncoder:
    """A spec's stored row tuples (`spec.stored_columns` order) as the feed's JSON key and row."""

    def __init__(self, spec: ProjectorSpec) -> None:
        self.spec = spec
        stored = spec.stored_columns
        self.key_positions = [stored.index(c) for c in spec.key_columns()]
        # every column in table order; a VIRTUAL alias reads the field it repeats
        self._row_positions = [(c, stored.index(spec.aliases.get(c, c))) for c in spec.columns]

    def key_of(self, row: Sequence) -> tuple:
        """The key columns' values of a stored row, in `spec.key_columns()` order."""
        return tuple(row[i] for i in self.key_positions)

    def key_json(self, key: Sequence) -> bytes:
        """`{column: value}` of a key (as `key_of` gives it), JSON bytes."""
        return orjson.dumps(dict(zip(self.spec.key_columns(), key)))

    def row_json(self, row: Sequence) -> bytes:
        """`{column: value}` of every column of a stored row, in table order, JSON bytes."""
        return orjson.dumps({column: row[i] for column, i in self._row_positions})


def is_logged(conn: sqlite3.Connection | sqlite3.Cursor, table: str) -> bool:
    """Whether `table`'s row changes are logged."""
    return conn.execute("SELECT 1 FROM row_feed_tables WHERE tbl = ?", (table,)).fetchone() is not None


def _last(cur: sqlite3.Connection | sqlite3.Cursor) -> int:
    # AUTOINCREMENT keeps the largest position ever given, even once its row is dropped.
    row = cur.execute("SELECT seq FROM sqlite_sequence WHERE name = 'row_changes'").fetchone()
    return 0 if row is None else row[0]


def _fresh_start(cur: sqlite3.Cursor) -> int:
    """A position past every cursor given so far (one is spent): the `oldest` of a log that starts again, so
    that a cursor from before is stale even when nothing else was logged since."""
    seq = cur.execute("INSERT INTO row_changes (tbl, op, key) VALUES ('', 'start', '{}') RETURNING seq").fetchone()[0]
    cur.execute("DELETE FROM row_changes WHERE seq = ?", (seq,))
    return seq


def enable(cur: sqlite3.Cursor, spec: ProjectorSpec) -> None:
    """Start logging `spec.table` (if not yet): its log starts with an insert of every row it has now."""
    if is_logged(cur, spec.table):
        return
    cur.execute("INSERT INTO row_feed_tables (tbl, oldest) VALUES (?, ?)", (spec.table, _fresh_start(cur)))
    cur.executemany("DELETE FROM meta WHERE key = ?", [(_TRIMMED + spec.table,), (_REBUILT + spec.table,)])
    columns = ", ".join(quote(c) for c in spec.stored_columns)
    rows = cur.execute(f"SELECT {columns} FROM {quote(spec.table)}").fetchall()
    log(cur, RowEncoder(spec), [], rows, INSERT)


def disable(cur: sqlite3.Cursor, table: str) -> None:
    """Stop logging `table` and drop its changes."""
    cur.execute("DELETE FROM row_changes WHERE tbl = ?", (table,))
    cur.execute("DELETE FROM row_feed_tables WHERE tbl = ?", (table,))
    cur.executemany("DELETE FROM meta WHERE key = ?", [(_TRIMMED + table,), (_REBUILT + table,)])


def logged_tables(conn: sqlite3.Connection | sqlite3.Cursor) -> set[str]:
    """The tables whose row changes are logged."""
    return {row[0] for row in conn.execute("SELECT tbl FROM row_feed_tables")}


def reset(cur: sqlite3.Cursor, table: str) -> None:
    """`table` was emptied (a build from scratch): its earlier changes go, and cursors from before are stale."""
    cur.execute("DELETE FROM row_changes WHERE tbl = ?", (table,))
    cur.execute("UPDATE row_feed_tables SET oldest = ? WHERE tbl = ?", (_fresh_start(cur), table))
    cur.execute("DELETE FROM meta WHERE key = ?", (_TRIMMED + table,))
    cur.execute("INSERT OR IGNORE INTO meta (key, value) VALUES (?, '1')", (_REBUILT + table,))


def log(cur: sqlite3.Cursor, encoder: RowEncoder, removed_keys: Iterable[tuple], rows: Sequence[Sequence],
        put: str) -> None:
    """Log one transaction's changes to a logged table: rows removed (their keys), then `rows` put (stored
    tuples) as `put` ("insert", or "replace" when the caller knows each key was there), each put of a removed
    key as "replace"; then drop the oldest changes past the bound."""
    removed = dict.fromkeys(removed_keys)
    put_keys = [encoder.key_of(row) for row in rows]
    again = set(put_keys) & removed.keys()
    table = encoder.spec.table
    entries = [(table, REMOVE, encoder.key_json(key), None) for key in removed if key not in again]
    entries += [(table, REPLACE if key in again else put, encoder.key_json(key), encoder.row_json(row))
                for key, row in zip(put_keys, rows)]
    if not entries:
        return
    cur.executemany("INSERT INTO row_changes (tbl, op, key, row) VALUES (?, ?, ?, ?)", entries)
    cut = _last(cur) - cur.execute("SELECT max_entries FROM feed_state").fetchone()[0]
    if cut > 0:
        cut_tables = {t for (t,) in cur.execute("DELETE FROM row_changes WHERE seq <= ? RETURNING tbl", (cut,))}
        if cut_tables:
            cur.execute("UPDATE row_feed_tables SET oldest = max(oldest, ?)", (cut,))
            cur.executemany("INSERT OR IGNORE INTO meta (key, value) VALUES (?, '1')",
                            [(_TRIMMED + t,) for t in cut_tables])


def oldest(conn: sqlite3.Connection, table: str) -> int:
    """The oldest cursor `read` accepts for `table`.

    Raises:
        NotLogged: the table's changes are not logged.
    """
    row = conn.execute("SELECT oldest FROM row_feed_tables WHERE tbl = ?", (table,)).fetchone()
    if row is None:
        raise NotLogged(f"no row changes are logged for {table!r} (add it to [store] row_change_tables)")
    return row[0]


def trimmed(conn: sqlite3.Connection, table: str) -> bool:
    """Whether the bound dropped changes of `table` since its log (re)started: then its changes from `oldest`
    no longer rebuild the table (read the rows, then follow from a cursor read before them)."""
    return conn.execute("SELECT 1 FROM meta WHERE key = ?", (_TRIMMED + table,)).fetchone() is not None


def rebuilt(conn: sqlite3.Connection, table: str) -> bool:
    """Whether `table`'s log started again since it was enabled (`reset`: built again from empty), so that a
    cursor from before its `oldest` may be one of its own earlier changes (else it predates its log)."""
    return conn.execute("SELECT 1 FROM meta WHERE key = ?", (_REBUILT + table,)).fetchone() is not None


def head(conn: sqlite3.Connection) -> int:
    """The position of the newest row change (0: none yet)."""
    return _last(conn)


def read(conn: sqlite3.Connection, table: str, since: int, limit: int) -> list[RowChange]:
    """The first `limit` changes of `table` after cursor `since`, in position order (run it in one read
    transaction).

    Raises:
        NotLogged: the table's changes are not logged.
        StaleCursor: `since` is older than the changes kept for it.
    """
    floor = oldest(conn, table)
    if since < floor:
        raise StaleCursor(since, floor)
    return [RowChange(seq, _bytes(op).decode(), table, _bytes(key), None if row is None else _bytes(row))
            for seq, op, key, row in conn.execute(
                "SELECT seq, op, key, row FROM row_changes WHERE tbl = ? AND seq > ? ORDER BY seq LIMIT ?",
                (table, since, limit))]


def _bytes(value: str | bytes) -> bytes:
    # The store's read connections return TEXT as bytes (db.connect), others as str.
    return value if isinstance(value, bytes) else value.encode()
