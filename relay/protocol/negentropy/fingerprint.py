"""NIP-77 fingerprints and the 256-bit id sums behind them, in numpy.

How this works
--------------
The fingerprint of a set of ids is the first 16 bytes of SHA-256 over their
sum (each id a little-endian 256-bit integer, summed mod 2**256) as 32 bytes,
then the varint of their count.  Sums are kept as eight little-endian 32-bit
limbs: an (n, 8) uint32 array holds n sums, limb sums add up in uint64
without overflow below 2**32 ids, and `limbs_add` / `limbs_sub` carry and
borrow across four 64-bit words.  With running sums (`running_id_sums`) the
fingerprint of any range of a sorted set costs one subtraction and one hash.

Source: NIP-77 appendix "Negentropy Protocol V1", "Fingerprint".
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

import numpy as np

from relay.protocol.negentropy.codec import FINGERPRINT_SIZE, ID_SIZE, NegentropyError, encode_varint, encode_varints

try:  # CPython's own SHA-256: OpenSSL 3's per-object digest fetch costs more than hashing 34 bytes
    from _sha256 import sha256 as _sha256  # Python 3.11
except ImportError:  # pragma: no cover - 3.12 renamed it; other interpreters fall back to hashlib
    try:
        from _sha2 import sha256 as _sha256
    except ImportError:
        _sha256 = hashlib.sha256
_SHA256_DIGEST = type(_sha256()).digest

_MOD256 = (1 << 256) - 1


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
    arr = as_id_array(ids)
    limb_sums = arr.view("<u4").sum(axis=0, dtype=np.uint64)
    return fingerprint_from_sum(combine_limbs(limb_sums.tolist()), len(arr))


def as_id_array(ids: np.ndarray | Iterable[bytes]) -> np.ndarray:
    """Ids as a C-contiguous (n, 32) uint8 array; NegentropyError for ids of the wrong size."""
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


def combine_limbs(limbs: Sequence[int]) -> int:
    """Sum of ``limbs[j] << 32*j`` as a Python int, not reduced mod 2**256 (limb sums may exceed 32 bits)."""
    total = 0
    for j, limb in enumerate(limbs):
        total += limb << (32 * j)
    return total


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
