"""Fuzz the NIP-77 engine as responder and as initiator: only `NegentropyError` may come out.

The responder runs over an in-memory `SortedVector` and over the SQLite
negentropy index (`IndexView`, what the relay answers NEG-OPEN `{}` from);
messages are random bytes, and valid messages from a peer with an
overlapping set, mutated (bytes flipped, cut, inserted, huge varints).
"""

from __future__ import annotations

import random
from functools import cache

import pytest
from hypothesis import given
from hypothesis import strategies as st

from relay.protocol.negentropy import Negentropy, NegentropyError, SortedVector
from relay.store.negentropy import IndexReader, IndexView, window_segments
from tests.hostile.fuzzing import examples
from tests.store.test_negentropy_index import open_index, write

T0 = 1_700_000_000


@cache
def _items() -> tuple[tuple[int, bytes], ...]:
    rng = random.Random(77)
    # Few distinct timestamps: many ties, so bounds need id prefixes.
    return tuple(sorted({(T0 + rng.randrange(40), rng.randbytes(32)) for _ in range(300)}))


@cache
def _vector() -> SortedVector:
    """`_items()` sealed in a SortedVector (read-only once sealed, so shared by examples)."""
    return SortedVector.from_items(_items())


@cache
def _peer_messages() -> tuple[bytes, ...]:
    """Valid messages of a whole exchange between a peer holding half our items (plus its own) and us."""
    rng = random.Random(78)
    peer_items = [it for it in _items() if rng.random() < 0.5] + [(T0 + 5, rng.randbytes(32)) for _ in range(20)]
    peer = Negentropy(SortedVector.from_items(peer_items), 4096)
    ours = Negentropy(_vector(), 4096)
    messages, message = [], peer.initiate()
    while message is not None:
        reply = ours.reconcile(message)
        messages += [message, reply]
        message = peer.reconcile_with_ids(reply)[0]
    return tuple(messages)


@st.composite
def _mutated(draw) -> bytes:
    data = bytearray(draw(st.sampled_from(_peer_messages())))
    for _ in range(draw(st.integers(1, 4))):
        pos = draw(st.integers(0, len(data)))
        action = draw(st.sampled_from(["flip", "cut", "insert", "varint", "drop"]))
        if action == "flip" and pos < len(data):
            data[pos] ^= 1 << draw(st.integers(0, 7))
        elif action == "cut":
            del data[pos:]
        elif action == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=8))
        elif action == "varint":
            data[pos:pos] = b"\xff" * draw(st.integers(1, 12)) + b"\x01"
        else:
            del data[pos:pos + draw(st.integers(1, 40))]
    return bytes(data)


MESSAGES = st.one_of(st.binary(max_size=100), st.binary(max_size=100).map(lambda b: b"\x61" + b), _mutated())


@pytest.fixture(scope="module")
def index_reader(tmp_path_factory):
    """A reader of the SQLite negentropy index holding `_items()` (small nodes: several levels)."""
    conn, _, number = open_index(tmp_path_factory.mktemp("neg") / "fuzz-neg.db", max_children=16)
    write(conn, number, _items(), max_children=16)
    yield IndexReader(conn, number)
    conn.close()


_TIMES = st.none() | st.integers(T0 - 2, T0 + 42) | st.sampled_from([0, 2**63 - 1])


def _respond(storage, message: bytes, frame_size_limit: int) -> None:
    try:
        reply = Negentropy(storage, frame_size_limit).reconcile(message)
    except NegentropyError:
        return
    assert reply[0] == 0x61
    assert not frame_size_limit or len(reply) <= frame_size_limit


@examples(100)
@given(MESSAGES, st.sampled_from([0, 4096]))
def test_fuzz_responder_over_sorted_vector_raises_only_negentropy_error(message, frame_size_limit):
    """Any message to the responder (SortedVector) is answered within the frame limit or raises NegentropyError."""
    _respond(_vector(), message, frame_size_limit)


@examples(100)
@given(message=MESSAGES, frame_size_limit=st.sampled_from([0, 4096]), since=_TIMES, until=_TIMES,
       limit=st.none() | st.integers(0, 400) | st.just(2**63 - 1))
def test_fuzz_responder_over_sqlite_index_raises_only_negentropy_error(index_reader, message, frame_size_limit,
                                                                       since, until, limit):
    """Any message to the responder (SQLite index, any since/until/limit window) is answered or raises NegentropyError."""
    storage = IndexView(index_reader, window_segments(index_reader, since, until, limit))
    _respond(storage, message, frame_size_limit)


@examples(100)
@given(MESSAGES, st.sampled_from([0, 4096]))
def test_fuzz_initiator_raises_only_negentropy_error(message, frame_size_limit):
    """Any reply to the initiator yields (next message or None, have, need) or raises NegentropyError."""
    client = Negentropy(SortedVector.from_items(_items()), frame_size_limit)
    client.initiate()
    try:
        following, have, need = client.reconcile_with_ids(message)
    except NegentropyError:
        return
    assert following is None or following[0] == 0x61
    assert all(len(id_) == 32 for id_ in [*have, *need])
