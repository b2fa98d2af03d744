"""The nodes of one filter's NIP-77 index and their writer, run inside the write transaction.

How this works
--------------
Each indexed filter keeps `neg_nodes` rows (see migrations 0002 and 0005)
that form a two-level B+-tree:

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
"""

from __future__ import annotations

import secrets
import sqlite3
import struct
from collections.abc import Iterable, Sequence
from itertools import islice

import numpy as np

from relay.protocol.negentropy import ID_SIZE

Key = tuple[int, bytes]
"""An item or node key: (created_at in unix seconds, 32-byte id); nodes may use SENTINEL."""

SENTINEL: Key = (-1, b"")
"""Start key of the first bucket and group of every filter: below every event (created_at >= 0)."""
MAX_CHILDREN = 256
"""Default: a node with more children (items of a bucket, buckets of a group) is split.

A node with fewer than max/8 children is merged into a sibling when the two
fit in one node; an index built from scratch fills its nodes to max/2.
Smaller values only serve tests (more splits and merges on fewer items)."""
LAYOUT = "2"
"""Version of the node scheme, in `meta`; a different stored value makes `setup` rebuild every index."""
SUM_COLUMNS = ", ".join(f"s{j}" for j in range(8))
"""The eight limb-sum columns of a node row, for SQL."""

_ZERO_SUMS = (0,) * 8
_NODE = "filter_no = ? AND level = ? AND created_at = ? AND id = ?"


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
    conn.executemany(f"INSERT INTO neg_nodes (filter_no, level, created_at, id, count, children, {SUM_COLUMNS},"
                     f" stamp, ts, ids) VALUES ({'?, ' * 16}?)", rows)


def _pack(keys: Sequence[Key]) -> tuple[bytes, bytes]:
    """A bucket's items as its (ts, ids) blobs."""
    return struct.pack(f"<{len(keys)}Q", *(k[0] for k in keys)), b"".join(k[1] for k in keys)


def unpack_bucket(ts_blob: bytes, ids_blob: bytes) -> list[Key]:
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
        return self.cur.execute(f"SELECT count, children, {SUM_COLUMNS} FROM neg_nodes WHERE {_NODE}",
                                (self.number, level, *key)).fetchone()

    def leaf(self, key: Key) -> list[Key]:
        """The items of the bucket starting at `key`."""
        return self.bucket(key)[2]

    def bucket(self, key: Key) -> tuple[int, tuple[int, ...], list[Key]]:
        """(count, limb sums s0..s7, items) of the bucket starting at `key`: one row read."""
        row = self.cur.execute(f"SELECT count, {SUM_COLUMNS}, ts, ids FROM neg_nodes WHERE {_NODE}",
                               (self.number, 1, *key)).fetchone()
        return row[0], row[1:9], unpack_bucket(row[9], row[10])

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
            f"INSERT OR REPLACE INTO neg_nodes (filter_no, level, created_at, id, count, children, {SUM_COLUMNS}, stamp)"
            f" VALUES ({'?, ' * 14}?)", (self.number, 2, *key, count, children, *sums, self.stamp))

    def put_leaf(self, key: Key, items: Sequence[Key]) -> tuple[int, list[int]]:
        """Insert or overwrite the bucket starting at `key` with `items` (sorted); return its count and sums."""
        ts_blob, ids_blob = _pack(items)
        sums = _limb_sums(ids_blob)
        self.cur.execute(
            f"INSERT OR REPLACE INTO neg_nodes (filter_no, level, created_at, id, count, children, {SUM_COLUMNS},"
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
            f"SELECT created_at, id, count, {SUM_COLUMNS} FROM neg_nodes WHERE filter_no = ? AND level = 1"
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
