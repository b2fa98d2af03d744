"""A client's side of NIP-01, NIP-42, NIP-45 and NIP-77: parse what a relay sends, encode what a client sends.

The relay's side is envelopes.py (parse what a client sends, encode what a relay
sends); this module is its mirror, used where this relay is a client of another
(relay/sync/peer.py).  The tests read envelopes.py's encoders back with
`parse_relay_message`, and this module's encoders with `parse_client_message`.

`parse_relay_message` turns one frame into a `RelayMessage` or raises
`RelayMessageError`, and nothing else, whatever the input.  Each element a
message's shape names must be there with its type, except the message of `OK`
and `CLOSED`, which older relays leave out ("" then); elements after those are
ignored.  Encoders return UTF-8 JSON ready to send as one text frame, as orjson
writes it (no white space).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import orjson

from relay.protocol.envelopes import decode_hex, encode_neg_msg

__all__ = [
    "RelayAuth", "RelayClosed", "RelayCount", "RelayEose", "RelayEvent", "RelayMessage", "RelayMessageError",
    "RelayNegErr", "RelayNegMsg", "RelayNotice", "RelayOk", "encode_auth_response", "encode_close",
    "encode_count_request", "encode_neg_close", "encode_neg_msg", "encode_neg_open", "encode_publish", "encode_req",
    "parse_relay_message",
]


# --- what a relay sends ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RelayEvent:
    """`["EVENT", <sub_id>, <event>]` (NIP-01): an event of subscription `sub_id`; `event` is the JSON value as
    sent, not validated (any JSON value: ingest validates it)."""

    sub_id: str
    event: object


@dataclass(frozen=True, slots=True)
class RelayOk:
    """`["OK", <event id>, <true|false>, <message>]` (NIP-01): the answer to an EVENT or an AUTH; `message` is
    "" when the relay left it out."""

    event_id: str
    accepted: bool
    message: str


@dataclass(frozen=True, slots=True)
class RelayEose:
    """`["EOSE", <sub_id>]` (NIP-01): the stored events of `sub_id` have all been sent."""

    sub_id: str


@dataclass(frozen=True, slots=True)
class RelayClosed:
    """`["CLOSED", <sub_id>, <prefix: reason>]` (NIP-01): the relay ended or refused `sub_id`; `message` is ""
    when the relay left it out."""

    sub_id: str
    message: str


@dataclass(frozen=True, slots=True)
class RelayNotice:
    """`["NOTICE", <message>]` (NIP-01)."""

    message: str


@dataclass(frozen=True, slots=True)
class RelayAuth:
    """`["AUTH", <challenge>]` (NIP-42, relay to client): answer with `encode_auth_response`."""

    challenge: str


@dataclass(frozen=True, slots=True)
class RelayCount:
    """`["COUNT", <sub_id>, {"count": <n>, "approximate": <bool>?}]` (NIP-45); `approximate` is False when left
    out."""

    sub_id: str
    count: int
    approximate: bool


@dataclass(frozen=True, slots=True)
class RelayNegMsg:
    """`["NEG-MSG", <sub_id>, <message, hex>]` (NIP-77): `message` decoded from its hex, its negentropy content
    not yet read."""

    sub_id: str
    message: bytes


@dataclass(frozen=True, slots=True)
class RelayNegErr:
    """`["NEG-ERR", <sub_id>, <prefix: reason>]` (NIP-77): the relay closed the negentropy session `sub_id`."""

    sub_id: str
    reason: str


RelayMessage = (RelayEvent | RelayOk | RelayEose | RelayClosed | RelayNotice | RelayAuth | RelayCount | RelayNegMsg
                | RelayNegErr)


class RelayMessageError(ValueError):
    """A frame from a relay that is not one of the messages above; `str()` says why.

    `verb` is the message's verb when it could be read ("" otherwise), and `ref`
    its subscription id (its event id for `OK`) when that could be read, else None:
    a client can fail the request the message was meant for.
    """

    def __init__(self, reason: str, verb: str = "", ref: str | None = None) -> None:
        super().__init__(reason)
        self.verb = verb
        self.ref = ref


def parse_relay_message(data: str | bytes) -> RelayMessage:
    """Parse one frame a relay sent (NIP-01 `EVENT`, `OK`, `EOSE`, `CLOSED`, `NOTICE`; NIP-42 `AUTH`; NIP-45
    `COUNT`; NIP-77 `NEG-MSG`, `NEG-ERR`) into its `Relay*` message.

    Raises:
        RelayMessageError: not JSON (or not UTF-8), not an array beginning with a string, an unknown verb, or
        an element missing or of the wrong type; `verb` and `ref` say what it was meant for.
    """
    try:
        message = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise RelayMessageError("malformed JSON") from None
    if type(message) is not list or not message or type(message[0]) is not str:
        raise RelayMessageError("message must be a JSON array starting with a verb")
    parse = _PARSERS.get(message[0])
    if parse is None:
        raise RelayMessageError(f"unknown message type {message[0][:32]!r}", message[0])
    return parse(_Elements(message))


class _Elements:
    """One relay message's elements, read in order; each failed read raises `RelayMessageError` naming the verb
    and, once read, the message's reference (`ref`)."""

    __slots__ = ("message", "verb", "ref")

    def __init__(self, message: list) -> None:
        self.message = message
        self.verb: str = message[0]
        self.ref: str | None = None

    def error(self, reason: str) -> RelayMessageError:
        return RelayMessageError(f"{self.verb} {reason}", self.verb, self.ref)

    def value(self, index: int, what: str) -> object:
        if len(self.message) <= index:
            raise self.error(f"lacks {what}")
        return self.message[index]

    def string(self, index: int, what: str) -> str:
        value = self.value(index, what)
        if type(value) is not str:
            raise self.error(f"{what} must be a string")
        return value

    def reference(self, what: str) -> str:
        """Element 1, the subscription id or event id the message is about (then in errors' `ref`)."""
        self.ref = self.string(1, what)
        return self.ref

    def optional_string(self, index: int, what: str) -> str:
        return self.string(index, what) if len(self.message) > index else ""


def _event(m: _Elements) -> RelayEvent:
    return RelayEvent(m.reference("a subscription id"), m.value(2, "an event"))


def _ok(m: _Elements) -> RelayOk:
    event_id = m.reference("an event id")
    accepted = m.value(2, "true or false")
    if type(accepted) is not bool:
        raise m.error("acceptance must be true or false")
    return RelayOk(event_id, accepted, m.optional_string(3, "a message"))


def _count(m: _Elements) -> RelayCount:
    sub_id = m.reference("a subscription id")
    result = m.value(2, "a result object")
    count = result.get("count") if type(result) is dict else None
    approximate = result.get("approximate", False) if type(result) is dict else None
    if type(count) is not int or count < 0 or type(approximate) is not bool:
        raise m.error('result must be {"count": <non-negative integer>, "approximate": <true|false>?}')
    return RelayCount(sub_id, count, approximate)


def _neg_msg(m: _Elements) -> RelayNegMsg:
    sub_id = m.reference("a subscription id")
    message = decode_hex(m.value(2, "a message"))
    if message is None:
        raise m.error("message must be a hex string")
    return RelayNegMsg(sub_id, message)


_PARSERS: dict[str, Callable[[_Elements], RelayMessage]] = {
    "EVENT": _event,
    "OK": _ok,
    "EOSE": lambda m: RelayEose(m.reference("a subscription id")),
    "CLOSED": lambda m: RelayClosed(m.reference("a subscription id"), m.optional_string(2, "a message")),
    "NOTICE": lambda m: RelayNotice(m.string(1, "a message")),
    "AUTH": lambda m: RelayAuth(m.string(1, "a challenge")),
    "COUNT": _count,
    "NEG-MSG": _neg_msg,
    "NEG-ERR": lambda m: RelayNegErr(m.reference("a subscription id"), m.string(2, "a reason")),
}


# --- what a client sends (NEG-MSG is the same both ways: envelopes.encode_neg_msg) ------------------------


def encode_publish(raw_event: bytes) -> bytes:
    """`["EVENT", <event>]` (NIP-01, client to relay) around an already serialized event."""
    return b'["EVENT",' + raw_event + b"]"


def encode_req(sub_id: str, *filters: dict) -> bytes:
    """`["REQ", <sub_id>, <filter>...]` (NIP-01); each filter a JSON object."""
    return orjson.dumps(["REQ", sub_id, *filters])


def encode_close(sub_id: str) -> bytes:
    """`["CLOSE", <sub_id>]` (NIP-01)."""
    return orjson.dumps(["CLOSE", sub_id])


def encode_count_request(sub_id: str, *filters: dict) -> bytes:
    """`["COUNT", <sub_id>, <filter>...]` (NIP-45, client to relay; the relay's answer is `RelayCount`)."""
    return orjson.dumps(["COUNT", sub_id, *filters])


def encode_auth_response(event: dict) -> bytes:
    """`["AUTH", <signed kind-22242 event>]` (NIP-42, client to relay; the challenge came as `RelayAuth`)."""
    return orjson.dumps(["AUTH", event])


def encode_neg_open(sub_id: str, filter_obj: dict, message: bytes) -> bytes:
    """`["NEG-OPEN", <sub_id>, <filter>, <initial message as lowercase hex>]` (NIP-77)."""
    return orjson.dumps(["NEG-OPEN", sub_id, filter_obj, message.hex()])


def encode_neg_close(sub_id: str) -> bytes:
    """`["NEG-CLOSE", <sub_id>]` (NIP-77)."""
    return orjson.dumps(["NEG-CLOSE", sub_id])
