"""What the reconciler reads (`NegentropyStorage`) and its in-memory implementation (`SortedVector`).

How this works
--------------
Storage is abstract: the reconciler only asks for sizes, items by index,
lower-bound searches and range fingerprints, in bulk where it can, so an
index kept in SQLite with per-bucket sums (relay/store/negentropy/) can
serve it.  `SortedVector` is the in-memory implementation, with numpy
arrays and prefix sums for O(1) fingerprints; `SortedVector.from_rows`
builds one from (created_at, id) rows, as a query returns them.

Source: NIP-77 appendix "Negentropy Protocol V1" (items are sorted by
timestamp, then id).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from itertools import islice
from typing import Protocol, runtime_checkable

import numpy as np

from relay.protocol.negentropy.codec import ID_SIZE, INFINITY, Bound, NegentropyError
from relay.protocol.negentropy.fingerprint import as_id_array, fingerprint_from_sum, running_id_sums

_ROWS_PER_CHUNK = 65_536  # rows turned into arrays at a time by `SortedVector.from_rows`


@runtime_checkable
class NegentropyStorage(Protocol):
    """What the reconciler needs from a sealed, sorted item set.

    Items are ``(timestamp, id)`` sorted by timestamp then id, indexed from 0.
    A SQLite-backed index can implement ``fingerprint`` from per-bucket sums.
    """

    def size(self) -> int:
        """Number of items."""
        ...

    def get_item(self, i: int) -> tuple[int, bytes]:
        """Item ``i`` as ``(timestamp, 32-byte id)``."""
        ...

    def fingerprint(self, begin: int, end: int) -> bytes:
        """16-byte fingerprint of the items in [begin, end)."""
        ...

    def id_bytes(self, begin: int, end: int) -> bytes:
        """The 32-byte ids of the items in [begin, end), in order, concatenated: 32 * (end - begin) bytes."""
        ...

    def lower_bounds(self, bounds: Sequence[Bound]) -> np.ndarray:
        """For each bound, the first index whose item is >= it (``size()`` if none): int64, shape (m,)."""
        ...

    def prefix_sums(self, indices: np.ndarray) -> np.ndarray:
        """Sum of the ids [0, i) mod 2**256 for each index i in [0, size]: (m, 8) little-endian uint32 limbs."""
        ...

    def items_at(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Items at the indices (each in [0, size)): timestamps (m,) uint64 and ids (m, 32) uint8."""
        ...


class SortedVector:
    """In-memory `NegentropyStorage`: add items, `seal()`, then query.

    Timestamps live in a uint64 array, ids in an (n, 32) uint8 array, and the
    running id sums (mod 2**256) in an (n + 1, 8) uint32 array, so a range
    fingerprint costs two lookups and one SHA-256.  Memory: about 72 bytes
    per item.  Raises NegentropyError for bad items, duplicate ids (found at
    `seal`), adding after `seal`, or querying before it.
    """

    def __init__(self) -> None:
        self._pending_ts: list[np.ndarray] = []
        self._pending_ids: list[np.ndarray] = []
        self._one_ts: list[int] = []
        self._one_ids: list[bytes] = []
        self._sealed = False

    @classmethod
    def from_items(cls, items: Iterable[tuple[int, bytes]]) -> SortedVector:
        """A sealed vector holding ``items`` (``(timestamp, id)`` pairs)."""
        vec = cls()
        for timestamp, id_ in items:
            vec.insert(timestamp, id_)
        vec.seal()
        return vec

    @classmethod
    def from_rows(cls, rows: Iterable[tuple[int, bytes]]) -> SortedVector:
        """A sealed vector of many ``(timestamp, 32-byte id)`` rows, converted to arrays in bulk.

        ``rows`` may be a list or a query's cursor of (created_at, id): it is
        read `_ROWS_PER_CHUNK` rows at a time, so a cursor's rows are never
        all held as Python tuples.  This is how the items of a filter that
        no index serves become storage (NIP-77 responder and initiator).
        Raises NegentropyError as `insert_many` and `seal` do.
        """
        vec = cls()
        rows = iter(rows)
        while chunk := list(islice(rows, _ROWS_PER_CHUNK)):
            timestamps = np.fromiter((t for t, _ in chunk), dtype=np.uint64, count=len(chunk))
            ids = np.frombuffer(b"".join(i for _, i in chunk), dtype=np.uint8).reshape(len(chunk), ID_SIZE)
            vec.insert_many(timestamps, ids)
        vec.seal()
        return vec

    def insert(self, timestamp: int, id_: bytes) -> None:
        """Add one item; ``timestamp`` in [0, 2**64 - 2], ``id_`` 32 bytes."""
        self._check_unsealed()
        if type(timestamp) is not int or not 0 <= timestamp < INFINITY:
            raise NegentropyError(f"timestamp out of range: {timestamp!r}")
        if not isinstance(id_, (bytes, bytearray, memoryview)) or len(id_) != ID_SIZE:
            raise NegentropyError(f"id must be 32 bytes, not {id_!r}")
        self._one_ts.append(timestamp)
        self._one_ids.append(bytes(id_))

    def insert_many(self, timestamps: np.ndarray | Iterable[int], ids: np.ndarray | Iterable[bytes]) -> None:
        """Add many items at once: ``timestamps`` shape (n,), ``ids`` (n, 32) uint8."""
        self._check_unsealed()
        ts = _as_timestamp_array(timestamps)
        arr = as_id_array(ids)
        if len(ts) != len(arr):
            raise NegentropyError(f"{len(ts)} timestamps for {len(arr)} ids")
        self._pending_ts.append(ts)
        self._pending_ids.append(arr)

    def seal(self) -> None:
        """Sort the items, reject duplicate ids and build the prefix sums."""
        self._check_unsealed()
        ts, ids = self._gather()
        order = _sort_order(ts, ids)
        self._ts = ts[order]
        self._ids = np.ascontiguousarray(ids[order])
        _reject_duplicate_ids(self._ids)
        self._ts_view = _byte_view(self._ts).cast("Q")
        self._id_view = _byte_view(self._ids)
        self._prefix = running_id_sums(self._ids)
        self._prefix_view = _byte_view(self._prefix)
        self._sealed = True
        self._pending_ts = self._pending_ids = self._one_ts = self._one_ids = []

    def _gather(self) -> tuple[np.ndarray, np.ndarray]:
        ts_parts = [*self._pending_ts, np.array(self._one_ts, dtype=np.uint64)]
        id_parts = [*self._pending_ids, as_id_array(self._one_ids)]
        return np.concatenate(ts_parts), np.concatenate(id_parts)

    def size(self) -> int:
        """Number of items."""
        self._check_sealed()
        return len(self._ts)

    def get_item(self, i: int) -> tuple[int, bytes]:
        """Item ``i`` as ``(timestamp, 32-byte id)``; IndexError if out of range."""
        self._check_sealed()
        if not 0 <= i < len(self._ts):
            raise IndexError(f"item index {i} out of range")
        return self._ts_view[i], bytes(self._id_view[i * ID_SIZE : (i + 1) * ID_SIZE])

    def fingerprint(self, begin: int, end: int) -> bytes:
        """16-byte fingerprint of the items in [begin, end), in O(1)."""
        self._check_range(begin, end)
        upper = int.from_bytes(self._prefix_view[end * ID_SIZE : (end + 1) * ID_SIZE], "little")
        lower = int.from_bytes(self._prefix_view[begin * ID_SIZE : (begin + 1) * ID_SIZE], "little")
        return fingerprint_from_sum(upper - lower, end - begin)

    def id_bytes(self, begin: int, end: int) -> bytes:
        """The 32-byte ids of the items in [begin, end), in order, concatenated: 32 * (end - begin) bytes."""
        self._check_range(begin, end)
        return self._id_view[begin * ID_SIZE : end * ID_SIZE].tobytes()

    def lower_bounds(self, bounds: Sequence[Bound]) -> np.ndarray:
        """For each bound, the first index whose item is >= it (``size()`` if none): int64, shape (m,)."""
        self._check_sealed()
        return sorted_lower_bounds(self._ts, self._id_view, *bound_keys(bounds))

    def prefix_sums(self, indices: np.ndarray) -> np.ndarray:
        """Sum of the ids [0, i) mod 2**256 for each index i in [0, size]: (m, 8) little-endian uint32 limbs."""
        self._check_sealed()
        return self._prefix[indices]

    def items_at(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Items at the indices (each in [0, size)): timestamps (m,) uint64 and ids (m, 32) uint8."""
        self._check_sealed()
        return self._ts[indices], self._ids[indices]

    def _check_range(self, begin: int, end: int) -> None:
        self._check_sealed()
        if not 0 <= begin <= end <= len(self._ts):
            raise NegentropyError(f"bad range [{begin}, {end}) for {len(self._ts)} items")

    def _check_sealed(self) -> None:
        if not self._sealed:
            raise NegentropyError("storage not sealed")

    def _check_unsealed(self) -> None:
        if self._sealed:
            raise NegentropyError("storage already sealed")


def _byte_view(arr: np.ndarray) -> memoryview:
    """Flat byte view of a C-contiguous array (without copying)."""
    return memoryview(arr).cast("B") if arr.size else memoryview(b"")


def _as_timestamp_array(timestamps: np.ndarray | Iterable[int]) -> np.ndarray:
    if isinstance(timestamps, np.ndarray):
        if timestamps.dtype.kind not in "iu":
            raise NegentropyError(f"timestamps must be integers, not {timestamps.dtype}")
        if timestamps.dtype.kind == "i" and timestamps.size and timestamps.min() < 0:
            raise NegentropyError("negative timestamp")
        ts = timestamps.astype(np.uint64).reshape(-1)
    else:
        values = list(timestamps)
        if any(type(t) is not int or t < 0 for t in values):
            raise NegentropyError("timestamps must be non-negative ints")
        if any(t >= INFINITY for t in values):
            raise NegentropyError("timestamp out of range")
        ts = np.array(values, dtype=np.uint64)
    if ts.size and ts.max() == np.uint64(INFINITY):
        raise NegentropyError("timestamp 2**64 - 1 is reserved for infinity")
    return ts


def _sort_order(ts: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Permutation sorting items by (timestamp, id bytes).

    Sorts on the timestamp and the id's first 8 bytes (big-endian, so byte
    order is kept); only if two items tie on both does it sort on all 32 bytes.
    """
    words = ids.view(">u8").astype(np.uint64)  # (n, 4), most significant first
    order = np.lexsort((words[:, 0], ts))
    ts_sorted, first_sorted = ts[order], words[order, 0]
    ties = (ts_sorted[1:] == ts_sorted[:-1]) & (first_sorted[1:] == first_sorted[:-1])
    if ties.any():
        order = np.lexsort((words[:, 3], words[:, 2], words[:, 1], words[:, 0], ts))
    return order


def _reject_duplicate_ids(ids: np.ndarray) -> None:
    """Raise NegentropyError if any id occurs twice (at any timestamps)."""
    if len(ids) < 2:
        return
    first_words = np.sort(ids.view(">u8")[:, 0].astype(np.uint64))
    shared = np.unique(first_words[1:][first_words[1:] == first_words[:-1]])
    if not len(shared):
        return
    candidates = np.isin(ids.view(">u8")[:, 0].astype(np.uint64), shared)
    seen: set[bytes] = set()
    for row in ids[candidates]:
        id_ = row.tobytes()
        if id_ in seen:
            raise NegentropyError(f"duplicate item id {id_.hex()}")
        seen.add(id_)


def bound_keys(bounds: Sequence[Bound]) -> tuple[np.ndarray, list[bytes]]:
    """The bounds' timestamps as a (m,) uint64 array and their id prefixes as a list."""
    return np.fromiter((b[0] for b in bounds), dtype=np.uint64, count=len(bounds)), [b[1] for b in bounds]


def sorted_lower_bounds(timestamps: np.ndarray, id_view: memoryview, query: np.ndarray,
                        prefixes: Sequence[bytes], offset: int = 0) -> np.ndarray:
    """Lower bounds in sorted items: the first index whose item is >= each bound (int64, (m,)).

    ``timestamps`` is the sorted uint64 array, ``id_view`` the ids as one flat
    byte view (32 bytes an item); the bounds are given as `bound_keys` gives
    them.  ``offset`` is added to every result.  Ties on a timestamp are
    searched by id only for bounds whose prefix has a nonzero byte.
    """
    lows = np.searchsorted(timestamps, query, side="left").astype(np.int64)
    highs = np.searchsorted(timestamps, query, side="right")
    for k in np.flatnonzero(highs > lows).tolist():
        prefix = prefixes[k]
        if prefix.strip(b"\0"):
            padded = prefix.ljust(ID_SIZE, b"\0")
            lo, hi = int(lows[k]), int(highs[k])
            lows[k] = lo + bisect.bisect_left(
                range(lo, hi), padded, key=lambda i: bytes(id_view[i * ID_SIZE : (i + 1) * ID_SIZE]))
    if offset:
        lows += offset
    return lows
