"""NIP-77 negentropy set reconciliation, protocol version 1, without I/O.

How this works
--------------
Each side holds a set of items ``(timestamp, 32-byte id)`` sorted by timestamp,
then id.  The initiator (the client) sends one message covering the whole
timestamp/id space; the responder (the relay) answers; and so on until the
initiator has nothing left to send.  A message is a version byte (0x61)
followed by ranges.  Every range has an exclusive upper bound (the lower bound
is the previous range's upper bound, or zero) and a mode:

* Skip: nothing to say about this range.
* Fingerprint: a 16-byte digest of the sender's ids in the range.  If the
  receiver's own digest differs it splits its items in the range into 16
  buckets and sends a fingerprint for each, or, below 32 items, the ids.
* IdList: every id the sender has in the range.  The initiator compares it
  with its own ids (have = only ours, need = only theirs); the responder
  answers with its own id list for the range.

A frame size limit caps each message: when the next range would overflow it,
the sender stops and ends the message with one Fingerprint range up to
infinity, so the peer splits what was left next round.  All of this follows
hoytech's reference implementation (cpp/negentropy.h) byte for byte.

Storage is abstract (`NegentropyStorage`): the reconciler only asks for sizes,
items by index, lower-bound searches and range fingerprints, so an index kept
in SQLite with per-bucket sums can serve it.  `SortedVector` is the in-memory
implementation, with numpy arrays and prefix sums for O(1) fingerprints.

Source: NIP-77 and its appendix "Negentropy Protocol V1"
(hoytech/negentropy docs/negentropy-protocol-v1.md).
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Iterable, Sequence
from enum import IntEnum
from typing import NamedTuple, Protocol, runtime_checkable

import numpy as np

try:  # CPython's own SHA-256: OpenSSL 3's per-object digest fetch costs more than hashing 34 bytes
    from _sha256 import sha256 as _sha256  # Python 3.11
except ImportError:  # pragma: no cover - 3.12 renamed it; other interpreters fall back to hashlib
    try:
        from _sha2 import sha256 as _sha256
    except ImportError:
        _sha256 = hashlib.sha256
_SHA256_DIGEST = type(_sha256()).digest

__all__ = [
    "BUCKETS",
    "FINGERPRINT_SIZE",
    "ID_SIZE",
    "INFINITY",
    "MIN_FRAME_SIZE_LIMIT",
    "PROTOCOL_VERSION",
    "Bound",
    "Mode",
    "Negentropy",
    "NegentropyError",
    "NegentropyStorage",
    "Range",
    "SortedVector",
    "decode_message",
    "decode_varint",
    "encode_message",
    "encode_varint",
    "fingerprint",
    "fingerprint_from_sum",
]

PROTOCOL_VERSION = 0x61
"""Version 1 of the protocol, as its message's first byte (v2 would be 0x62)."""
ID_SIZE = 32
"""Bytes in an item id (a Nostr event id)."""
FINGERPRINT_SIZE = 16
"""Bytes in a range fingerprint."""
INFINITY = 2**64 - 1
"""The reserved "infinity" timestamp; no item may use it."""
BUCKETS = 16
"""A mismatched range is split into this many buckets (reference value)."""
MIN_FRAME_SIZE_LIMIT = 4096
"""Smallest nonzero frame size limit the reference accepts, in bytes."""

_FRAME_MARGIN = 200  # the reference stops filling a frame 200 bytes early
_MOD256 = (1 << 256) - 1
_ONE_BYTE = [bytes([n]) for n in range(0x80)]
_FINGERPRINT_MODE = bytes([1])  # Mode.FINGERPRINT as a varint


class NegentropyError(ValueError):
    """Any error raised by this module: a malformed or unsupported message,
    a bad item, or a call out of order.  The message says which."""


class Mode(IntEnum):
    """Range modes (NIP-77 appendix, "Range")."""

    SKIP = 0
    FINGERPRINT = 1
    ID_LIST = 2


class Bound(NamedTuple):
    """An exclusive range upper bound (NIP-77 appendix, "Bound").

    ``timestamp`` is an int in [0, 2**64 - 1] (``INFINITY`` is the top);
    ``id_prefix`` is 0 to 32 bytes, implicitly padded with zero bytes.
    """

    timestamp: int
    id_prefix: bytes = b""


ZERO_BOUND = Bound(0)
INFINITY_BOUND = Bound(INFINITY)


class Range(NamedTuple):
    """One decoded range of a message.

    ``payload`` is the 16-byte fingerprint for Fingerprint, the list of
    32-byte ids for IdList, and None for Skip.
    """

    upper_bound: Bound
    mode: Mode
    payload: bytes | list[bytes] | None = None


# ---------------------------------------------------------------- varints


def encode_varint(n: int) -> bytes:
    """Encode an unsigned int as a negentropy varint (NIP-77 appendix, "Varint").

    Base-128 digits, most significant first, high bit set on every byte but
    the last.  Raises NegentropyError for negative numbers.
    """
    if 0 <= n < 0x80:
        return _ONE_BYTE[n]
    if n < 0:
        raise NegentropyError(f"cannot encode negative varint {n}")
    if n < 0x4000:  # two digits: most timestamp deltas and bucket sizes
        return bytes((0x80 | (n >> 7), n & 0x7F))
    out = [n & 0x7F]
    n >>= 7
    while n:
        out.append(0x80 | (n & 0x7F))
        n >>= 7
    return bytes(reversed(out))


def decode_varint(buf: bytes, pos: int = 0) -> tuple[int, int]:
    """Decode a varint at ``buf[pos:]``; return ``(value, next_pos)``.

    Raises NegentropyError if the buffer ends inside the varint or the value
    does not fit in 64 bits.
    """
    value = 0
    while True:
        if pos >= len(buf):
            raise NegentropyError("premature end of varint")
        byte = buf[pos]
        pos += 1
        value = (value << 7) | (byte & 0x7F)
        if value > INFINITY:
            raise NegentropyError("varint does not fit in 64 bits")
        if not byte & 0x80:
            return value, pos


# ---------------------------------------------------------------- fingerprints


def fingerprint_from_sum(id_sum: int, count: int) -> bytes:
    """Fingerprint from a precomputed id sum (NIP-77 appendix, "Fingerprint").

    ``id_sum`` is the sum of the ids as little-endian 256-bit ints (reduced
    mod 2**256 here); ``count`` the number of ids.  Returns the first 16 bytes
    of SHA-256(sum as 32 little-endian bytes + varint(count)).
    """
    data = (id_sum & _MOD256).to_bytes(ID_SIZE, "little") + encode_varint(count)
    return hashlib.sha256(data).digest()[:FINGERPRINT_SIZE]


def fingerprint(ids: np.ndarray | Iterable[bytes]) -> bytes:
    """Fingerprint of a collection of 32-byte ids; 16 bytes.

    ``ids`` is a uint8 array of shape (n, 32) or an iterable of 32-byte
    bytes.  The sum is vectorized: each id is eight little-endian 32-bit
    limbs, summed per limb in uint64 (exact below 2**32 ids), then combined.
    Raises NegentropyError for ids of the wrong size.
    """
    arr = _as_id_array(ids)
    limb_sums = arr.view("<u4").sum(axis=0, dtype=np.uint64)
    return fingerprint_from_sum(_combine_limbs(limb_sums), len(arr))


def _as_id_array(ids: np.ndarray | Iterable[bytes]) -> np.ndarray:
    if isinstance(ids, np.ndarray):
        arr = np.ascontiguousarray(ids, dtype=np.uint8)
        if arr.ndim != 2 or arr.shape[1] != ID_SIZE:
            if arr.size == 0:
                return np.zeros((0, ID_SIZE), np.uint8)
            raise NegentropyError(f"id array must have shape (n, 32), not {arr.shape}")
        return arr
    id_list = list(ids)
    if any(len(id_) != ID_SIZE for id_ in id_list):
        raise NegentropyError("ids must be 32 bytes each")
    return np.frombuffer(b"".join(id_list), np.uint8).reshape(-1, ID_SIZE)


def _combine_limbs(limbs: np.ndarray) -> int:
    """Sum of ``limbs[j] << 32*j`` as a Python int."""
    total = 0
    for j, limb in enumerate(limbs.tolist()):
        total += limb << (32 * j)
    return total


# ---------------------------------------------------------------- storage


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
        arr = _as_id_array(ids)
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
        id_parts = [*self._pending_ids, _as_id_array(self._one_ids)]
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


def range_fingerprints(lower: np.ndarray, upper: np.ndarray, counts: Sequence[int]) -> np.ndarray:
    """Fingerprints of ranges from their prefix sums (NIP-77 appendix, "Fingerprint").

    ``lower`` and ``upper`` are (m, 8) uint32 limb arrays (sums of the ids
    before each range's start and end, mod 2**256), ``counts`` the ranges'
    sizes.  Returns the m 16-byte fingerprints as an (m, 16) uint8 array.
    """
    sums = limbs_sub(upper, lower).view(np.uint8).reshape(-1, ID_SIZE)
    varints, used = encode_varints(np.asarray(counts, dtype=np.uint64))
    widths = used.sum(axis=1)
    found = np.unique(widths).tolist()
    if len(found) == 1:  # the usual case: similar range sizes
        return _sha256_rows(np.concatenate([sums, varints[:, : found[0]]], axis=1))
    digests = np.empty((len(sums), FINGERPRINT_SIZE), dtype=np.uint8)
    for width in found:
        rows = np.flatnonzero(widths == width)
        digests[rows] = _sha256_rows(np.concatenate([sums[rows], varints[rows, :width]], axis=1))
    return digests


def _sha256_rows(inputs: np.ndarray) -> np.ndarray:
    """The first 16 bytes of the SHA-256 of each row of an (m, w) uint8 array: (m, 16) uint8.

    Each row becomes one bytes object through a void view, and the hashing
    runs in `map`: no Python frame per hash.
    """
    rows = np.ascontiguousarray(inputs).view(f"V{inputs.shape[1]}").ravel().tolist()
    digests = b"".join(map(_SHA256_DIGEST, map(_sha256, rows)))
    return np.frombuffer(digests, dtype=np.uint8).reshape(-1, 32)[:, :FINGERPRINT_SIZE]


def limbs_sub(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(a - b) mod 2**256 for (m, 8) little-endian uint32 limb arrays; returns (m, 8) uint32."""
    x, y = _words(a), _words(b)
    out = np.empty_like(x)
    borrow = np.zeros(len(x), dtype=bool)
    for j in range(4):  # 64-bit words: two limbs each, little-endian
        out[:, j] = x[:, j] - y[:, j] - borrow
        borrow = (x[:, j] < y[:, j]) | ((x[:, j] == y[:, j]) & borrow)
    return out.view("<u4")


def limbs_add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(a + b) mod 2**256 for (m, 8) little-endian uint32 limb arrays; returns (m, 8) uint32."""
    x, y = _words(a), _words(b)
    out = np.empty_like(x)
    carry = np.zeros(len(x), dtype=bool)
    for j in range(4):
        out[:, j] = x[:, j] + y[:, j] + carry
        carry = (out[:, j] < x[:, j]) | ((out[:, j] == x[:, j]) & carry)
    return out.view("<u4")


def _words(limbs: np.ndarray) -> np.ndarray:
    """(m, 8) uint32 limbs as (m, 4) little-endian uint64 words (a view when contiguous)."""
    return np.ascontiguousarray(limbs, dtype="<u4").view("<u8")


def minimal_bound_lengths(before: tuple[np.ndarray, np.ndarray], at: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """Id prefix lengths of the shortest bounds > each item of ``before`` and <= the matching item of ``at``.

    Both are (timestamps (m,) uint64, ids (m, 32) uint8) as `items_at` returns,
    for adjacent items; the bound is (``at``'s timestamp, that many bytes of
    its id): 0 where the timestamps differ.  Returns (m,) int64.
    """
    ts_before, ids_before = before
    ts_at, ids_at = at
    lengths = np.zeros(len(ts_at), dtype=np.int64)
    tied = np.flatnonzero(ts_before == ts_at)
    if len(tied):
        lengths[tied] = np.argmax(ids_before[tied] != ids_at[tied], axis=1) + 1
    return lengths


def encode_varints(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Varints (as `encode_varint`) of uint64 values, in bulk: a (n, w) uint8 matrix, each left-aligned,
    and the (n, w) mask of the bytes that belong to it; w (1 to 10) is the widest varint's length."""
    values = values.astype(np.uint64)
    top = int(values.max()) if len(values) else 0
    width = max(1, -(-top.bit_length() // 7))
    digits = np.ones(len(values), dtype=np.int64)
    for k in range(1, width):
        digits += (values >> np.uint64(7 * k)) > 0
    position = np.arange(width)[None, :]
    last = digits[:, None] - 1
    shifts = (np.maximum(last - position, 0) * 7).astype(np.uint64)
    out = ((values[:, None] >> shifts) & np.uint64(0x7F)).astype(np.uint8)
    out[position < last] |= 0x80
    return out, position <= last


def running_id_sums(ids: np.ndarray) -> np.ndarray:
    """Running sums of the ids mod 2**256: shape (n + 1, 8) little-endian uint32.

    Row k is the sum of the first k ids.  Each limb's cumulative sum stays
    exact in uint64 below 2**32 items (one contiguous column at a time); the
    carries are then folded upward in place.
    """
    n = len(ids)
    limbs = ids.view("<u4")
    sums = np.zeros((8, n + 1), dtype=np.uint64)
    for j in range(8):
        np.cumsum(limbs[:, j], dtype=np.uint64, out=sums[j, 1:])
    carry = np.empty(n + 1, dtype=np.uint64)
    for j in range(7):
        np.right_shift(sums[j], np.uint64(32), out=carry)
        sums[j + 1] += carry
    return sums.astype("<u4").T.copy()  # the cast keeps each limb's low 32 bits


# ---------------------------------------------------------------- wire format


def _version(msg: bytes) -> int:
    """The version byte that starts every message; NegentropyError for an empty one."""
    if not msg:
        raise NegentropyError("parse ends prematurely")
    return msg[0]


class _Encoder:
    """Bound encoder; the timestamp delta state spans one whole message."""

    def __init__(self) -> None:
        self.last_timestamp = 0

    def bound(self, out: bytearray, bound: Bound) -> None:
        timestamp, prefix = bound
        if timestamp == INFINITY:
            self.last_timestamp = INFINITY
            out += b"\x00"
        else:
            delta = timestamp - self.last_timestamp
            if delta < 0:
                raise NegentropyError("internal error: bounds out of order")
            self.last_timestamp = timestamp
            out += _ONE_BYTE[delta + 1] if delta < 0x7F else encode_varint(delta + 1)
        out += _ONE_BYTE[len(prefix)]  # at most 32
        out += prefix


def decode_message(msg: bytes) -> tuple[int, list[Range]]:
    """Parse a message into ``(version_byte, ranges)`` without reconciling.

    Only version 0x61 bodies are parsed; for any other version byte the
    range list is empty.  Raises NegentropyError if the message is malformed.
    """
    version = _version(msg)
    if version != PROTOCOL_VERSION:
        return version, []
    parsed = _parse_ranges(bytes(msg))
    if parsed.error is not None:
        raise parsed.error
    return version, [Range(Bound(*bound), Mode(mode), payload)
                     for bound, mode, payload in zip(parsed.bounds, parsed.modes, parsed.payloads)]


class _Parsed(NamedTuple):
    """A message's ranges as columns: (timestamp, id prefix) bound tuples, modes (0-2), payloads."""

    bounds: list[tuple[int, bytes]]
    modes: list[int]
    payloads: list[bytes | list[bytes] | None]
    error: NegentropyError | None


def _parse_ranges(data: bytes) -> _Parsed:
    """The ranges of the message `data` (its version byte first) up to its end, or up to a malformed
    one: then also its error.

    A reconciler reports the error only if it gets that far: a frame that
    fills up first ends the reply without reading the rest, as the reference.
    This loop runs once per range of every message: the common one- and
    two-byte varints are decoded inline, and the ranges come out as plain
    tuples in columns (a named tuple costs a call each).
    """
    pos, last = 1, 0  # past the version byte; bounds are delta-coded from timestamp 0
    end = len(data)
    bounds: list[tuple[int, bytes]] = []
    modes: list[int] = []
    payloads: list[bytes | list[bytes] | None] = []
    add_bound, add_mode, add_payload = bounds.append, modes.append, payloads.append
    try:
        while pos < end:
            if data[pos] < 0x80:
                encoded = data[pos]
                pos += 1
            elif pos + 1 < end and data[pos + 1] < 0x80:  # two digits: most timestamp deltas
                encoded = ((data[pos] & 0x7F) << 7) | data[pos + 1]
                pos += 2
            else:
                encoded, pos = decode_varint(data, pos)
            if encoded == 0 or last == INFINITY:
                last = INFINITY
            else:
                last += encoded - 1
                if last > INFINITY:
                    last = INFINITY
            if pos < end and data[pos] < 0x80:
                length = data[pos]
                pos += 1
            else:
                length, pos = decode_varint(data, pos)
            if length > ID_SIZE:
                raise NegentropyError(f"bound key too long ({length} bytes)")
            if end - pos < length:
                raise NegentropyError("parse ends prematurely")
            bound = (last, data[pos : pos + length])
            pos += length
            if pos < end and data[pos] < 0x80:
                mode = data[pos]
                pos += 1
            else:
                mode, pos = decode_varint(data, pos)
            if mode == 1:
                if end - pos < FINGERPRINT_SIZE:
                    raise NegentropyError("parse ends prematurely")
                add_payload(data[pos : pos + FINGERPRINT_SIZE])
                pos += FINGERPRINT_SIZE
            elif mode == 2:
                count, pos = decode_varint(data, pos)
                if count * ID_SIZE > end - pos:
                    raise NegentropyError("parse ends prematurely (id list)")
                add_payload([data[k : k + ID_SIZE] for k in range(pos, pos + count * ID_SIZE, ID_SIZE)])
                pos += count * ID_SIZE
            elif mode == 0:
                add_payload(None)
            else:
                raise NegentropyError(f"unexpected mode {mode}")
            add_bound(bound)
            add_mode(mode)
    except NegentropyError as exc:
        return _Parsed(bounds, modes, payloads, exc)
    return _Parsed(bounds, modes, payloads, None)


def encode_message(ranges: Iterable[Range], version: int = PROTOCOL_VERSION) -> bytes:
    """Encode ranges (ascending bounds) into a message; inverse of `decode_message`."""
    out = bytearray([version])
    encoder = _Encoder()
    for rng in ranges:
        encoder.bound(out, rng.upper_bound)
        out += encode_varint(rng.mode)
        if rng.mode is Mode.FINGERPRINT:
            out += rng.payload
        elif rng.mode is Mode.ID_LIST:
            out += encode_varint(len(rng.payload))
            out += b"".join(rng.payload)
    return bytes(out)


# ---------------------------------------------------------------- reconciler


class Negentropy:
    """The negentropy v1 reconciler over one `NegentropyStorage`.

    ``frame_size_limit`` is the maximum message size in bytes, 0 for none;
    nonzero values below 4096 raise NegentropyError (as in the reference).
    The initiator calls `initiate` once, then `reconcile_with_ids` on each
    reply until it returns None as the next message.  The responder calls
    `reconcile` on each message it receives.  One instance serves one
    reconciliation.
    """

    def __init__(self, storage: NegentropyStorage, frame_size_limit: int = 0) -> None:
        if frame_size_limit < 0 or 0 < frame_size_limit < MIN_FRAME_SIZE_LIMIT:
            raise NegentropyError(f"frame_size_limit too small: {frame_size_limit}")
        self.storage = storage
        self.frame_size_limit = frame_size_limit
        self.is_initiator = False

    def initiate(self) -> bytes:
        """Initiator: the first message (covers everything up to infinity).

        Raises NegentropyError if called twice.
        """
        if self.is_initiator:
            raise NegentropyError("already initiated")
        self.is_initiator = True
        out = bytearray([PROTOCOL_VERSION])
        size = self.storage.size()
        _Splits(self.storage, [(0, size)]).write(0, size, INFINITY_BOUND, out, _Encoder())
        return bytes(out)

    def reconcile(self, msg: bytes) -> bytes:
        """Responder: answer one message from the initiator.

        Returns the reply (always at least the version byte).  A version byte
        in 0x60-0x6f other than 0x61 gets the reply b"\\x61" (our highest
        version).  Raises NegentropyError for a malformed message, a version
        byte outside 0x60-0x6f, or when called on an initiator.
        """
        if self.is_initiator:
            raise NegentropyError("initiator must call reconcile_with_ids")
        return self._reconcile(msg, [], [])

    def reconcile_with_ids(self, msg: bytes) -> tuple[bytes | None, list[bytes], list[bytes]]:
        """Initiator: process a reply; return ``(next_msg, have_ids, need_ids)``.

        ``next_msg`` is None when reconciliation is complete.  ``have_ids`` are
        32-byte ids only we hold (in storage order), ``need_ids`` ids only the
        peer holds (in message order), found in this round.  With a frame
        limit an id can be reported again in a later round, as the reference
        does (a frame that fills up drops the pending Skip, so settled ranges
        are reconciled again): treat the results as sets.  Raises
        NegentropyError for a malformed or unsupported reply, or before
        `initiate`.
        """
        if not self.is_initiator:
            raise NegentropyError("reconcile_with_ids needs initiate() first")
        have: list[bytes] = []
        need: list[bytes] = []
        out = self._reconcile(msg, have, need)
        return (None if len(out) == 1 else out), have, need

    def _reconcile(self, msg: bytes, have: list[bytes], need: list[bytes]) -> bytes:
        version = _version(msg)
        if not 0x60 <= version <= 0x6F:
            raise NegentropyError(f"invalid negentropy protocol version byte 0x{version:02x}")
        if version != PROTOCOL_VERSION:
            if self.is_initiator:
                raise NegentropyError(f"unsupported negentropy protocol version {version - 0x60}")
            return bytes([PROTOCOL_VERSION])
        return _Round(self, bytes(msg), have, need).run()

    def _exceeds_frame(self, size: int) -> bool:
        return bool(self.frame_size_limit) and size > self.frame_size_limit - _FRAME_MARGIN


class _Splits:
    """The 16-bucket splits of many ranges, their fingerprints and bounds computed in bulk.

    A mismatched range of n >= 32 items is described by 16 fingerprints over
    consecutive buckets (the first n mod 16 one item larger) separated by
    minimal bounds; below 32 items by its ids (reference: splitRange).
    """

    def __init__(self, storage: NegentropyStorage, ranges: Sequence[tuple[int, int]]) -> None:
        self.storage = storage
        self._splits: dict[tuple[int, int], tuple[tuple[int, bytes], bytes, int, bytes]] = {}
        big = [(lo, hi) for lo, hi in ranges if hi - lo >= 2 * BUCKETS]
        if not big:
            return
        lows = np.array([lo for lo, _ in big], dtype=np.int64)
        per_bucket, with_extra = np.divmod(np.array([hi - lo for lo, hi in big], dtype=np.int64), BUCKETS)
        sizes = per_bucket[:, None] + (np.arange(BUCKETS)[None, :] < with_extra[:, None])
        edges = np.concatenate([lows[:, None], lows[:, None] + np.cumsum(sizes, axis=1)], axis=1)
        prefixes = storage.prefix_sums(edges.ravel()).reshape(len(big), BUCKETS + 1, 8)
        digests = range_fingerprints(prefixes[:, :-1].reshape(-1, 8), prefixes[:, 1:].reshape(-1, 8),
                                     sizes.ravel().tolist())
        inner = edges[:, 1:BUCKETS].ravel()
        ts, ids = storage.items_at(np.concatenate([inner - 1, inner]))
        m = len(inner)
        lengths = minimal_bound_lengths((ts[:m], ids[:m]), (ts[m:], ids[m:])).reshape(len(big), BUCKETS - 1)
        ts_at, ids_at = ts[m:].reshape(len(big), BUCKETS - 1), ids[m:].reshape(len(big), BUCKETS - 1, ID_SIZE)
        middles = _encode_middles(ts_at, ids_at, lengths, digests)
        first_ids = ids_at[:, 0].tobytes()
        last_digests = np.ascontiguousarray(digests[BUCKETS - 1 :: BUCKETS]).view(f"V{FINGERPRINT_SIZE}").ravel()
        for s, (key, first_ts, first_length, middle, last_ts, last_digest) in enumerate(zip(
                big, ts_at[:, 0].tolist(), lengths[:, 0].tolist(), middles, ts_at[:, -1].tolist(),
                last_digests.tolist())):
            first = (first_ts, first_ids[s * ID_SIZE : s * ID_SIZE + first_length])
            self._splits[key] = (first, middle, last_ts, last_digest)

    def write(self, lower: int, upper: int, upper_bound: Bound, out: bytearray, enc: _Encoder) -> None:
        """Append the description of our items in [lower, upper), ending at ``upper_bound``."""
        found = self._splits.get((lower, upper))
        if found is None:
            enc.bound(out, upper_bound)
            out += encode_varint(Mode.ID_LIST) + encode_varint(upper - lower)
            out += self.storage.id_bytes(lower, upper)
            return
        first, middle, last_timestamp, last_digest = found
        enc.bound(out, first)
        out += middle
        enc.last_timestamp = last_timestamp  # the bounds in `middle` are delta-coded from `first` on
        enc.bound(out, upper_bound)
        out += _FINGERPRINT_MODE
        out += last_digest


def _encode_middles(timestamps: np.ndarray, ids: np.ndarray, lengths: np.ndarray, digests: np.ndarray) -> list[bytes]:
    """Each split's ranges from its first fingerprint to its last bound but one, encoded in bulk.

    ``timestamps`` (s, 15), ``ids`` (s, 15, 32) and ``lengths`` (s, 15) give
    the 15 inner bounds of s splits, ``digests`` (16 * s, 16) their 16 fingerprints each.
    Split k's bytes are: Fingerprint mode and digest 0, then for j = 1..14
    bound j (timestamp delta from bound j - 1, prefix length, prefix), mode
    and digest j.  One byte matrix with a mask of what each cell holds, read
    out in row order, replaces some 30 small appends per split.
    """
    splits, inner = timestamps.shape
    varints, varint_used = encode_varints((timestamps[:, 1:] - timestamps[:, :-1] + np.uint64(1)).ravel())
    longest = int(lengths[:, 1:].max()) if splits else 0
    # a cell: timestamp delta, prefix length, prefix, mode, digest; as narrow as this batch allows
    at_length = varints.shape[1]
    at_prefix = at_length + 1
    at_mode = at_prefix + longest
    at_digest = at_mode + 1
    cells = np.zeros((splits, inner, at_digest + FINGERPRINT_SIZE), dtype=np.uint8)
    used = np.zeros(cells.shape, dtype=bool)
    cells[:, 1:, :at_length] = varints.reshape(splits, inner - 1, at_length)
    used[:, 1:, :at_length] = varint_used.reshape(splits, inner - 1, at_length)
    cells[:, 1:, at_length] = lengths[:, 1:]
    used[:, 1:, at_length] = True
    cells[:, 1:, at_prefix:at_mode] = ids[:, 1:, :longest]
    used[:, 1:, at_prefix:at_mode] = np.arange(longest)[None, None, :] < lengths[:, 1:, None]
    cells[:, :, at_mode] = Mode.FINGERPRINT
    used[:, :, at_mode] = True
    cells[:, :, at_digest:] = digests.reshape(splits, BUCKETS, FINGERPRINT_SIZE)[:, :inner]
    used[:, :, at_digest:] = True
    flat = cells[used].tobytes()
    ends = np.cumsum(used.reshape(splits, -1).sum(axis=1)).tolist()
    return [flat[start:end] for start, end in zip([0, *ends[:-1]], ends)]


class _Round:
    """Processing of one incoming message (reference: reconcileAux).

    The storage work is done in bulk first: every range's upper index, our
    fingerprint of every Fingerprint range, and the splits of the mismatched
    ones; then the reply is written range by range, as the reference does.
    """

    def __init__(self, neg: Negentropy, msg: bytes, have: list[bytes], need: list[bytes]) -> None:
        self.neg = neg
        self.storage = neg.storage
        self.msg = msg
        self.have = have
        self.need = need
        self.enc = _Encoder()
        self.out = bytearray([PROTOCOL_VERSION])
        self.size = neg.storage.size()
        self.skip = False

    def run(self) -> bytes:
        bounds, modes, payloads, error = _parse_ranges(self.msg)
        uppers = np.maximum.accumulate(self.storage.lower_bounds(bounds)).tolist() if bounds else []
        lowers = [0, *uppers[:-1]]
        mismatched = self._mismatched(modes, payloads, lowers, uppers)
        splits = _Splits(self.storage, [(lowers[k], uppers[k]) for k in mismatched])
        skip_mode, fingerprint_mode = Mode.SKIP, Mode.FINGERPRINT  # Enum attribute lookups are slow in a loop
        for k, mode in enumerate(modes):
            if mode == skip_mode or (mode == fingerprint_mode and k not in mismatched):
                self.skip = True  # nothing written: the frame cannot fill here
                continue
            lower, upper = lowers[k], uppers[k]
            pending = bytearray()
            previous = bounds[k - 1] if k else ZERO_BOUND
            if mode == fingerprint_mode:
                self._flush_skip(pending, previous)
                splits.write(lower, upper, bounds[k], pending, self.enc)
            else:
                upper = self._id_list(lower, upper, bounds[k], payloads[k], pending, previous)
            if self.neg._exceeds_frame(len(self.out) + len(pending)):
                self._finish_with_fingerprint(upper)
                return bytes(self.out)
            self.out += pending
        if error is not None:
            raise error
        return bytes(self.out)

    def _mismatched(self, modes: list[int], payloads: list, lowers: list[int], uppers: list[int]) -> set[int]:
        """Positions of the Fingerprint ranges whose fingerprint differs from ours."""
        fp = [k for k, mode in enumerate(modes) if mode == 1]  # Mode.FINGERPRINT
        if not fp:
            return set()
        prefixes = self.storage.prefix_sums(np.array([lowers[k] for k in fp] + [uppers[k] for k in fp]))
        ours = range_fingerprints(prefixes[: len(fp)], prefixes[len(fp):], [uppers[k] - lowers[k] for k in fp])
        theirs = np.frombuffer(b"".join([payloads[k] for k in fp]), dtype=np.uint8).reshape(-1, FINGERPRINT_SIZE)
        return set(np.asarray(fp)[(ours != theirs).any(axis=1)].tolist())

    def _flush_skip(self, pending: bytearray, prev_bound: Bound) -> None:
        if self.skip:
            self.skip = False
            self.enc.bound(pending, prev_bound)
            pending += encode_varint(Mode.SKIP)

    def _id_list(self, lower: int, upper: int, bound: Bound, their_ids: list[bytes], pending: bytearray,
                 prev_bound: Bound) -> int:
        """Handle an IdList range ending at `bound`; return the (possibly shrunk) upper index."""
        if self.neg.is_initiator:
            self._diff_ids(lower, upper, their_ids)
            self.skip = True
            return upper
        self._flush_skip(pending, prev_bound)
        upper = self._answer_id_list(lower, upper, bound, pending)
        self.out += pending
        del pending[:]
        return upper

    def _diff_ids(self, lower: int, upper: int, their_ids: list[bytes]) -> None:
        remaining = dict.fromkeys(their_ids)
        ours = self.storage.id_bytes(lower, upper)
        for id_ in (ours[k : k + ID_SIZE] for k in range(0, len(ours), ID_SIZE)):
            if id_ in remaining:
                del remaining[id_]
            else:
                self.have.append(id_)
        self.need.extend(remaining)

    def _answer_id_list(self, lower: int, upper: int, bound: Bound, pending: bytearray) -> int:
        """Responder: send our ids in [lower, upper), cut short if the frame fills."""
        count = self._ids_that_fit(upper - lower)
        end_bound = bound
        if count < upper - lower:
            upper = lower + count
            end_bound = Bound(*self.storage.get_item(upper))
        self.enc.bound(pending, end_bound)
        pending += encode_varint(Mode.ID_LIST) + encode_varint(count)
        pending += self.storage.id_bytes(lower, upper)
        return upper

    def _ids_that_fit(self, available: int) -> int:
        """Ids the reference adds before its frame check trips (checked before each id)."""
        limit = self.neg.frame_size_limit
        if not limit:
            return available
        budget = limit - _FRAME_MARGIN - len(self.out)
        return 0 if budget < 0 else min(available, budget // ID_SIZE + 1)

    def _finish_with_fingerprint(self, upper: int) -> None:
        """Frame full: one Fingerprint range to infinity for our items from ``upper``."""
        self.enc.bound(self.out, INFINITY_BOUND)
        self.out += encode_varint(Mode.FINGERPRINT)
        self.out += self.storage.fingerprint(upper, self.size)
