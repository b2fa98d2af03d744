"""Hand-written nasty inputs sent to a real relay over a real WebSocket.

Each case sends one hostile message (or frame sequence) and checks the first
reply: its verb and NIP-01 prefix, or the close code for what RFC 6455 says
fails the connection (1009 too big, 1007 not UTF-8).  After each case the
same connection still answers a REQ where it stays open, and a separate
healthy client publishes an event and reads it back.

Decisions: a binary frame is read like a text frame (UTF-8 JSON); a frame
that is not UTF-8 closes the connection with 1007; JSON that Python cannot
read (more than 4,300 digits in a number, nesting past the decoders' depth)
gets NOTICE "invalid:" even when it names a subscription.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import pytest
import pytest_asyncio
from websockets.exceptions import ConnectionClosed

from tests.conftest import make_config
from tests.helpers import Client, Keys
from tests.inprocess import Relay

MALLORY = Keys(0x3A11)
_EVENT = MALLORY.sign(content="hostile corpus")
_HEX = "%064x"


def _event(**changes) -> str:
    return json.dumps(["EVENT", {**_EVENT, **changes}])


def _req(*filters, sub_id: str = "s") -> str:
    return json.dumps(["REQ", sub_id, *filters])


Send = Callable[[Client], Awaitable[None]]


@dataclass(frozen=True)
class Case:
    """One nasty input: `send` it, then expect `reply` (verb, [ok flag,] message prefix) or a close `code`."""

    name: str
    send: str | bytes | Send
    reply: tuple = ()
    code: int | None = None


def _text_bytes(*fragments: bytes) -> Send:
    """A text message of raw bytes (maybe not UTF-8), fragmented as given: what `ws.send(str)` cannot produce."""
    async def send(client: Client) -> None:
        async with client.ws.send_context():
            protocol = client.ws.protocol
            protocol.send_text(fragments[0], fin=len(fragments) == 1)
            for k, fragment in enumerate(fragments[1:], 2):
                protocol.send_continuation(fragment, fin=k == len(fragments))
    return send


def _fragments(text: str, size: int) -> Send:
    async def send(client: Client) -> None:
        await client.ws.send([text[k:k + size] for k in range(0, len(text), size)])
    return send


async def _whitespace_100_mb(client: Client) -> None:
    """100 MB of whitespace as 64 KiB fragments of one message; stops once the relay has closed (1 MiB max)."""
    chunk = " " * 65_536

    async def fragments():
        yield "["
        for _ in range(100 * 2**20 // len(chunk)):
            yield chunk

    try:
        await client.ws.send(fragments())
    except ConnectionClosed:
        pass


_UTF8_EVENT = MALLORY.sign(content="naïve ☕ 𝄞")
_UTF8_BYTES = json.dumps(["EVENT", _UTF8_EVENT], ensure_ascii=False).encode()
_CLEF = _UTF8_BYTES.index("𝄞".encode())
_NUL_EVENT = MALLORY.sign(content="a\u0000b", tags=[["t", "x\u0000y"]])

NOTICE = ("NOTICE", "invalid:")
CLOSED = ("CLOSED", "invalid:")
OK_FALSE = ("OK", False, "invalid:")
CASES = [
    # Structure and depth
    Case("nesting_100k_brackets", "[" * 100_000, NOTICE),
    Case("nesting_50k_objects", '{"a":' * 50_000, NOTICE),
    Case("req_filter_nested_100k", '["REQ","s",' + "[" * 100_000, NOTICE),
    Case("tag_values_nested_900", '["REQ","s",{"#e":' + "[" * 900 + "]" * 900 + "}]", CLOSED),
    Case("not_an_array", "{}", NOTICE),
    Case("json_string", '"EVENT"', NOTICE),
    Case("numbers_array", "[1,2,3]", NOTICE),
    Case("empty_text_frame", "", NOTICE),
    Case("empty_binary_frame", b"", NOTICE),
    # Numbers where integers are expected
    Case("created_at_1e400", _event(created_at=1e400).replace("Infinity", "1e400"), OK_FALSE),
    Case("created_at_2_70", _event(created_at=2**70), OK_FALSE),
    Case("created_at_negative", _event(created_at=-1), OK_FALSE),
    Case("kind_2_70", _event(kind=2**70), ("OK", False, "invalid: kind must be an integer from 0 to 65535")),
    Case("kind_float", _event(kind=1.0), OK_FALSE),
    Case("kind_true", _event(kind=True), OK_FALSE),
    Case("kind_nan", _event(kind=float("nan")), OK_FALSE),
    Case("limit_2_70", _req({"limit": 2**70}), ("CLOSED", "invalid: limit must be an integer from 0 to 9223372036854775807")),
    Case("limit_1e400", _req({"limit": 1}).replace("1}", "1e400}"), CLOSED),
    Case("limit_true", _req({"limit": True}), CLOSED),
    Case("limit_nan", _req({"limit": float("nan")}), CLOSED),
    Case("limit_5000_digits", _req({"limit": 1}).replace("1}", "9" * 5000 + "}"), NOTICE),
    Case("since_negative", _req({"since": -1}), CLOSED),
    Case("since_2_76", _req({"since": 2**76}), ("CLOSED", "invalid: since must be an integer from 0 to 9223372036854775807")),
    Case("until_float", _req({"until": 1.5}), CLOSED),
    Case("kinds_2_70", _req({"kinds": [2**70]}), CLOSED),
    Case("kinds_float", _req({"kinds": [1.0]}), CLOSED),
    # NUL and lone surrogates
    Case("content_lone_surrogate", _event(content="\ud800"), OK_FALSE),
    Case("tag_lone_surrogate", _event(tags=[["t", "\udfff"]]), OK_FALSE),
    Case("sub_id_lone_surrogate", _req({"limit": 0}, sub_id="\ud800"), NOTICE),
    Case("close_lone_surrogate", json.dumps(["CLOSE", "\ud800"]), NOTICE),
    Case("tag_filter_lone_surrogate", _req({"#t": ["\ud800"]}), CLOSED),
    Case("sub_id_nul", _req({"limit": 0}, sub_id="a\u0000b"), ("EOSE",)),
    Case("event_with_nul", json.dumps(["EVENT", _NUL_EVENT]), ("OK", True, "")),
    # Shapes NIP-01 rules out
    Case("tag_empty", json.dumps(["EVENT", MALLORY.sign(content="empty tag", tags=[[]])]),
         ("OK", False, "invalid: a tag must hold at least one string")),
    Case("tag_filter_two_letters", _req({"#ab": ["x"]}), ("CLOSED", "invalid: a tag filter's key is # and one letter")),
    Case("tag_filter_hash_alone", _req({"#": ["x"]}), ("CLOSED", "invalid: a tag filter's key is # and one letter")),
    Case("search_ignored", _req({"search": "x", "limit": 0}), ("EOSE",)),  # NIP-50 lets a relay ignore it
    # Hex
    Case("ids_not_hex", _req({"ids": ["xyz"]}), CLOSED),
    Case("ids_uppercase", _req({"ids": ["A" * 64]}), CLOSED),
    Case("authors_63_chars", _req({"authors": ["a" * 63]}), CLOSED),
    Case("authors_65_chars", _req({"authors": ["a" * 65]}), CLOSED),
    Case("event_id_uppercase", _event(id=_EVENT["id"].upper()), OK_FALSE),  # OK echoes the id as sent
    Case("event_id_short", _event(id=_EVENT["id"][:-1]), NOTICE),
    Case("event_pubkey_uppercase", _event(pubkey=_EVENT["pubkey"].upper()), OK_FALSE),
    Case("event_sig_not_hex", _event(sig="z" * 128), OK_FALSE),
    # Size
    Case("authors_10000", _req({"authors": [_HEX % k for k in range(10_000)]}), ("EOSE",)),
    Case("authors_10001", _req({"authors": [_HEX % k for k in range(10_001)]}), CLOSED),
    Case("tag_values_10000", _req({"#t": [str(k) for k in range(10_000)]}), ("EOSE",)),
    Case("req_1000_filters", _req(*[{"kinds": [k]} for k in range(1000)]), CLOSED),
    Case("whitespace_100_mb_fragmented", _whitespace_100_mb, code=1009),
    # Frames
    Case("event_in_7_byte_fragments", _fragments(json.dumps(["EVENT", MALLORY.sign(content="in pieces")]), 7),
         ("OK", True, "")),
    Case("fragment_split_inside_utf8_char",
         _text_bytes(_UTF8_BYTES[:_CLEF + 1], _UTF8_BYTES[_CLEF + 1:_CLEF + 3], _UTF8_BYTES[_CLEF + 3:]),
         ("OK", True, "")),
    Case("binary_frame_req", _req({"limit": 0}).encode(), ("EOSE",)),
    Case("invalid_utf8_text", _text_bytes(b'["REQ","\xff",{}]'), code=1007),
    Case("surrogate_encoded_in_utf8", _text_bytes(b'["REQ","\xed\xa0\x80",{}]'), code=1007),
    Case("invalid_utf8_in_fragment", _text_bytes(b'["REQ","s",', b'{"#t":["\xc3"]}]'), code=1007),
    # Verbs and arity
    Case("unknown_verb", json.dumps(["HELLO"]), NOTICE),
    Case("auth_not_supported", json.dumps(["AUTH", "x"]), NOTICE),
    Case("lowercase_verb", json.dumps(["req", "s", {}]), NOTICE),
    Case("close_no_id", json.dumps(["CLOSE"]), NOTICE),
    Case("close_two_ids", json.dumps(["CLOSE", "a", "b"]), NOTICE),
    Case("event_two_events", json.dumps(["EVENT", _EVENT, _EVENT]), OK_FALSE),
    Case("count_no_filter", json.dumps(["COUNT", "s"]), CLOSED),
    Case("neg_msg_no_message", json.dumps(["NEG-MSG", "s"]), ("NEG-ERR", "invalid:")),
    Case("neg_open_odd_hex", json.dumps(["NEG-OPEN", "s", {}, "6"]), ("NEG-ERR", "invalid:")),
    Case("neg_open_bad_version", json.dumps(["NEG-OPEN", "s", {}, "ff"]), ("NEG-ERR", "invalid:")),
    Case("neg_open_limit_2_70", json.dumps(["NEG-OPEN", "s", {"limit": 2**70}, "61"]), ("NEG-ERR", "invalid:")),
    Case("neg_open_since_int64_max", json.dumps(["NEG-OPEN", "s", {"since": 2**63 - 1}, "6100000200"]), ("NEG-MSG",)),
    Case("neg_open_unindexed_until_0", json.dumps(["NEG-OPEN", "s", {"kinds": [1], "until": 0}, "6100000200"]),
         ("NEG-MSG",)),
    Case("neg_open_huge_varint", json.dumps(["NEG-OPEN", "s", {}, "61" + "ff" * 12 + "01"]), ("NEG-ERR", "invalid:")),
]


async def _healthy_round_trip(relay, label: str) -> None:
    """Another client publishes a new event and reads it back."""
    healthy = await Client.connect(relay.url)
    try:
        event = Keys(0x600D).sign(content=f"still serving after {label}")
        assert await healthy.publish(event) == ["OK", event["id"], True, ""]
        assert [e["id"] for e in await healthy.req("back", {"ids": [event["id"]]})] == [event["id"]]
    finally:
        await healthy.close()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def shared_relay(tmp_path_factory):
    """One relay for the whole corpus: damage left by one case shows in the next ones too."""
    relay = Relay(make_config(tmp_path_factory.mktemp("corpus")))
    await relay.start()
    yield relay
    await relay.stop()


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
async def test_nasty_input_gets_its_answer_and_the_relay_keeps_serving(shared_relay, case):
    """The case's reply (verb and prefix) or close code; then this connection (if open) and others still work."""
    client = await Client.connect(shared_relay.url)
    try:
        await _send_and_check(client, case)
    finally:
        await client.close()
    await _healthy_round_trip(shared_relay, case.name)


async def _send_and_check(client: Client, case: Case) -> None:
    if callable(case.send):
        await case.send(client)
    else:
        await client.send(case.send)
    if case.code is not None:
        with pytest.raises(ConnectionClosed):
            await client.recv()
        assert client.ws.close_code == case.code
    else:
        reply = await client.recv()
        assert reply[0] == case.reply[0], reply
        if reply[0] == "OK":
            assert reply[2] is case.reply[1], reply
        if len(case.reply) > 1:
            assert reply[-1].startswith(case.reply[-1]), reply
        assert await client.req("after", {"limit": 0}) == []


async def test_event_with_nul_comes_back_byte_for_byte(client):
    """NUL in content and tags is valid JSON: stored and served back unchanged (SQLite must not cut it)."""
    assert (await client.publish(_NUL_EVENT))[2] is True
    assert await client.req("nul", {"ids": [_NUL_EVENT["id"]]}) == [_NUL_EVENT]
    assert await client.req("tag", {"#t": ["x\u0000y"]}) == [_NUL_EVENT]
