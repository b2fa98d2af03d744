"""`relay verify` for the NIP-50 search index: the index recomputed from `events` and compared, token by token.

The stored index is contentless (no text to compare), so the comparison is
of what FTS5 indexed: an in-memory index is built from the documents of the
stored events (text.py) and both are read through FTS5's `fts5vocab`
instance tables, (token, rowid, column, offset) in token order, in step.
The outcome is a `TableCheck` (the projectors' comparison) of the table
`search_text`, whose lists hold `events.seq` values: an event of an indexed
kind with no row is `missing`, a row without such an event `orphan`, and a
row whose tokens differ `mismatched`.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable

from relay.store.db import read_transaction
from relay.store.projectors.verify import TableCheck
from relay.store.search.index import INSERT_SQL, TABLE, create_sql, indexed_seqs, read_record, settings, \
    stored_documents, table_exists

_VOCAB = "search_verify_vocab"


def verify_search(conn: sqlite3.Connection, kinds: Iterable[int] | None) -> TableCheck:
    """Check the stored index against the events, for `[search] kinds` (None: search disabled).

    `conn` is opened read-only on the file (`mode=ro`): a temporary
    `fts5vocab` table is created on it.  One read transaction, so the
    comparison is of one snapshot.
    """
    record = read_record(conn)
    if kinds is None:
        problem = None if record is None else "search is disabled: dropped at the next start"
        return TableCheck("search", TABLE, problem=problem)
    if record != settings(kinds) or not table_exists(conn):
        return TableCheck("search", TABLE, problem="not built for this configuration: restart the relay")
    query_only = conn.execute("PRAGMA query_only").fetchone()[0]
    conn.execute("PRAGMA query_only = 0")  # the temp table only: the file itself is open read-only
    memory = sqlite3.connect(":memory:", isolation_level=None)
    try:
        conn.execute(f"CREATE VIRTUAL TABLE IF NOT EXISTS temp.{_VOCAB} USING fts5vocab(main, {TABLE}, 'instance')")
        memory.execute(create_sql())
        memory.execute(f"CREATE VIRTUAL TABLE {_VOCAB} USING fts5vocab({TABLE}, 'instance')")
        with read_transaction(conn):
            seqs = indexed_seqs(conn, kinds)
            memory.executemany(INSERT_SQL, stored_documents(conn.cursor(), seqs))
            rows = {r[0] for r in conn.execute(f"SELECT rowid FROM {TABLE}")}
            check = TableCheck("search", TABLE, len(rows), sorted(set(seqs) - rows), sorted(rows - set(seqs)))
            differing = _differing(conn.execute(f"SELECT * FROM temp.{_VOCAB}"),
                                   memory.execute(f"SELECT * FROM {_VOCAB}"))
        check.mismatched = sorted(differing - set(check.missing) - set(check.orphan))
        return check
    finally:
        memory.close()
        conn.execute(f"DROP TABLE IF EXISTS temp.{_VOCAB}")
        conn.execute(f"PRAGMA query_only = {int(query_only)}")


_COLUMNS = {"text": 0, "domain": 1}  # fts5vocab gives a token's columns in table order, not by name


def _differing(actual: Iterable[tuple], expected: Iterable[tuple]) -> set[int]:
    """Rowids of the (token, rowid, column, offset) instances found on one side only; both in FTS5's order
    (token, as UTF-8 bytes, which is code point order; rowid; column; offset)."""
    found: set[int] = set()
    left = ((t, d, _COLUMNS[c], o) for t, d, c, o in actual)
    right = ((t, d, _COLUMNS[c], o) for t, d, c, o in expected)
    a, e = next(left, None), next(right, None)
    while a is not None or e is not None:
        if a == e:
            a, e = next(left, None), next(right, None)
        elif e is None or (a is not None and a < e):
            found.add(a[1])
            a = next(left, None)
        else:
            found.add(e[1])
            e = next(right, None)
    return found
