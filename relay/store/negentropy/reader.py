"""Serving NIP-77 from the index: random access to one filter's items, ranges and fingerprints.

How this works
--------------
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

A filter that no index serves is answered from a `SortedVector` built from
one query (`query_vector`).

Source: NIP-77 and its appendix "Negentropy Protocol V1" (fingerprints).
"""

from __future__ import annotations

import bisect
import sqlite3
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

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
    combine_limbs,
    limbs_add,
    limbs_sub,
    range_fingerprints,
    running_id_sums,
    sorted_lower_bounds,
)
from relay.store.negentropy.tree import SUM_COLUMNS, Key
from relay.store.queries import compile_filter

_MOD256 = (1 << 256) - 1


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
        rows = self._fetch(f"SELECT created_at, id, count, stamp, {SUM_COLUMNS} FROM neg_nodes"
                           " WHERE filter_no = ? AND level = 2 ORDER BY created_at, id", (number,))
        if not rows:
            raise IndexOutOfStep(f"negentropy index {number} does not exist")
        self._starts: list[Key] = [(r[0], r[1]) for r in rows]
        self._stamps = [r[3] for r in rows]
        self._counts = [0]
        sums = [0]
        for r in rows:
            self._counts.append(self._counts[-1] + r[2])
            sums.append(sums[-1] + combine_limbs(r[4:12]))
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
    Reads only (created_at, id), a chunk of rows at a time (`SortedVector.from_rows`).
    """
    if f.is_empty() or limit <= 0:
        return SortedVector.from_rows(())
    compiled = compile_filter(f, limit, now, private)
    return SortedVector.from_rows(conn.execute(f"SELECT created_at, id FROM ({compiled.sql})", compiled.params))
