"""NIP-77 negentropy v1 wire format: varints, bounds, modes, and messages encoded and decoded.

How this works
--------------
A message is a version byte (0x61) followed by ranges.  Every range has an
exclusive upper bound (the lower bound is the previous range's upper bound,
or zero) and a mode:

* Skip: nothing to say about this range.
* Fingerprint: a 16-byte digest of the sender's ids in the range.
* IdList: every id the sender has in the range.

A bound is a timestamp, delta-coded from the previous bound of the same
message as a varint (0 is infinity), then the length and bytes of the
shortest id prefix that separates the items on either side.  Varints are
base-128, most significant digit first.  What a receiver does with each
mode is the reconciler's part (reconciler.py).

Source: NIP-77 and its appendix "Negentropy Protocol V1"
(hoytech/negentropy docs/negentropy-protocol-v1.md).
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import IntEnum
from typing import NamedTuple

import numpy as np

PROTOCOL_VERSION = 0x61
"""Version 1 of the protocol, as its message's first byte (v2 would be 0x62)."""
ID_SIZE = 32
"""Bytes in an item id (a Nostr event id)."""
FINGERPRINT_SIZE = 16
"""Bytes in a range fingerprint."""
INFINITY = 2**64 - 1
"""The reserved "infinity" timestamp; no item may use it."""

_ONE_BYTE = [bytes([n]) for n in range(0x80)]


class NegentropyError(ValueError):
    """Any error raised by the negentropy package: a malformed or unsupported message,
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


# ---------------------------------------------------------------- messages


def version_byte(msg: bytes) -> int:
    """The version byte that starts every message; NegentropyError for an empty one."""
    if not msg:
        raise NegentropyError("parse ends prematurely")
    return msg[0]


class BoundEncoder:
    """Bound encoder; the timestamp delta state spans one whole message."""

    def __init__(self) -> None:
        self.last_timestamp = 0

    def bound(self, out: bytearray, bound: Bound) -> None:
        """Append `bound` to `out`: its timestamp as a delta varint (0 for infinity), prefix length, prefix."""
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
    version = version_byte(msg)
    if version != PROTOCOL_VERSION:
        return version, []
    parsed = parse_ranges(bytes(msg))
    if parsed.error is not None:
        raise parsed.error
    return version, [Range(Bound(*bound), Mode(mode), payload)
                     for bound, mode, payload in zip(parsed.bounds, parsed.modes, parsed.payloads)]


class ParsedRanges(NamedTuple):
    """A message's ranges as columns: (timestamp, id prefix) bound tuples, modes (0-2), payloads."""

    bounds: list[tuple[int, bytes]]
    modes: list[int]
    payloads: list[bytes | list[bytes] | None]
    error: NegentropyError | None


def parse_ranges(data: bytes) -> ParsedRanges:
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
        return ParsedRanges(bounds, modes, payloads, exc)
    return ParsedRanges(bounds, modes, payloads, None)


def encode_message(ranges: Iterable[Range], version: int = PROTOCOL_VERSION) -> bytes:
    """Encode ranges (ascending bounds) into a message; inverse of `decode_message`."""
    out = bytearray([version])
    encoder = BoundEncoder()
    for rng in ranges:
        encoder.bound(out, rng.upper_bound)
        out += encode_varint(rng.mode)
        if rng.mode is Mode.FINGERPRINT:
            out += rng.payload
        elif rng.mode is Mode.ID_LIST:
            out += encode_varint(len(rng.payload))
            out += b"".join(rng.payload)
    return bytes(out)
