"""A bulk load into an empty store: the events table's secondary indexes are built once, at the end.

How this works: each of `DEFERRED` keys events by a random-looking value
(pubkey) or is sorted apart from the order events arrive in, so inserting
into it dirties about one page per event and index, written to the WAL at
every commit and again at the checkpoint.  Built by `CREATE INDEX` over the
loaded table instead, each is one sorted pass.  `defer_indexes` saves their
`CREATE` statements in `meta` and drops them, in one transaction, only when
the store holds no event; `restore_indexes` runs the saved statements and
forgets them, in one transaction.  `Store.open` calls `restore_indexes`, so a
load that died half-way leaves a store whose next writer builds them first.
The writer's own reads (ids, coordinates, tombstones) use other indexes.
"""

from __future__ import annotations

import sqlite3

import orjson

from relay.store.db import transaction
from relay.store.writes import Changes

DEFERRED = ("events_by_created", "events_by_pubkey", "events_by_kind", "events_by_pubkey_kind")
META_KEY = "bulk:deferred_indexes"  # meta: the saved CREATE INDEX statements, as a JSON list


def defer_indexes(conn: sqlite3.Connection, hooks: object = ()) -> tuple[Changes, bool]:
    """`Store.run_job` job: drop `DEFERRED` (their statements kept in `meta`) if the store holds no event;
    True when it did."""
    with transaction(conn) as cur:
        if cur.execute("SELECT 1 FROM events LIMIT 1").fetchone() is not None:
            return Changes(), False
        saved = [sql for (sql,) in cur.execute(
            f"SELECT sql FROM sqlite_master WHERE type = 'index' AND name IN ({','.join('?' * len(DEFERRED))})"
            " ORDER BY name", DEFERRED)]
        cur.execute("INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value ="
                    " excluded.value", (META_KEY, orjson.dumps(saved).decode()))
        for name in DEFERRED:
            cur.execute(f"DROP INDEX IF EXISTS {name}")
    return Changes(), True


def restore_indexes(conn: sqlite3.Connection, hooks: object = ()) -> tuple[Changes, int]:
    """`Store.run_job` job (and `Store.open`): build the indexes `defer_indexes` dropped, if any; how many."""
    row = conn.execute("SELECT value FROM meta WHERE key = ?", (META_KEY,)).fetchone()
    if row is None:
        return Changes(), 0
    statements = orjson.loads(row[0])
    with transaction(conn) as cur:
        for sql in statements:
            cur.execute(sql.replace("CREATE INDEX", "CREATE INDEX IF NOT EXISTS", 1))
        cur.execute("DELETE FROM meta WHERE key = ?", (META_KEY,))
    return Changes(), len(statements)
