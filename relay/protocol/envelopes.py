"""Client and relay messages of NIP-01, NIP-42, NIP-45 and NIP-77: parse what comes in, encode what goes out.

Parsing turns one WebSocket text frame into an envelope; a frame that cannot
be answered in kind raises `MessageError`, whose `verb` and `ref` tell the
connection how to answer (OK for an EVENT with a readable id, CLOSED for a
REQ/COUNT with a subscription id, NEG-ERR for NEG-OPEN/NEG-MSG with one,
NOTICE otherwise).  Encoders return UTF-8
bytes ready to send as a text frame.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import orjson

from relay.protocol.event import is_hex64
from relay.protocol.filters import MAX_SEARCH_BYTES, Filter, parse_filter
from relay.protocol.rejection import Rejection

MAX_SUBSCRIPTION_ID_CHARS = 64  # NIP-01


@dataclass(frozen=True, slots=True)
class EventEnvelope:
    """`["EVENT", <event>]`: `event` is the still unvalidated JSON object."""

    event: object


@dataclass(frozen=True, slots=True)
class AuthEnvelope:
    """`["AUTH", <signed kind-22242 event>]` (NIP-42): `event` is the still unvalidated JSON object."""

    event: dict


@dataclass(frozen=True, slots=True)
class ReqEnvelope:
    """`["REQ", <sub_id>, <filter>...]` (NIP-01)."""

    sub_id: str
    filters: list[Filter]


@dataclass(frozen=True, slots=True)
class CountEnvelope:
    """`["COUNT", <sub_id>, <filter>...]` (NIP-45)."""

    sub_id: str
    filters: list[Filter]


@dataclass(frozen=True, slots=True)
class CloseEnvelope:
    """`["CLOSE", <sub_id>]` (NIP-01)."""

    sub_id: str


@dataclass(frozen=True, slots=True)
class NegOpenEnvelope:
    """`["NEG-OPEN", <sub_id>, <filter>, <initial message, hex>]` (NIP-77).

    `initial_message` is the message decoded from its hex (which must be an
    even number of 0-9a-fA-F characters); its negentropy content is not yet
    parsed.  NEG sub_ids are a namespace apart from REQ's.
    """

    sub_id: str
    filter: Filter
    initial_message: bytes


@dataclass(frozen=True, slots=True)
class NegMsgEnvelope:
    """`["NEG-MSG", <sub_id>, <message, hex>]` (NIP-77); `message` is decoded like NEG-OPEN's."""

    sub_id: str
    message: bytes


@dataclass(frozen=True, slots=True)
class NegCloseEnvelope:
    """`["NEG-CLOSE", <sub_id>]` (NIP-77)."""

    sub_id: str


NEG_VERBS = ("NEG-OPEN", "NEG-MSG", "NEG-CLOSE")


class MessageError(Rejection):
    """A message that cannot be carried out.

    `verb` is the message's verb when it could be read ("" otherwise) and
    `ref` the event id (EVENT) or subscription id (REQ, COUNT, CLOSE) to
    answer to, or None when there is none.
    """

    def __init__(self, rejection: Rejection, verb: str = "", ref: str | None = None) -> None:
        super().__init__(rejection.prefix, rejection.reason)
        self.verb = verb
        self.ref = ref


def loads(data: str | bytes) -> object:
    """Decode JSON, strictly with orjson, else with the stdlib (escaped lone surrogates, big integers).

    The fallback lets a message holding a lone surrogate or an out-of-range
    number be answered `OK false` / `CLOSED` with its id instead of a NOTICE;
    validation refuses those values afterwards.

    Raises:
        Rejection: "invalid:" when neither decoder accepts `data` ("malformed JSON", or "JSON nested too deeply").
    """
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        pass
    try:
        # Decoded strictly here: json.loads(bytes) would let UTF-8-encoded surrogates through (surrogatepass).
        return json.loads(data.decode() if isinstance(data, bytes) else data)
    except ValueError:
        raise Rejection("invalid", "malformed JSON") from None
    except RecursionError:  # past orjson's 1024 levels, the fallback's recursion
        raise Rejection("invalid", "JSON nested too deeply") from None


def _sub_id(value: object, verb: str) -> str:
    if type(value) is not str or not 0 < len(value) <= MAX_SUBSCRIPTION_ID_CHARS:
        raise MessageError(Rejection("invalid", "subscription id must be a string of 1 to 64 characters"), verb)
    if not value.isascii():
        try:
            value.encode()
        except UnicodeEncodeError:
            raise MessageError(Rejection("invalid", "subscription id is not valid UTF-8"), verb) from None
    return value


def _filters(message: list, verb: str, sub_id: str, max_filters: int, max_items: int,
             max_search_bytes: int) -> list[Filter]:
    raw = message[2:]
    if not raw:
        raise MessageError(Rejection("invalid", f"{verb} needs at least one filter"), verb, sub_id)
    if len(raw) > max_filters:
        raise MessageError(Rejection("invalid", f"too many filters (max {max_filters})"), verb, sub_id)
    try:
        return [parse_filter(f, max_items, max_search_bytes) for f in raw]
    except Rejection as exc:
        raise MessageError(exc, verb, sub_id) from None


def parse_client_message(data: str | bytes, max_filters: int, max_items: int = 10_000,
                         max_search_bytes: int = MAX_SEARCH_BYTES):
    """Parse one client frame into an Event/Auth/Req/Count/Close/Neg* envelope (NIP-01, NIP-42, NIP-45, NIP-77).

    `max_filters` bounds the filters of one REQ or COUNT; `max_items` the
    length of each list inside a filter; `max_search_bytes` a filter's NIP-50 `search`.

    Raises:
        MessageError: "invalid:" for malformed JSON, a non-array, an unknown
        verb, or wrong arguments; `verb`/`ref` say whom to answer.
    """
    try:
        message = loads(data)
    except Rejection as exc:
        raise MessageError(exc) from None
    if type(message) is not list or not message or type(message[0]) is not str:
        raise MessageError(Rejection("invalid", "message must be a JSON array starting with a verb"))
    verb = message[0]
    if verb in ("EVENT", "AUTH"):
        # An EVENT's object is validated later (parse_event); an AUTH's must at least be an object.
        if len(message) != 2 or (verb == "AUTH" and type(message[1]) is not dict):
            ref = message[1].get("id") if len(message) > 1 and type(message[1]) is dict else None
            raise MessageError(Rejection("invalid", f"{verb} takes exactly one event object"), verb,
                               ref if is_hex64(ref) else None)
        return EventEnvelope(message[1]) if verb == "EVENT" else AuthEnvelope(message[1])
    if verb in ("REQ", "COUNT"):
        sub_id = _sub_id(message[1] if len(message) > 1 else None, verb)
        filters = _filters(message, verb, sub_id, max_filters, max_items, max_search_bytes)
        return ReqEnvelope(sub_id, filters) if verb == "REQ" else CountEnvelope(sub_id, filters)
    if verb == "CLOSE":
        if len(message) != 2:
            raise MessageError(Rejection("invalid", "CLOSE takes exactly one subscription id"), verb)
        return CloseEnvelope(_sub_id(message[1], verb))
    if verb in NEG_VERBS:
        return _parse_neg(message, verb, max_items)
    raise MessageError(Rejection("invalid", f"unknown message type {verb[:32]!r}"), verb)


def decode_hex(value: object) -> bytes | None:
    """The bytes of a NIP-77 message sent as hex: `value` a string of an even number of 0-9a-fA-F characters;
    None for anything else."""
    # bytes.fromhex skips whitespace between digit pairs: the decoded length tells it apart
    if type(value) is str and value.isascii():
        try:
            decoded = bytes.fromhex(value)
        except ValueError:
            return None
        if 2 * len(decoded) == len(value):
            return decoded
    return None


def _neg_hex(value: object, verb: str, sub_id: str) -> bytes:
    decoded = decode_hex(value)
    if decoded is None:
        raise MessageError(Rejection("invalid", "negentropy message must be a hex string"), verb, sub_id)
    return decoded


def _parse_neg(message: list, verb: str, max_items: int):
    """NIP-77 NEG-OPEN / NEG-MSG / NEG-CLOSE; errors carry the sub_id once it could be read."""
    sub_id = _sub_id(message[1] if len(message) > 1 else None, verb)
    if verb == "NEG-CLOSE":
        if len(message) != 2:
            raise MessageError(Rejection("invalid", "NEG-CLOSE takes exactly one subscription id"), verb, sub_id)
        return NegCloseEnvelope(sub_id)
    if verb == "NEG-MSG":
        if len(message) != 3:
            raise MessageError(Rejection("invalid", "NEG-MSG takes a subscription id and a message"), verb, sub_id)
        return NegMsgEnvelope(sub_id, _neg_hex(message[2], verb, sub_id))
    if len(message) != 4:
        raise MessageError(Rejection("invalid", "NEG-OPEN takes a subscription id, a filter and a message"),
                           verb, sub_id)
    try:
        f = parse_filter(message[2], max_items)
    except Rejection as exc:
        raise MessageError(exc, verb, sub_id) from None
    return NegOpenEnvelope(sub_id, f, _neg_hex(message[3], verb, sub_id))


def encode_ok(event_id: str, accepted: bool, message: str = "") -> bytes:
    """`["OK", <event id>, <true|false>, <message>]` (NIP-01)."""
    return orjson.dumps(["OK", event_id, accepted, message])


def encode_auth_challenge(challenge: str) -> bytes:
    """`["AUTH", <challenge>]` (NIP-42, relay to client)."""
    return orjson.dumps(["AUTH", challenge])


def encode_event(sub_id: str, raw_event: bytes) -> bytes:
    """`["EVENT", <sub_id>, <event>]` around an already serialized event (NIP-01)."""
    return b'["EVENT",' + orjson.dumps(sub_id) + b"," + raw_event + b"]"


def encode_eose(sub_id: str) -> bytes:
    """`["EOSE", <sub_id>]` (NIP-01)."""
    return orjson.dumps(["EOSE", sub_id])


def encode_closed(sub_id: str, message: str) -> bytes:
    """`["CLOSED", <sub_id>, <prefix: reason>]` (NIP-01)."""
    return orjson.dumps(["CLOSED", sub_id, message])


def encode_notice(message: str) -> bytes:
    """`["NOTICE", <message>]` (NIP-01)."""
    return orjson.dumps(["NOTICE", message])


def encode_count(sub_id: str, count: int) -> bytes:
    """`["COUNT", <sub_id>, {"count": <n>}]` (NIP-45)."""
    return orjson.dumps(["COUNT", sub_id, {"count": count}])


def encode_neg_msg(sub_id: str, message: bytes) -> bytes:
    """`["NEG-MSG", <sub_id>, <message as lowercase hex>]` (NIP-77, either way: relay and client send the same);
    `message` is a negentropy message."""
    return orjson.dumps(["NEG-MSG", sub_id, message.hex()])


def encode_neg_err(sub_id: str, reason: str) -> bytes:
    """`["NEG-ERR", <sub_id>, <prefix: reason>]` (NIP-77, NIP-01 prefixes); the session is closed after it."""
    return orjson.dumps(["NEG-ERR", sub_id, reason])
