"""Fuzz the client-message, filter and event parsers: only their documented errors may come out.

`parse_client_message` raises only `MessageError`; `parse_filter` and
`parse_event` only `Rejection`; a parsed filter compiles to SQL that SQLite
runs.  Inputs are random JSON, random bytes, and mutations of valid messages
built from real events.  Inputs that once broke a parser are kept as
`@example`s.
"""

from __future__ import annotations

import sqlite3
import time
from functools import cache

import orjson
from hypothesis import example, given
from hypothesis import strategies as st

from relay.protocol.envelopes import EventEnvelope, MessageError, NegOpenEnvelope, ReqEnvelope, parse_client_message
from relay.protocol.event import Event, EventLimits, parse_event
from relay.protocol.filters import Filter, parse_filter
from relay.protocol.rejection import Rejection
from relay.store import db
from relay.store.queries import compile_count, compile_filter, run_count, run_query
from tests.hostile.fuzzing import JSON_VALUES, NASTY_NUMBERS, dumps, examples, mutated_event, mutated_text, real_events

LIMITS = EventLimits()
_FILTER_KEYS = ("ids", "authors", "kinds", "#e", "#p", "#t", "since", "until", "limit")


@st.composite
def real_filter(draw) -> dict:
    """A filter built from a real event's fields, some of them replaced by hostile values."""
    event = draw(st.sampled_from(real_events()))
    valid = {"ids": [event["id"]], "authors": [event["pubkey"]], "kinds": [event["kind"]],
             "#e": [t[1] for t in event["tags"] if len(t) > 1][:3], "#p": [event["pubkey"]], "#t": ["nostr"],
             "since": event["created_at"] - 10, "until": event["created_at"], "limit": 10}
    keys = draw(st.lists(st.sampled_from(_FILTER_KEYS), unique=True, max_size=5))
    f = {key: valid[key] for key in keys}
    for key in draw(st.lists(st.sampled_from(_FILTER_KEYS), max_size=2)):
        f[key] = draw(NASTY_NUMBERS | JSON_VALUES | st.lists(NASTY_NUMBERS, max_size=3))
    return f


def _valid_messages() -> st.SearchStrategy[list]:
    sub_id = st.text(min_size=1, max_size=8)
    hex_msg = st.binary(max_size=40).map(bytes.hex)
    return st.one_of(
        st.builds(lambda e: ["EVENT", e], st.sampled_from(real_events())),
        st.builds(lambda s, fs: ["REQ", s, *fs], sub_id, st.lists(real_filter(), min_size=1, max_size=3)),
        st.builds(lambda s, fs: ["COUNT", s, *fs], sub_id, st.lists(real_filter(), min_size=1, max_size=3)),
        st.builds(lambda s: ["CLOSE", s], sub_id),
        st.builds(lambda s, f, m: ["NEG-OPEN", s, f, "61" + m], sub_id, real_filter(), hex_msg),
        st.builds(lambda s, m: ["NEG-MSG", s, "61" + m], sub_id, hex_msg),
        st.builds(lambda s: ["NEG-CLOSE", s], sub_id),
    )


FRAMES = st.one_of(
    _valid_messages().map(dumps),
    mutated_text(_valid_messages().map(dumps)),
    st.lists(JSON_VALUES, max_size=4).map(lambda items: dumps([*items])),
    st.builds(lambda verb, rest: dumps([verb, *rest]),
              st.sampled_from(["EVENT", "REQ", "COUNT", "CLOSE", "NEG-OPEN", "NEG-MSG", "NEG-CLOSE", "AUTH"]),
              st.lists(JSON_VALUES, max_size=4)),
    st.builds(lambda e: dumps(["EVENT", e]), mutated_event()),
    JSON_VALUES.map(dumps),
)
"""Client frames as text: valid, mutated, and random."""


@cache
def _database() -> sqlite3.Connection:
    conn = sqlite3.connect(":memory:", isolation_level=None)
    db.migrate(conn)
    return conn


def _check_filter_runs(f: Filter) -> None:
    """The filter compiles to SQL that SQLite accepts (its bound values fit SQLite's types)."""
    now = int(time.time())
    run_query(_database(), [compile_filter(f, 5, now)])
    run_count(_database(), [compile_count(f, now)])


def _parse_fully(frame: str | bytes) -> None:
    try:
        envelope = parse_client_message(frame, max_filters=5, max_items=50)
    except MessageError as err:
        assert err.prefix == "invalid" and err.reason
        return
    if isinstance(frame, bytes):
        frame.decode()  # only UTF-8 frames make envelopes
    if type(envelope) is EventEnvelope:
        try:
            event = parse_event(envelope.event, LIMITS, time.time())
        except Rejection as rejection:
            assert rejection.prefix == "invalid"
        else:
            assert type(event) is Event and event.raw.decode()
    elif type(envelope) is ReqEnvelope:
        for f in envelope.filters:
            _check_filter_runs(f)
    elif type(envelope) is NegOpenEnvelope:  # the bytes are exactly the hex the client sent
        assert envelope.initial_message.hex() == orjson.loads(frame)[3].lower()


@examples(100)
@given(FRAMES)
@example("[" * 100_000)
@example('["REQ","s",{"limit":' + "9" * 5000 + "}]")
@example('["REQ","s",{"since":1e400}]')
@example('["EVENT",{"id":NaN}]')
@example(b'["REQ","\xff",{}]')
@example(b'["EVENT",{"content":"\xed\xa0\x80"}]')  # a UTF-8-encoded surrogate: not UTF-8, no envelope
def test_fuzz_client_messages_raise_only_message_error(frame):
    """Any text frame parses into an envelope or raises MessageError "invalid:"; events and filters within too."""
    _parse_fully(frame)


@examples(200)
@given(st.binary(max_size=200))
def test_fuzz_binary_frames_raise_only_message_error(frame):
    """Any bytes (invalid UTF-8 included) parse or raise MessageError."""
    _parse_fully(frame)


@examples(100)
@given(real_filter() | JSON_VALUES)
def test_fuzz_filters_raise_only_rejection(obj):
    """parse_filter returns a Filter whose SQL runs, or raises Rejection "invalid:"."""
    try:
        f = parse_filter(obj, max_items=50)
    except Rejection as rejection:
        assert rejection.prefix == "invalid"
        return
    assert type(f) is Filter
    _check_filter_runs(f)


@examples(100)
@given(mutated_event() | JSON_VALUES)
def test_fuzz_events_raise_only_rejection(obj):
    """parse_event returns an Event or raises Rejection "invalid:", whatever the object."""
    try:
        event = parse_event(obj, LIMITS, time.time())
    except Rejection as rejection:
        assert rejection.prefix == "invalid"
    else:
        assert event.id == obj["id"]
