"""NIP-77 client messages (NEG-OPEN, NEG-MSG, NEG-CLOSE) and relay replies (NEG-MSG, NEG-ERR)."""

from __future__ import annotations

import json

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from relay.protocol.envelopes import (
    MessageError,
    NegCloseEnvelope,
    NegMsgEnvelope,
    NegOpenEnvelope,
    encode_neg_err,
    encode_neg_msg,
    parse_client_message,
)
from relay.protocol.rejection import Rejection


def test_parses_each_negentropy_verb():
    """NEG-OPEN carries one filter and a hex message, NEG-MSG a hex message (both decoded), NEG-CLOSE only the id."""
    opened = parse_client_message('["NEG-OPEN", "n", {"kinds": [1], "since": 5}, "61ABcd"]', 5)
    assert isinstance(opened, NegOpenEnvelope)
    assert (opened.sub_id, opened.initial_message) == ("n", b"\x61\xab\xcd")
    assert opened.filter.kinds == frozenset({1}) and opened.filter.since == 5
    assert parse_client_message(b'["NEG-MSG", "n", "6100"]', 5) == NegMsgEnvelope("n", b"\x61\x00")
    assert parse_client_message('["NEG-CLOSE", "n"]', 5) == NegCloseEnvelope("n")


@pytest.mark.parametrize("message, ref", [
    ('["NEG-OPEN", "n", {}, "6"]', "n"),            # odd length
    ('["NEG-OPEN", "n", {}, "6g"]', "n"),           # not hex
    ('["NEG-OPEN", "n", {}, " 61"]', "n"),          # bytes.fromhex would skip the space: refused
    ('["NEG-MSG", "n", "61 00 "]', "n"),            # spaces between pairs, even length: refused
    ('["NEG-MSG", "n", "61\\u00e9\\u00e9"]', "n"),      # not ASCII
    ('["NEG-OPEN", "n", {}, 61]', "n"),             # not a string
    ('["NEG-OPEN", "n", {"kinds": 1}, "61"]', "n"),  # bad filter
    ('["NEG-OPEN", "n", {}]', "n"),                 # no message
    ('["NEG-OPEN", "n", {}, {}, "61"]', "n"),       # two filters
    ('["NEG-MSG", "n"]', "n"),
    ('["NEG-MSG", "n", "zz"]', "n"),
    ('["NEG-CLOSE", "n", "x"]', "n"),
    ('["NEG-OPEN", 5, {}, "61"]', None),           # no readable subscription id
    ('["NEG-MSG"]', None),
])
def test_malformed_negentropy_messages_name_their_subscription(message, ref):
    """A malformed NEG-* raises MessageError "invalid:" with the verb and, when readable, the sub_id."""
    with pytest.raises(MessageError) as caught:
        parse_client_message(message, 5)
    assert caught.value.prefix == "invalid"
    assert caught.value.verb == json.loads(message)[0]
    assert caught.value.ref == ref


def test_encoders_write_lowercase_hex_and_prefixed_reasons():
    """NEG-MSG carries the message as lowercase hex; NEG-ERR the reason as given."""
    assert orjson.loads(encode_neg_msg("n", b"\x61\xab")) == ["NEG-MSG", "n", "61ab"]
    assert orjson.loads(encode_neg_err("n", "closed: idle")) == ["NEG-ERR", "n", "closed: idle"]


@given(st.lists(st.one_of(st.text(max_size=8), st.integers(), st.none(), st.dictionaries(st.text(max_size=3),
                                                                                         st.integers())),
                max_size=4),
       st.sampled_from(["NEG-OPEN", "NEG-MSG", "NEG-CLOSE"]))
def test_arbitrary_negentropy_arguments_parse_or_raise_rejection(args, verb):
    """Any arguments to a NEG-* verb either parse or raise a Rejection, never anything else."""
    try:
        parse_client_message(json.dumps([verb, *args]), 5)
    except Rejection:
        pass
