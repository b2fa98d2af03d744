"""`created_at` per coordinate for records: reserved by the writer, in a committed row, before the event is signed.

A record's `created_at` is `max(now, high-water mark + 1, last reserved + 1)` for its coordinate, where the mark
is the newest `created_at` the store has seen there: the coordinate's mark (which survives deletion) and its
address tombstone (a NIP-09 `a` deletion removes the versions up to its `created_at`, so a version written
after it must be newer).  `reserve` runs as ONE writer job (`Store.run_job`), so two callers, in one process or
in several on the same database (SQLite's write lock), never get one value, and the row in `record_clock`
keeps the order across restarts (the fleetmesh seed's `forward_clock`, made durable).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from relay.store.batch import Coordinate
from relay.store.db import transaction
from relay.store.writes import Changes, TransactionHook


def reserve(conn: sqlite3.Connection, hooks: Sequence[TransactionHook], coordinate: Coordinate, now: int,
            ceiling: int) -> tuple[Changes, int]:
    """Reserve the next `created_at` of `coordinate` ((kind, 32-byte pubkey, d_tag)) at `now` (unix seconds), in one
    transaction (`Store.run_job` form); returns it.  Past `ceiling` nothing is reserved, and the value it would
    have been is returned (the caller waits, or refuses with `rate-limited:`)."""
    with transaction(conn) as cur:
        value = max(now, _high_water(cur, coordinate) + 1)
        if value <= ceiling:
            cur.execute("INSERT INTO record_clock (kind, pubkey, d_tag, last) VALUES (?, ?, ?, ?)"
                        " ON CONFLICT DO UPDATE SET last = excluded.last", (*coordinate, value))
    return Changes(), value


def _high_water(cur: sqlite3.Cursor, coordinate: Coordinate) -> int:
    """The newest created_at known at `coordinate`: its mark, its address tombstone, its last reservation (-1: none)."""
    found = cur.execute(
        "SELECT max(coalesce((SELECT created_at FROM coordinates WHERE kind = ?1 AND pubkey = ?2 AND d_tag = ?3), -1),"
        " coalesce((SELECT until FROM address_tombstones WHERE kind = ?1 AND pubkey = ?2 AND d_tag = ?3), -1),"
        " coalesce((SELECT last FROM record_clock WHERE kind = ?1 AND pubkey = ?2 AND d_tag = ?3), -1))",
        coordinate).fetchone()
    return found[0]


__all__ = ["reserve"]
