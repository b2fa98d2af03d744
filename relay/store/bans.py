"""The writer's moderation jobs: list changes, and bans that remove stored events for real.

Each function is a `Store.run_job` job: ONE transaction on the write
connection, returning (the `Changes` made, a result).  A banned event leaves
through the store's one removal path (`writes.remove_events`: the row, its
tag index rows, then the hooks: projected rows and negentropy entries), in
the transaction that records its ban, so `relay verify` stays clean and the
ban settles it for sync as a tombstone does.  A banned pubkey's stored
events go in steps of `batch` (`purge_step`), like retention: its
`purge_pubkey` row, written with the ban, stays until a step finds nothing
left, so a purge cut short by a crash is resumed (relay/ingest/moderation.py).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from relay.store import feed
from relay.store.batch import Row
from relay.store.db import transaction
from relay.store.moderation import ALLOWED_EVENT, PURGE_PUBKEY, Entry, bump, write_entry
from relay.store.writes import Changes, TransactionHook, remove_events

_COLUMNS = "seq, id, pubkey, created_at, kind, d_tag, raw"


def set_entries(conn: sqlite3.Connection, hooks: Sequence[TransactionHook], entries: Sequence[Entry],
                drop: Sequence[str] = ()) -> tuple[Changes, None]:
    """Add or replace `entries`, removing each item from the lists `drop` (NIP-86: a ban lifts an allow)."""
    with transaction(conn) as cur:
        for entry in entries:
            write_entry(cur, entry, drop)
    return Changes(), None


def lift_or_set(conn: sqlite3.Connection, hooks: Sequence[TransactionHook], entry: Entry,
                opposite: str) -> tuple[Changes, bool]:
    """Take `entry`'s item off the list `opposite` if it is there (result True), else add `entry` (False)."""
    with transaction(conn) as cur:
        lifted = cur.execute("DELETE FROM moderation WHERE list = ? AND item = ?", (opposite, entry.item)).rowcount
        if lifted:
            bump(cur)
        else:
            write_entry(cur, entry)
    return Changes(), lifted > 0


def remove_entry(conn: sqlite3.Connection, hooks: Sequence[TransactionHook], lists: Sequence[str],
                 item: str) -> tuple[Changes, bool]:
    """Remove `item` from each of `lists` (a pubkey's unfinished purge too, when unbanned); the result says
    whether a row went."""
    with transaction(conn) as cur:
        gone = sum(cur.execute("DELETE FROM moderation WHERE list = ? AND item = ?", (name, item)).rowcount
                   for name in lists)
        bump(cur)
    return Changes(), gone > 0


def ban_event(conn: sqlite3.Connection, hooks: Sequence[TransactionHook], entry: Entry) -> tuple[Changes, bool]:
    """Record the ban `entry` (an event id) and remove the event if stored; the result says whether it was."""
    with transaction(conn) as cur:
        write_entry(cur, entry, drop=(ALLOWED_EVENT,))
        rows = [Row(*r) for r in cur.execute(f"SELECT {_COLUMNS} FROM events WHERE id = ?",
                                             (bytes.fromhex(entry.item),))]
        changes = remove_events(cur, rows, hooks, feed.BANNED)
    return changes, bool(rows)


def purge_step(conn: sqlite3.Connection, hooks: Sequence[TransactionHook], pubkey: str,
               batch: int) -> tuple[Changes, int]:
    """Remove up to `batch` stored events of the banned `pubkey` (64 hex); the result is how many.

    Fewer than `batch` means none is left: the purge's row goes in the same transaction.
    """
    with transaction(conn) as cur:
        rows = [Row(*r) for r in cur.execute(f"SELECT {_COLUMNS} FROM events WHERE pubkey = ? LIMIT ?",
                                             (bytes.fromhex(pubkey), batch))]
        changes = remove_events(cur, rows, hooks, feed.BANNED)
        if len(rows) < batch:
            cur.execute("DELETE FROM moderation WHERE list = ? AND item = ?", (PURGE_PUBKEY, pubkey))
            bump(cur)
    return changes, len(rows)
