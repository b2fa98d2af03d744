"""Retention: removing old events by rule, in short transactions on the writer, with eviction records.

How this works
--------------
A retention run (relay/retention.py) walks the events a rule selects from
the oldest, in `Scan` steps.  Each step is one job on the store's writer
(`Store.run_job`), so client writes interleave between steps: it reads at
most `batch` rows after the scan's cursor (ordered by created_at ascending,
ties by id descending, as the (created_at DESC, id) indexes read backwards),
keeps the protected ones (`Protection`), removes the others exactly as the
NIP-40 purge does (`writes.remove_events`: the rows, then the hooks: projected
tables and the negentropy index follow), records their ids in `evictions`,
and commits.  The cursor moves past every row read, so a step never reads a
protected row twice within one run and each transaction is bounded by
`batch` rows however many protected events there are.

`evictions` is read only by peer sync: an evicted id is not fetched from a
peer again, and an evicted event arriving from a peer is refused as settled
(`batch.EVICTED`).  A client may publish it again and it is stored.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass

from relay.protocol.filters import Filter
from relay.store import feed
from relay.store.batch import Row
from relay.store.projectors.rows import stored_event
from relay.store.db import transaction
from relay.store.writes import Changes, TransactionHook, ids_in, remove_events

START: tuple[int, bytes] = (-1, b"")
"""The cursor before the oldest event (created_at >= 0)."""


@dataclass(frozen=True, slots=True)
class Protection:
    """Events retention never removes.

    `kinds`: the kinds of protected projectors: every stored event of such a kind backs (or may back) a
    row of its table, so none is removed.  `filters`: NIP-01 filters (negentropy `protected_filters`);
    an event matching any is kept.
    """

    kinds: frozenset[int] = frozenset()
    filters: tuple[Filter, ...] = ()

    def protects(self, row: Row) -> bool:
        """True when the stored event of `row` must be kept."""
        if row.kind in self.kinds:
            return True
        if not self.filters:
            return False
        event = stored_event(row.raw)
        return any(f.matches(event) for f in self.filters)


@dataclass(frozen=True, slots=True)
class Scan:
    """What one retention step reads: events of `kind` (None: any kind) with created_at < `before`
    (unix seconds; None: any age), after `cursor` (created_at, id) in the scan order."""

    kind: int | None
    before: int | None
    cursor: tuple[int, bytes] = START


@dataclass(frozen=True, slots=True)
class Step:
    """The outcome of one step: rows `read`, `evicted`, and the cursor after the last row read
    (`done` when fewer than the batch were left to read)."""

    read: int
    evicted: int
    cursor: tuple[int, bytes]
    done: bool


_COLUMNS = "seq, id, pubkey, created_at, kind, d_tag, raw"


def _select(scan: Scan, batch: int) -> tuple[str, tuple]:
    where, params = ["created_at >= ?", "NOT (created_at = ? AND id >= ?)"], [scan.cursor[0], scan.cursor[0],
                                                                              scan.cursor[1]]
    if scan.kind is not None:
        where.insert(0, "kind = ?")
        params.insert(0, scan.kind)
    if scan.before is not None:
        where.append("created_at < ?")
        params.append(scan.before)
    # (created_at ASC, id DESC) is the reverse of events_by_kind / events_by_created: no sort.
    sql = f"SELECT {_COLUMNS} FROM events WHERE {' AND '.join(where)} ORDER BY created_at, id DESC LIMIT ?"
    return sql, (*params, batch)


def evict_step(conn: sqlite3.Connection, hooks: Sequence[TransactionHook], scan: Scan, batch: int,
               budget: int, protection: Protection, now: int) -> tuple[Changes, Step]:
    """One retention step in ONE transaction: read up to `batch` rows of `scan`, remove up to `budget`
    of the unprotected ones, record them in `evictions` (at `now`, unix seconds), run `hooks`, commit.

    `Store.run_job` form: returns (the removals, the `Step`).  Reading stops at the row that spends the
    budget, so the cursor never passes an event left in place for want of budget.
    """
    with transaction(conn) as cur:
        rows = [Row(*r) for r in cur.execute(*_select(scan, batch))]
        evicted: list[Row] = []
        read = 0
        for row in rows:
            if len(evicted) >= budget:
                break
            read += 1
            if not protection.protects(row):
                evicted.append(row)
        cur.executemany("INSERT OR REPLACE INTO evictions (id, created_at, evicted_at) VALUES (?, ?, ?)",
                        [(r.id, r.created_at, now) for r in evicted])
        changes = remove_events(cur, evicted, hooks, feed.RETENTION)
    cursor = (rows[read - 1].created_at, rows[read - 1].id) if read else scan.cursor
    return changes, Step(read, len(evicted), cursor, done=len(rows) < batch and read == len(rows))


def scan_rows(conn: sqlite3.Connection, scan: Scan, batch: int) -> list[Row]:
    """Up to `batch` rows of `scan`, oldest first (read job: the shards' guard chooses among them)."""
    return [Row(*r) for r in conn.execute(*_select(scan, batch))]


def evict_ids(conn: sqlite3.Connection, hooks: Sequence[TransactionHook], ids: list[bytes], now: int,
              shard: str | None = None) -> tuple[Changes, int]:
    """Remove the stored events among `ids` (32-byte) in ONE transaction, recorded in `evictions` at `now` with
    `shard` (a handover's; None: a retention rule's), as `evict_step` does.  `Store.run_job` form: returns
    (the removals, how many were stored)."""
    with transaction(conn) as cur:
        rows = [Row(*r) for r in ids_in(cur, f"SELECT {_COLUMNS} FROM events WHERE id IN ({{}})", ids)]
        cur.executemany("INSERT OR REPLACE INTO evictions (id, created_at, evicted_at, shard) VALUES (?, ?, ?, ?)",
                        [(r.id, r.created_at, now, shard) for r in rows])
        changes = remove_events(cur, rows, hooks, feed.RETENTION)
    return changes, len(rows)


def forget_evictions(conn: sqlite3.Connection, hooks: Sequence[TransactionHook], shard: str) -> tuple[Changes, int]:
    """Forget the handed-over events of `shard` (taken back: peer sync may fetch them again).  `Store.run_job`
    form: returns (no changes, how many were forgotten)."""
    with transaction(conn) as cur:
        cur.execute("DELETE FROM evictions WHERE shard = ?", (shard,))
    return Changes(), cur.rowcount


def evicted_among(conn: sqlite3.Connection, ids: list[bytes]) -> set[bytes]:
    """The 32-byte ids among `ids` that retention removed here (read job, for peer sync)."""
    return {r[0] for r in ids_in(conn.cursor(), "SELECT id FROM evictions WHERE id IN ({})", ids)}


def count_events(conn: sqlite3.Connection) -> int:
    """How many events are stored (read job)."""
    return conn.execute("SELECT count(*) FROM events").fetchone()[0]
