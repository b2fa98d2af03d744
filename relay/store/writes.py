"""The write transaction: insert, NIP-01 supersession, NIP-09 deletion, NIP-40 purge.

`apply_batch` runs on the writer connection's thread and applies a whole batch
of validated events in ONE transaction.  Every refusal that depends on stored
state is decided here, so that the live set is a function of the set of
events accepted, whatever their order:

- a tombstone (deleter's pubkey + id) refuses the deleted event forever;
- an address tombstone refuses versions of a coordinate up to its `until`;
- a coordinate's high-water mark (newest `created_at`, lowest id on ties)
  survives deletion, so an older version never comes back.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from relay.protocol.event import Event, is_addressable, is_decimal, is_hex64, is_replaceable

STORED = (True, "")
DUPLICATE = (True, "duplicate: already have this event")
NEWER_VERSION = (False, "duplicate: have a newer version")
DELETED = (False, "blocked: this event was deleted")

DELETION_KIND = 5  # NIP-09


@dataclass(frozen=True, slots=True)
class Write:
    """One validated event queued for the writer; `origin` is '' (local) or a peer."""

    event: Event
    origin: str = ""


@dataclass(frozen=True, slots=True)
class Removed:
    """An event row that left the store (superseded, deleted or expired)."""

    seq: int
    id: bytes
    pubkey: bytes
    created_at: int
    kind: int
    d_tag: str | None


@dataclass(slots=True)
class Changes:
    """What one transaction did: events inserted (in order) and rows removed.

    An event inserted and then superseded or deleted in the same batch is in
    both lists: it was accepted, and it is gone.
    """

    inserted: list[Event] = field(default_factory=list)
    removed: list[Removed] = field(default_factory=list)

    def net(self) -> tuple[list[Event], list[Removed]]:
        """(events inserted and still stored, rows removed that were stored before this transaction)."""
        removed_ids = {r.id for r in self.removed}
        kept = [e for e in self.inserted if bytes.fromhex(e.id) not in removed_ids]
        inserted_ids = {bytes.fromhex(e.id) for e in self.inserted}
        return kept, [r for r in self.removed if r.id not in inserted_ids]


class TransactionHook(Protocol):
    """Keeps derived tables (projectors, the negentropy index) in step with events, in the same transaction."""

    def setup(self, conn: sqlite3.Connection) -> None:
        """Create or bring up to date the hook's tables; runs once at open on the writer connection."""

    def apply(self, cur: sqlite3.Cursor, changes: Changes) -> None:
        """Apply one transaction's changes before COMMIT; an exception rolls the whole batch back."""


_REMOVE_RETURNING = " RETURNING seq, id, pubkey, created_at, kind, d_tag"


@dataclass(slots=True)
class _Batch:
    """Work in progress of one transaction: its Changes, and tag rows not yet written, by seq."""

    changes: Changes = field(default_factory=Changes)
    tag_rows: dict[int, set] = field(default_factory=dict)


def _remove(cur: sqlite3.Cursor, where: str, params: tuple, batch: _Batch) -> None:
    rows = cur.execute("DELETE FROM events WHERE " + where + _REMOVE_RETURNING, params).fetchall()
    if rows:
        # seq values are reused once the highest row is gone: drop unwritten tag rows now.
        for r in rows:
            batch.tag_rows.pop(r[0], None)
        cur.executemany("DELETE FROM tags WHERE seq = ?", [(r[0],) for r in rows])
        batch.changes.removed.extend(Removed(*r) for r in rows)


def _is_newer(created_at: int, id_: bytes, than: tuple[int, bytes]) -> bool:
    # NIP-01: the newest created_at wins; on a tie the lowest id wins.
    return created_at > than[0] or (created_at == than[0] and id_ < than[1])


def _supersede(cur: sqlite3.Cursor, ev: Event, idb: bytes, pk: bytes, tombstoned: bool, batch: _Batch):
    """Settle a replaceable/addressable event against its coordinate; None means insert it.

    A newer version that was deleted before it arrived (`tombstoned`) still
    supersedes the older ones and raises the high-water mark: the outcome must
    not depend on whether the deletion came first.
    """
    kind, d_tag = ev.kind, ev.d_tag if is_addressable(ev.kind) else ""
    key = (kind, pk, d_tag)
    row = cur.execute(
        "SELECT until FROM address_tombstones WHERE kind = ? AND pubkey = ? AND d_tag = ?", key
    ).fetchone()
    if row is not None and ev.created_at <= row[0]:
        return DELETED
    hwm = cur.execute(
        "SELECT created_at, id FROM coordinates WHERE kind = ? AND pubkey = ? AND d_tag = ?", key
    ).fetchone()
    if hwm is not None:
        if hwm[1] == idb:
            return DELETED if tombstoned else DUPLICATE
        if not _is_newer(ev.created_at, idb, hwm):
            return NEWER_VERSION
    _remove(cur, "kind = ? AND pubkey = ? AND d_tag = ?", key, batch)
    cur.execute(
        "INSERT INTO coordinates (kind, pubkey, d_tag, created_at, id) VALUES (?, ?, ?, ?, ?)"
        " ON CONFLICT (kind, pubkey, d_tag) DO UPDATE SET created_at = excluded.created_at, id = excluded.id",
        (*key, ev.created_at, idb),
    )
    return DELETED if tombstoned else None


def _parse_address(value: str, pk_hex: str) -> tuple[int, str] | None:
    """(kind, d_tag) of an `a` tag `kind:pubkey:d` that the deleter may delete, else None."""
    parts = value.split(":", 2)
    if len(parts) != 3 or parts[1] != pk_hex or not is_decimal(parts[0]) or len(parts[0]) > 5:
        return None
    kind = int(parts[0])
    if is_replaceable(kind):
        return (kind, "")
    if is_addressable(kind):
        return (kind, parts[2])
    return None


def _apply_deletion(cur: sqlite3.Cursor, ev: Event, idb: bytes, pk: bytes, batch: _Batch) -> None:
    """NIP-09: delete the author's own events named by `e` and `a` tags, and remember it."""
    for target in dict.fromkeys(ev.tag_values("e")):
        if not is_hex64(target):
            continue
        tid = bytes.fromhex(target)
        cur.execute(
            "INSERT OR IGNORE INTO tombstones (id, pubkey, deletion_id) VALUES (?, ?, ?)", (tid, pk, idb)
        )
        # A deletion of a deletion has no effect (NIP-09).
        _remove(cur, "id = ? AND pubkey = ? AND kind != 5", (tid, pk), batch)
    for value in dict.fromkeys(ev.tag_values("a")):
        address = _parse_address(value, ev.pubkey)
        if address is None:
            continue
        kind, d_tag = address
        cur.execute(
            "INSERT INTO address_tombstones (kind, pubkey, d_tag, until) VALUES (?, ?, ?, ?)"
            " ON CONFLICT (kind, pubkey, d_tag) DO UPDATE SET until = max(until, excluded.until)",
            (kind, pk, d_tag, ev.created_at),
        )
        _remove(cur, "kind = ? AND pubkey = ? AND d_tag = ? AND created_at <= ?",
                (kind, pk, d_tag, ev.created_at), batch)


def _tag_rows(ev: Event, seq: int) -> set[tuple[str, str, int, int]]:
    return {
        (t[0], t[1], ev.created_at, seq)
        for t in ev.tags
        if len(t) > 1 and len(t[0]) == 1 and t[0].isascii() and t[0].isalpha()
    }


def _apply_one(cur: sqlite3.Cursor, write: Write, batch: _Batch) -> tuple[bool, str]:
    ev = write.event
    idb, pk = bytes.fromhex(ev.id), bytes.fromhex(ev.pubkey)
    # A deletion of a deletion has no effect (NIP-09): kind 5 ignores tombstones.
    tombstoned = ev.kind != DELETION_KIND and cur.execute(
        "SELECT 1 FROM tombstones WHERE id = ? AND pubkey = ?", (idb, pk)
    ).fetchone() is not None
    d_tag = None
    if is_replaceable(ev.kind) or is_addressable(ev.kind):
        refusal = _supersede(cur, ev, idb, pk, tombstoned, batch)
        if refusal is not None:
            return refusal
        d_tag = ev.d_tag if is_addressable(ev.kind) else ""
    elif tombstoned:
        return DELETED
    cur.execute(
        "INSERT OR IGNORE INTO events (id, pubkey, created_at, kind, d_tag, expiration, origin, raw)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (idb, pk, ev.created_at, ev.kind, d_tag, ev.expiration, write.origin, ev.raw.decode()),
    )
    if cur.rowcount == 0:
        return DUPLICATE
    batch.tag_rows[cur.lastrowid] = _tag_rows(ev, cur.lastrowid)
    batch.changes.inserted.append(ev)
    if ev.kind == DELETION_KIND:
        _apply_deletion(cur, ev, idb, pk, batch)
    return STORED


def apply_batch(conn: sqlite3.Connection, writes: list[Write],
                hooks: Sequence[TransactionHook] = ()) -> tuple[list[tuple[bool, str]], Changes]:
    """Apply `writes` and every hook in one IMMEDIATE transaction and commit.

    Returns one (accepted, message) outcome per write, in order, with the
    NIP-01 prefixes of an OK reply, and the `Changes` made.  Rolls back and
    re-raises on any database error: nothing of the batch is kept.
    """
    batch = _Batch()
    cur = conn.cursor()
    cur.execute("BEGIN IMMEDIATE")
    try:
        outcomes = [_apply_one(cur, w, batch) for w in writes]
        rows = [row for rows in batch.tag_rows.values() for row in rows]
        if rows:
            cur.executemany("INSERT OR IGNORE INTO tags (name, value, created_at, seq) VALUES (?, ?, ?, ?)", rows)
        _run_hooks(cur, hooks, batch.changes)
        cur.execute("COMMIT")
    except BaseException:
        conn.rollback()
        raise
    return outcomes, batch.changes


def _run_hooks(cur: sqlite3.Cursor, hooks: Sequence[TransactionHook], changes: Changes) -> None:
    if changes.inserted or changes.removed:
        for hook in hooks:
            hook.apply(cur, changes)


def purge_expired(conn: sqlite3.Connection, now: int, max_rows: int,
                  hooks: Sequence[TransactionHook] = ()) -> Changes:
    """NIP-40: remove up to `max_rows` events whose expiration <= `now` (unix seconds), in one transaction."""
    batch = _Batch()
    cur = conn.cursor()
    cur.execute("BEGIN IMMEDIATE")
    try:
        _remove(cur, "seq IN (SELECT seq FROM events WHERE expiration <= ? LIMIT ?)", (now, max_rows), batch)
        _run_hooks(cur, hooks, batch.changes)
        cur.execute("COMMIT")
    except BaseException:
        conn.rollback()
        raise
    return batch.changes
