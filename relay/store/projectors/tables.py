"""SQL side of projectors: table DDL and schema evolution, the `meta` records, the refusal log.

A projected table is `STRICT` (SQLite checks every value's type).  One row
per event makes a rowid table with its PRIMARY KEY as a unique index (rows can
be wide: a profile's `about`); one row per tag value makes narrow rows, stored
`WITHOUT ROWID` in key order.  A reserved column that repeats a field (`_pubkey`
when a field's source is `pubkey`) is a VIRTUAL generated column.  Indexes are named
`<table>__<col>_<col>`; indexes of that form that the spec no longer lists
are dropped.  `meta` holds one JSON record per projector under
`projector:<name>`: {"type", "hash", "revision", "state", "tables"}, where
state is "current" (the table equals the projection of the events),
"building" (a rebuild started and has not finished) or "removed" (no longer
configured; its table is kept but no longer maintained).
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterable
from importlib import resources

import orjson

from relay.store.db import append_bounded
from relay.store.projectors.spec import RESERVED_COLUMNS, ProjectorSpec

META_PREFIX = "projector:"


def quote(identifier: str) -> str:
    """An SQL identifier in double quotes (names are validated by the spec; this is belt and braces)."""
    return '"' + identifier.replace('"', '""') + '"'


def ensure_store_tables(conn: sqlite3.Connection) -> None:
    """Create the refusal log and causal state tables if missing (migration 0003, applied idempotently).

    A database numbered past 3 by a migration that was written before 0003
    existed would otherwise never get them.
    """
    if conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'causal_ops_by_event'").fetchone() is None:
        sql = resources.files("relay.store.migrations").joinpath("0003_projectors.sql").read_text(encoding="utf-8")
        conn.executescript(f"BEGIN IMMEDIATE;\n{sql}\nCOMMIT;")


def create_table_sql(spec: ProjectorSpec) -> str:
    """The CREATE TABLE statement of `spec`'s table (reserved columns first, then fields, key in storage order)."""
    key = spec.key_columns()
    lines = [_reserved_definition(spec, column) for column in RESERVED_COLUMNS]
    for f in spec.fields:
        lines.append(f"{quote(f.name)} {f.type}" + (" NOT NULL" if f.name in key else ""))
    lines.append("PRIMARY KEY (" + ", ".join(quote(c) for c in key) + ")")
    # One row per tag value: narrow rows, stored in key order (no separate key index to maintain).
    options = "STRICT, WITHOUT ROWID" if spec.row_per_tag else "STRICT"
    return f"CREATE TABLE {quote(spec.table)} (\n    " + ",\n    ".join(lines) + f"\n) {options}"


def _reserved_definition(spec: ProjectorSpec, column: str) -> str:
    type_ = spec.column_types[column]
    alias = spec.aliases.get(column)
    if alias is None:
        return f"{column} {type_} NOT NULL"
    # The same value as a field: computed on read, never stored twice.
    return f"{column} {type_} GENERATED ALWAYS AS ({quote(alias)}) VIRTUAL"


def index_name(table: str, columns: Iterable[str]) -> str:
    """The name of our index on `columns` of `table`."""
    return f"{table}__" + "_".join(c.lstrip("_") for c in columns)


def table_exists(conn: sqlite3.Connection | sqlite3.Cursor, table: str) -> bool:
    """True when a table called `table` exists."""
    return conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)).fetchone() is not None


def _columns(cur: sqlite3.Cursor, table: str) -> tuple[dict[str, str], tuple[str, ...]]:
    info = cur.execute(f"PRAGMA table_xinfo({quote(table)})").fetchall()
    # (cid, name, type, notnull, default, pk, hidden): pk is the 1-based position in the key, 0 if not in it;
    # hidden is 2 for a VIRTUAL generated column.  The type of a generated column is its definition's.
    sql = cur.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)).fetchone()[0]
    columns = {}
    for row in info:
        name, type_ = row[1], row[2].upper()
        if row[6] == 2:
            match = re.search(re.escape(name) + r" \w+ GENERATED ALWAYS AS \((\"[^\"]+\")\) VIRTUAL", sql)
            type_ = f"{type_} = {match.group(1) if match else '?'}"
        columns[name] = type_
    key = tuple(row[1] for row in sorted((r for r in info if r[5]), key=lambda r: r[5]))
    return columns, key


def _wanted_columns(spec: ProjectorSpec) -> dict[str, str]:
    aliases = spec.aliases
    return {name: type_ + (f" = {quote(aliases[name])}" if name in aliases else "")
            for name, type_ in spec.column_types.items()}


def sync_schema(cur: sqlite3.Cursor, spec: ProjectorSpec) -> str:
    """Make `spec.table` have the spec's columns, key and indexes, keeping what it can.

    Returns "created", "altered" (new columns added with ALTER TABLE),
    "recreated" (dropped and created again: a column removed or retyped, or
    a different key) or "unchanged".  Rows are left as they are: the caller
    rebuilds them.
    """
    outcome = "unchanged"
    if not table_exists(cur, spec.table):
        cur.execute(create_table_sql(spec))
        outcome = "created"
    else:
        columns, key = _columns(cur, spec.table)
        wanted = _wanted_columns(spec)
        kept = all(wanted.get(name) == type_ for name, type_ in columns.items())
        if not kept or key != spec.key_columns():
            cur.execute(f"DROP TABLE {quote(spec.table)}")
            cur.execute(create_table_sql(spec))
            outcome = "recreated"
        else:
            for name in wanted:
                if name not in columns:  # only fields can be new: reserved columns are always there
                    cur.execute(f"ALTER TABLE {quote(spec.table)} ADD COLUMN {quote(name)} {spec.column_types[name]}")
                    outcome = "altered"
    _sync_indexes(cur, spec)
    return outcome


def _sync_indexes(cur: sqlite3.Cursor, spec: ProjectorSpec) -> None:
    wanted = {index_name(spec.table, ix): ix for ix in spec.indexes}
    existing = {row[0] for row in cur.execute(
        "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = ? AND sql IS NOT NULL", (spec.table,))}
    for name in existing - wanted.keys():
        if name.startswith(spec.table + "__"):
            cur.execute(f"DROP INDEX {quote(name)}")
    for name, columns in wanted.items():
        if name not in existing:
            cur.execute(f"CREATE INDEX {quote(name)} ON {quote(spec.table)} ("
                        + ", ".join(quote(c) for c in columns) + ")")


def read_meta(conn: sqlite3.Connection | sqlite3.Cursor) -> dict[str, dict]:
    """Every projector record in `meta`, by projector name."""
    rows = conn.execute("SELECT key, value FROM meta WHERE key >= ? AND key < ?",
                        (META_PREFIX, META_PREFIX[:-1] + chr(ord(META_PREFIX[-1]) + 1))).fetchall()
    return {key[len(META_PREFIX):]: orjson.loads(value) for key, value in rows}


def write_meta(cur: sqlite3.Cursor, name: str, record: dict | None) -> None:
    """Store (or, with None, delete) the `meta` record of projector `name`."""
    if record is None:
        cur.execute("DELETE FROM meta WHERE key = ?", (META_PREFIX + name,))
    else:
        cur.execute("INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                    (META_PREFIX + name, orjson.dumps(record, option=orjson.OPT_SORT_KEYS).decode()))


def build_progress(conn: sqlite3.Connection | sqlite3.Cursor, name: str) -> dict | None:
    """{"done", "total"} (events) of projector `name` while it is being built (state "building"), else None."""
    row = conn.execute("SELECT value FROM meta WHERE key = ?", (META_PREFIX + name,)).fetchone()
    record = orjson.loads(row[0]) if row is not None else None
    if record is None or record.get("state") != "building":
        return None
    build = record.get("build", {})
    return {"done": build.get("done", 0), "total": build.get("total", 0)}


def record_refusals(cur: sqlite3.Cursor, refusals: list[tuple[str, str, str]], now: int, max_kept: int) -> None:
    """Append (projector, event_id hex, reason) rows at `now` (unix seconds); keep at most `max_kept` rows.

    A later refusal of the same event by the same projector replaces the earlier one.
    """
    append_bounded(cur, "projector_refusals", ("projector", "event_id", "reason", "at"),
                   [(p, e, r, now) for p, e, r in refusals], max_kept)


def dump_table(conn: sqlite3.Connection | sqlite3.Cursor, table: str, columns: Iterable[str],
               order: Iterable[str]) -> bytes:
    """Every row of `table` as JSON lines (`columns` in order), sorted by `order`: bytes comparable across stores."""
    cols = ", ".join(quote(c) for c in columns)
    rows = conn.execute(f"SELECT {cols} FROM {quote(table)} ORDER BY " + ", ".join(quote(c) for c in order))
    return b"".join(orjson.dumps(list(row)) + b"\n" for row in rows)
