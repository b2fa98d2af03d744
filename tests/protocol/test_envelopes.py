"""Client message parsing and relay message encoding (NIP-01, NIP-45)."""

from __future__ import annotations

import json

import pytest

from relay.protocol.envelopes import (
    CloseEnvelope,
    CountEnvelope,
    EventEnvelope,
    MessageError,
    ReqEnvelope,
    encode_closed,
    encode_count,
    encode_eose,
    encode_event,
    encode_notice,
    encode_ok,
    parse_client_message,
)


def test_parses_each_verb():
    """EVENT, REQ, COUNT and CLOSE parse into their envelopes."""
    assert parse_client_message('["EVENT", {"id": 1}]', 5) == EventEnvelope({"id": 1})
    req = parse_client_message('["REQ", "s", {"kinds": [1]}, {}]', 5)
    assert isinstance(req, ReqEnvelope) and req.sub_id == "s" and len(req.filters) == 2
    assert isinstance(parse_client_message(b'["COUNT", "c", {}]', 5), CountEnvelope)
    assert parse_client_message('["CLOSE", "s"]', 5) == CloseEnvelope("s")


@pytest.mark.parametrize(
    "frame, verb, ref",
    [
        ("nope", "", None),
        ('{"a": 1}', "", None),
        ('["AUTHX", 1]', "AUTHX", None),
        ('["REQ", "s", {}, {}, {}]', "REQ", "s"),
        ('["REQ", "s", {"kinds": "1"}]', "REQ", "s"),
        ('["COUNT", "c"]', "COUNT", "c"),
        ('["REQ", ""]', "REQ", None),
        ('["EVENT", {"id": "' + "a" * 64 + '"}, 1]', "EVENT", "a" * 64),
        ("[" * 100_000 + "]" * 100_000, "", None),
    ],
)
def test_errors_say_whom_to_answer(frame, verb, ref):
    """A bad message raises MessageError with the verb and the id to answer to, prefix "invalid"."""
    with pytest.raises(MessageError) as err:
        parse_client_message(frame, 2)
    assert (err.value.verb, err.value.ref, err.value.prefix) == (verb, ref, "invalid")


@pytest.mark.parametrize("frame, reason", [("[1,", "malformed JSON"), ("[" * 5000 + "]" * 5000, "JSON nested too deeply")])
def test_undecodable_frames_say_why(frame, reason):
    """A frame no decoder accepts is refused "invalid:" with the reason: malformed, or nested too deeply."""
    with pytest.raises(MessageError) as err:
        parse_client_message(frame, 2)
    assert err.value.reason == reason


def test_encoders_produce_nip01_arrays():
    """Encoders produce the exact NIP-01 / NIP-45 arrays."""
    assert json.loads(encode_ok("ab", False, "invalid: x")) == ["OK", "ab", False, "invalid: x"]
    assert json.loads(encode_event("s", b'{"id":"x"}')) == ["EVENT", "s", {"id": "x"}]
    assert json.loads(encode_eose("s")) == ["EOSE", "s"]
    assert json.loads(encode_closed("s", "error: y")) == ["CLOSED", "s", "error: y"]
    assert json.loads(encode_notice("n")) == ["NOTICE", "n"]
    assert json.loads(encode_count("c", 3)) == ["COUNT", "c", {"count": 3}]
