"""NIP-77 negentropy set reconciliation, protocol version 1, without I/O.

How this works
--------------
Each side holds a set of items ``(timestamp, 32-byte id)`` sorted by timestamp,
then id, and the two find which ids only one of them holds by exchanging
messages of ranges (a bound, a mode, a payload).  The parts, by seam:

* codec.py: varints, bounds, modes, and messages encoded and decoded;
* fingerprint.py: range fingerprints and the 256-bit id sums behind them;
* storage.py: what the reconciler reads (`NegentropyStorage`) and the
  in-memory implementation (`SortedVector`);
* reconciler.py: `Negentropy`, the initiator and responder, byte for byte
  as hoytech's reference implementation.

This package's interface is what it exports here; the SQLite index in
relay/store/negentropy/ implements `NegentropyStorage` with it.  Source:
NIP-77 and its appendix "Negentropy Protocol V1".
"""

from relay.protocol.negentropy.codec import (
    FINGERPRINT_SIZE,
    ID_SIZE,
    INFINITY,
    INFINITY_BOUND,
    PROTOCOL_VERSION,
    ZERO_BOUND,
    Bound,
    Mode,
    NegentropyError,
    Range,
    decode_message,
    decode_varint,
    encode_message,
    encode_varint,
    encode_varints,
)
from relay.protocol.negentropy.fingerprint import (
    combine_limbs,
    fingerprint,
    fingerprint_from_sum,
    limbs_add,
    limbs_sub,
    range_fingerprints,
    running_id_sums,
)
from relay.protocol.negentropy.reconciler import BUCKETS, MIN_FRAME_SIZE_LIMIT, Negentropy
from relay.protocol.negentropy.storage import NegentropyStorage, SortedVector, bound_keys, sorted_lower_bounds

__all__ = [
    "BUCKETS",
    "FINGERPRINT_SIZE",
    "ID_SIZE",
    "INFINITY",
    "INFINITY_BOUND",
    "MIN_FRAME_SIZE_LIMIT",
    "PROTOCOL_VERSION",
    "ZERO_BOUND",
    "Bound",
    "Mode",
    "Negentropy",
    "NegentropyError",
    "NegentropyStorage",
    "Range",
    "SortedVector",
    "bound_keys",
    "combine_limbs",
    "decode_message",
    "decode_varint",
    "encode_message",
    "encode_varint",
    "encode_varints",
    "fingerprint",
    "fingerprint_from_sum",
    "limbs_add",
    "limbs_sub",
    "range_fingerprints",
    "running_id_sums",
    "sorted_lower_bounds",
]
