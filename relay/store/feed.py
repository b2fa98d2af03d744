"""The change feed: every committed insertion and removal of an event, by position, in commit order.

How this works
--------------
Positions are one integer sequence shared by insertions and removals.  An
insertion's position is the `events.seq` its row gets; a removal's is a row
of `removals` (the change_feed migration), written in the same transaction by
`log_removals`, which also keeps the position of the insertion it undoes.
The next free position is one more than the largest of `events.seq`,
`removals.seq` and `feed_state.trimmed_through`: a removal always comes
after its insertion, so no position is ever given twice, and because the
single writer reads it inside its IMMEDIATE transaction, positions grow
in commit order.

`read` answers "what changed after cursor N" from three index ranges: rows of
`events` after N (insertions, with the event), removals after N, and the
insertions after N whose event has been removed since (from `removals.insert_seq`,
without the event).  An event inserted and later removed so shows both.

`removals` keeps at most `feed_state.max_entries` rows (oldest dropped first);
`trimmed_through` is the highest position dropped.  A cursor below it could
miss a removal, so `read` refuses it (`StaleCursor`), never skipping silently.
Insertions need no log: a live event is its own row.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass
from heapq import merge

import orjson

# Reasons a removal carries: NIP-01 supersession, NIP-09 deletion, NIP-62 request to vanish, NIP-40 expiry,
# a retention rule, and an operator's ban.
SUPERSEDED, DELETED, VANISHED, EXPIRED, RETENTION, BANNED = (
    "superseded", "deleted", "vanished", "expired", "retention", "banned")


@dataclass(frozen=True, slots=True)
class Change:
    """One change at `cursor` (its position): `op` "insert" or "remove" of event `id`.

    `id` and `pubkey` are 64-char hex, `created_at` unix seconds.  `reason`
    is set on removals (one of the constants above); `raw` (the event's
    canonical JSON, bytes) and `origin` ('' or the peer it came from) on
    insertions whose event is still stored, else None.
    """

    cursor: int
    op: str
    id: str
    kind: int
    pubkey: str
    created_at: int
    reason: str | None = None
    raw: bytes | None = None
    origin: str | None = None

    def as_json(self) -> bytes:
        """One JSON line of `relay changes`: {"cursor","op","id","kind","pubkey","created_at","reason"?,"event"?}."""
        obj: dict = {"cursor": self.cursor, "op": self.op, "id": self.id, "kind": self.kind, "pubkey": self.pubkey,
                     "created_at": self.created_at}
        if self.reason is not None:
            obj["reason"] = self.reason
        if self.raw is not None:
            obj["event"] = orjson.Fragment(self.raw)
        return orjson.dumps(obj)


class StaleCursor(LookupError):
    """A cursor older than what the removal log keeps: changes after it may be gone."""

    def __init__(self, cursor: int, oldest: int) -> None:
        super().__init__(f"cursor {cursor} is older than the oldest kept, {oldest}")
        self.cursor = cursor
        self.oldest = oldest


def next_position(cur: sqlite3.Cursor | sqlite3.Connection) -> int:
    """The next free position (inside the write transaction that will use it)."""
    return cur.execute(
        "SELECT max(coalesce((SELECT max(seq) FROM events), 0), coalesce((SELECT max(seq) FROM removals), 0),"
        " (SELECT trimmed_through FROM feed_state)) + 1").fetchone()[0]


def set_max_entries(conn: sqlite3.Connection, max_entries: int) -> None:
    """Bound the removal log to `max_entries` rows (`store.change_log_max_entries`); trims at the next removal."""
    conn.execute("UPDATE feed_state SET max_entries = ?", (max_entries,))


def log_removals(cur: sqlite3.Cursor, removed: Iterable, reasons: dict[int, str], first: int) -> None:
    """Give each removed row (a `batch.Removed`) a position from `first` on, in order, and log it with its
    reason, in the caller's transaction; then drop the oldest log rows past the bound.

    `reasons` maps a removed row's insertion position (`Removed.seq`) to its reason.
    """
    rows = [(first + i, r.seq, r.id, r.pubkey, r.created_at, r.kind, reasons[r.seq]) for i, r in enumerate(removed)]
    if not rows:
        return
    cur.executemany("INSERT INTO removals (seq, insert_seq, id, pubkey, created_at, kind, reason)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
    entries, max_entries = cur.execute(
        "UPDATE feed_state SET entries = entries + ? RETURNING entries, max_entries", (len(rows),)).fetchone()
    if entries > max_entries:
        cut = cur.execute("SELECT seq FROM removals ORDER BY seq LIMIT 1 OFFSET ?",
                          (entries - max_entries - 1,)).fetchone()[0]
        cur.execute("DELETE FROM removals WHERE seq <= ?", (cut,))
        cur.execute("UPDATE feed_state SET entries = ?, trimmed_through = ?", (max_entries, cut))


def head(conn: sqlite3.Connection) -> int:
    """The position of the newest change (0: none yet), a cursor after which nothing has happened."""
    return next_position(conn) - 1


def oldest(conn: sqlite3.Connection) -> int:
    """The oldest cursor `read` accepts: changes after it are all kept."""
    return conn.execute("SELECT trimmed_through FROM feed_state").fetchone()[0]


def _kinds_clause(kinds: frozenset[int] | None) -> tuple[str, list[int]]:
    if kinds is None:
        return "", []
    return f" AND kind IN ({','.join('?' * len(kinds))})", sorted(kinds)


def read(conn: sqlite3.Connection, since: int, limit: int, kinds: frozenset[int] | None = None) -> list[Change]:
    """The first `limit` changes after cursor `since`, in position order; only of `kinds` if given.

    Run it in one read transaction (`db.read_transaction`) so that the three
    ranges agree.  Raises `StaleCursor` when `since` is below `oldest`.
    """
    floor = oldest(conn)
    if since < floor:
        raise StaleCursor(since, floor)
    where, params = _kinds_clause(kinds)
    stored = (Change(seq, "insert", id_.hex(), kind, pk.hex(), created_at, None, bytes(raw), _text(origin))
              for seq, id_, pk, created_at, kind, raw, origin in conn.execute(
                  "SELECT seq, id, pubkey, created_at, kind, CAST(raw AS BLOB), origin FROM events"
                  f" WHERE seq > ?{where} ORDER BY seq LIMIT ?", (since, *params, limit)))
    removed = (Change(seq, "remove", id_.hex(), kind, pk.hex(), created_at, _text(reason))
               for seq, id_, pk, created_at, kind, reason in conn.execute(
                   "SELECT seq, id, pubkey, created_at, kind, reason FROM removals"
                   f" WHERE seq > ?{where} ORDER BY seq LIMIT ?", (since, *params, limit)))
    gone = (Change(seq, "insert", id_.hex(), kind, pk.hex(), created_at)
            for seq, id_, pk, created_at, kind in conn.execute(
                "SELECT insert_seq, id, pubkey, created_at, kind FROM removals"
                f" WHERE insert_seq > ?{where} ORDER BY insert_seq LIMIT ?", (since, *params, limit)))
    changes = []
    for change in merge(stored, removed, gone, key=lambda c: c.cursor):
        if len(changes) == limit:
            break
        changes.append(change)
    return changes


def _text(value: str | bytes) -> str:
    # Read connections return TEXT as bytes (db.connect).
    return value.decode() if isinstance(value, bytes) else value
