"""The events that a write policy refused here: the peers' ones settled for peer sync; the newest, for people.

A policy's refusal of a peer's event is final here, like a retention
eviction (relay/store/retention.py): its id is recorded in
`policy_refusals`, and peer sync does not fetch it again (`refused_among`).
At most `max_rows` ids are kept, the oldest dropped first: a dropped id is
fetched once more and refused again.  A client may still publish it (its
policies decide).

Every refusal sent as one (`OK false`, from any source; not a client's
shadow-reject, nor a policy's failure) also goes to the short log
`policy_refusal_log` (`LOG_ROWS` rows, oldest dropped), with its kind,
source, policy and message: the status page lists the newest (`recent`).
Both are written by one writer job (`record`), so a worker process's page
reads what the writer process's policies refused.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from relay.store.db import append_bounded, transaction
from relay.store.projectors.tables import table_exists
from relay.store.writes import Changes, TransactionHook, ids_in

MAX_ROWS = 100_000
"""Refused ids kept by default (about 60 bytes each)."""
LOG_ROWS = 100
"""Refusals kept in `policy_refusal_log`, for people: the newest."""
LOG_COLUMNS = ("event_id", "kind", "source", "policy", "reason", "at")


def record(conn: sqlite3.Connection, hooks: Sequence[TransactionHook], refused: list[tuple[bytes, str]],
           now: int, max_rows: int = MAX_ROWS,
           logged: Sequence[tuple[str, int, str, str, str]] = ()) -> tuple[Changes, int]:
    """Record `refused` (32-byte id, peer URL) at `now` (unix seconds) and drop the oldest past `max_rows`, and
    append `logged` (64-hex id, kind, source name, policy name, OK message) to the log, in one transaction
    (`Store.run_job` form; nothing is removed from the events); returns the settled rows dropped."""
    with transaction(conn) as cur:
        cur.executemany("INSERT OR REPLACE INTO policy_refusals (id, origin, refused_at) VALUES (?, ?, ?)",
                        [(id_, origin, now) for id_, origin in refused])
        excess = cur.execute("SELECT count(*) FROM policy_refusals").fetchone()[0] - max_rows
        if excess > 0:
            cur.execute("DELETE FROM policy_refusals WHERE id IN"
                        " (SELECT id FROM policy_refusals ORDER BY refused_at LIMIT ?)", (excess,))
        append_bounded(cur, "policy_refusal_log", LOG_COLUMNS, [(*row, now) for row in logged], LOG_ROWS)
    return Changes(), max(excess, 0)


def recent(conn: sqlite3.Connection, limit: int) -> list[tuple]:
    """The newest `limit` rows of the log, newest first: (unix seconds, 64-hex id, kind, source, policy,
    message); [] in a database without the log (not migrated yet: read-only)."""
    if not table_exists(conn, "policy_refusal_log"):
        return []
    return conn.execute("SELECT at, event_id, kind, source, policy, reason FROM policy_refusal_log"
                        " ORDER BY seq DESC LIMIT ?", (limit,)).fetchall()


def refused_among(conn: sqlite3.Connection, ids: list[bytes]) -> set[bytes]:
    """The 32-byte ids among `ids` that a write policy refused from a peer (read job, for peer sync)."""
    return {r[0] for r in ids_in(conn.cursor(), "SELECT id FROM policy_refusals WHERE id IN ({})", ids)}
