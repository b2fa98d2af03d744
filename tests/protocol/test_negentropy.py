"""Tests for relay.protocol.negentropy (NIP-77, negentropy protocol v1).

Three kinds of evidence:
* byte-for-byte agreement with the JavaScript engine of npm nostr-tools
  (its `nip77` module), driven through one long-lived Node process;
* replay of the recorded JS <-> Kotlin interop transcripts in
  shared/data/negentropy/ (see shared/data/SOURCES.md, "Negentropy");
* Hypothesis properties: any two sets reconcile to the exact differences.

nostr-tools is a client library: its `Negentropy.reconcile` handles a received
IdList like an initiator does (it reports have/need through callbacks and
sends nothing back), where the reference responder (hoytech cpp/js, strfry,
the JS side of the transcripts) answers with its own IdList.  So a nostr-tools
engine is an exact twin of our initiator, but of our responder only for
messages that carry no IdList range; the responder's IdList replies are pinned
by the transcripts and by hand-checked vectors below.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relay.protocol.negentropy import (
    INFINITY,
    PROTOCOL_VERSION,
    Bound,
    Mode,
    Negentropy,
    NegentropyError,
    NegentropyStorage,
    Range,
    SortedVector,
    decode_message,
    decode_varint,
    encode_message,
    encode_varint,
    encode_varints,
    fingerprint,
    fingerprint_from_sum,
    limbs_add,
    limbs_sub,
    range_fingerprints,
)

REPO = Path(__file__).resolve().parents[2]
NEG_DATA = REPO / ".." / "shared" / "data" / "negentropy"
JS_DIR = REPO / "tests" / "js"
JS_DRIVER = JS_DIR / "nip77_driver.mjs"

Item = tuple[int, bytes]


# ---------------------------------------------------------------- helpers


def random_items(rnd: random.Random, count: int, ts_lo: int, ts_hi: int) -> list[Item]:
    """``count`` items with random ids and timestamps in [ts_lo, ts_hi]."""
    return [(rnd.randint(ts_lo, ts_hi), rnd.randbytes(32)) for _ in range(count)]


def split_sets(
    rnd: random.Random, items: list[Item], p_only_a: float, p_only_b: float
) -> tuple[list[Item], list[Item]]:
    """Deal ``items`` into A only, B only, or both."""
    a: list[Item] = []
    b: list[Item] = []
    for item in items:
        x = rnd.random()
        if x < p_only_a:
            a.append(item)
        elif x < p_only_a + p_only_b:
            b.append(item)
        else:
            a.append(item)
            b.append(item)
    return a, b


def expected_diff(a: list[Item], b: list[Item]) -> tuple[set[bytes], set[bytes]]:
    ids_a = {id_ for _, id_ in a}
    ids_b = {id_ for _, id_ in b}
    return ids_a - ids_b, ids_b - ids_a


@dataclass
class Exchange:
    have: list[bytes] = field(default_factory=list)
    need: list[bytes] = field(default_factory=list)
    rounds: int = 0
    bytes_up: int = 0
    bytes_down: int = 0


def reconcile_locally(a: list[Item], b: list[Item], frame_size_limit: int) -> Exchange:
    """Our initiator (items a) against our responder (items b)."""
    initiator = Negentropy(SortedVector.from_items(a), frame_size_limit)
    responder = Negentropy(SortedVector.from_items(b), frame_size_limit)
    result = Exchange()
    msg: bytes | None = initiator.initiate()
    while msg is not None:
        assert_frame_fits(msg, frame_size_limit)
        reply = responder.reconcile(msg)
        assert_frame_fits(reply, frame_size_limit)
        result.rounds += 1
        result.bytes_up += len(msg)
        result.bytes_down += len(reply)
        msg, have, need = initiator.reconcile_with_ids(reply)
        result.have += have
        result.need += need
        assert result.rounds < 1000, "reconciliation does not converge"
    return result


def assert_frame_fits(msg: bytes, frame_size_limit: int) -> None:
    if frame_size_limit:
        assert len(msg) <= frame_size_limit


def assert_exact(result: Exchange, a: list[Item], b: list[Item], frame_size_limit: int) -> None:
    """have/need are exactly the set differences.

    With a frame limit an id can be reported again in a later round, as the
    reference does (see test_ids_can_repeat_across_rounds_with_a_frame_limit).
    """
    only_a, only_b = expected_diff(a, b)
    assert set(result.have) == only_a
    assert set(result.need) == only_b
    if not frame_size_limit:
        assert len(result.have) == len(only_a) and len(result.need) == len(only_b)


def has_id_list(msg: bytes) -> bool:
    return any(r.mode is Mode.ID_LIST for r in decode_message(msg)[1])


# ---------------------------------------------------------------- varints


@pytest.mark.parametrize(
    ("value", "encoded"),
    [
        (0, "00"),
        (1, "01"),
        (127, "7f"),
        (128, "8100"),
        (255, "817f"),
        (16383, "ff7f"),
        (16384, "818000"),
        (2**64 - 1, "81ffffffffffffffff7f"),
    ],
)
def test_varint_known_encodings(value: int, encoded: str) -> None:
    assert encode_varint(value).hex() == encoded
    assert decode_varint(bytes.fromhex(encoded)) == (value, len(encoded) // 2)


@given(st.integers(0, 2**64 - 1), st.binary(max_size=4))
def test_varint_roundtrip(value: int, tail: bytes) -> None:
    encoded = encode_varint(value)
    assert decode_varint(b"\xff" + encoded + tail, 1) == (value, 1 + len(encoded))


def test_varint_errors() -> None:
    with pytest.raises(NegentropyError, match="premature end"):
        decode_varint(b"\x81\x80")
    with pytest.raises(NegentropyError, match="64 bits"):
        decode_varint(b"\x82" + b"\x80" * 8 + b"\x00")
    with pytest.raises(NegentropyError):
        encode_varint(-1)


# ---------------------------------------------------------------- fingerprints


def naive_fingerprint(ids: list[bytes]) -> bytes:
    total = sum(int.from_bytes(i, "little") for i in ids) % 2**256
    return hashlib.sha256(total.to_bytes(32, "little") + encode_varint(len(ids))).digest()[:16]


def test_fingerprint_of_empty_set() -> None:
    expected = hashlib.sha256(bytes(32) + b"\x00").digest()[:16]
    assert fingerprint([]) == expected
    assert fingerprint(np.zeros((0, 32), np.uint8)) == expected


def test_fingerprint_wraps_mod_2_256() -> None:
    ids = [b"\xff" * 32] * 3 + [b"\x01" + bytes(31)]
    assert fingerprint(ids) == naive_fingerprint(ids)
    # 3 * (2**256 - 1) + 1 == 2**256 * 3 - 2  ->  sum mod 2**256 is 2**256 - 2
    expected = hashlib.sha256(((2**256 - 2)).to_bytes(32, "little") + b"\x04").digest()[:16]
    assert fingerprint(ids) == expected


@given(st.lists(st.binary(min_size=32, max_size=32), max_size=60))
def test_fingerprint_matches_naive_sum(ids: list[bytes]) -> None:
    assert fingerprint(ids) == naive_fingerprint(ids)
    arr = np.frombuffer(b"".join(ids), np.uint8).reshape(-1, 32)
    assert fingerprint(arr) == naive_fingerprint(ids)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**32), st.integers(0, 300), st.data())
def test_storage_range_fingerprint_matches_items(seed: int, count: int, data: st.DataObject) -> None:
    rnd = random.Random(seed)
    items = random_items(rnd, count, 0, 5)
    # ids near 2**256 so the running sums wrap often
    items = [(ts, b"\xff" * 24 + id_[24:]) if i % 2 else (ts, id_) for i, (ts, id_) in enumerate(items)]
    vec = SortedVector.from_items(items)
    ordered = sorted(items)
    for _ in range(10):
        begin = data.draw(st.integers(0, count))
        end = data.draw(st.integers(begin, count))
        assert vec.fingerprint(begin, end) == naive_fingerprint([i for _, i in ordered[begin:end]])


def test_fingerprint_of_a_million_ids_is_fast() -> None:
    ids = np.random.default_rng(7).integers(0, 256, size=(1_000_000, 32), dtype=np.uint8)
    start = time.perf_counter()
    digest = fingerprint(ids)
    elapsed = time.perf_counter() - start
    sample = [bytes(row) for row in ids[:1000]]
    assert fingerprint(ids[:1000]) == naive_fingerprint(sample)
    assert len(digest) == 16
    assert elapsed < 1.0, f"fingerprint of 1M ids took {elapsed:.3f}s"


# ---------------------------------------------------------------- storage


def test_sorted_vector_sorts_by_timestamp_then_id() -> None:
    items = [(5, b"\x02" * 32), (3, b"\x09" * 32), (5, b"\x01" * 32), (0, b"\xff" * 32)]
    vec = SortedVector.from_items(items)
    assert isinstance(vec, NegentropyStorage)
    assert vec.size() == 4
    assert [vec.get_item(i) for i in range(4)] == sorted(items)
    assert vec.id_bytes(1, 3) == b"\x09" * 32 + b"\x01" * 32


def test_sorted_vector_bulk_insert_matches_single_inserts() -> None:
    rnd = random.Random(3)
    items = random_items(rnd, 500, 0, 20)
    bulk = SortedVector()
    bulk.insert_many(np.array([t for t, _ in items[:300]], np.int64), [i for _, i in items[:300]])
    for ts, id_ in items[300:]:
        bulk.insert(ts, id_)
    bulk.seal()
    single = SortedVector.from_items(items)
    assert [bulk.get_item(i) for i in range(500)] == [single.get_item(i) for i in range(500)]
    assert bulk.fingerprint(17, 420) == single.fingerprint(17, 420)


def test_sorted_vector_from_rows_matches_single_inserts() -> None:
    """Rows given as a list or as a one-pass iterator over several chunks build the same vector."""
    rnd = random.Random(4)
    items = random_items(rnd, 70_000, 0, 1_000)
    single = SortedVector.from_items(items)
    for rows in (items, iter(items)):
        vec = SortedVector.from_rows(rows)
        assert vec.size() == single.size()
        assert vec.id_bytes(0, vec.size()) == single.id_bytes(0, single.size())
        assert vec.fingerprint(0, vec.size()) == single.fingerprint(0, single.size())
    assert SortedVector.from_rows([]).size() == 0


def test_sorted_vector_rejects_duplicates_and_bad_items() -> None:
    id_ = bytes(range(32))
    with pytest.raises(NegentropyError, match="duplicate"):
        SortedVector.from_items([(1, id_), (1, id_)])
    with pytest.raises(NegentropyError, match="duplicate"):
        SortedVector.from_items([(1, id_), (2, b"\x00" + id_[1:]), (7, id_)])
    vec = SortedVector()
    with pytest.raises(NegentropyError):
        vec.insert(1, b"short")
    with pytest.raises(NegentropyError):
        vec.insert(INFINITY, id_)
    with pytest.raises(NegentropyError):
        vec.insert(-1, id_)
    with pytest.raises(NegentropyError, match="not sealed"):
        vec.size()
    vec.seal()
    with pytest.raises(NegentropyError, match="already sealed"):
        vec.insert(1, id_)
    with pytest.raises(NegentropyError, match="bad range"):
        vec.fingerprint(0, 1)


def test_lower_bounds_with_id_prefixes() -> None:
    ids = [bytes([0x10, 0x20]) + bytes(30), bytes([0x10, 0x30]) + bytes(30), bytes([0x40]) * 32]
    vec = SortedVector.from_items([(7, i) for i in ids] + [(3, b"\x99" * 32), (9, b"\x00" * 32)])
    bounds = [Bound(0), Bound(4), Bound(7),
              Bound(7, b"\x10\x20"),  # equal to the padded id
              Bound(7, b"\x10\x21"), Bound(7, b"\x10\x30\x00"), Bound(7, b"\x41"), Bound(9), Bound(INFINITY)]
    assert vec.lower_bounds(bounds).tolist() == [0, 1, 1, 1, 2, 2, 4, 4, vec.size()]


# ---------------------------------------------------------------- wire format


def test_initiate_on_empty_set() -> None:
    neg = Negentropy(SortedVector.from_items([]))
    # version, bound(infinity: ts 0, no prefix), IdList, 0 ids
    assert neg.initiate() == bytes.fromhex("6100000200")


def test_split_uses_minimal_bounds_and_delta_timestamps() -> None:
    # 32 items: ids 0..31 at timestamp 100 (bucket size 2), so bounds within a
    # timestamp need an id prefix; the last bound is infinity.
    items = [(100, bytes([0xAB, i]) + bytes(30)) for i in range(32)]
    msg = Negentropy(SortedVector.from_items(items)).initiate()
    version, ranges = decode_message(msg)
    assert version == PROTOCOL_VERSION
    assert [r.mode for r in ranges] == [Mode.FINGERPRINT] * 16
    assert ranges[0].upper_bound == Bound(100, bytes([0xAB, 2]))
    assert ranges[-1].upper_bound == Bound(INFINITY)
    # first bound: timestamp 100 encoded as 1 + 100; then deltas of 0 -> 1
    assert msg[1:6] == bytes([101, 2, 0xAB, 2, Mode.FINGERPRINT])
    assert msg[22:27] == bytes([1, 2, 0xAB, 4, Mode.FINGERPRINT])
    assert encode_message(ranges) == msg


def test_bound_without_prefix_when_timestamps_differ() -> None:
    items = [(1000 + i, bytes([i]) * 32) for i in range(40)]
    _, ranges = decode_message(Negentropy(SortedVector.from_items(items)).initiate())
    # 40 items -> 8 buckets of 3 then 8 of 2; the first bound is item 3's timestamp
    assert ranges[0].upper_bound == Bound(1003)
    assert all(r.upper_bound.id_prefix == b"" for r in ranges)


def test_frame_size_limit_validation() -> None:
    storage = SortedVector.from_items([])
    for bad in (1, 4095, -1):
        with pytest.raises(NegentropyError, match="frame_size_limit"):
            Negentropy(storage, bad)
    Negentropy(storage, 0)
    Negentropy(storage, 4096)


@pytest.mark.parametrize("version", [0x60, 0x62, 0x63, 0x6F])
def test_responder_answers_unsupported_version_with_its_own(version: int) -> None:
    neg = Negentropy(SortedVector.from_items([(1, b"\x01" * 32)]))
    assert neg.reconcile(bytes([version]) + b"\x00\x00\x01" + bytes(16)) == b"\x61"


def test_version_byte_outside_the_family_and_initiator_mismatch_raise() -> None:
    responder = Negentropy(SortedVector.from_items([]))
    for bad in (b"\x00", b"\x5f", b"\x70", b"\xff\x00"):
        with pytest.raises(NegentropyError, match="version"):
            responder.reconcile(bad)
    initiator = Negentropy(SortedVector.from_items([]))
    initiator.initiate()
    with pytest.raises(NegentropyError, match="unsupported"):
        initiator.reconcile_with_ids(b"\x62")


@pytest.mark.parametrize(
    ("msg", "match"),
    [
        (b"", "prematurely"),
        (b"\x61\x00", "varint"),
        (b"\x61\x00\x00\x01" + bytes(15), "prematurely"),
        (b"\x61\x00\x00\x02\x02" + bytes(40), "prematurely"),
        (b"\x61\x00\x00\x03", "unexpected mode"),
        (b"\x61\x01\x21" + bytes(33) + b"\x00", "too long"),
        (b"\x61\x00\x00\x02\x8f\xff\xff\xff\xff\xff\xff\xff\x7f", "prematurely"),
    ],
)
def test_malformed_messages_raise_negentropy_error(msg: bytes, match: str) -> None:
    neg = Negentropy(SortedVector.from_items([(1, b"\x01" * 32)]))
    with pytest.raises(NegentropyError, match=match):
        neg.reconcile(msg)


def test_role_misuse_raises() -> None:
    neg = Negentropy(SortedVector.from_items([]))
    with pytest.raises(NegentropyError):
        neg.reconcile_with_ids(b"\x61")
    neg.initiate()
    with pytest.raises(NegentropyError):
        neg.initiate()
    with pytest.raises(NegentropyError):
        neg.reconcile(b"\x61")


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=120), st.booleans())
def test_garbage_only_ever_raises_negentropy_error(body: bytes, as_initiator: bool) -> None:
    rnd = random.Random(len(body))
    neg = Negentropy(SortedVector.from_items(random_items(rnd, 40, 0, 3)), 4096)
    try:
        if as_initiator:
            neg.initiate()
            neg.reconcile_with_ids(b"\x61" + body)
        else:
            neg.reconcile(b"\x61" + body)
    except NegentropyError:
        pass


def test_responder_answers_id_list_with_its_own_ids() -> None:
    ours = [(10 + i, bytes([i + 1]) * 32) for i in range(5)]
    responder = Negentropy(SortedVector.from_items(ours))
    query = encode_message([Range(Bound(INFINITY), Mode.ID_LIST, [b"\x01" * 32, b"\xee" * 32])])
    reply = responder.reconcile(query)
    assert reply == encode_message([Range(Bound(INFINITY), Mode.ID_LIST, [i for _, i in ours])])


def test_responder_id_list_cut_by_frame_limit() -> None:
    # The reference checks the frame before adding each id: with only the
    # version byte written, (4096 - 200 - 1) // 32 + 1 = 122 ids fit.  The
    # IdList then ends at the first id left out (a full 32-byte bound) and a
    # Fingerprint range for the rest runs to infinity.
    ours = [(1000 + i, i.to_bytes(2, "big") * 16) for i in range(300)]
    vec = SortedVector.from_items(ours)
    responder = Negentropy(vec, 4096)
    reply = responder.reconcile(encode_message([Range(Bound(INFINITY), Mode.ID_LIST, [])]))
    _, ranges = decode_message(reply)
    assert [r.mode for r in ranges] == [Mode.ID_LIST, Mode.FINGERPRINT]
    assert ranges[0].payload == [i for _, i in ours[:122]]
    assert ranges[0].upper_bound == Bound(*ours[122])
    assert ranges[1].upper_bound == Bound(INFINITY)
    assert ranges[1].payload == vec.fingerprint(122, 300)
    assert len(reply) <= 4096


def test_overflowing_frame_ends_with_fingerprint_of_the_rest() -> None:
    # Every bucket mismatches; the responder splits them until the frame
    # (4096 - 200 bytes) would overflow, then sends one Fingerprint range up
    # to infinity over its items after the range it could not answer.
    rnd = random.Random(11)
    ours = random_items(rnd, 20_000, 0, 10**6)
    theirs = random_items(rnd, 20_000, 0, 10**6)
    initiator = Negentropy(SortedVector.from_items(theirs), 4096)
    vec = SortedVector.from_items(ours)
    query = initiator.initiate()
    reply = Negentropy(vec, 4096).reconcile(query)
    _, ranges = decode_message(reply)
    assert len(reply) <= 4096 - 200 + 19
    assert ranges[-1].mode is Mode.FINGERPRINT and ranges[-1].upper_bound == Bound(INFINITY)
    answered = sum(r.mode is Mode.FINGERPRINT for r in ranges[:-1]) // 16
    assert 0 < answered < 16
    # the Fingerprint covers our items from the upper end of the range not answered
    _, query_ranges = decode_message(query)
    cut = int(vec.lower_bounds([query_ranges[answered].upper_bound])[0])
    assert ranges[-1].payload == vec.fingerprint(cut, vec.size())


def test_ids_can_repeat_across_rounds_with_a_frame_limit() -> None:
    # Reference behaviour (nostr-tools agrees round by round, case "repeats"):
    # when a frame fills up, the Skip still pending for ranges the initiator
    # has settled is dropped, the closing Fingerprint range starts before
    # them, and they are reconciled, and reported, again.
    a, b = case_sets("repeats")
    limited = reconcile_locally(a, b, 4096)
    assert len(limited.need) > len(set(limited.need))
    assert_exact(limited, a, b, 4096)
    unlimited = reconcile_locally(a, b, 0)
    assert len(unlimited.need) == len(set(unlimited.need))
    assert_exact(unlimited, a, b, 0)


# ---------------------------------------------------------------- shared vectors


def neg_file(name: str) -> Path:
    path = NEG_DATA / name
    if not path.is_file():
        pytest.fail(f"missing shared test data {path} (shared/ must sit beside the repo)")
    return path


def load_item_set(name: str) -> list[Item]:
    items = []
    for line in neg_file(name).read_text().splitlines():
        if line.strip():
            ts, id_hex = line.split(",")
            items.append((int(ts), bytes.fromhex(id_hex)))
    return items


def load_transcript(*names: str) -> list[tuple[int, str, list[str]]]:
    events = []
    for order, line in enumerate(line for name in names for line in neg_file(name).read_text().splitlines()):
        if line.strip():
            ms, node, *cmd = line.split(",")
            events.append((int(ms), order, node, cmd))
    events.sort()
    return [(ms, node, cmd) for ms, _, node, cmd in events]


@dataclass
class ReplayNode:
    frame_size_limit: int
    items: list[Item] = field(default_factory=list)
    neg: Negentropy | None = None
    output: bytes | None = None
    have: list[bytes] = field(default_factory=list)
    need: list[bytes] = field(default_factory=list)


def replay(events: list[tuple[int, str, list[str]]]) -> tuple[dict[str, ReplayNode], int]:
    """Play every node of a transcript with our engine; return nodes and msg count."""
    nodes: dict[str, ReplayNode] = {}
    delivered = 0
    for _, name, cmd in events:
        if cmd[0] == "create":
            nodes[name] = ReplayNode(int(cmd[1]))
        elif cmd[0] == "item":
            nodes[name].items.append((int(cmd[1]), bytes.fromhex(cmd[2])))
        elif cmd[0] == "seal":
            node = nodes[name]
            node.neg = Negentropy(SortedVector.from_items(node.items), node.frame_size_limit)
        elif cmd[0] == "initiate":
            nodes[name].output = nodes[name].neg.initiate()
        elif cmd[0] == "msg":
            (other,) = [n for key, n in nodes.items() if key != name]
            assert cmd[1] == other.output.hex(), f"message {delivered} to {name} differs"
            deliver(nodes[name], bytes.fromhex(cmd[1]))
            delivered += 1
        else:
            raise AssertionError(f"unknown transcript command {cmd}")
    return nodes, delivered


def deliver(node: ReplayNode, msg: bytes) -> None:
    if node.neg.is_initiator:
        node.output, have, need = node.neg.reconcile_with_ids(msg)
        node.have += have
        node.need += need
    else:
        node.output = node.neg.reconcile(msg)


@pytest.mark.parametrize(
    ("files", "initiator"),
    [
        (("lang1-js-client.txt", "lang1-kotlin-server.txt"), "kotlin-side"),
        (("lang2-js-server.txt", "lang2-kotlin-client.txt"), "js-side"),
    ],
)
def test_transcript_replay(files: tuple[str, str], initiator: str) -> None:
    nodes, delivered = replay(load_transcript(*files))
    assert delivered == 2
    assert nodes[initiator].neg.is_initiator
    assert nodes[initiator].output is None  # reconciliation finished
    assert nodes[initiator].have == [] and nodes[initiator].need == []
    assert len(nodes[initiator].items) == 25


@pytest.mark.parametrize("frame_size_limit", [0, 4096])
@pytest.mark.parametrize("prefix", ["simpletest", "framelimits"])
def test_shared_item_sets_reconcile(prefix: str, frame_size_limit: int) -> None:
    client = load_item_set(f"{prefix}-client.txt")
    server = load_item_set(f"{prefix}-server.txt")
    result = reconcile_locally(client, server, frame_size_limit)
    assert_exact(result, client, server, frame_size_limit)
    result = reconcile_locally(server, client, frame_size_limit)
    assert_exact(result, server, client, frame_size_limit)


def test_lang3_messages_decode_and_are_answered() -> None:
    events = load_transcript("lang3-js-server.txt")
    items = [(int(c[1]), bytes.fromhex(c[2])) for _, _, c in events if c[0] == "item"]
    msgs = [bytes.fromhex(c[1]) for _, _, c in events if c[0] == "msg"]
    assert len(items) == 24_715 and len(msgs) == 2
    responder = Negentropy(SortedVector.from_items(items))
    for msg in msgs:
        version, ranges = decode_message(msg)
        assert version == PROTOCOL_VERSION and ranges
        assert encode_message(ranges) == msg
        assert ranges[-1].upper_bound == Bound(INFINITY)
        decode_message(responder.reconcile(msg))


# ---------------------------------------------------------------- properties


ids32 = st.binary(min_size=32, max_size=32)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 6), ids32, st.sampled_from("ABC")), unique_by=lambda t: t[1], max_size=150
    ),
    st.sampled_from([0, 4096]),
)
def test_small_sets_reconcile_exactly(spec: list[tuple[int, bytes, str]], frame_size_limit: int) -> None:
    a = [(ts, id_) for ts, id_, side in spec if side in "AC"]
    b = [(ts, id_) for ts, id_, side in spec if side in "BC"]
    assert_exact(reconcile_locally(a, b, frame_size_limit), a, b, frame_size_limit)


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**32),
    count=st.integers(0, 6000),
    ts_span=st.sampled_from([0, 1, 3, 1000, 2**31, 2**64 - 2]),
    p_only_a=st.sampled_from([0.0, 0.01, 0.1, 0.5, 1.0]),
    p_only_b=st.sampled_from([0.0, 0.01, 0.1, 0.5]),
    frame_size_limit=st.sampled_from([0, 4096, 4096, 10_000]),
)
def test_large_sets_reconcile_exactly(
    seed: int, count: int, ts_span: int, p_only_a: float, p_only_b: float, frame_size_limit: int
) -> None:
    rnd = random.Random(seed)
    items = random_items(rnd, count, 0, ts_span)
    a, b = split_sets(rnd, items, p_only_a, min(p_only_b, 1.0 - p_only_a))
    assert_exact(reconcile_locally(a, b, frame_size_limit), a, b, frame_size_limit)


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**32), count=st.integers(0, 3000), frame_size_limit=st.sampled_from([0, 4096]))
def test_empty_side_reconciles_exactly(seed: int, count: int, frame_size_limit: int) -> None:
    items = random_items(random.Random(seed), count, 0, 10)
    assert_exact(reconcile_locally(items, [], frame_size_limit), items, [], frame_size_limit)
    assert_exact(reconcile_locally([], items, frame_size_limit), [], items, frame_size_limit)


@settings(max_examples=20)
@given(st.integers(0x60, 0x6F).filter(lambda v: v != PROTOCOL_VERSION), st.binary(max_size=40))
def test_any_other_version_gets_our_version_back(version: int, body: bytes) -> None:
    neg = Negentropy(SortedVector.from_items([]))
    assert neg.reconcile(bytes([version]) + body) == b"\x61"


def test_version_0x62_gets_0x61() -> None:
    assert Negentropy(SortedVector.from_items([])).reconcile(b"\x62") == b"\x61"


# ---------------------------------------------------------------- nostr-tools


class NostrTools:
    """The nostr-tools nip77 engine in a long-lived Node process (JSON lines)."""

    def __init__(self, node: str) -> None:
        self._proc = subprocess.Popen(
            [node, str(JS_DRIVER)],
            cwd=JS_DIR,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        self._handles = 0

    def call(self, op: str, **args: object) -> dict:
        self._proc.stdin.write(json.dumps({"op": op, **args}) + "\n")
        self._proc.stdin.flush()
        line = self._proc.stdout.readline()
        if not line:
            raise RuntimeError(f"nostr-tools driver exited with {self._proc.wait()}")
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"nostr-tools: {reply['error']}")
        return reply

    def engine(self, items: list[Item], frame_size_limit: int) -> JsEngine:
        self._handles += 1
        handle = f"e{self._handles}"
        self.call("new", h=handle, frame=frame_size_limit, items=[[ts, id_.hex()] for ts, id_ in items])
        return JsEngine(self, handle)

    def close(self) -> None:
        self._proc.stdin.close()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


@dataclass
class JsEngine:
    driver: NostrTools
    handle: str

    def initiate(self) -> bytes:
        return bytes.fromhex(self.driver.call("initiate", h=self.handle)["msg"])

    def reconcile(self, msg: bytes) -> tuple[bytes | None, list[bytes], list[bytes]]:
        reply = self.driver.call("reconcile", h=self.handle, msg=msg.hex())
        out = None if reply["msg"] is None else bytes.fromhex(reply["msg"])
        return out, [bytes.fromhex(h) for h in reply["have"]], [bytes.fromhex(n) for n in reply["need"]]

    def free(self) -> None:
        self.driver.call("free", h=self.handle)


@pytest.fixture(scope="module")
def nostr_tools() -> Iterator[NostrTools]:
    node = shutil.which("node")
    if node is None:
        pytest.fail("node is not installed; the nostr-tools comparison needs Node 20+")
    if not (JS_DIR / "node_modules" / "nostr-tools").is_dir():
        npm = shutil.which("npm")
        if npm is None:
            pytest.fail("npm is not installed; needed once for `npm ci --prefix tests/js`")
        subprocess.run(
            [npm, "ci", "--prefix", str(JS_DIR), "--silent", "--no-audit", "--no-fund"],
            check=True,
            capture_output=True,
            timeout=600,
        )
    driver = NostrTools(node)
    yield driver
    driver.close()


def case_sets(name: str) -> tuple[list[Item], list[Item]]:
    """Named (A, B) item sets for the comparison against nostr-tools."""
    rnd = random.Random(name)
    now = 1_700_000_000
    if name == "random":
        return split_sets(rnd, random_items(rnd, 3000, now - 10**6, now), 0.05, 0.04)
    if name == "one_timestamp":
        return split_sets(rnd, random_items(rnd, 3000, now, now), 0.1, 0.1)
    if name == "few_timestamps":
        return split_sets(rnd, random_items(rnd, 2000, now, now + 2), 0.2, 0.01)
    if name == "disjoint":
        return split_sets(rnd, random_items(rnd, 1500, 0, 100), 0.5, 0.5)
    if name == "identical":
        items = random_items(rnd, 5000, now - 10**6, now)
        return items, list(items)
    if name == "empty_both":
        return [], []
    if name == "empty_initiator":
        return [], random_items(rnd, 700, 0, 1000)
    if name == "empty_responder":
        return random_items(rnd, 700, 0, 1000), []
    if name == "tiny":
        return split_sets(rnd, random_items(rnd, 20, 5, 6), 0.3, 0.3)
    if name == "large":
        return split_sets(rnd, random_items(rnd, 20_000, now - 10**7, now), 0.03, 0.03)
    if name == "large_skewed":
        items = random_items(rnd, 10_000, now - 10**5, now)
        return [it for it in items if rnd.random() < 0.9], items
    if name == "repeats":  # with a 4096 frame the initiator reports some ids twice
        return split_sets(rnd, random_items(rnd, 926, now, now), 0.0, 0.5)
    if name in ("simpletest", "framelimits"):
        return load_item_set(f"{name}-client.txt"), load_item_set(f"{name}-server.txt")
    raise AssertionError(name)


CASES = [
    "random",
    "one_timestamp",
    "few_timestamps",
    "disjoint",
    "identical",
    "empty_both",
    "empty_initiator",
    "empty_responder",
    "tiny",
    "large",
    "large_skewed",
    "repeats",
    "simpletest",
    "framelimits",
]
# nostr-tools refuses a frame limit of 0 (and anything < 4096); a huge limit
# behaves as "unlimited", so our 0 is compared against 2**31.
FRAMES = [(4096, 4096), (60_000, 60_000), (0, 2**31)]


@dataclass
class Comparison:
    """Counters and results of one exchange checked against nostr-tools."""

    have: set[bytes] = field(default_factory=set)
    need: set[bytes] = field(default_factory=set)
    rounds: int = 0
    responder_messages_compared: int = 0


def ours_vs_twin_initiator(ours: Negentropy, twin: JsEngine, reply: bytes, cmp: Comparison) -> bytes | None:
    """Feed a reply to our initiator and to its nostr-tools twin; they must agree."""
    msg, have, need = ours.reconcile_with_ids(reply)
    js_msg, js_have, js_need = twin.reconcile(reply)
    assert js_msg == msg, f"initiator message differs in round {cmp.rounds}"
    assert js_have == have and js_need == need, f"have/need differ in round {cmp.rounds}"
    cmp.have.update(have)
    cmp.need.update(need)
    return msg


def compare_responders(ours: bytes, js: JsEngine, query: bytes, cmp: Comparison) -> None:
    """Our responder's reply against a nostr-tools twin's for the same query.

    nostr-tools answers nothing to an IdList range (so such queries are not
    compared) and returns null instead of a bare version byte.
    """
    if has_id_list(query):
        return
    js_reply = js.reconcile(query)[0]
    assert (js_reply or b"\x61") == ours, f"responder message differs in round {cmp.rounds}"
    cmp.responder_messages_compared += 1


@pytest.mark.parametrize(("our_frame", "js_frame"), FRAMES, ids=["4096", "60000", "unlimited"])
@pytest.mark.parametrize("case", CASES)
def test_nostr_tools_initiates_against_our_responder(
    nostr_tools: NostrTools, case: str, our_frame: int, js_frame: int
) -> None:
    """nostr-tools client <-> our relay; our initiator runs as its twin."""
    a, b = case_sets(case)
    js_initiator = nostr_tools.engine(a, js_frame)
    js_responder_twin = nostr_tools.engine(b, js_frame)
    our_initiator_twin = Negentropy(SortedVector.from_items(a), our_frame)
    our_responder = Negentropy(SortedVector.from_items(b), our_frame)
    cmp = Comparison()
    msg: bytes | None = js_initiator.initiate()
    assert our_initiator_twin.initiate() == msg
    while msg is not None:
        cmp.rounds += 1
        assert_frame_fits(msg, our_frame)
        reply = our_responder.reconcile(msg)
        assert_frame_fits(reply, our_frame)
        compare_responders(reply, js_responder_twin, msg, cmp)
        msg = ours_vs_twin_initiator(our_initiator_twin, js_initiator, reply, cmp)
        assert cmp.rounds < 500
    only_a, only_b = expected_diff(a, b)
    assert (cmp.have, cmp.need) == (only_a, only_b)
    if len(a) >= 32:
        assert cmp.responder_messages_compared >= 1
    js_initiator.free()
    js_responder_twin.free()


@pytest.mark.parametrize(("our_frame", "js_frame"), FRAMES, ids=["4096", "60000", "unlimited"])
@pytest.mark.parametrize("case", CASES)
def test_our_initiator_against_nostr_tools_responder(
    nostr_tools: NostrTools, case: str, our_frame: int, js_frame: int
) -> None:
    """Our client <-> a nostr-tools peer; a nostr-tools twin shadows our initiator.

    The nostr-tools peer settles IdList ranges on its own side, so the exact
    differences are what our initiator found plus what the peer reported.
    """
    a, b = case_sets(case)
    js_responder = nostr_tools.engine(b, js_frame)
    js_initiator_twin = nostr_tools.engine(a, js_frame)
    our_initiator = Negentropy(SortedVector.from_items(a), our_frame)
    our_responder_twin = Negentropy(SortedVector.from_items(b), our_frame)
    cmp = Comparison()
    msg: bytes | None = our_initiator.initiate()
    assert js_initiator_twin.initiate() == msg
    peer_have: set[bytes] = set()
    peer_need: set[bytes] = set()
    while msg is not None:
        cmp.rounds += 1
        reply, have, need = js_responder.reconcile(msg)
        peer_have.update(have)
        peer_need.update(need)
        if not has_id_list(msg):
            assert (reply or b"\x61") == our_responder_twin.reconcile(msg), f"round {cmp.rounds}"
            cmp.responder_messages_compared += 1
        if reply is None:
            break
        msg = ours_vs_twin_initiator(our_initiator, js_initiator_twin, reply, cmp)
        assert cmp.rounds < 500
    only_a, only_b = expected_diff(a, b)
    assert cmp.have | peer_need == only_a
    assert cmp.need | peer_have == only_b
    js_responder.free()
    js_initiator_twin.free()


_U256 = st.one_of(st.integers(0, 2**256 - 1), st.sampled_from([0, 1, 2**64 - 1, 2**64, 2**128 - 1, 2**256 - 1]))


@settings(max_examples=200, deadline=None)
@given(pairs=st.lists(st.tuples(_U256, _U256), min_size=1, max_size=20))
def test_limb_arithmetic_is_mod_2_256(pairs):
    """limbs_add / limbs_sub on (m, 8) uint32 limbs equal Python's (a +/- b) mod 2**256, carries across every word."""
    def limbs(values):
        return np.frombuffer(b"".join(v.to_bytes(32, "little") for v in values), dtype="<u4").reshape(-1, 8)

    def ints(arr):
        return [int.from_bytes(row.tobytes(), "little") for row in arr]

    a, b = limbs([x for x, _ in pairs]), limbs([y for _, y in pairs])
    assert ints(limbs_add(a, b)) == [(x + y) % 2**256 for x, y in pairs]
    assert ints(limbs_sub(a, b)) == [(x - y) % 2**256 for x, y in pairs]


@settings(max_examples=100, deadline=None)
@given(values=st.lists(st.one_of(st.integers(0, 2**64 - 1), st.sampled_from([0, 127, 128, 16383, 16384, 2**63])),
                       min_size=1, max_size=30))
def test_bulk_varints_equal_one_at_a_time(values):
    """encode_varints' masked rows are exactly encode_varint's bytes, for every width up to 10 digits."""
    cells, used = encode_varints(np.array(values, dtype=np.uint64))
    assert [cells[k][used[k]].tobytes() for k in range(len(values))] == [encode_varint(v) for v in values]


@settings(max_examples=100, deadline=None)
@given(ranges=st.lists(st.tuples(_U256, _U256, st.integers(0, 2**40)), min_size=1, max_size=20))
def test_bulk_range_fingerprints_equal_one_at_a_time(ranges):
    """range_fingerprints from prefix-sum limbs equals fingerprint_from_sum of (upper - lower) mod 2**256, count."""
    def limbs(values):
        return np.frombuffer(b"".join(v.to_bytes(32, "little") for v in values), dtype="<u4").reshape(-1, 8)

    lower, upper = limbs([lo for lo, _, _ in ranges]), limbs([hi for _, hi, _ in ranges])
    assert [row.tobytes() for row in range_fingerprints(lower, upper, [n for _, _, n in ranges])] == [
        fingerprint_from_sum((hi - lo) % 2**256, n) for lo, hi, n in ranges]
