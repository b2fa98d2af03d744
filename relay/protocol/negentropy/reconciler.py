"""The NIP-77 negentropy v1 reconciler (`Negentropy`) over a `NegentropyStorage`.

How this works
--------------
Each side holds a set of items ``(timestamp, 32-byte id)`` sorted by timestamp,
then id.  The initiator (the client) sends one message covering the whole
timestamp/id space; the responder (the relay) answers; and so on until the
initiator has nothing left to send.  For each range of a message received:

* Skip: nothing to do.
* Fingerprint: if our own digest of the range differs, split our items in
  the range into 16 buckets and send a fingerprint for each, or, below 32
  items, the ids.
* IdList: the initiator compares it with its own ids (have = only ours,
  need = only theirs); the responder answers with its own id list for the
  range.

A frame size limit caps each message: when the next range would overflow it,
the sender stops and ends the message with one Fingerprint range up to
infinity, so the peer splits what was left next round.  All of this follows
hoytech's reference implementation (cpp/negentropy.h) byte for byte.

Source: NIP-77 and its appendix "Negentropy Protocol V1"
(hoytech/negentropy docs/negentropy-protocol-v1.md).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from relay.protocol.negentropy.codec import (
    FINGERPRINT_SIZE,
    ID_SIZE,
    INFINITY_BOUND,
    PROTOCOL_VERSION,
    ZERO_BOUND,
    Bound,
    BoundEncoder,
    Mode,
    NegentropyError,
    encode_varint,
    encode_varints,
    parse_ranges,
    version_byte,
)
from relay.protocol.negentropy.fingerprint import range_fingerprints
from relay.protocol.negentropy.storage import NegentropyStorage

BUCKETS = 16
"""A mismatched range is split into this many buckets (reference value)."""
MIN_FRAME_SIZE_LIMIT = 4096
"""Smallest nonzero frame size limit the reference accepts, in bytes."""

_FRAME_MARGIN = 200  # the reference stops filling a frame 200 bytes early
_FINGERPRINT_MODE = bytes([1])  # Mode.FINGERPRINT as a varint


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
        _Splits(self.storage, [(0, size)]).write(0, size, INFINITY_BOUND, out, BoundEncoder())
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
        version = version_byte(msg)
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

    def write(self, lower: int, upper: int, upper_bound: Bound, out: bytearray, enc: BoundEncoder) -> None:
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
        self.enc = BoundEncoder()
        self.out = bytearray([PROTOCOL_VERSION])
        self.size = neg.storage.size()
        self.skip = False

    def run(self) -> bytes:
        bounds, modes, payloads, error = parse_ranges(self.msg)
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
