"""Records, the reading side: rows of declared projectors by key, or by indexed columns a page at a time.

How this works.  A `TableView` describes one projected table from its
`ProjectorSpec`: its columns and types, its key (the storage class's key,
`ProjectorSpec.key_columns`) and its indexes.  Only the key's and the
indexes' columns may be matched (equality, bound parameters), and only so
that an index serves the read: the columns matched include the first column
of the key or of an index, and the order is the next column of such an
index after the columns matched (`follows?pubkey=A&order_by=followed`), so
a page never sorts or scans a large table picked by a client.

Keyset pagination: a page is ordered by (order column, key columns...),
which is a total order since the key is unique; its `next` cursor holds the
last row's values of those columns, and the next page starts strictly after
them.  So a row left unchanged during a walk is returned exactly once, in
order, whatever is written meanwhile; a row changed meanwhile appears at
most once per version (a new order value may place it before or after the
cursor).  The cursor is opaque to clients: base64url of the JSON array of
those values.
"""

from __future__ import annotations

import base64
import binascii
import sqlite3
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from relay.store.projectors.spec import ProjectorSpec
from relay.store.projectors.tables import build_progress, quote
from relay.store.reads import ReadPool

DEFAULT_LIMIT = 100
"""Rows of a page when no limit is given."""


class RecordQueryError(ValueError):
    """A read that cannot be answered; `parameter` names the part of the request at fault
    ("table", "limit", "order_by", "after", or a column name)."""

    def __init__(self, parameter: str, message: str) -> None:
        super().__init__(f"{parameter}: {message}")
        self.parameter = parameter
        self.message = message


class TableBuilding(RuntimeError):
    """The table's projector is being built (projectors/build.py): its rows are not all there yet.

    `progress` is {"done", "total"}: events of the projector's kind built so far, and to build.
    """

    def __init__(self, table: str, progress: dict) -> None:
        super().__init__(f"{table} is being built ({progress['done']} of {progress['total']} events)")
        self.table = table
        self.progress = progress


@dataclass(frozen=True, slots=True)
class Page:
    """One page of rows (dicts of column -> value, in order) and the cursor of the next page (None: the last)."""

    rows: list[dict[str, Any]]
    next: str | None


@dataclass(frozen=True)
class TableView:
    """What may be read from one projected table: `columns` (name -> SQL type, in row order), `key`
    (the primary key's columns in storage order), `indexes` (each a tuple of columns), `kind` its events'."""

    name: str
    kind: int
    columns: dict[str, str]
    key: tuple[str, ...]
    indexes: tuple[tuple[str, ...], ...]

    @classmethod
    def of(cls, spec: ProjectorSpec) -> TableView:
        """The view of a declared projector's table."""
        return cls(spec.table, spec.kind, spec.column_types, spec.key_columns(), spec.indexes)

    @property
    def searchable(self) -> tuple[str, ...]:
        """Columns that may be matched with equality or ordered by: the key's and the indexes' columns."""
        return tuple(dict.fromkeys((*self.key, *(c for ix in self.indexes for c in ix))))

    def describe(self) -> dict[str, Any]:
        """The JSON shape `GET /tables` lists: {"name", "kind", "columns": [{"name", "type"}], "key", "indexes"}."""
        return {"name": self.name, "kind": self.kind,
                "columns": [{"name": c, "type": t} for c, t in self.columns.items()],
                "key": list(self.key), "indexes": [list(ix) for ix in self.indexes]}

    def value(self, column: str, value: object) -> object:
        """`value` for `column` as its SQL type (a query string's text is converted: "7" for INTEGER is 7).

        Raises:
            RecordQueryError: naming `column`, for an unknown or unsearchable column or a value of another type.
        """
        if column not in self.columns:
            raise RecordQueryError(column, f"no such column in {self.name}")
        if column not in self.searchable:
            raise RecordQueryError(column, "not the key or an indexed column (columns: "
                                           + ", ".join(self.searchable) + ")")
        return _typed(column, self.columns[column], value)

    def get(self, conn: sqlite3.Connection, pk: Mapping[str, object]) -> dict[str, Any] | None:
        """The row whose key is `pk` (every key column -> its value), or None.

        Raises:
            RecordQueryError: a key column missing from `pk`, or another column in it.
        """
        for column in self.key:
            if column not in pk:
                raise RecordQueryError(column, f"missing: the key of {self.name} is " + ", ".join(self.key))
        for column in pk:
            if column not in self.key:
                raise RecordQueryError(column, f"not a key column of {self.name} (key: " + ", ".join(self.key) + ")")
        page = self.query(conn, pk, None, 1, None)
        return page.rows[0] if page.rows else None

    def query(self, conn: sqlite3.Connection, where: Mapping[str, object], order_by: str | None, limit: int | None,
              after: str | None) -> Page:
        """Rows whose columns equal `where` (key or indexed columns), ordered by `order_by` (default: the key)
        then the key, at most `limit` (>= 0; None: all) of them, starting after the cursor `after` (a `Page.next`).

        Raises:
            RecordQueryError: naming the parameter (a column, "order_by", "after").
        """
        clauses, params = [], []
        for column, value in where.items():
            clauses.append(f"{quote(column)} = ?")
            params.append(self.value(column, value))
        order = self._order(order_by, set(where))
        if after is not None:
            clause, values = _after(order, self._cursor(order, after))
            clauses.append(clause)
            params.extend(values)
        columns = tuple(self.columns)
        sql = (f"SELECT {', '.join(quote(c) for c in columns)} FROM {quote(self.name)}"
               + (" WHERE " + " AND ".join(clauses) if clauses else "")
               + " ORDER BY " + ", ".join(quote(c) for c in order) + " LIMIT ?")
        # -1: no limit; one row more tells whether a next page follows (SQLite's LIMIT is a signed 64-bit INTEGER)
        rows = conn.execute(sql, (*params, -1 if limit is None else min(limit + 1, 2**63 - 1))).fetchall()
        # The store's read connections give TEXT as bytes (relay/store/db.py); projected tables hold no BLOB.
        found = [{c: v.decode() if type(v) is bytes else v for c, v in zip(columns, row)} for row in rows[:limit]]
        # limit 0: no rows, and no cursor, as there is no last row to continue after
        last = found[-1] if limit and len(rows) > limit else None
        return Page(found, None if last is None else encode_cursor([last[c] for c in order]))

    def _cursor(self, order: tuple[str, ...], after: str) -> list[object]:
        values = decode_cursor(after, len(order))
        for column, value in zip(order, values):
            # a NULL only where a non-key column leads the order; else each value of its column's type
            if value is None and (column in self.key or column != order[0]) or value is not None and type(value) not in \
                    {"TEXT": (str,), "INTEGER": (int,), "REAL": (int, float)}[self.columns[column]] \
                    or type(value) is int and not _fits_sqlite(value):
                raise RecordQueryError("after", "not a cursor of this table and order")
        return values

    def _order(self, order_by: str | None, matched: set[str]) -> tuple[str, ...]:
        """(order column, key columns...) once an index serves the match and the order (module docstring)."""
        indexes = (self.key, *self.indexes)
        if matched and not any(ix[0] in matched for ix in indexes):
            raise RecordQueryError(next(iter(matched)), "an index must serve the match: match also one of "
                                   + ", ".join(dict.fromkeys(ix[0] for ix in indexes)))
        if order_by is None:
            return self.key
        if order_by not in self.columns:
            raise RecordQueryError("order_by", f"no column {order_by!r} in {self.name}")
        # an index orders by its next column after the leading ones matched
        ordered = {c for ix in indexes for c in ix[:_leading(ix, matched) + 1]}
        if order_by not in ordered:
            raise RecordQueryError("order_by", f"no index orders {self.name} by {order_by!r} here (order by one of "
                                   + ", ".join(c for c in self.columns if c in ordered) + ")")
        return (order_by, *(c for c in self.key if c != order_by))


def _leading(index: tuple[str, ...], matched: set[str]) -> int:
    """How many leading columns of `index` are matched with equality."""
    count = 0
    while count < len(index) and index[count] in matched:
        count += 1
    return count


class Records:
    """Reading rows of a store's projected tables on its read connections (never the writer), in one read
    transaction per call: the Python API of records (`Node.records`).

    `specs` are the store's projectors (causal ones are left out: their tables declare no key to page by);
    the tables of `private_kinds` are left out too (the HTTP API passes `[auth] private_kinds`; the default
    serves every table).
    """

    def __init__(self, store: ReadPool, specs: Iterable[object], private_kinds: Iterable[int] = ()) -> None:
        self.store = store
        self.tables = views(specs, private_kinds)
        self._projector = {s.table: s.name for s in specs if isinstance(s, ProjectorSpec)}

    def view(self, table: str) -> TableView:
        """The view of `table`.

        Raises:
            RecordQueryError: ("table") not a readable projected table.
        """
        found = self.tables.get(table)
        if found is None:
            raise RecordQueryError("table", f"{table!r} is not a readable projected table (tables: "
                                   + ", ".join(sorted(self.tables)) + ")")
        return found

    async def get_record(self, table: str, pk: Mapping[str, object]) -> dict[str, Any] | None:
        """The row of `table` whose key columns equal `pk` ({column: value}), or None (see `TableView.get`).

        Raises:
            TableBuilding: its projector is being built.
        """
        return await self.store.read_snapshot(self._when_built, table, self.view(table).get, pk)

    async def query_records(self, table: str, where: Mapping[str, object] | None = None, order_by: str | None = None,
                            limit: int = DEFAULT_LIMIT, after: str | None = None) -> Page:
        """One page of `table`'s rows (see `TableView.query`); pass `Page.next` as `after` for the next one.

        Raises:
            RecordQueryError: naming the parameter at fault ("limit" below 1).
            TableBuilding: its projector is being built.
        """
        if type(limit) is not int or limit < 1:
            raise RecordQueryError("limit", f"must be an integer >= 1, got {limit!r}")
        return await self.store.read_snapshot(self._when_built, table, self.view(table).query, dict(where or {}),
                                              order_by, limit, after)

    def _when_built(self, conn: sqlite3.Connection, table: str, read, *args):
        return when_built(conn, self._projector[table], table, read, *args)


def when_built(conn: sqlite3.Connection, projector: str, table: str, read, *args):
    """`read(conn, *args)`, unless `projector` (which writes `table`) is being built; call it inside the read's
    own snapshot, so that a build finishing meanwhile is seen finished or not at all.

    Raises:
        TableBuilding: the projector is being built.
    """
    progress = build_progress(conn, projector)
    if progress is not None:
        raise TableBuilding(table, progress)
    return read(conn, *args)


def has_row(conn: sqlite3.Connection, table: str, match: Mapping[str, object]) -> bool:
    """Whether `table` has a row whose columns equal `match` (column -> value)."""
    where = " AND ".join(f"{quote(column)} = ?" for column in match)
    found = conn.execute(f"SELECT 1 FROM {quote(table)} WHERE {where} LIMIT 1", tuple(match.values())).fetchone()
    return found is not None


def views(specs: Iterable[object], private_kinds: Iterable[int] = ()) -> dict[str, TableView]:
    """The readable tables of `specs` by name: each declared projector (`ProjectorSpec`) whose kind is not one
    of `private_kinds` (NIP-42: never served to anyone but their author or recipient)."""
    hidden = frozenset(private_kinds)
    return {s.table: TableView.of(s) for s in specs if isinstance(s, ProjectorSpec) and s.kind not in hidden}


def encode_cursor(values: list[object]) -> str:
    """The opaque cursor of a row: base64url (unpadded) of the JSON array of its order values."""
    return base64.urlsafe_b64encode(orjson.dumps(values)).rstrip(b"=").decode()


def decode_cursor(cursor: str, width: int) -> list[object]:
    """The values `encode_cursor` packed, checked to be `width` scalars.

    Raises:
        RecordQueryError: ("after") not a cursor of this table and order.
    """
    try:
        values = orjson.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except (binascii.Error, ValueError):
        raise RecordQueryError("after", "not a cursor this relay gave") from None
    if type(values) is not list or len(values) != width or not all(
            v is None or type(v) in (str, int, float) for v in values):
        raise RecordQueryError("after", "not a cursor of this table and order")
    return values


def _after(order: tuple[str, ...], values: list[object]) -> tuple[str, list[object]]:
    """The condition "strictly after `values` in `order`".  Only the first order column can be NULL (the key's
    never are); SQLite sorts NULL first, and a row value holding NULL compares as NULL (false)."""
    columns = ", ".join(quote(c) for c in order)
    marks = ", ".join("?" for _ in order)
    if values[0] is not None:
        return f"({columns}) > ({marks})", values
    first, rest = quote(order[0]), order[1:]
    if not rest:
        return f"{first} IS NOT NULL", []
    rest_columns, rest_marks = ", ".join(quote(c) for c in rest), ", ".join("?" for _ in rest)
    return f"({first} IS NOT NULL OR ({first} IS NULL AND ({rest_columns}) > ({rest_marks})))", values[1:]


def _typed(column: str, type_: str, value: object) -> object:
    if type_ == "TEXT":
        if type(value) is not str:
            raise RecordQueryError(column, f"expected text, got {value!r}")
        return value
    if type(value) is str:
        try:
            value = int(value) if type_ == "INTEGER" and value.isascii() and value.lstrip("-").isdecimal() \
                else float(value)
        except ValueError:
            raise RecordQueryError(column, f"expected {type_.lower()}, got {value!r}") from None
        if type_ == "INTEGER" and type(value) is not int:
            raise RecordQueryError(column, f"expected an integer, got {value!r}")
    if type_ == "INTEGER" and type(value) is not int or type_ == "REAL" and type(value) not in (int, float):
        raise RecordQueryError(column, f"expected {type_.lower()}, got {value!r}")
    if type(value) is int and not _fits_sqlite(value):
        raise RecordQueryError(column, f"{value} is outside SQLite's 64-bit integers")
    return value


def _fits_sqlite(value: int) -> bool:
    """Whether SQLite can bind `value` (a signed 64-bit INTEGER; Python raises OverflowError past it)."""
    return -2**63 <= value < 2**63


__all__ = ["DEFAULT_LIMIT", "Page", "RecordQueryError", "Records", "TableBuilding", "TableView", "decode_cursor", "encode_cursor",
           "has_row", "views", "when_built"]
