"""The NIP-77 negentropy index: (created_at, id) of the live events, kept in the write transaction.

How this works
--------------
`NegentropyIndex` is a `TransactionHook`.  For the full event set (filter
`{}`) and for each filter configured under `[negentropy] filters`, it keeps
one `neg_items` row per (filter, event), and summary rows in `neg_nodes` (see
migrations/0002_negentropy.sql) that form a two-level B+-tree:

* a bucket (level 1) covers the items from its start key up to the next
  bucket's start key: it stores their count and the sums of their ids' eight
  32-bit little-endian limbs, each summed without carry in a 64-bit integer,
  so adding or removing an item is nine integer additions and the carries
  are folded only when a fingerprint is computed;
* a group (level 2) covers the buckets from its start key up to the next
  group's start key, with the same count and sums, and its number of buckets.

Every group starts where one of its buckets starts, and the first bucket and
group of a filter start at the sentinel key (-1, b"") below every event, so
each key falls in exactly one bucket and one group.  A node with more than
`MAX_CHILDREN` (256) children is split (a bucket by reading its items); one
with fewer than 32 is merged into a sibling, which reads no item.  A
batch updates each touched bucket and group once, with summed deltas.

Reading (`IndexReader`, one per message, inside ONE read transaction): the
groups of a filter are read once (roughly N / 16,000 rows for N items), a
group's buckets (< 2 * MAX_CHILDREN rows) and a bucket's items (likewise)
only when an index falls strictly inside them.  The fingerprint of the items
[a, b) is built from prefix(b) - prefix(a), where prefix(i), the exact sum of
the first i ids, is whole groups + whole buckets of i's group + the items of
i's bucket before i.  So a full-range fingerprint reads only the groups.

`IndexView` adapts a reader to `NegentropyStorage` for one NEG-OPEN filter:
the items of its since/until window, and with a `limit` the newest `limit`
of them (see `window_segments`).

Source: NIP-77 and its appendix "Negentropy Protocol V1" (fingerprints);
the bucket sums follow DESIGN.md, "Negentropy (NIP-77)".
"""

from __future__ import annotations

import bisect
import json
import sqlite3
import struct
from collections.abc import Iterable, Iterator, Sequence

import numpy as np

from relay.protocol.auth import PrivateKinds
from relay.protocol.filters import Filter
from relay.protocol.negentropy import (
    INFINITY,
    Bound,
    Negentropy,
    NegentropyError,
    SortedVector,
    fingerprint_from_sum,
)
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
LAYOUT = "1"
"""Version of the node scheme, in `meta`; a different stored value makes `setup` rebuild every index."""

_LAYOUT_KEY = "negentropy_index_layout"
_LIMBS = struct.Struct("<8I")
_SUMS = ", ".join(f"s{j}" for j in range(8))
_ZERO_SUMS = (0,) * 8
_INDEXED_ITEMS_FETCH = 65_536  # rows per fetchmany when a SortedVector is built from a query


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


class NegentropyIndex:
    """TransactionHook: the negentropy index of the full set and of `filters` (NIP-01 filters).

    `filters` carry no since/until/limit (their spec ignores them).  Call
    `filter_no(f)` after `setup` to learn whether a NEG-OPEN filter is indexed.
    """

    def __init__(self, filters: Iterable[Filter] = (), max_children: int = MAX_CHILDREN) -> None:
        if max_children < 4:
            raise ValueError("max_children must be at least 4")
        self.max_children = max_children
        self._filters: dict[str, Filter] = {FULL_SET_SPEC: Filter()}
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

    def setup(self, conn: sqlite3.Connection) -> None:
        """Bring the stored indexes in line with the configured filters, in one transaction.

        Indexes of filters no longer configured are deleted; missing ones are
        built from `events` (reading every matching event once).
        """
        conn.execute("BEGIN IMMEDIATE")
        try:
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
                    _build(conn, number, f, self.max_children // 2)
                numbers[spec] = number
            conn.execute("COMMIT")
        except BaseException:
            conn.rollback()
            raise
        self._numbers = numbers

    def apply(self, cur: sqlite3.Cursor, changes: Changes) -> None:
        """Add the events inserted and remove the rows removed by one transaction (its `net()` changes)."""
        inserted, removed = changes.net()
        new = [((ev.created_at, bytes.fromhex(ev.id)), ev) for ev in inserted]
        gone = [(r.created_at, r.id) for r in removed]
        for spec, f in self._filters.items():
            adds = [key for key, ev in new if spec == FULL_SET_SPEC or f.matches(ev)]
            if adds or gone:
                update_items(cur, self._numbers[spec], adds, gone, self.max_children)


class DropNegentropyIndex:
    """TransactionHook for `[negentropy] enabled = false`: empties the index at setup, then does nothing.

    An index not kept up to date must not survive to be trusted later: with
    negentropy enabled again, `NegentropyIndex.setup` rebuilds it.
    """

    def setup(self, conn: sqlite3.Connection) -> None:
        """Delete every index row, in one transaction."""
        conn.execute("BEGIN IMMEDIATE")
        try:
            _clear(conn)
            conn.execute("COMMIT")
        except BaseException:
            conn.rollback()
            raise

    def apply(self, cur: sqlite3.Cursor, changes: Changes) -> None:
        """Nothing: no index is kept."""


def _clear(conn: sqlite3.Connection) -> None:
    for table in ("neg_items", "neg_nodes", "neg_filters"):
        conn.execute(f"DELETE FROM {table}")


def _drop_filter(conn: sqlite3.Connection, number: int) -> None:
    for table in ("neg_items", "neg_nodes", "neg_filters"):
        conn.execute(f"DELETE FROM {table} WHERE filter_no = ?", (number,))


def _build(conn: sqlite3.Connection, number: int, f: Filter, fill: int) -> None:
    """Index every stored event matching `f` (expired ones too: they stay in `events` until the purge)."""
    if filter_spec(f) == FULL_SET_SPEC:
        conn.execute("INSERT INTO neg_items (filter_no, created_at, id) SELECT ?, created_at, id FROM events",
                     (number,))
    else:
        # limit -1: none (SQLite); now -1: before every expiration, which is >= 0.
        compiled = compile_filter(f, -1, -1)
        conn.execute(f"INSERT INTO neg_items (filter_no, created_at, id) SELECT ?, created_at, id"
                     f" FROM ({compiled.sql})", (number, *compiled.params))
    build_nodes(conn, number, fill)


def build_nodes(conn: sqlite3.Connection, number: int, fill: int = MAX_CHILDREN // 2) -> None:
    """(Re)build filter `number`'s buckets and groups from its `neg_items` rows, `fill` children each."""
    conn.execute("DELETE FROM neg_nodes WHERE filter_no = ?", (number,))
    cursor = conn.execute("SELECT created_at, id FROM neg_items WHERE filter_no = ? ORDER BY created_at, id",
                          (number,))
    buckets: list[tuple[Key, int, list[int]]] = []
    while rows := cursor.fetchmany(fill):
        limbs = np.frombuffer(b"".join(r[1] for r in rows), dtype="<u4").reshape(-1, 8)
        sums = [int(s) for s in limbs.sum(axis=0, dtype=np.uint64)]
        buckets.append((SENTINEL if not buckets else (rows[0][0], rows[0][1]), len(rows), sums))
    if not buckets:
        buckets.append((SENTINEL, 0, list(_ZERO_SUMS)))
    groups = []
    for start in range(0, len(buckets), fill):
        chunk = buckets[start:start + fill]
        sums = [sum(b[2][j] for b in chunk) for j in range(8)]
        groups.append((chunk[0][0], sum(b[1] for b in chunk), len(chunk), sums))
    sql = f"INSERT INTO neg_nodes (filter_no, level, created_at, id, count, children, {_SUMS}) VALUES ({'?, ' * 13}?)"
    conn.executemany(sql, [(number, 1, *key, count, count, *sums) for key, count, sums in buckets])
    conn.executemany(sql, [(number, 2, *key, count, children, *sums) for key, count, children, sums in groups])


def update_items(cur: sqlite3.Cursor, number: int, adds: Sequence[Key], removes: Sequence[Key],
                 max_children: int = MAX_CHILDREN) -> None:
    """Insert the items `adds` and delete the items `removes` of filter `number`, keeping its nodes in step.

    `adds` must not be indexed yet (sqlite3.IntegrityError otherwise, which
    rolls the batch back); `removes` not indexed are ignored.  Also the way
    tests fill an index with synthetic items.
    """
    _Tree(cur, number, max_children).update(adds, removes)


class _Tree:
    """The nodes of one filter, on the writer's cursor."""

    def __init__(self, cur: sqlite3.Cursor, number: int, max_children: int) -> None:
        self.cur = cur
        self.number = number
        self.max = max_children
        self.min = max_children // 8 or 1

    # -- row access

    def node(self, level: int, key: Key) -> tuple | None:
        """(count, children, s0..s7) of the node starting at `key`, or None."""
        return self.cur.execute(
            f"SELECT count, children, {_SUMS} FROM neg_nodes"
            " WHERE filter_no = ? AND level = ? AND created_at = ? AND id = ?", (self.number, level, *key)).fetchone()

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

    def add(self, level: int, key: Key, count: int, children: int, sums: Sequence[int]) -> None:
        """Add deltas to a node's count, children and limb sums."""
        self.cur.execute(
            "UPDATE neg_nodes SET count = count + ?, children = children + ?, "
            + ", ".join(f"s{j} = s{j} + ?" for j in range(8))
            + " WHERE filter_no = ? AND level = ? AND created_at = ? AND id = ?",
            (count, children, *sums, self.number, level, *key))

    def put(self, level: int, key: Key, count: int, children: int, sums: Sequence[int]) -> None:
        """Insert or overwrite a node."""
        self.cur.execute(
            f"INSERT OR REPLACE INTO neg_nodes (filter_no, level, created_at, id, count, children, {_SUMS})"
            f" VALUES ({'?, ' * 13}?)", (self.number, level, *key, count, children, *sums))

    def delete(self, level: int, key: Key) -> None:
        """Remove a node row (its range joins the previous node's)."""
        self.cur.execute("DELETE FROM neg_nodes WHERE filter_no = ? AND level = ? AND created_at = ? AND id = ?",
                         (self.number, level, *key))

    def children_of(self, level: int, start: Key, end: Key | None) -> tuple[list[Key], np.ndarray, np.ndarray]:
        """Children of the node [start, end): items (level 1) or buckets (level 2).

        Returns their keys, their counts (shape (n,)) and their limb sums
        (shape (n, 8), uint64).
        """
        upper = "" if end is None else " AND (created_at, id) < (?, ?)"
        params = (self.number, *start) + (() if end is None else end)
        if level == 1:
            rows = self.cur.execute(
                "SELECT created_at, id FROM neg_items WHERE filter_no = ? AND (created_at, id) >= (?, ?)"
                + upper + " ORDER BY created_at, id", params).fetchall()
            limbs = np.frombuffer(b"".join(r[1] for r in rows), dtype="<u4").reshape(-1, 8)
            return [(c, i) for c, i in rows], np.ones(len(rows), dtype=np.int64), limbs.astype(np.uint64)
        rows = self.cur.execute(
            f"SELECT created_at, id, count, {_SUMS} FROM neg_nodes WHERE filter_no = ? AND level = 1"
            " AND (created_at, id) >= (?, ?)" + upper + " ORDER BY created_at, id", params).fetchall()
        return ([(r[0], r[1]) for r in rows], np.array([r[2] for r in rows], dtype=np.int64),
                np.array([r[3:] for r in rows], dtype=np.uint64).reshape(-1, 8))

    # -- changes

    def update(self, adds: Sequence[Key], removes: Sequence[Key]) -> None:
        """Write the items, then one delta per touched bucket and group, then split/merge those nodes."""
        changed = [(key, 1) for key in adds]
        if adds:
            self.cur.executemany("INSERT INTO neg_items (filter_no, created_at, id) VALUES (?, ?, ?)",
                                 [(self.number, *key) for key in adds])
        for key in removes:
            self.cur.execute("DELETE FROM neg_items WHERE filter_no = ? AND created_at = ? AND id = ?",
                             (self.number, *key))
            if self.cur.rowcount:
                changed.append((key, -1))
        if not changed:
            return
        changed.sort()
        buckets = {}
        for start, members in self._by_node(1, changed).items():
            ids, signs = zip(*((key[1], sign) for key, sign in members))
            limbs = np.frombuffer(b"".join(ids), dtype="<u4").reshape(-1, 8).astype(np.int64)
            sums = (limbs * np.array(signs, dtype=np.int64)[:, None]).sum(axis=0)  # |sum| < 2**63
            buckets[start] = [sum(signs), *(int(x) for x in sums)]
            self.add(1, start, buckets[start][0], buckets[start][0], buckets[start][1:])
        for start, members in self._by_node(2, sorted(buckets.items())).items():
            delta = [sum(column) for column in zip(*(bucket_delta for _, bucket_delta in members))]
            self.add(2, start, delta[0], 0, delta[1:])
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
        keys, counts, sums = self.children_of(level, key, self.next_start(level, key))
        n = len(keys)
        k = max(2, n // (self.max // 2))
        cuts = [n * j // k for j in range(k + 1)]
        for j in range(k):
            lo, hi = cuts[j], cuts[j + 1]
            start = key if j == 0 else keys[lo]  # the first piece keeps the start: sentinels stay
            piece_sums = [int(x) for x in sums[lo:hi].sum(axis=0, dtype=np.uint64)]
            self.put(level, start, int(counts[lo:hi].sum()), hi - lo, piece_sums)
        if level == 1:
            parent = self.floor(2, key)
            self.add(2, parent, 0, k - 1, _ZERO_SUMS)
            touched_groups.add(parent)

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
        self.add(level, keep, gone_node[0], gone_node[1], gone_node[2:])
        self.delete(level, gone)
        if parent is not None:
            self.add(2, parent, 0, -1, _ZERO_SUMS)
            touched_groups.add(parent)


# ---------------------------------------------------------------- read side


class IndexOutOfStep(RuntimeError):
    """The index's nodes disagree with its items (a bug, or a write that bypassed the hook)."""


class _Directory:
    """Consecutive nodes: start keys, running counts and running exact id sums (len = nodes + 1)."""

    __slots__ = ("starts", "counts", "sums")

    def __init__(self, rows: list[tuple]) -> None:
        self.starts: list[Key] = [(r[0], r[1]) for r in rows]
        self.counts = [0]
        self.sums = [0]
        for r in rows:
            self.counts.append(self.counts[-1] + r[2])
            self.sums.append(self.sums[-1] + _combine(r[3:11]))

    def locate(self, i: int) -> tuple[int, int]:
        """(node, offset in it) of the i-th item, 0 <= i < total (empty nodes are skipped)."""
        node = bisect.bisect_right(self.counts, i) - 1
        return node, i - self.counts[node]


class IndexReader:
    """Random access to one filter's index through `conn`, with per-message caches.

    Use it inside one read transaction and drop it after: it caches what it
    reads.  Indices are global positions in (created_at, id) order.
    `rows_read` counts the rows fetched so far.

    Raises:
        IndexOutOfStep: when the nodes and the items disagree.
    """

    def __init__(self, conn: sqlite3.Connection, number: int) -> None:
        self._conn = conn
        self._number = number
        self.rows_read = 0
        rows = self._fetch(f"SELECT created_at, id, count, {_SUMS} FROM neg_nodes"
                           " WHERE filter_no = ? AND level = 2 ORDER BY created_at, id", (number,))
        if not rows:
            raise IndexOutOfStep(f"negentropy index {number} does not exist")
        self._groups = _Directory(rows)
        self._buckets: dict[int, _Directory] = {}
        self._items: dict[tuple[int, int], tuple[list[Key], list[int]]] = {}
        self.size = self._groups.counts[-1]

    def _fetch(self, sql: str, params: tuple) -> list[tuple]:
        rows = self._conn.execute(sql, params).fetchall()
        self.rows_read += len(rows)
        return rows

    def _range(self, start: Key, end: Key | None) -> tuple[str, tuple]:
        if end is None:
            return " AND (created_at, id) >= (?, ?)", start
        return " AND (created_at, id) >= (?, ?) AND (created_at, id) < (?, ?)", start + end

    def _bucket_dir(self, g: int) -> _Directory:
        found = self._buckets.get(g)
        if found is None:
            starts = self._groups.starts
            where, params = self._range(starts[g], starts[g + 1] if g + 1 < len(starts) else None)
            found = _Directory(self._fetch(
                f"SELECT created_at, id, count, {_SUMS} FROM neg_nodes WHERE filter_no = ? AND level = 1"
                + where + " ORDER BY created_at, id", (self._number, *params)))
            if found.counts[-1] != self._groups.counts[g + 1] - self._groups.counts[g]:
                raise IndexOutOfStep(f"negentropy index {self._number}: group {starts[g]} disagrees with buckets")
            self._buckets[g] = found
        return found

    def _bucket_items(self, g: int, b: int) -> tuple[list[Key], list[int]]:
        found = self._items.get((g, b))
        if found is None:
            buckets = self._bucket_dir(g)
            if b + 1 < len(buckets.starts):
                end = buckets.starts[b + 1]
            else:
                end = self._groups.starts[g + 1] if g + 1 < len(self._groups.starts) else None
            where, params = self._range(buckets.starts[b], end)
            rows = self._fetch("SELECT created_at, id FROM neg_items WHERE filter_no = ?" + where
                               + " ORDER BY created_at, id", (self._number, *params))
            if len(rows) != buckets.counts[b + 1] - buckets.counts[b]:
                raise IndexOutOfStep(f"negentropy index {self._number}: bucket {buckets.starts[b]} disagrees")
            keys = [(r[0], r[1]) for r in rows]
            sums = [0]
            for _, id_ in rows:
                sums.append(sums[-1] + int.from_bytes(id_, "little"))
            found = self._items[(g, b)] = (keys, sums)
        return found

    def _locate(self, i: int) -> tuple[int, int, int]:
        g, offset = self._groups.locate(i)
        b, offset = self._bucket_dir(g).locate(offset)
        return g, b, offset

    def prefix(self, i: int) -> int:
        """Exact (unreduced) sum of the first `i` ids, 0 <= i <= size, as little-endian 256-bit ints."""
        if i <= 0:
            return 0
        if i >= self.size:
            return self._groups.sums[-1]
        g, offset = self._groups.locate(i)
        total = self._groups.sums[g]
        if offset == 0:
            return total
        buckets = self._bucket_dir(g)
        b, offset = buckets.locate(offset)
        total += buckets.sums[b]
        if offset == 0:
            return total
        return total + self._bucket_items(g, b)[1][offset]

    def item(self, i: int) -> Key:
        """The i-th item (created_at, id); IndexError outside [0, size)."""
        if not 0 <= i < self.size:
            raise IndexError(f"item index {i} out of range")
        g, b, offset = self._locate(i)
        return self._bucket_items(g, b)[0][offset]

    def lower_bound(self, key: Key) -> int:
        """Index of the first item >= `key` (size if none); `key` may use a timestamp up to 2**64 - 1."""
        if key[0] >= INFINITY:
            return self.size
        g = bisect.bisect_right(self._groups.starts, key) - 1
        buckets = self._bucket_dir(g)
        b = bisect.bisect_right(buckets.starts, key) - 1
        keys = self._bucket_items(g, b)[0]
        return self._groups.counts[g] + buckets.counts[b] + bisect.bisect_left(keys, key)

    def iter_ids(self, begin: int, end: int) -> Iterator[bytes]:
        """The ids of the items [begin, end), in order."""
        i = begin
        while i < end:
            g, b, offset = self._locate(i)
            keys = self._bucket_items(g, b)[0][offset:offset + end - i]
            for key in keys:
                yield key[1]
            i += len(keys)


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

    def find_lower_bound(self, begin: int, end: int, bound: Bound) -> int:
        """First index in [begin, end) whose item is >= `bound`, else `end`."""
        self._check_range(begin, end)
        if bound.timestamp >= INFINITY:
            return end
        position = self._reader.lower_bound((bound.timestamp, bound.padded_id()))
        below = sum(min(max(position, s), e) - s for s, e in self._segments)
        return min(max(below, begin), end)

    def _parts(self, begin: int, end: int) -> Iterator[tuple[int, int]]:
        """Global ranges holding the view's items [begin, end)."""
        for (s, e), offset in zip(self._segments, self._offsets):
            lo, hi = max(begin, offset), min(end, offset + e - s)
            if lo < hi:
                yield s + lo - offset, s + hi - offset

    def fingerprint(self, begin: int, end: int) -> bytes:
        """16-byte fingerprint of the items in [begin, end) (NIP-77 appendix, "Fingerprint")."""
        self._check_range(begin, end)
        total = sum(self._reader.prefix(hi) - self._reader.prefix(lo) for lo, hi in self._parts(begin, end))
        return fingerprint_from_sum(total, end - begin)

    def iter_ids(self, begin: int, end: int) -> Iterator[bytes]:
        """The 32-byte ids of the items in [begin, end), in order."""
        self._check_range(begin, end)
        for lo, hi in self._parts(begin, end):
            yield from self._reader.iter_ids(lo, hi)


def reconcile_from_index(conn: sqlite3.Connection, number: int, f: Filter, message: bytes,
                         frame_size_limit: int) -> bytes:
    """Answer one NIP-77 message (NEG-OPEN's initial one or a NEG-MSG) from index `number`, as responder.

    Run it inside one read transaction (`Store.read_snapshot`).  The items
    are those of `f`'s since/until window, limited by `f.limit` (see
    `window_segments`); `frame_size_limit` bounds the reply, in bytes.

    Raises:
        NegentropyError: a malformed message.
        IndexOutOfStep: a corrupt index.
    """
    reader = IndexReader(conn, number)
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

    f = parse_filter(json.loads(spec))
    if spec == FULL_SET_SPEC:
        rows = conn.execute("SELECT created_at, id FROM events").fetchall()
    else:
        compiled = compile_filter(f, -1, -1)
        rows = conn.execute(f"SELECT created_at, id FROM ({compiled.sql})", compiled.params).fetchall()
    return sorted((c, bytes(i)) for c, i in rows)


def check_nodes(conn: sqlite3.Connection, number: int) -> list[str]:
    """Every disagreement between filter `number`'s nodes and its items (empty when consistent)."""
    problems = []
    items = conn.execute("SELECT created_at, id FROM neg_items WHERE filter_no = ? ORDER BY created_at, id",
                         (number,)).fetchall()
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
