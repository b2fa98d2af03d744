"""Event validation and the NIP-01 serialization, without I/O."""

from __future__ import annotations

import json
import time

import pytest

from relay.protocol.event import (
    EventLimits,
    is_addressable,
    is_ephemeral,
    is_replaceable,
    kind_class,
    parse_event,
    serialize_for_id,
    verify_signature,
)
from relay.protocol.rejection import Rejection
from tests.helpers import DATA, Keys, read_jsonl

NOW = time.time()


def test_id_serialization_matches_nip01_for_every_code_point():
    """Every non-surrogate code point serializes exactly as NIP-01 (json.dumps, ensure_ascii=False)."""
    text = "".join(chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF)
    expected = json.dumps([0, "p", 1, 1, [[text]], text], separators=(",", ":"), ensure_ascii=False).encode()
    assert serialize_for_id("p", 1, 1, [[text]], text) == expected


def test_control_characters_use_short_escapes_and_lowercase_hex():
    """\\n \\" \\\\ \\r \\t \\b \\f get short escapes, other controls lowercase \\u00xx, DEL and U+2028 verbatim."""
    out = serialize_for_id("p", 1, 1, [], '\n"\\\r\t\b\f\x01\x1f\x7f\u2028')
    assert out.endswith(b'"\\n\\"\\\\\\r\\t\\b\\f\\u0001\\u001f\x7f\xe2\x80\xa8"]')


def test_control_character_event_from_the_data_verifies():
    """The synthetic event with \\b, \\f, \\u0001, \\u001f, U+2028 and U+2029 passes id and signature."""
    events = read_jsonl(DATA / "events_synthetic" / "nostrbook-synthetic.jsonl")
    (raw,) = [e for e in events if e["id"] == "aa72e0c89dd2a7f2d7e586630069093aba4ce4bfab14343d9c9956a40e5efe10"]
    event = parse_event(raw, EventLimits(), NOW)
    assert verify_signature(event)
    assert event.raw == json.dumps(raw, separators=(",", ":"), ensure_ascii=False).encode()


def test_lone_surrogate_is_invalid():
    """A string holding a lone surrogate cannot be canonical UTF-8: "invalid:"."""
    event = Keys(1).sign(content="x")
    event["content"] = "a\ud800b"
    with pytest.raises(Rejection) as err:
        parse_event(event, EventLimits(), NOW)
    assert err.value.prefix == "invalid"


def test_extra_fields_are_dropped_from_the_stored_form():
    """Fields outside NIP-01's seven are not kept in the canonical JSON."""
    event = Keys(1).sign(content="x")
    parsed = parse_event({**event, "seen_on": ["wss://x"]}, EventLimits(), NOW)
    assert json.loads(parsed.raw) == event


@pytest.mark.parametrize(
    "kind, cls",
    [(0, "replaceable"), (1, "regular"), (3, "replaceable"), (5, "regular"), (44, "regular"),
     (1000, "regular"), (9999, "regular"), (10000, "replaceable"), (19999, "replaceable"),
     (20000, "ephemeral"), (29999, "ephemeral"), (30000, "addressable"), (39999, "addressable"),
     (40000, "regular"), (65535, "regular")],
)
def test_kind_classes(kind, cls):
    """NIP-01 kind ranges map to regular, replaceable, ephemeral and addressable."""
    assert kind_class(kind) == cls
    assert is_replaceable(kind) == (cls == "replaceable")
    assert is_ephemeral(kind) == (cls == "ephemeral")
    assert is_addressable(kind) == (cls == "addressable")


def test_d_tag_expiration_and_coordinate():
    """The first d tag and NIP-40 expiration are read; coordinates follow the kind class."""
    keys = Keys(2)
    event = parse_event(keys.sign(kind=30023, tags=[["d", "slug"], ["d", "other"], ["expiration", "99"]]),
                        EventLimits(), NOW)
    assert (event.d_tag, event.expiration) == ("slug", 99)
    assert event.coordinate == (30023, keys.pubkey, "slug")
    assert event.has_expired(100) and not event.has_expired(98)
    note = parse_event(keys.sign(kind=1, tags=[["expiration", "soon"]]), EventLimits(), NOW)
    assert note.coordinate is None and note.expiration is None
    profile = parse_event(keys.sign(kind=0, tags=[["d", "ignored"]]), EventLimits(), NOW)
    assert profile.coordinate == (0, keys.pubkey, "")


def test_every_real_event_validates():
    """Every event of the real data set passes shape, id and signature checks."""
    events = read_jsonl(DATA / "all_real_valid_dedup.jsonl")
    limits = EventLimits()
    assert all(verify_signature(parse_event(e, limits, NOW)) for e in events)
    assert len(events) == 6335


def test_every_invalid_fixture_is_refused():
    """Every `event` under invalid/ is refused with "invalid:" (by parsing or signature)."""
    refused = 0
    for path in sorted((DATA / "invalid").glob("*.jsonl")):
        for line in read_jsonl(path):
            try:
                event = parse_event(line["event"], EventLimits(), NOW)
            except Rejection as err:
                assert err.prefix == "invalid"
                refused += 1
                continue
            assert not verify_signature(event), line
            refused += 1
    assert refused == 162
