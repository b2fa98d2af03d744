"""The peers' events that a write policy refused here: settled for peer sync, in a bounded record.

A policy's refusal of a peer's event is final here, like a retention
eviction (relay/store/retention.py): its id is recorded in
`policy_refusals`, and peer sync does not fetch it again (`refused_among`).
At most `max_rows` ids are kept, the oldest dropped first: a dropped id is
fetched once more and refused again.  A client may still publish it (its
policies decide).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from relay.store.db import transaction
from relay.store.writes import Changes, TransactionHook, ids_in

MAX_ROWS = 100_000
"""Refused ids kept by default (about 60 bytes each)."""


def record(conn: sqlite3.Connection, hooks: Sequence[TransactionHook], refused: list[tuple[bytes, str]],
           now: int, max_rows: int = MAX_ROWS) -> tuple[Changes, int]:
    """Record `refused` (32-byte id, peer URL) at `now` (unix seconds) and drop the oldest past `max_rows`,
    in one transaction (`Store.run_job` form; nothing is removed from the events); returns the rows dropped."""
    with transaction(conn) as cur:
        cur.executemany("INSERT OR REPLACE INTO policy_refusals (id, origin, refused_at) VALUES (?, ?, ?)",
                        [(id_, origin, now) for id_, origin in refused])
        excess = cur.execute("SELECT count(*) FROM policy_refusals").fetchone()[0] - max_rows
        if excess > 0:
            cur.execute("DELETE FROM policy_refusals WHERE id IN"
                        " (SELECT id FROM policy_refusals ORDER BY refused_at LIMIT ?)", (excess,))
    return Changes(), max(excess, 0)


def refused_among(conn: sqlite3.Connection, ids: list[bytes]) -> set[bytes]:
    """The 32-byte ids among `ids` that a write policy refused from a peer (read job, for peer sync)."""
    return {r[0] for r in ids_in(conn.cursor(), "SELECT id FROM policy_refusals WHERE id IN ({})", ids)}
