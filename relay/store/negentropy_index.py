"""The NIP-77 negentropy index: (created_at, id) of the live events, kept in the write transaction.

How this works
--------------
`NegentropyIndex` is a `TransactionHook`.  For the full event set (filter
`{}`) and for each filter configured under `[negentropy] filters`, it keeps
`neg_nodes` rows (see migrations 0002 and 0005) that form a two-level B+-tree:

* a bucket (level 1) holds the items from its start key up to the next
  bucket's start key, packed in its row (timestamps and ids as two blobs),
  with their count and the sums of their ids' eight 32-bit little-endian
  limbs, each summed without carry in a 64-bit integer (the carries are
  folded only when a fingerprint is computed);
* a group (level 2) covers the buckets from its start key up to the next
  group's start key, with the same count and sums, its number of buckets,
  and a random stamp written anew by every change below it.

Every group starts where one of its buckets starts, and the first bucket and
group of a filter start at the sentinel key (-1, b"") below every event, so
each key falls in exactly one bucket and one group.  A node with more than
`MAX_CHILDREN` (256) children is split; one with fewer than 32 is merged into
a sibling.  A batch rewrites each touched bucket once and adds one summed
delta to each touched group.

Reading (`IndexReader`, one per message, inside ONE read transaction): the
groups of a filter are read once (roughly N / 16,000 rows for N items); a
group's buckets (< 2 * MAX_CHILDREN rows) only when an index falls strictly
inside it, decoded into arrays with per-item prefix sums.  Decoded groups can
be kept in a `GroupCache` shared by the relay's sessions: a group whose stamp
and count are unchanged in the new transaction is taken from the cache, so a
reconciliation of many messages decodes each group about once.  A
full-range fingerprint reads only the groups.

`IndexView` adapts a reader to `NegentropyStorage` for one NEG-OPEN filter:
the items of its since/until window, and with a `limit` the newest `limit`
of them (see `window_segments`).

Source: NIP-77 and its appendix "Negentropy Protocol V1" (fingerprints);
the bucket sums follow DESIGN.md, "Negentropy (NIP-77)".
"""

from __future__ import annotations

import bisect
import json
import secrets
import sqlite3
import struct
import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import islice

import numpy as np

from relay.protocol.auth import PrivateKinds
from relay.protocol.filters import Filter
from relay.protocol.negentropy import (
    ID_SIZE,
    INFINITY,
    Bound,
    Negentropy,
    NegentropyError,
    SortedVector,
    bound_keys,
    limbs_add,
    limbs_sub,
    range_fingerprints,
    running_id_sums,
    sorted_lower_bounds,
)
from relay.store.db import transaction
from relay.store.queries import compile_filter
from relay.store.writes import Changes

Key = tuple[int, bytes]
"""An item or node key: (created_at in unix seconds, 32-byte id); nodes may use SENTINEL."""

SENTINEL: Key = (-1, b"")
"""Start key of the first bucket and group of every filter: below every event (created_at >= 0)."""
FULL_SET_SPEC = "{}"
"""`filter_spec` of the full event set, always indexed."""
MAX_CHILDREN = 256
"""Default: a node with more children (items of a bucket, buckets of a group) is split.

A node with fewer than max/8 children is merged into a sibling when the two
fit in one node; an index built from scratch fills its nodes to max/2.
Smaller values only serve tests (more splits and merges on fewer items)."""
LAYOUT = "2"
"""Version of the node scheme, in `meta`; a different stored value makes `setup` rebuild every index."""

_LAYOUT_KEY = "negentropy_index_layout"
_LIMBS = struct.Struct("<8I")
_SUMS = ", ".join(f"s{j}" for j in range(8))
_ZERO_SUMS = (0,) * 8
_INDEXED_ITEMS_FETCH = 65_536  # rows per fetchmany when a SortedVector is built from a query
_MOD256 = (1 << 256) - 1
_NODE = "filter_no = ? AND level = ? AND created_at = ? AND id = ?"


def filter_spec(f: Filter) -> str:
    """Canonical JSON of `f` without since/until/limit: the identity of an indexed filter.

    Keys sorted, list values sorted, compact; `Filter()` gives "{}".
    """
    obj: dict[str, list] = {}
    if f.ids is not None:
        obj["ids"] = sorted(f.ids)
    if f.authors is not None:
        obj["authors"] = sorted(f.authors)
    if f.kinds is not None:
        obj["kinds"] = sorted(f.kinds)
    for name, values in f.tags:
        obj["#" + name] = sorted(values)
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _combine(limbs: Sequence[int]) -> int:
    """The exact integer sum of limb sums: sum of limbs[j] << 32*j (not reduced mod 2**256)."""
    total = 0
    for j, limb in enumerate(limbs):
        total += limb << (32 * j)
    return total


# ---------------------------------------------------------------- write side


def public_spec(private_kinds: Iterable[int]) -> str:
    """`filter_spec` of the public set: every event but those of the NIP-42 private kinds (not a NIP-01 filter)."""
    return "public:" + json.dumps({"excluded_kinds": sorted(set(private_kinds))}, separators=(",", ":"))


class NegentropyIndex:
    """TransactionHook: the negentropy index of the full set and of `filters` (NIP-01 filters).

    `filters` carry no since/until/limit (their spec ignores them).  With
    `private_kinds` (NIP-42 private kinds, e.g. 4 and 1059), the public set,
    every event of other kinds, is indexed too: it answers the full-set
    NEG-OPEN of a reader who may see none of those kinds' events.  Call
    `filter_no(f)` / `public_no()` after `setup` to learn what is indexed.
    """

    def __init__(self, filters: Iterable[Filter] = (), max_children: int = MAX_CHILDREN,
                 private_kinds: Iterable[int] = ()) -> None:
        if max_children < 4:
            raise ValueError("max_children must be at least 4")
        self.max_children = max_children
        self._filters: dict[str, Filter] = {FULL_SET_SPEC: Filter()}
        self._private = frozenset(private_kinds)
        self._public = public_spec(self._private) if self._private else None
        if self._public:
            self._filters[self._public] = Filter()  # matched by kind in `apply`, built by `_build`
        for f in filters:
            self._filters.setdefault(filter_spec(f), f)
        self._numbers: dict[str, int] = {}

    @property
    def specs(self) -> list[str]:
        """The `filter_spec` of every indexed filter, the full set first."""
        return list(self._filters)

    def filter_no(self, f: Filter) -> int | None:
        """The `neg_filters.filter_no` whose index serves `f` (since/until/limit aside), or None."""
        return self._numbers.get(filter_spec(f))

    def public_no(self, f: Filter, private_kinds: frozenset[int]) -> int | None:
        """The index serving `f` to a reader who may see no event of `private_kinds`, or None.

        Only the full-set filter `{}` (since/until/limit aside) is served, and
        only when `private_kinds` are the ones this index leaves out.
        """
        if self._public is None or private_kinds != self._private or filter_spec(f) != FULL_SET_SPEC:
            return None
        return self._numbers.get(self._public)

    def setup(self, conn: sqlite3.Connection) -> None:
        """Bring the stored indexes in line with the configured filters, in one transaction.

        Indexes of filters no longer configured are deleted; missing ones are
        built from `events` (reading every matching event once).
        """
        with transaction(conn):
            layout = conn.execute("SELECT value FROM meta WHERE key = ?", (_LAYOUT_KEY,)).fetchone()
            if layout is None or layout[0] != LAYOUT:
                _clear(conn)
                conn.execute("INSERT INTO meta (key, value) VALUES (?, ?)"
                             " ON CONFLICT (key) DO UPDATE SET value = excluded.value", (_LAYOUT_KEY, LAYOUT))
            stored = dict(conn.execute("SELECT spec, filter_no FROM neg_filters").fetchall())
            for spec, number in stored.items():
                if spec not in self._filters:
                    _drop_filter(conn, number)
            numbers = {}
            for spec, f in self._filters.items():
                number = stored.get(spec)
                if number is None:
                    number = conn.execute("INSERT INTO neg_filters (spec) VALUES (?)", (spec,)).lastrowid
                    _build(conn, number, spec, f, self.max_children // 2)
                numbers[spec] = number
        self._numbers = numbers

    def apply(self, cur: sqlite3.Cursor, changes: Changes) -> None:
        """Add the events inserted and remove the rows removed by one transaction (its `net()` changes)."""
        inserted, removed = changes.net()
        new = [((ev.created_at, bytes.fromhex(ev.id)), ev) for ev in inserted]
        gone = [(r.created_at, r.id) for r in removed]
        for spec, f in self._filters.items():
            if spec == FULL_SET_SPEC:
                adds = [key for key, _ in new]
            elif spec == self._public:
                adds = [key for key, ev in new if ev.kind not in self._private]
            else:
                adds = [key for key, ev in new if f.matches(ev)]
            if adds or gone:
                update_items(cur, self._numbers[spec], adds, gone, self.max_children)


class DropNegentropyIndex:
    """TransactionHook for `[negentropy] enabled = false`: empties the index at setup, then does nothing.

    An index not kept up to date must not survive to be trusted later: with
    negentropy enabled again, `NegentropyIndex.setup` rebuilds it.
    """

    def setup(self, conn: sqlite3.Connection) -> None:
        """Delete every index row, in one transaction."""
        with transaction(conn):
            _clear(conn)

    def apply(self, cur: sqlite3.Cursor, changes: Changes) -> None:
        """Nothing: no index is kept."""


def _clear(conn: sqlite3.Connection) -> None:
    for table in ("neg_nodes", "neg_filters"):
        conn.execute(f"DELETE FROM {table}")


def _drop_filter(conn: sqlite3.Connection, number: int) -> None:
    for table in ("neg_nodes", "neg_filters"):
        conn.execute(f"DELETE FROM {table} WHERE filter_no = ?", (number,))


def _build(conn: sqlite3.Connection, number: int, spec: str, f: Filter, fill: int) -> None:
    """Index every stored event of `spec` (expired ones too: they stay in `events` until the purge)."""
    build_nodes(conn, number, _matching(conn, spec, f, "ORDER BY created_at, id"), fill)


def _matching(conn: sqlite3.Connection, spec: str, f: Filter, order: str = "") -> sqlite3.Cursor:
    """(created_at, id) of the stored events of the indexed set `spec` (whose filter is `f`)."""
    if spec == FULL_SET_SPEC:
        return conn.execute(f"SELECT created_at, id FROM events {order}")
    if spec.startswith("public:"):
        kinds = json.loads(spec.removeprefix("public:"))["excluded_kinds"]
        return conn.execute(f"SELECT created_at, id FROM events WHERE kind NOT IN ({', '.join('?' * len(kinds))})"
                            f" {order}", kinds)
    # limit -1: none (SQLite); now -1: before every expiration, which is >= 0.
    compiled = compile_filter(f, -1, -1)
    return conn.execute(f"SELECT created_at, id FROM ({compiled.sql}) {order}", compiled.params)


def build_nodes(conn: sqlite3.Connection, number: int, items: Iterable[Key], fill: int = MAX_CHILDREN // 2) -> None:
    """(Re)build filter `number`'s buckets and groups from `items`, sorted (created_at, id) pairs, `fill` children each."""
    conn.execute("DELETE FROM neg_nodes WHERE filter_no = ?", (number,))
    stamp = secrets.randbits(62)
    items = iter(items)
    buckets: list[tuple[Key, int, list[int]]] = []
    rows = []
    while chunk := list(islice(items, fill)):
        start = SENTINEL if not buckets else (chunk[0][0], bytes(chunk[0][1]))
        ts_blob, ids_blob = _pack(chunk)
        sums = _limb_sums(ids_blob)
        buckets.append((start, len(chunk), sums))
        rows.append((number, 1, *start, len(chunk), len(chunk), *sums, 0, ts_blob, ids_blob))
    if not buckets:
        buckets.append((SENTINEL, 0, list(_ZERO_SUMS)))
        rows.append((number, 1, *SENTINEL, 0, 0, *_ZERO_SUMS, 0, b"", b""))
    for start in range(0, len(buckets), fill):
        group = buckets[start:start + fill]
        sums = [sum(b[2][j] for b in group) for j in range(8)]
        rows.append((number, 2, *group[0][0], sum(b[1] for b in group), len(group), *sums, stamp, None, None))
    conn.executemany(f"INSERT INTO neg_nodes (filter_no, level, created_at, id, count, children, {_SUMS},"
                     f" stamp, ts, ids) VALUES ({'?, ' * 16}?)", rows)


def _pack(keys: Sequence[Key]) -> tuple[bytes, bytes]:
    """A bucket's items as its (ts, ids) blobs."""
    return struct.pack(f"<{len(keys)}Q", *(k[0] for k in keys)), b"".join(k[1] for k in keys)


def _unpack(ts_blob: bytes, ids_blob: bytes) -> list[Key]:
    """A bucket's (ts, ids) blobs as its sorted items."""
    timestamps = struct.unpack(f"<{len(ts_blob) // 8}Q", ts_blob)
    return [(t, ids_blob[k * ID_SIZE:(k + 1) * ID_SIZE]) for k, t in enumerate(timestamps)]


def _limb_sums(ids_blob: bytes) -> list[int]:
    """The eight carry-free limb sums of packed ids."""
    if not ids_blob:
        return list(_ZERO_SUMS)
    return [int(x) for x in np.frombuffer(ids_blob, dtype="<u4").reshape(-1, 8).sum(axis=0, dtype=np.uint64)]


def update_items(cur: sqlite3.Cursor, number: int, adds: Sequence[Key], removes: Sequence[Key],
                 max_children: int = MAX_CHILDREN) -> None:
    """Insert the items `adds` and delete the items `removes` of filter `number`, keeping its nodes in step.

    `adds` must not be indexed yet (sqlite3.IntegrityError otherwise, which
    rolls the batch back); `removes` not indexed are ignored.  Also the way
    tests fill an index with synthetic items.
    """
    _Tree(cur, number, max_children).update(adds, removes)


class _Tree:
    """The nodes of one filter, on the writer's cursor; one instance per update (one group stamp)."""

    def __init__(self, cur: sqlite3.Cursor, number: int, max_children: int) -> None:
        self.cur = cur
        self.number = number
        self.max = max_children
        self.min = max_children // 8 or 1
        self.stamp = secrets.randbits(62)

    # -- row access

    def node(self, level: int, key: Key) -> tuple | None:
        """(count, children, s0..s7) of the node starting at `key`, or None."""
        return self.cur.execute(f"SELECT count, children, {_SUMS} FROM neg_nodes WHERE {_NODE}",
                                (self.number, level, *key)).fetchone()

    def leaf(self, key: Key) -> list[Key]:
        """The items of the bucket starting at `key`."""
        return self.bucket(key)[2]

    def bucket(self, key: Key) -> tuple[int, tuple[int, ...], list[Key]]:
        """(count, limb sums s0..s7, items) of the bucket starting at `key`: one row read."""
        row = self.cur.execute(f"SELECT count, {_SUMS}, ts, ids FROM neg_nodes WHERE {_NODE}",
                               (self.number, 1, *key)).fetchone()
        return row[0], row[1:9], _unpack(row[9], row[10])

    def floor(self, level: int, key: Key) -> Key:
        """Start of the node covering `key` (the last start <= key; the sentinel always qualifies)."""
        row = self.cur.execute(
            "SELECT created_at, id FROM neg_nodes WHERE filter_no = ? AND level = ? AND (created_at, id) <= (?, ?)"
            " ORDER BY created_at DESC, id DESC LIMIT 1", (self.number, level, *key)).fetchone()
        if row is None:
            raise RuntimeError(f"negentropy index {self.number} has no level-{level} sentinel")
        return row[0], row[1]

    def next_start(self, level: int, key: Key) -> Key | None:
        """Start of the next node after the one starting at `key` (the end of its range), or None."""
        row = self.cur.execute(
            "SELECT created_at, id FROM neg_nodes WHERE filter_no = ? AND level = ? AND (created_at, id) > (?, ?)"
            " ORDER BY created_at, id LIMIT 1", (self.number, level, *key)).fetchone()
        return None if row is None else (row[0], row[1])

    def prev_start(self, level: int, key: Key) -> Key | None:
        """Start of the node before the one starting at `key`, or None."""
        row = self.cur.execute(
            "SELECT created_at, id FROM neg_nodes WHERE filter_no = ? AND level = ? AND (created_at, id) < (?, ?)"
            " ORDER BY created_at DESC, id DESC LIMIT 1", (self.number, level, *key)).fetchone()
        return None if row is None else (row[0], row[1])

    def add_to_group(self, key: Key, count: int, children: int, sums: Sequence[int]) -> None:
        """Add deltas to a group's count, children and limb sums, and give it this update's stamp.

        (Buckets are rewritten whole by `put_leaf`.)
        """
        self.cur.execute(
            "UPDATE neg_nodes SET count = count + ?, children = children + ?, stamp = ?, "
            + ", ".join(f"s{j} = s{j} + ?" for j in range(8)) + f" WHERE {_NODE}",
            (count, children, self.stamp, *sums, self.number, 2, *key))

    def put_group(self, key: Key, count: int, children: int, sums: Sequence[int]) -> None:
        """Insert or overwrite a group, with this update's stamp."""
        self.cur.execute(
            f"INSERT OR REPLACE INTO neg_nodes (filter_no, level, created_at, id, count, children, {_SUMS}, stamp)"
            f" VALUES ({'?, ' * 14}?)", (self.number, 2, *key, count, children, *sums, self.stamp))

    def put_leaf(self, key: Key, items: Sequence[Key]) -> tuple[int, list[int]]:
        """Insert or overwrite the bucket starting at `key` with `items` (sorted); return its count and sums."""
        ts_blob, ids_blob = _pack(items)
        sums = _limb_sums(ids_blob)
        self.cur.execute(
            f"INSERT OR REPLACE INTO neg_nodes (filter_no, level, created_at, id, count, children, {_SUMS},"
            f" ts, ids) VALUES ({'?, ' * 15}?)", (self.number, 1, *key, len(items), len(items), *sums,
                                                 ts_blob, ids_blob))
        return len(items), sums

    def delete(self, level: int, key: Key) -> None:
        """Remove a node row (its range joins the previous node's)."""
        self.cur.execute(f"DELETE FROM neg_nodes WHERE {_NODE}", (self.number, level, *key))

    def buckets_of(self, start: Key, end: Key | None) -> tuple[list[Key], np.ndarray, np.ndarray]:
        """The buckets of the group [start, end): their keys, counts (n,) and limb sums (n, 8) uint64."""
        upper = "" if end is None else " AND (created_at, id) < (?, ?)"
        params = (self.number, *start) + (() if end is None else end)
        rows = self.cur.execute(
            f"SELECT created_at, id, count, {_SUMS} FROM neg_nodes WHERE filter_no = ? AND level = 1"
            " AND (created_at, id) >= (?, ?)" + upper + " ORDER BY created_at, id", params).fetchall()
        return ([(r[0], r[1]) for r in rows], np.array([r[2] for r in rows], dtype=np.int64),
                np.array([r[3:] for r in rows], dtype=np.uint64).reshape(-1, 8))

    # -- changes

    def update(self, adds: Sequence[Key], removes: Sequence[Key]) -> None:
        """Rewrite each touched bucket, add one delta per touched group, then split/merge those nodes."""
        changes = sorted([(key, True) for key in adds] + [(key, False) for key in removes])
        if not changes:
            return
        buckets = {}
        for start, members in self._by_node(1, changes).items():
            old_count, old_sums, items = self.bucket(start)
            gone = {key for key, added in members if not added}
            kept = [key for key in items if key not in gone] if gone else items
            new = [key for key, added in members if added]
            if new and not set(new).isdisjoint(kept):
                raise sqlite3.IntegrityError(f"negentropy index {self.number}: item already indexed")
            count, sums = self.put_leaf(start, sorted(kept + new) if new else kept)
            buckets[start] = [count - old_count, *(s - o for s, o in zip(sums, old_sums))]
        for start, members in self._by_node(2, sorted(buckets.items())).items():
            delta = [sum(column) for column in zip(*(bucket_delta for _, bucket_delta in members))]
            self.add_to_group(start, delta[0], 0, delta[1:])
        touched_groups: set[Key] = set()
        for start in sorted(buckets):
            self.rebalance(1, start, touched_groups)
        for start in sorted(touched_groups):
            self.rebalance(2, start, touched_groups)

    def _by_node(self, level: int, changes: Sequence[tuple[Key, object]]) -> dict[Key, list[tuple[Key, object]]]:
        """Group (key, value) pairs, in key order, by the start of the level-`level` node covering each key."""
        found: dict[Key, list[tuple[Key, object]]] = {}
        lo: Key | None = None
        hi: Key | None = None
        for key, value in changes:
            if lo is None or (hi is not None and key >= hi):
                lo = self.floor(level, key)
                hi = self.next_start(level, lo)
            found.setdefault(lo, []).append((key, value))
        return found

    def rebalance(self, level: int, key: Key, touched_groups: set[Key]) -> None:
        """Split the node at `key` if it has too many children, merge it if too few."""
        node = self.node(level, key)
        if node is None:
            return
        if node[1] > self.max:
            self.split(level, key, touched_groups)
        elif node[1] < self.min:
            self.merge(level, key, node, touched_groups)

    def split(self, level: int, key: Key, touched_groups: set[Key]) -> None:
        """Cut a node into k >= 2 nodes of n/k children (max/2 <= n/k < 3/4 max)."""
        if level == 1:
            items = self.leaf(key)
            n = len(items)
            k = max(2, n // (self.max // 2))
            cuts = [n * j // k for j in range(k + 1)]
            for j in range(k):  # the first piece keeps the start: sentinels stay
                self.put_leaf(key if j == 0 else items[cuts[j]], items[cuts[j]:cuts[j + 1]])
            parent = self.floor(2, key)
            self.add_to_group(parent, 0, k - 1, _ZERO_SUMS)
            touched_groups.add(parent)
            return
        keys, counts, sums = self.buckets_of(key, self.next_start(2, key))
        n = len(keys)
        k = max(2, n // (self.max // 2))
        cuts = [n * j // k for j in range(k + 1)]
        for j in range(k):
            lo, hi = cuts[j], cuts[j + 1]
            piece_sums = [int(x) for x in sums[lo:hi].sum(axis=0, dtype=np.uint64)]
            self.put_group(key if j == 0 else keys[lo], int(counts[lo:hi].sum()), hi - lo, piece_sums)

    def merge(self, level: int, key: Key, node: tuple, touched_groups: set[Key]) -> None:
        """Merge an underfull node with a sibling (buckets: same group) if both fit in one node.

        An empty bucket alone in its group goes with its group: the previous
        bucket and group then cover their key range.
        """
        if level == 1:
            parent = self.floor(2, key)
            parent_end = self.next_start(2, parent)
            first = key == parent
        else:
            parent, parent_end, first = None, None, key == SENTINEL
        if not first:
            prev = self.prev_start(level, key)
            if self.node(level, prev)[1] + node[1] <= self.max:
                self._absorb(level, prev, key, node, parent, touched_groups)
                return
        after = self.next_start(level, key)
        if after is not None and (parent_end is None or after < parent_end):
            after_node = self.node(level, after)
            if node[1] + after_node[1] <= self.max:
                self._absorb(level, key, after, after_node, parent, touched_groups)
        elif level == 1 and first and node[0] == 0 and parent != SENTINEL:
            self.delete(1, key)
            self.delete(2, parent)
            touched_groups.discard(parent)

    def _absorb(self, level: int, keep: Key, gone: Key, gone_node: tuple, parent: Key | None,
                touched_groups: set[Key]) -> None:
        """Merge the node at `gone` into the node at `keep`, just before it."""
        if level == 1:
            self.put_leaf(keep, self.leaf(keep) + self.leaf(gone))
        else:
            self.add_to_group(keep, gone_node[0], gone_node[1], gone_node[2:])
        self.delete(level, gone)
        if parent is not None:
            self.add_to_group(parent, 0, -1, _ZERO_SUMS)
            touched_groups.add(parent)


# ---------------------------------------------------------------- read side


class IndexOutOfStep(RuntimeError):
    """The index's nodes disagree with its items (a bug, or a write that bypassed the hook)."""


@dataclass(frozen=True)
class _Group:
    """One group's items, decoded: sorted timestamps (n,) uint64, ids (n, 32) uint8, running id sums
    from the group's start (n + 1, 8) uint32 limbs mod 2**256, and the stamp they were read at."""

    stamp: int
    timestamps: np.ndarray
    ids: np.ndarray
    id_view: memoryview
    prefix: np.ndarray


class GroupCache:
    """Decoded groups shared by the readers of one relay: at most `max_items` items, least recently used out.

    Keyed by (filter_no, group start key).  An entry serves a reader only if
    its stamp and item count equal those of the group row that the reader
    read in its own transaction; every change below a group gives it a new
    random stamp, so a cached group is what that transaction would decode.
    About 72 bytes an item.  Thread-safe (readers run on several threads).
    """

    def __init__(self, max_items: int) -> None:
        self.max_items = max_items
        self.items = 0
        self._groups: OrderedDict[tuple[int, Key], _Group] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple[int, Key], stamp: int, count: int) -> _Group | None:
        """The cached group at `key` if it has this stamp and count, else None."""
        with self._lock:
            group = self._groups.get(key)
            if group is None or group.stamp != stamp or len(group.timestamps) != count:
                return None
            self._groups.move_to_end(key)
            return group

    def put(self, key: tuple[int, Key], group: _Group) -> None:
        """Keep `group` (replacing any older one at `key`), evicting the least recently used past the bound."""
        if len(group.timestamps) > self.max_items:
            return
        with self._lock:
            old = self._groups.pop(key, None)
            if old is not None:
                self.items -= len(old.timestamps)
            self._groups[key] = group
            self.items += len(group.timestamps)
            while self.items > self.max_items:
                _, evicted = self._groups.popitem(last=False)
                self.items -= len(evicted.timestamps)


class IndexReader:
    """Random access to one filter's index through `conn`, single and in bulk.

    Use it inside one read transaction and drop it after: it keeps what it
    decodes (and shares it through `cache`, if given).  Indices are global
    positions in (created_at, id) order.  `rows_read` counts the rows
    fetched.  Prefix sums are mod 2**256.

    Raises:
        IndexOutOfStep: when the nodes disagree with each other.
    """

    def __init__(self, conn: sqlite3.Connection, number: int, cache: GroupCache | None = None) -> None:
        self._conn = conn
        self._number = number
        self._cache = cache
        self.rows_read = 0
        rows = self._fetch(f"SELECT created_at, id, count, stamp, {_SUMS} FROM neg_nodes"
                           " WHERE filter_no = ? AND level = 2 ORDER BY created_at, id", (number,))
        if not rows:
            raise IndexOutOfStep(f"negentropy index {number} does not exist")
        self._starts: list[Key] = [(r[0], r[1]) for r in rows]
        self._stamps = [r[3] for r in rows]
        self._counts = [0]
        sums = [0]
        for r in rows:
            self._counts.append(self._counts[-1] + r[2])
            sums.append(sums[-1] + _combine(r[4:12]))
        self._count_array = np.array(self._counts, dtype=np.int64)
        # the sum of the ids before each group, as limbs mod 2**256 (prefix_sums adds the group's own)
        self._base = np.frombuffer(b"".join((x & _MOD256).to_bytes(32, "little") for x in sums),
                                   dtype="<u4").reshape(-1, 8)
        self._start_ts = np.array([t for t, _ in self._starts[1:]], dtype=np.uint64)  # past the sentinel
        self._decoded: dict[int, _Group] = {}
        self.size = self._counts[-1]

    def _fetch(self, sql: str, params: tuple) -> list[tuple]:
        rows = self._conn.execute(sql, params).fetchall()
        self.rows_read += len(rows)
        return rows

    def _group(self, g: int) -> _Group:
        found = self._decoded.get(g)
        if found is not None:
            return found
        key, count = (self._number, self._starts[g]), self._counts[g + 1] - self._counts[g]
        found = self._cache.get(key, self._stamps[g], count) if self._cache is not None else None
        if found is None:
            upper, params = "", (self._number, *self._starts[g])
            if g + 1 < len(self._starts):
                upper, params = " AND (created_at, id) < (?, ?)", params + self._starts[g + 1]
            rows = self._fetch("SELECT ts, ids FROM neg_nodes WHERE filter_no = ? AND level = 1"
                               " AND (created_at, id) >= (?, ?)" + upper + " ORDER BY created_at, id", params)
            timestamps = np.frombuffer(b"".join(r[0] for r in rows), dtype="<u8")
            ids = np.frombuffer(b"".join(r[1] for r in rows), dtype=np.uint8).reshape(-1, ID_SIZE)
            if len(timestamps) != count or len(ids) != count:
                raise IndexOutOfStep(f"negentropy index {self._number}: group {self._starts[g]} disagrees"
                                     f" with its buckets ({count} != {len(timestamps)})")
            found = _Group(self._stamps[g], timestamps, ids, memoryview(ids).cast("B") if count else
                           memoryview(b""), running_id_sums(ids))
            if self._cache is not None:
                self._cache.put(key, found)
        self._decoded[g] = found
        return found

    def _locate(self, i: int) -> tuple[int, int]:
        """(group, offset in it) of the i-th item, 0 <= i < size (empty groups are skipped)."""
        g = bisect.bisect_right(self._counts, i) - 1
        return g, i - self._counts[g]

    def _group_of_key(self, key: Key) -> int:
        return bisect.bisect_right(self._starts, key) - 1

    # -- one at a time

    def item(self, i: int) -> Key:
        """The i-th item (created_at, id); IndexError outside [0, size)."""
        if not 0 <= i < self.size:
            raise IndexError(f"item index {i} out of range")
        g, offset = self._locate(i)
        group = self._group(g)
        return int(group.timestamps[offset]), bytes(group.id_view[offset * ID_SIZE:(offset + 1) * ID_SIZE])

    def lower_bound(self, key: Key) -> int:
        """Index of the first item >= `key` (size if none); `key` may use a timestamp up to 2**64 - 1."""
        return int(self.lower_bounds([Bound(key[0], key[1])])[0])

    def id_bytes(self, begin: int, end: int) -> bytes:
        """The ids of the items [begin, end), in order, concatenated: 32 * (end - begin) bytes."""
        parts, i = [], begin
        while i < end:
            g, offset = self._locate(i)
            take = min(end - i, self._counts[g + 1] - i)
            parts.append(self._group(g).id_view[offset * ID_SIZE:(offset + take) * ID_SIZE])
            i += take
        return b"".join(parts)

    # -- in bulk (NegentropyStorage's bulk methods, over global indices)

    def lower_bounds(self, bounds: Sequence[Bound]) -> np.ndarray:
        """For each bound, the index of the first item >= it (size if none): int64, shape (m,)."""
        result = np.full(len(bounds), self.size, dtype=np.int64)
        query, prefixes = bound_keys(bounds)
        groups = np.searchsorted(self._start_ts, query, side="right")  # last group starting at or before
        after_first = np.flatnonzero(groups > 0)
        # a bound on a group start's timestamp may lie before that start: compare ids
        for k in after_first[self._start_ts[groups[after_first] - 1] == query[after_first]].tolist():
            groups[k] = self._group_of_key((int(query[k]), prefixes[k].ljust(ID_SIZE, b"\0")))
        finite = np.flatnonzero(query < np.uint64(INFINITY))
        for g, positions in _by_group(groups[finite], finite):
            group = self._group(g)
            result[positions] = sorted_lower_bounds(group.timestamps, group.id_view, query[positions],
                                                    [prefixes[k] for k in positions.tolist()], self._counts[g])
        return result

    def _split_indices(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        groups = np.clip(np.searchsorted(self._count_array, indices, side="right") - 1, 0, len(self._starts) - 1)
        return groups, indices - self._count_array[groups]

    def prefix_sums(self, indices: np.ndarray) -> np.ndarray:
        """Sum of the ids [0, i) mod 2**256 for each index i in [0, size]: (m, 8) uint32 limbs."""
        indices = np.asarray(indices, dtype=np.int64)
        groups, offsets = self._split_indices(indices)
        local = np.zeros((len(indices), 8), dtype="<u4")
        inside = np.flatnonzero(offsets > 0)  # offset 0: the group's own sum suffices, nothing to decode
        for g, positions in _by_group(groups[inside], inside):
            local[positions] = self._group(g).prefix[offsets[positions]]
        return limbs_add(self._base[groups], local)

    def items_at(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Items at the indices (each in [0, size)): timestamps (m,) uint64 and ids (m, 32) uint8."""
        indices = np.asarray(indices, dtype=np.int64)
        groups, offsets = self._split_indices(indices)
        timestamps = np.empty(len(indices), dtype=np.uint64)
        ids = np.empty((len(indices), ID_SIZE), dtype=np.uint8)
        for g, positions in _by_group(groups, np.arange(len(indices))):
            group = self._group(g)
            timestamps[positions] = group.timestamps[offsets[positions]]
            ids[positions] = group.ids[offsets[positions]]
        return timestamps, ids


def _by_group(groups: np.ndarray, positions: np.ndarray) -> Iterator[tuple[int, np.ndarray]]:
    """(group, the positions whose group it is) for each group present; one sort, not one scan per group."""
    order = np.argsort(groups, kind="stable")
    groups, positions = groups[order], positions[order]
    cuts = np.flatnonzero(groups[1:] != groups[:-1]) + 1
    for start, end in zip([0, *cuts.tolist()], [*cuts.tolist(), len(groups)]):
        if start < end:
            yield int(groups[start]), positions[start:end]


def window_segments(reader: IndexReader, since: int | None, until: int | None,
                    limit: int | None) -> list[tuple[int, int]]:
    """Global index ranges [start, end) of the items a NEG-OPEN filter's window selects.

    `since`/`until` are inclusive unix seconds.  With `limit`, the newest
    `limit` items in NIP-01 order (created_at descending, then lowest id
    first): the same set a REQ with that limit returns, so at a tie on the
    oldest timestamp kept the lowest ids stay, which can make two ranges.
    """
    lo = 0 if since is None else reader.lower_bound((since, b""))
    hi = reader.size if until is None else reader.lower_bound((until + 1, b""))
    hi = max(lo, hi)
    if limit is None or hi - lo <= limit:
        return [(lo, hi)]
    if limit == 0:
        return []
    cut = reader.item(hi - limit)[0]  # created_at of the oldest item a plain suffix would keep
    newer = reader.lower_bound((cut + 1, b""))
    same = max(lo, reader.lower_bound((cut, b"")))
    taken = limit - (hi - newer)  # items at `cut`, lowest ids first
    return [(same, same + taken), (newer, hi)] if same + taken < newer else [(same, hi)]


class IndexView:
    """`NegentropyStorage` over the items of `segments` (ascending, disjoint global ranges) of a reader.

    Raises NegentropyError for a range outside [0, size()], as SortedVector does.
    """

    def __init__(self, reader: IndexReader, segments: Sequence[tuple[int, int]]) -> None:
        self._reader = reader
        self._segments = [(s, e) for s, e in segments if e > s]
        self._offsets = [0]
        for s, e in self._segments:
            self._offsets.append(self._offsets[-1] + e - s)
        self._offset_array = np.array(self._offsets, dtype=np.int64)
        self._starts = np.array([s for s, _ in self._segments], dtype=np.int64)
        if self._segments:
            edges = reader.prefix_sums(np.array([x for segment in self._segments for x in segment]))
            self._start_sums = edges[0::2]
            whole = limbs_sub(edges[1::2], edges[0::2])
            self._before = np.zeros_like(whole)
            for k in range(1, len(whole)):
                self._before[k:k + 1] = limbs_add(self._before[k - 1:k], whole[k - 1:k])

    def size(self) -> int:
        """Number of items."""
        return self._offsets[-1]

    def _check_range(self, begin: int, end: int) -> None:
        if not 0 <= begin <= end <= self._offsets[-1]:
            raise NegentropyError(f"bad range [{begin}, {end}) for {self._offsets[-1]} items")

    def _global(self, i: int) -> int:
        k = bisect.bisect_right(self._offsets, i) - 1
        return self._segments[k][0] + i - self._offsets[k]

    def get_item(self, i: int) -> tuple[int, bytes]:
        """Item `i` as (timestamp, 32-byte id); IndexError if out of range."""
        if not 0 <= i < self._offsets[-1]:
            raise IndexError(f"item index {i} out of range")
        return self._reader.item(self._global(i))

    def _parts(self, begin: int, end: int) -> Iterator[tuple[int, int]]:
        """Global ranges holding the view's items [begin, end)."""
        for (s, e), offset in zip(self._segments, self._offsets):
            lo, hi = max(begin, offset), min(end, offset + e - s)
            if lo < hi:
                yield s + lo - offset, s + hi - offset

    def fingerprint(self, begin: int, end: int) -> bytes:
        """16-byte fingerprint of the items in [begin, end) (NIP-77 appendix, "Fingerprint")."""
        self._check_range(begin, end)
        sums = self.prefix_sums(np.array([begin, end]))
        return range_fingerprints(sums[:1], sums[1:], [end - begin])[0].tobytes()

    def id_bytes(self, begin: int, end: int) -> bytes:
        """The 32-byte ids of the items in [begin, end), in order, concatenated: 32 * (end - begin) bytes."""
        self._check_range(begin, end)
        return b"".join([self._reader.id_bytes(lo, hi) for lo, hi in self._parts(begin, end)])

    def lower_bounds(self, bounds: Sequence[Bound]) -> np.ndarray:
        """For each bound, the first index whose item is >= it (``size()`` if none): int64, shape (m,)."""
        found = self._reader.lower_bounds(bounds)
        below = np.zeros(len(bounds), dtype=np.int64)
        for s, e in self._segments:
            below += np.clip(found, s, e) - s
        return below

    def _globals(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(segment, global index) of view indices in [0, size] (size maps to the last segment's end)."""
        segment = np.clip(np.searchsorted(self._offset_array, indices, side="right") - 1, 0,
                          len(self._segments) - 1)
        return segment, self._starts[segment] + indices - self._offset_array[segment]

    def prefix_sums(self, indices: np.ndarray) -> np.ndarray:
        """Sum of the ids [0, i) mod 2**256 for each index i in [0, size]: (m, 8) uint32 limbs."""
        indices = np.asarray(indices, dtype=np.int64)
        if not self._segments:
            return np.zeros((len(indices), 8), dtype="<u4")
        if len(self._segments) == 1 and self._segments[0][0] == 0:  # the common case: view = reader from 0
            return self._reader.prefix_sums(indices)
        segment, at = self._globals(indices)
        # the segments before, whole, plus this one from its start
        return limbs_add(self._before[segment], limbs_sub(self._reader.prefix_sums(at), self._start_sums[segment]))

    def items_at(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Items at the indices (each in [0, size)): timestamps (m,) uint64 and ids (m, 32) uint8."""
        return self._reader.items_at(self._globals(np.asarray(indices, dtype=np.int64))[1])


def reconcile_from_index(conn: sqlite3.Connection, number: int, f: Filter, message: bytes,
                         frame_size_limit: int, cache: GroupCache | None = None) -> bytes:
    """Answer one NIP-77 message (NEG-OPEN's initial one or a NEG-MSG) from index `number`, as responder.

    Run it inside one read transaction (`Store.read_snapshot`).  The items
    are those of `f`'s since/until window, limited by `f.limit` (see
    `window_segments`); `frame_size_limit` bounds the reply, in bytes;
    `cache` keeps decoded groups for the next messages.

    Raises:
        NegentropyError: a malformed message.
        IndexOutOfStep: a corrupt index.
    """
    reader = IndexReader(conn, number, cache)
    view = IndexView(reader, window_segments(reader, f.since, f.until, f.limit))
    return Negentropy(view, frame_size_limit).reconcile(message)


def query_vector(conn: sqlite3.Connection, f: Filter, limit: int, now: int,
                 private: PrivateKinds | None = None) -> SortedVector:
    """A sealed SortedVector of the (created_at, id) of the live events matching `f`, at most `limit`.

    The newest first when cut: the events a REQ for `f` with that limit
    returns (NIP-01 order).  `now` is unix seconds, for NIP-40 expiry;
    `private` leaves out the private kinds' events the reader may not see.
    Reads only (created_at, id), `_INDEXED_ITEMS_FETCH` rows at a time.
    """
    vector = SortedVector()
    if not f.is_empty() and limit > 0:
        compiled = compile_filter(f, limit, now, private)
        cursor = conn.execute(f"SELECT created_at, id FROM ({compiled.sql})", compiled.params)
        while rows := cursor.fetchmany(_INDEXED_ITEMS_FETCH):
            timestamps = np.fromiter((r[0] for r in rows), dtype=np.uint64, count=len(rows))
            ids = np.frombuffer(b"".join(r[1] for r in rows), dtype=np.uint8).reshape(-1, 32)
            vector.insert_many(timestamps, ids)
    vector.seal()
    return vector


def recompute(conn: sqlite3.Connection, spec: str) -> list[Key]:
    """What the index of `spec` should hold, recomputed from `events`: sorted (created_at, id) (for checks)."""
    from relay.protocol.filters import parse_filter  # only checks need it

    f = Filter() if spec == FULL_SET_SPEC or spec.startswith("public:") else parse_filter(json.loads(spec))
    return sorted((c, bytes(i)) for c, i in _matching(conn, spec, f))


def indexed_items(conn: sqlite3.Connection, number: int) -> list[Key]:
    """Every item of filter `number`'s index, in bucket order, from the buckets' rows (for checks)."""
    rows = conn.execute("SELECT ts, ids FROM neg_nodes WHERE filter_no = ? AND level = 1 ORDER BY created_at, id",
                        (number,)).fetchall()
    return [item for ts_blob, ids_blob in rows for item in _unpack(ts_blob, ids_blob)]


def check_nodes(conn: sqlite3.Connection, number: int, items: list[Key] | None = None) -> list[str]:
    """Every disagreement between filter `number`'s nodes and its items (empty when consistent).

    `items` are its `indexed_items` if the caller has read them already.
    """
    problems = []
    if items is None:
        items = indexed_items(conn, number)
    if any(a >= b for a, b in zip(items, items[1:])):
        problems.append("bucket items out of order or repeated")
    for level in (1, 2):
        nodes = conn.execute(f"SELECT created_at, id, count, children, {_SUMS} FROM neg_nodes"
                             " WHERE filter_no = ? AND level = ? ORDER BY created_at, id", (number, level)).fetchall()
        if not nodes or (nodes[0][0], nodes[0][1]) != SENTINEL:
            problems.append(f"level {level}: no sentinel first node")
            continue
        starts = [(n[0], n[1]) for n in nodes]
        for k, n in enumerate(nodes):
            lo = bisect.bisect_left(items, starts[k])
            hi = len(items) if k + 1 == len(nodes) else bisect.bisect_left(items, starts[k + 1])
            ids = [i for _, i in items[lo:hi]]
            sums = [sum(_LIMBS.unpack(i)[j] for i in ids) for j in range(8)]
            if n[2] != len(ids) or list(n[4:12]) != sums:
                problems.append(f"level {level} node {starts[k]}: count/sums disagree with its items")
            if level == 1 and n[3] != n[2]:
                problems.append(f"bucket {starts[k]}: children {n[3]} != count {n[2]}")
        if level == 1:
            bucket_starts = starts
        else:
            known = set(bucket_starts)
            for k, start in enumerate(starts):
                if start not in known:
                    problems.append(f"group {start} does not start at a bucket")
                end = starts[k + 1] if k + 1 < len(starts) else None
                inside = [s for s in bucket_starts if s >= start and (end is None or s < end)]
                if nodes[k][3] != len(inside):
                    problems.append(f"group {start}: children {nodes[k][3]} != {len(inside)} buckets")
    return problems
