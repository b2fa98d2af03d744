"""The client's side of the protocol (relay/protocol/client.py) against the relay's (relay/protocol/envelopes.py):
what the relay encodes, the client parses back; what the client encodes, the relay parses back."""

from __future__ import annotations

from dataclasses import astuple

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from relay.protocol.client import (
    RelayAuth,
    RelayClosed,
    RelayCount,
    RelayEose,
    RelayEvent,
    RelayMessageError,
    RelayNegErr,
    RelayNegMsg,
    RelayNotice,
    RelayOk,
    encode_auth_response,
    encode_close,
    encode_count_request,
    encode_neg_close,
    encode_neg_msg,
    encode_neg_open,
    encode_publish,
    encode_req,
    parse_relay_message,
)
from relay.protocol.envelopes import (
    AuthEnvelope,
    CloseEnvelope,
    CountEnvelope,
    EventEnvelope,
    NegCloseEnvelope,
    NegMsgEnvelope,
    NegOpenEnvelope,
    ReqEnvelope,
    encode_auth_challenge,
    encode_closed,
    encode_count,
    encode_eose,
    encode_event,
    encode_neg_err,
    encode_notice,
    encode_ok,
    parse_client_message,
)
from relay.protocol.filters import parse_filter
from tests.hostile.fuzzing import real_events

TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=20)  # what JSON can carry: no lone surrogates
SUB_ID = st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=64)  # NIP-01's bounds
EVENT_ID = st.binary(min_size=32, max_size=32).map(bytes.hex)
EVENTS = st.sampled_from(real_events(20))
FILTERS = st.lists(st.fixed_dictionaries({}, optional={"kinds": st.lists(st.integers(0, 65535), max_size=3),
                                                       "authors": st.lists(EVENT_ID, max_size=2),
                                                       "since": st.integers(0, 2**31), "limit": st.integers(0, 500),
                                                       "#t": st.lists(TEXT, max_size=2)}),
                   min_size=1, max_size=3)


def test_parses_each_verb():
    """Each relay message parses into its Relay* message; OK's and CLOSED's message may be left out."""
    assert parse_relay_message('["EVENT","s",{"id":"x"}]') == RelayEvent("s", {"id": "x"})
    assert parse_relay_message(b'["OK","ab",true,"duplicate: have it"]') == RelayOk("ab", True, "duplicate: have it")
    assert parse_relay_message('["OK","ab",false]') == RelayOk("ab", False, "")
    assert parse_relay_message('["EOSE","s"]') == RelayEose("s")
    assert parse_relay_message('["CLOSED","s","error: x"]') == RelayClosed("s", "error: x")
    assert parse_relay_message('["CLOSED","s"]') == RelayClosed("s", "")
    assert parse_relay_message('["NOTICE","hello"]') == RelayNotice("hello")
    assert parse_relay_message('["AUTH","challenge"]') == RelayAuth("challenge")
    assert parse_relay_message('["COUNT","c",{"count":7}]') == RelayCount("c", 7, False)
    assert parse_relay_message('["COUNT","c",{"count":7,"approximate":true}]') == RelayCount("c", 7, True)
    assert parse_relay_message('["NEG-MSG","n","61ABcd"]') == RelayNegMsg("n", b"\x61\xab\xcd")
    assert parse_relay_message('["NEG-ERR","n","closed: idle"]') == RelayNegErr("n", "closed: idle")


def test_elements_after_the_shape_are_ignored():
    """A later NIP may add elements: what follows a message's shape is not read."""
    assert parse_relay_message('["EOSE","s",1]') == RelayEose("s")
    assert parse_relay_message('["OK","ab",true,"",{"x":1}]') == RelayOk("ab", True, "")


@pytest.mark.parametrize("frame, verb, ref", [
    ("nope", "", None),
    (b"\xff", "", None),
    ("[" * 100_000 + "]" * 100_000, "", None),
    ('{"OK": 1}', "", None),
    ("[]", "", None),
    ("[1]", "", None),
    ('["HELLO","s"]', "HELLO", None),
    ('["EVENT"]', "EVENT", None),
    ('["EVENT",["s"],{}]', "EVENT", None),
    ('["EVENT","s"]', "EVENT", "s"),
    ('["OK","ab"]', "OK", "ab"),
    ('["OK","ab","true",""]', "OK", "ab"),
    ('["OK","ab",true,1]', "OK", "ab"),
    ('["EOSE"]', "EOSE", None),
    ('["CLOSED",{"sub":1},"error: x"]', "CLOSED", None),
    ('["CLOSED","s",null]', "CLOSED", "s"),
    ('["NOTICE"]', "NOTICE", None),
    ('["NOTICE",5]', "NOTICE", None),
    ('["AUTH",{"challenge":1}]', "AUTH", None),
    ('["COUNT","c",{"count":-1}]', "COUNT", "c"),
    ('["COUNT","c",{"count":true}]', "COUNT", "c"),
    ('["COUNT","c",{"count":1,"approximate":1}]', "COUNT", "c"),
    ('["COUNT","c",[1]]', "COUNT", "c"),
    ('["NEG-MSG",[1],"61"]', "NEG-MSG", None),
    ('["NEG-MSG","n","6"]', "NEG-MSG", "n"),
    ('["NEG-MSG","n","61 62"]', "NEG-MSG", "n"),
    ('["NEG-MSG","n",97]', "NEG-MSG", "n"),
    ('["NEG-ERR","n"]', "NEG-ERR", "n"),
])
def test_a_malformed_message_names_its_verb_and_reference(frame, verb, ref):
    """RelayMessageError, with the verb and the subscription or event id once they could be read."""
    with pytest.raises(RelayMessageError) as err:
        parse_relay_message(frame)
    assert (err.value.verb, err.value.ref) == (verb, ref) and str(err.value)


def test_encoders_write_nip01_json_exactly():
    """Compact JSON as orjson writes it, the event's own bytes kept as they are."""
    raw = b'{"id":"ab","kind":1}'
    assert encode_publish(raw) == b'["EVENT",{"id":"ab","kind":1}]'
    assert encode_req("s", {"kinds": [1]}, {"ids": ["ab"], "limit": 1}) == \
        b'["REQ","s",{"kinds":[1]},{"ids":["ab"],"limit":1}]'
    assert encode_close("s") == b'["CLOSE","s"]'
    assert encode_count_request("c", {"kinds": [1]}) == b'["COUNT","c",{"kinds":[1]}]'
    assert encode_auth_response({"id": "ab"}) == b'["AUTH",{"id":"ab"}]'
    assert encode_neg_open("n", {"kinds": [1]}, b"\x61\xab") == b'["NEG-OPEN","n",{"kinds":[1]},"61ab"]'
    assert encode_neg_msg("n", b"\x61\xab") == b'["NEG-MSG","n","61ab"]'
    assert encode_neg_close("n") == b'["NEG-CLOSE","n"]'
    assert encode_req("s\u00e9\n", {}) == '["REQ","s\u00e9\\n",{}]'.encode()  # UTF-8, not \u-escaped


@given(SUB_ID, EVENT_ID, st.booleans(), TEXT, EVENTS, st.integers(0, 2**63 - 1), st.binary(max_size=64))
def test_what_the_relay_encodes_the_client_parses_back(sub_id, event_id, accepted, text, event, count, neg):
    """envelopes.py's encoders, read back by parse_relay_message."""
    assert parse_relay_message(encode_event(sub_id, orjson.dumps(event))) == RelayEvent(sub_id, event)
    assert parse_relay_message(encode_ok(event_id, accepted, text)) == RelayOk(event_id, accepted, text)
    assert parse_relay_message(encode_eose(sub_id)) == RelayEose(sub_id)
    assert parse_relay_message(encode_closed(sub_id, text)) == RelayClosed(sub_id, text)
    assert parse_relay_message(encode_notice(text)) == RelayNotice(text)
    assert parse_relay_message(encode_auth_challenge(text)) == RelayAuth(text)
    assert parse_relay_message(encode_count(sub_id, count)) == RelayCount(sub_id, count, False)
    assert parse_relay_message(encode_neg_msg(sub_id, neg)) == RelayNegMsg(sub_id, neg)
    assert parse_relay_message(encode_neg_err(sub_id, text)) == RelayNegErr(sub_id, text)


@given(SUB_ID, FILTERS, EVENTS, st.binary(max_size=64))
def test_what_the_client_encodes_the_relay_parses_back(sub_id, filters, event, neg):
    """This module's encoders, read back by the relay's parse_client_message."""
    parsed = [astuple(parse_filter(f)) for f in filters]  # (a Filter equals itself only)

    def parse(frame: bytes):
        return parse_client_message(frame, max_filters=len(filters))

    assert parse(encode_publish(orjson.dumps(event))) == EventEnvelope(event)
    req, count, neg_open = (parse(encode_req(sub_id, *filters)), parse(encode_count_request(sub_id, *filters)),
                            parse(encode_neg_open(sub_id, filters[0], neg)))
    assert type(req) is ReqEnvelope and (req.sub_id, [astuple(f) for f in req.filters]) == (sub_id, parsed)
    assert type(count) is CountEnvelope and (count.sub_id, [astuple(f) for f in count.filters]) == (sub_id, parsed)
    assert type(neg_open) is NegOpenEnvelope and (neg_open.sub_id, astuple(neg_open.filter),
                                                  neg_open.initial_message) == (sub_id, parsed[0], neg)
    assert parse(encode_close(sub_id)) == CloseEnvelope(sub_id)
    assert parse(encode_auth_response(event)) == AuthEnvelope(event)
    assert parse(encode_neg_msg(sub_id, neg)) == NegMsgEnvelope(sub_id, neg)
    assert parse(encode_neg_close(sub_id)) == NegCloseEnvelope(sub_id)
