"""Settling one batch of events in memory, against state read once per batch.

How this works: `writes.apply_batch` reads, in a few set queries, everything
the batch can touch (which of its ids exist, their tombstones, and for every
coordinate it names: the high-water mark, the address tombstone and the live
version, and the NIP-62 and retention records of its authors and ids).
`BatchPlan.settle` then walks the events in arrival order, with NIP-01
supersession, NIP-09 deletion and NIP-62 requests to vanish decided in
Python against that state (updated as it goes), and collects what to
write: rows to insert, rows to remove, coordinates, tombstones, requests to
vanish.  The SQL that follows is a handful of
`executemany` calls, so the writer releases and retakes the GIL a few times
per batch instead of several times per event.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from relay.protocol.event import Event, is_addressable, is_decimal, is_hex64, is_replaceable
from relay.protocol.vanish import VANISH_KIND, covered, names_relay
from relay.store import feed

STORED = (True, "")
DUPLICATE = (True, "duplicate: already have this event")
NEWER_VERSION = (False, "duplicate: have a newer version")
DELETED = (False, "blocked: this event was deleted")
VANISHED = (False, "blocked: deleted at its author's request to vanish (NIP-62)")
EVICTED = (False, "blocked: deleted here by retention; not taken back from peers")
BANNED = (False, "blocked: banned by this relay's operator")

DELETION_KIND = 5  # NIP-09
UNDELETABLE_KINDS = (DELETION_KIND, VANISH_KIND)  # a kind-5 deletion of these has no effect (NIP-09, NIP-62)

Coordinate = tuple[int, bytes, str]  # (kind, pubkey, d_tag): d_tag is "" for replaceable kinds


@dataclass(slots=True)
class Removed:
    """An event row that left the store (superseded, deleted or expired)."""

    seq: int
    id: bytes
    pubkey: bytes
    created_at: int
    kind: int
    d_tag: str | None


@dataclass(slots=True)
class Row(Removed):
    """An event row: one already stored (read at batch start) or one this batch inserts."""

    raw: str
    event: Event | None = None  # set for rows this batch inserts
    origin: str = ""


def coordinate_of(event: Event, pubkey: bytes) -> Coordinate | None:
    """(kind, pubkey, d_tag) of a replaceable or addressable event, else None (NIP-01)."""
    if is_replaceable(event.kind):
        return (event.kind, pubkey, "")
    if is_addressable(event.kind):
        return (event.kind, pubkey, event.d_tag)
    return None


def parse_address(value: str, pubkey_hex: str) -> tuple[int, str] | None:
    """(kind, d_tag) of an `a` tag `kind:pubkey:d` the deleter may delete, else None (NIP-09)."""
    parts = value.split(":", 2)
    if len(parts) != 3 or parts[1] != pubkey_hex or not is_decimal(parts[0]) or len(parts[0]) > 5:
        return None
    kind = int(parts[0])
    if is_replaceable(kind):
        return (kind, "")
    if is_addressable(kind):
        return (kind, parts[2])
    return None


def addresses_deleted_by(event: Event, pubkey: bytes) -> list[Coordinate]:
    """The coordinates a kind-5 event's `a` tags delete: only the deleter's own."""
    found = []
    for value in dict.fromkeys(event.tag_values("a")):
        address = parse_address(value, event.pubkey)
        if address is not None:
            found.append((address[0], pubkey, address[1]))
    return found


def is_newer(created_at: int, id_: bytes, than: tuple[int, bytes]) -> bool:
    """Whether a version (`created_at`, 32-byte `id_`) of a coordinate replaces `than` (created_at, id): NIP-01,
    the newest created_at wins; on a tie the lowest id wins."""
    return created_at > than[0] or (created_at == than[0] and id_ < than[1])


@dataclass(slots=True)
class BatchState:
    """What the store holds that a batch can touch, read once at batch start."""

    next_seq: int
    existing: set[bytes] = field(default_factory=set)
    tombstones: set[tuple[bytes, bytes]] = field(default_factory=set)
    marks: dict[Coordinate, tuple[int, bytes]] = field(default_factory=dict)  # high-water marks
    until: dict[Coordinate, int] = field(default_factory=dict)  # address tombstones
    live: dict[Coordinate, Row] = field(default_factory=dict)  # live version per coordinate
    vanished: dict[str, int] = field(default_factory=dict)  # NIP-62: hex pubkey -> created_at it vanished up to
    evicted: set[bytes] = field(default_factory=set)  # ids removed by retention (refused from peers only)
    banned: set[str] = field(default_factory=set)  # hex ids of the batch's banned events or authors' (moderation)


@dataclass(slots=True)
class BatchPlan:
    """The outcome of settling a batch: replies, and the writes that make them true."""

    state: BatchState
    relay_urls: frozenset[tuple] = frozenset()  # this relay's URL keys (relay_url_key), for NIP-62 `relay` tags
    outcomes: list[tuple[bool, str]] = field(default_factory=list)
    inserts: dict[bytes, Row] = field(default_factory=dict)  # by id, in arrival order
    accepted: list[Event] = field(default_factory=list)
    accepted_seqs: list[int] = field(default_factory=list)  # each accepted event's change feed position
    removed: list[Row] = field(default_factory=list)  # stored or batch rows that leave
    reasons: dict[int, str] = field(default_factory=dict)  # removed row's seq -> why (`feed.SUPERSEDED`, ...)
    deleted_ids: list[tuple[bytes, bytes]] = field(default_factory=list)  # (id, pubkey) to delete if stored
    new_tombstones: list[tuple[bytes, bytes, bytes]] = field(default_factory=list)
    # coordinate -> (expiration, evidence): the new mark's NIP-40 expiry, and its JSON when it arrived deleted
    dirty_marks: dict[Coordinate, tuple[int | None, str | None]] = field(default_factory=dict)
    deleted_versions: list[Row] = field(default_factory=list)  # live versions deleted by `e`: their mark's evidence
    dirty_until: set[Coordinate] = field(default_factory=set)
    vanish_requests: list[tuple[bytes, int, bytes]] = field(default_factory=list)  # (pubkey, until, request id)

    def settle(self, event: Event, origin: str) -> None:
        """Decide one event in arrival order and append its (accepted, message) outcome."""
        self.outcomes.append(self._settle(event, origin))

    def _settle(self, event: Event, origin: str) -> tuple[bool, str]:
        if event.id in self.state.banned:
            return BANNED  # a ban committed while the event waited in the writer queue
        idb, pk = bytes.fromhex(event.id), bytes.fromhex(event.pubkey)
        # Before the duplicate check: a request earlier in this batch deletes stored events only at write time.
        if self.state.vanished and covered(event, self.state.vanished):
            return VANISHED
        if idb in self.state.existing or idb in self.inserts:
            return DUPLICATE
        if origin and idb in self.state.evicted:
            return EVICTED  # peer sync never brings back what retention removed; a client may publish it again
        # A deletion of a deletion (or of a request to vanish) has no effect (NIP-09): they ignore tombstones.
        tombstoned = event.kind not in UNDELETABLE_KINDS and (idb, pk) in self.state.tombstones
        coordinate = coordinate_of(event, pk)
        if coordinate is not None:
            refusal = self._supersede(coordinate, event, idb, tombstoned)
            if refusal is not None:
                return refusal
        elif tombstoned:
            return DELETED
        row = Row(self.state.next_seq, idb, pk, event.created_at, event.kind,
                  coordinate[2] if coordinate else None, event.raw.decode(), event, origin)
        self.state.next_seq += 1
        self.inserts[idb] = row
        self.accepted.append(event)
        self.accepted_seqs.append(row.seq)
        if coordinate is not None:
            self.state.live[coordinate] = row
        if event.kind == DELETION_KIND:
            self._delete(event, idb, pk)
        elif names_relay(event, self.relay_urls):
            self._vanish(event, idb, pk)
        return STORED

    def _supersede(self, coordinate: Coordinate, event: Event, idb: bytes, tombstoned: bool):
        """Settle a version against its coordinate; None means insert it.

        A newer version deleted before it arrived (`tombstoned`) still
        supersedes older ones and raises the high-water mark, so the outcome
        does not depend on whether the deletion came first; the mark keeps it
        as evidence for peers that still hold an older version (`evidence.py`).
        """
        created_at = event.created_at
        until = self.state.until.get(coordinate)
        if until is not None and created_at <= until:
            return DELETED
        mark = self.state.marks.get(coordinate)
        if mark is not None:
            if mark[1] == idb:
                return DELETED if tombstoned else DUPLICATE
            if not is_newer(created_at, idb, mark):
                return NEWER_VERSION
        self._remove(self.state.live.pop(coordinate, None), feed.SUPERSEDED)
        self.state.marks[coordinate] = (created_at, idb)
        self.dirty_marks[coordinate] = (event.expiration, event.raw.decode() if tombstoned else None)
        return DELETED if tombstoned else None

    def _remove(self, row: Row | None, reason: str) -> None:
        if row is None:
            return
        self.reasons[row.seq] = reason
        if row.event is not None:
            del self.inserts[row.id]
        else:
            self.state.existing.discard(row.id)
        self.removed.append(row)

    def _delete(self, deletion: Event, idb: bytes, pk: bytes) -> None:
        """NIP-09: the deleter's own events named by `e` and `a` tags go, and are remembered."""
        live_by_id = {row.id: c for c, row in self.state.live.items()}
        for target in dict.fromkeys(deletion.tag_values("e")):
            if not is_hex64(target):
                continue
            tid = bytes.fromhex(target)
            self.state.tombstones.add((tid, pk))
            self.new_tombstones.append((tid, pk, idb))
            self._delete_id(tid, pk, live_by_id)
        for coordinate in addresses_deleted_by(deletion, pk):
            until = max(self.state.until.get(coordinate, deletion.created_at), deletion.created_at)
            self.state.until[coordinate] = until
            self.dirty_until.add(coordinate)
            row = self.state.live.get(coordinate)
            if row is not None and row.created_at <= until:
                self._remove(self.state.live.pop(coordinate), feed.DELETED)

    def _delete_id(self, tid: bytes, pk: bytes, live_by_id: dict[bytes, Coordinate]) -> None:
        row = self.inserts.get(tid)
        if row is None and tid in live_by_id:
            row = self.state.live[live_by_id[tid]]
        if row is None:
            self.deleted_ids.append((tid, pk))  # stored before, if at all: SQL checks author and kind
            return
        if row.pubkey != pk or row.kind in UNDELETABLE_KINDS:
            return
        if row.d_tag is not None:
            self.deleted_versions.append(row)
        self._drop_insert(row, feed.DELETED)

    def _drop_insert(self, row: Row, reason: str) -> None:
        """Remove a row this batch inserts or one read at batch start, and its coordinate's live entry."""
        if row.d_tag is not None and self.state.live.get((row.kind, row.pubkey, row.d_tag)) is row:
            del self.state.live[(row.kind, row.pubkey, row.d_tag)]
        self._remove(row, reason)

    def _vanish(self, request: Event, idb: bytes, pk: bytes) -> None:
        """NIP-62: the author's events up to the request's created_at, and gift wraps p-tagging the author,
        go and are refused from now on.  Those of this batch go here; stored ones at write time
        (`vanish.select_covered`)."""
        until = max(self.state.vanished.get(request.pubkey, -1), request.created_at)
        self.state.vanished[request.pubkey] = until
        self.vanish_requests.append((pk, until, idb))
        for row in list(self.inserts.values()):
            if covered(row.event, self.state.vanished):
                self._drop_insert(row, feed.VANISHED)
