"""Fuzz the client's parser of relay messages (relay/protocol/client.py): a hostile peer's frames.

`parse_relay_message` returns a `Relay*` message whose fields have their
documented types, or raises `RelayMessageError`; nothing else, for any text or
bytes.  Inputs are random JSON, random bytes, and mutations of the messages the
relay's own encoders write.
"""

from __future__ import annotations

import orjson
from hypothesis import example, given
from hypothesis import strategies as st

from relay.protocol import envelopes
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
    parse_relay_message,
)
from tests.hostile.fuzzing import JSON_VALUES, NASTY_NUMBERS, dumps, examples, mutated_text, real_events

VERBS = ["EVENT", "OK", "EOSE", "CLOSED", "NOTICE", "AUTH", "COUNT", "NEG-MSG", "NEG-ERR"]
FIELDS = {  # each message's fields and their types
    RelayEvent: {"sub_id": str, "event": object},
    RelayOk: {"event_id": str, "accepted": bool, "message": str},
    RelayEose: {"sub_id": str},
    RelayClosed: {"sub_id": str, "message": str},
    RelayNotice: {"message": str},
    RelayAuth: {"challenge": str},
    RelayCount: {"sub_id": str, "count": int, "approximate": bool},
    RelayNegMsg: {"sub_id": str, "message": bytes},
    RelayNegErr: {"sub_id": str, "reason": str},
}


def _valid_messages() -> st.SearchStrategy[str]:
    """What a relay sends, written by the relay's own encoders (as text)."""
    text = st.text(max_size=12)
    return st.one_of(
        st.builds(lambda s, e: envelopes.encode_event(s, orjson.dumps(e)), text, st.sampled_from(real_events())),
        st.builds(envelopes.encode_ok, st.sampled_from([e["id"] for e in real_events(10)]), st.booleans(), text),
        st.builds(envelopes.encode_eose, text),
        st.builds(envelopes.encode_closed, text, text),
        st.builds(envelopes.encode_notice, text),
        st.builds(envelopes.encode_auth_challenge, text),
        st.builds(envelopes.encode_count, text, st.integers(0, 2**63 - 1)),
        st.builds(envelopes.encode_neg_msg, text, st.binary(max_size=40)),
        st.builds(envelopes.encode_neg_err, text, text),
    ).map(bytes.decode)


FRAMES = st.one_of(
    _valid_messages(),
    mutated_text(_valid_messages()),
    st.lists(JSON_VALUES, max_size=4).map(lambda items: dumps([*items])),
    st.builds(lambda verb, rest: dumps([verb, *rest]), st.sampled_from(VERBS),
              st.lists(JSON_VALUES | NASTY_NUMBERS, max_size=4)),
    st.builds(lambda s, result: dumps(["COUNT", s, result]), st.text(max_size=4),
              st.dictionaries(st.sampled_from(["count", "approximate"]), JSON_VALUES | NASTY_NUMBERS)),
    JSON_VALUES.map(dumps),
)
"""Relay frames as text: valid, mutated, and random."""


def _parse(frame: str | bytes) -> None:
    try:
        message = parse_relay_message(frame)
    except RelayMessageError as err:
        assert str(err) and type(err.verb) is str and (err.ref is None or type(err.ref) is str)
        return
    assert type(message) in FIELDS, message
    for name, kind in FIELDS[type(message)].items():
        assert kind is object or type(getattr(message, name)) is kind, (name, message)
    if isinstance(frame, bytes):
        frame.decode()  # only UTF-8 frames make messages


@examples(200)
@given(FRAMES)
@example("[" * 100_000)
@example('["COUNT","c",{"count":' + "9" * 5000 + "}]")
@example('["OK","ab",NaN]')
@example('["NEG-MSG","n","\\ud800"]')
@example(b'["NOTICE","\xed\xa0\x80"]')  # a UTF-8-encoded surrogate: not UTF-8, no message
def test_fuzz_relay_messages_raise_only_relay_message_error(frame):
    """Any text frame parses into a Relay* message with fields of their types, or raises RelayMessageError."""
    _parse(frame)


@examples(200)
@given(st.binary(max_size=200) | FRAMES.map(lambda text: text.encode("utf-8", "surrogatepass")))
def test_fuzz_binary_relay_frames_raise_only_relay_message_error(frame):
    """Any bytes (invalid UTF-8 included) parse or raise RelayMessageError."""
    _parse(frame)
