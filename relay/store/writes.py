"""The write transaction: insert, NIP-01 supersession, NIP-09 deletion, NIP-62 vanish, NIP-40 purge.

`apply_batch` runs on the writer connection's thread and applies a whole batch
of validated events in ONE transaction: read what the batch can touch, settle
it in memory (`batch.BatchPlan`), write the result with a few `executemany`
calls, run the hooks, COMMIT.  Every refusal that depends on stored state is
decided there, so that the live set is a function of the set of events
accepted, whatever their order:

- a tombstone (deleter's pubkey + id) refuses the deleted event forever;
- an address tombstone refuses versions of a coordinate up to its `until`;
- a coordinate's high-water mark (newest `created_at`, lowest id on ties)
  survives deletion, so an older version never comes back.
- a `vanished` record (NIP-62) refuses its author's events, and gift wraps
  p-tagging it, up to its `until`;
- an `evictions` record (retention) refuses the event when a peer sends it;
- a ban (relay/store/moderation.py) refuses the event, or its author's events, from every source.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import orjson

from relay.protocol.event import Event
from relay.store import evidence, feed, moderation, vanish
from relay.store.db import transaction
from relay.store.batch import (
    DELETION_KIND,
    UNDELETABLE_KINDS,
    BatchPlan,
    BatchState,
    Coordinate,
    Removed,
    Row,
    addresses_deleted_by,
    coordinate_of,
)

@dataclass(frozen=True, slots=True)
class Write:
    """One validated event queued for the writer; `origin` is '' (local) or a peer."""

    event: Event
    origin: str = ""


@dataclass(slots=True)
class Changes:
    """What one transaction did: events inserted (in order) and rows removed, with why.

    An event inserted and then superseded or deleted in the same batch is in
    both lists: it was accepted, and it is gone.
    """

    inserted: list[Event] = field(default_factory=list)
    removed: list[Removed] = field(default_factory=list)
    # event id (hex) -> peer URL for the batch's writes that came by peer sync (look up ids of `inserted`);
    # relay/sync/ never pushes an event back to the peer it came from
    origins: dict[str, str] = field(default_factory=dict)
    # removed row's seq (its insertion's position in the change feed) -> reason (relay/store/feed.py)
    reasons: dict[int, str] = field(default_factory=dict)
    # each inserted event's position in the change feed, in the order of `inserted`
    seqs: list[int] = field(default_factory=list)
    _net: tuple[list[Event], list[Removed]] | None = field(default=None, repr=False, compare=False)

    def net(self) -> tuple[list[Event], list[Removed]]:
        """(events inserted and still stored, rows removed that were stored before this transaction).

        Computed once: every hook asks for it (a Changes is not modified once made)."""
        if self._net is None:
            if not self.removed:  # the common batch: nothing superseded or deleted
                self._net = list(self.inserted), []
            else:
                removed_ids = {r.id for r in self.removed}
                inserted_ids = {bytes.fromhex(e.id) for e in self.inserted}
                self._net = ([e for e in self.inserted if bytes.fromhex(e.id) not in removed_ids],
                             [r for r in self.removed if r.id not in inserted_ids])
        return self._net


class TransactionHook(Protocol):
    """Keeps derived tables (projectors, the negentropy index) in step with events, in the same transaction."""

    def setup(self, conn: sqlite3.Connection) -> None:
        """Create or bring up to date the hook's tables; runs once at open on the writer connection."""

    def apply(self, cur: sqlite3.Cursor, changes: Changes) -> None:
        """Apply one transaction's changes before COMMIT; an exception rolls the whole batch back."""


_IN_CHUNK = 900  # bound parameters per statement, well under SQLite's limit



def tag_rows(tags: list, created_at: int, seq: int) -> set[tuple[str, str, int, int]]:
    """Rows of the tag index for one event: (name, value, created_at, seq) of each single-letter tag."""
    return {
        (t[0], t[1], created_at, seq)
        for t in tags
        if len(t) > 1 and len(t[0]) == 1 and t[0].isascii() and t[0].isalpha()
    }


def _chunks(items: list, size: int):
    for start in range(0, len(items), size):
        yield items[start:start + size]


def ids_in(cur: sqlite3.Cursor, sql: str, ids: list[bytes]) -> list[tuple]:
    """The rows of `sql` (a statement with one `IN ({})` for `ids`), run in chunks below SQLite's variable limit."""
    rows = []
    for chunk in _chunks(ids, _IN_CHUNK):
        rows += cur.execute(sql.format(",".join("?" * len(chunk))), chunk).fetchall()
    return rows


def _by_coordinate(cur: sqlite3.Cursor, select: str, table: str, coordinates: list[Coordinate]) -> list[tuple]:
    rows = []
    for chunk in _chunks(coordinates, _IN_CHUNK // 3):
        values = ",".join("(?,?,?)" for _ in chunk)
        rows += cur.execute(
            f"SELECT {select} FROM (VALUES {values}) v CROSS JOIN {table} x"
            " ON x.kind = v.column1 AND x.pubkey = v.column2 AND x.d_tag = v.column3",
            [p for c in chunk for p in c],
        ).fetchall()
    return rows


def _read_state(cur: sqlite3.Cursor, writes: list[Write]) -> BatchState:
    """Everything `writes` can touch, in a few set queries."""
    events = [w.event for w in writes]
    state = BatchState(next_seq=feed.next_position(cur))
    ids = [bytes.fromhex(e.id) for e in events]
    state.existing = {r[0] for r in ids_in(cur, "SELECT id FROM events WHERE id IN ({})", ids)}
    state.tombstones = set(ids_in(cur, "SELECT id, pubkey FROM tombstones WHERE id IN ({})", ids))
    state.vanished = {pk.hex(): until for pk, until in ids_in(cur, vanish.VANISHED_SQL,
                                                                  vanish.pubkeys_to_check(cur, events))}
    from_peers = [bytes.fromhex(w.event.id) for w in writes if w.origin]
    state.evicted = {r[0] for r in ids_in(cur, "SELECT id FROM evictions WHERE id IN ({})", from_peers)}
    state.banned = moderation.refused(cur, events)
    coordinates: dict[Coordinate, None] = {}
    for event in events:
        pk = bytes.fromhex(event.pubkey)
        coordinate = coordinate_of(event, pk)
        if coordinate is not None:
            coordinates[coordinate] = None
        if event.kind == DELETION_KIND:
            coordinates.update(dict.fromkeys(addresses_deleted_by(event, pk)))
    if coordinates:
        wanted = list(coordinates)
        for k, p, d, created_at, id_ in _by_coordinate(cur, "x.kind, x.pubkey, x.d_tag, x.created_at, x.id",
                                                      "coordinates", wanted):
            state.marks[(k, p, d)] = (created_at, id_)
        for k, p, d, until in _by_coordinate(cur, "x.kind, x.pubkey, x.d_tag, x.until", "address_tombstones", wanted):
            state.until[(k, p, d)] = until
        for r in _by_coordinate(cur, "x.seq, x.id, x.pubkey, x.created_at, x.kind, x.d_tag, x.raw", "events", wanted):
            state.live[(r[4], r[2], r[5])] = Row(*r)
    return state


def _delete_stored(cur: sqlite3.Cursor, rows: list[Row]) -> None:
    """Remove stored rows and their tag index entries (keys recomputed from the stored JSON)."""
    if not rows:
        return
    cur.executemany("DELETE FROM events WHERE seq = ?", [(r.seq,) for r in rows])
    keys = [key for r in rows for key in tag_rows(orjson.loads(r.raw)["tags"], r.created_at, r.seq)]
    cur.executemany("DELETE FROM tags WHERE name = ? AND value = ? AND created_at = ? AND seq = ?", keys)


def _delete_by_id(cur: sqlite3.Cursor, targets: list[tuple[bytes, bytes]]) -> list[Row]:
    # Few per batch: NIP-09 targets stored before it, checked for author and kind by SQL; each once, though
    # several deletions of the batch name it (else it would be handed to the hooks and the feed twice).
    rows = []
    for tid, pk in dict.fromkeys(targets):
        rows += [Row(*r) for r in cur.execute(
            "SELECT seq, id, pubkey, created_at, kind, d_tag, raw FROM events WHERE id = ? AND pubkey = ?"
            f" AND kind NOT IN ({','.join('?' * len(UNDELETABLE_KINDS))})", (tid, pk, *UNDELETABLE_KINDS))]
    _delete_stored(cur, rows)
    return rows


def _write_plan(cur: sqlite3.Cursor, plan: BatchPlan) -> list[Row]:
    """Apply a settled plan; returns the stored rows removed (removals first: coordinates are unique)."""
    stored_removed = [r for r in plan.removed if r.event is None]
    _delete_stored(cur, stored_removed)
    by_id = _delete_by_id(cur, plan.deleted_ids)
    stored_removed += by_id
    plan.reasons.update(dict.fromkeys((r.seq for r in by_id), feed.DELETED))
    for pubkey, until, _ in plan.vanish_requests:  # NIP-62, after the removals above: each row is removed once
        covered = vanish.select_covered(cur, pubkey, until)
        _delete_stored(cur, covered)
        stored_removed += covered
        plan.reasons.update(dict.fromkeys((r.seq for r in covered), feed.VANISHED))
    vanish.record(cur, plan.vanish_requests)
    rows = list(plan.inserts.values())
    if rows:
        cur.executemany(
            "INSERT INTO events (seq, id, pubkey, created_at, kind, d_tag, expiration, origin, raw)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [(r.seq, r.id, r.pubkey, r.created_at, r.kind, r.d_tag, r.event.expiration, r.origin, r.raw)
             for r in rows],
        )
        cur.executemany(
            "INSERT OR IGNORE INTO tags (name, value, created_at, seq) VALUES (?, ?, ?, ?)",
            [key for r in rows for key in tag_rows(r.event.tags, r.created_at, r.seq)],
        )
    state = plan.state
    cur.executemany(
        "INSERT INTO coordinates (kind, pubkey, d_tag, created_at, id, expiration, deleted_raw)"
        " VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (kind, pubkey, d_tag) DO UPDATE SET"
        " created_at = excluded.created_at, id = excluded.id, expiration = excluded.expiration,"
        " deleted_raw = excluded.deleted_raw",
        [(*c, *state.marks[c], *extra) for c, extra in plan.dirty_marks.items()],
    )
    evidence.keep(cur, plan.deleted_versions + [r for r in by_id if r.d_tag is not None])
    cur.executemany(
        "INSERT INTO address_tombstones (kind, pubkey, d_tag, until) VALUES (?, ?, ?, ?)"
        " ON CONFLICT (kind, pubkey, d_tag) DO UPDATE SET until = max(until, excluded.until)",
        [(*c, state.until[c]) for c in plan.dirty_until],
    )
    cur.executemany("INSERT OR IGNORE INTO tombstones (id, pubkey, deletion_id) VALUES (?, ?, ?)",
                    plan.new_tombstones)
    return stored_removed


def _run_hooks(cur: sqlite3.Cursor, hooks: Sequence[TransactionHook], changes: Changes) -> None:
    if changes.inserted or changes.removed:
        for hook in hooks:
            hook.apply(cur, changes)


def apply_batch(conn: sqlite3.Connection, writes: list[Write], hooks: Sequence[TransactionHook] = (),
                relay_urls: frozenset[tuple] = frozenset()) -> tuple[list[tuple[bool, str]], Changes]:
    """Apply `writes` and every hook in one IMMEDIATE transaction and commit.

    `relay_urls` are this relay's URL keys (`relay_url_key`): a NIP-62 request to vanish naming one of them (or
    `ALL_RELAYS`) is honoured in the same transaction.

    Returns one (accepted, message) outcome per write, in order, with the
    NIP-01 prefixes of an OK reply, and the `Changes` made.  Rolls back and
    re-raises on any database error: nothing of the batch is kept.
    """
    with transaction(conn) as cur:
        plan = BatchPlan(_read_state(cur, writes), relay_urls)
        for w in writes:
            plan.settle(w.event, w.origin)
        stored_removed = _write_plan(cur, plan)
        in_batch = [r for r in plan.removed if r.event is not None]
        changes = Changes(plan.accepted, stored_removed + in_batch,
                          {w.event.id: w.origin for w in writes if w.origin},  # peer sync: no echo to the origin
                          plan.reasons, plan.accepted_seqs)
        feed.log_removals(cur, changes.removed, changes.reasons, plan.state.next_seq)
        _run_hooks(cur, hooks, changes)
    return plan.outcomes, changes


def purge_expired(conn: sqlite3.Connection, now: int, max_rows: int,
                  hooks: Sequence[TransactionHook] = ()) -> Changes:
    """NIP-40: remove up to `max_rows` events whose expiration <= `now` (unix seconds), in one transaction.

    Expired high-water marks go too: an expired version leaves no mark (nor
    the one it replaced: a coordinate keeps one), so a node that never saw it
    and one that purged it take the same older version.
    """
    with transaction(conn) as cur:
        cur.execute("DELETE FROM coordinates WHERE expiration <= ?", (now,))
        return remove_events(cur, [Row(*r) for r in cur.execute(
            "SELECT seq, id, pubkey, created_at, kind, d_tag, raw FROM events WHERE expiration <= ? LIMIT ?",
            (now, max_rows))], hooks, feed.EXPIRED)


def remove_events(cur: sqlite3.Cursor, rows: list[Row], hooks: Sequence[TransactionHook], reason: str) -> Changes:
    """Delete stored `rows` (tag index entries too), log each in the change feed with `reason`, and run `hooks`
    on that removal, in the caller's transaction.

    The one removal path outside a batch (NIP-40 purges, retention, bans:
    `reason` is `feed.EXPIRED`, `feed.RETENTION`, `feed.BANNED`), so the
    change feed, projected tables and the negentropy index follow them as
    they follow any write.
    """
    first = feed.next_position(cur)  # before the delete: the rows may hold the highest position
    _delete_stored(cur, rows)
    changes = Changes([], rows, reasons=dict.fromkeys((r.seq for r in rows), reason))
    feed.log_removals(cur, rows, changes.reasons, first)
    _run_hooks(cur, hooks, changes)
    return changes
