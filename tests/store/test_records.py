"""Keyset pages of records (relay/store/records.py) against a sort of the whole table, on a real SQLite file."""

from __future__ import annotations

import sqlite3
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relay.store.projectors.builtin import ARTICLES, BUILTIN_PROJECTORS
from relay.store.projectors.tables import create_table_sql, index_name, quote
from relay.store.records import RecordQueryError, TableView, encode_cursor

VIEW = TableView.of(ARTICLES)  # key (pubkey, d); published_at INTEGER, indexed, NULL when the tag is absent
HEX = st.sampled_from(["a" * 64, "b" * 64, "c" * 64])
ROWS = st.lists(st.tuples(HEX, st.sampled_from(["", "x", "y", "z", "zz"]),
                          st.one_of(st.none(), st.integers(-3, 3))), max_size=40, unique_by=lambda r: r[:2])


def _table(path: Path, rows: list[tuple]) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute(create_table_sql(ARTICLES))
    conn.executemany("INSERT INTO articles (_event_id, _created_at, pubkey, d, published_at) VALUES (?, 1, ?, ?, ?)",
                     [(f"{i:064x}", *row) for i, row in enumerate(rows)])
    return conn


def _key(row: dict, order: str | None) -> tuple:
    # SQLite's order: NULL first, then numbers, then text by bytes
    value = row[order] if order else None
    return (value is not None, value if value is not None else 0, row["pubkey"], row["d"])


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(rows=ROWS, order=st.sampled_from([None, "published_at", "pubkey", "d"]), limit=st.integers(1, 7),
       author=st.one_of(st.none(), HEX))
def test_joined_pages_are_the_sorted_rows_once(rows, order, limit, author):
    """Following `next` cursors from the first page yields every matching row once, in (order, key) order,
    NULL order values included."""
    where = {"pubkey": author} if author else {}
    if order == "d" and author is None:  # the key orders by d only within one author
        with pytest.raises(RecordQueryError) as refused:
            VIEW.query(sqlite3.connect(":memory:"), where, order, limit, None)
        assert refused.value.parameter == "order_by"
        return
    with tempfile.TemporaryDirectory() as tmp:
        conn = _table(Path(tmp) / "r.db", rows)
        got, after = [], None
        for _ in range(len(rows) + 2):
            page = VIEW.query(conn, where, order, limit, after)
            assert len(page.rows) <= limit
            got += page.rows
            after = page.next
            if after is None:
                break
        everything = VIEW.query(conn, where, order, None, None).rows
        conn.close()
    expected = sorted((r for r in everything), key=lambda r: _key(r, order))
    assert got == expected
    assert len(everything) == sum(1 for r in rows if author in (None, r[0]))


class _Plans:
    """A connection that answers EXPLAIN QUERY PLAN of each query instead of running it."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.plans: list[list[str]] = []

    def execute(self, sql: str, params) -> sqlite3.Cursor:
        self.plans.append([row[3] for row in self.conn.execute("EXPLAIN QUERY PLAN " + sql, params)])
        return self.conn.execute(sql, params)


def test_every_allowed_page_is_an_index_search_and_the_rest_is_refused():
    """For each built-in table, each match of a key or index prefix and each order allowed with it, the page
    after a cursor is a SEARCH that sorts no more than ties; other orders and matches are refused."""
    conn = sqlite3.connect(":memory:")
    for spec in BUILTIN_PROJECTORS:
        conn.execute(create_table_sql(spec))
        for ix in spec.indexes:
            conn.execute(f"CREATE INDEX {quote(index_name(spec.table, ix))} ON {quote(spec.table)} "
                         f"({', '.join(quote(c) for c in ix)})")
        view, plans = TableView.of(spec), _Plans(conn)
        sample = {c: "a" if t == "TEXT" else 1 for c, t in view.columns.items()}  # a value of each column's type
        for matched in ({}, *({ix[0]: sample[ix[0]]} for ix in (view.key, *view.indexes))):
            for order in (None, *view.searchable):
                try:
                    view.query(plans, matched, order, 10, None)
                except RecordQueryError as exc:
                    assert exc.parameter == "order_by" and order not in (None, view.key[0]), (spec.table, order)
                    continue
                columns = (order, *(c for c in view.key if c != order)) if order else view.key
                cursor = encode_cursor([sample[c] for c in columns])
                view.query(plans, matched, order, 10, cursor)
                plan = plans.plans[-1]
                assert plan[0].startswith("SEARCH"), (spec.table, matched, order, plan)
                # a whole sort only of the rows an index matched (one author's articles by published_at)
                assert not any("TEMP B-TREE FOR ORDER BY" in step for step in plan) or matched, plan
    follows, profiles = (TableView.of(spec) for spec in BUILTIN_PROJECTORS[1::-1])
    for view, matched, order, parameter in ((follows, {"followed": "a"}, None, "followed"),  # no index leads with it
                                            (follows, {}, "followed", "order_by"), (profiles, {}, "about", "order_by"),
                                            (profiles, {"about": "a"}, None, "about")):
        with pytest.raises(RecordQueryError) as refused:
            view.query(conn, matched, order, 10, None)
        assert refused.value.parameter == parameter
