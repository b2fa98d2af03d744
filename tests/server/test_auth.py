"""NIP-42 AUTH, write rules, kind rules and private kinds, through the real server.

The private kinds (4 and 1059 by default) must never reach a connection that
is neither their author nor a `p`-tagged recipient: not by REQ (stored or
live), COUNT, nor NEG-OPEN (checked with our own negentropy engine).
"""

from __future__ import annotations

import asyncio
import time

import orjson
from websockets.frames import Frame, Opcode

from relay.protocol.negentropy import Negentropy, SortedVector
from tests.helpers import Client, Keys, raw_websocket
from tests.inprocess import Relay
from tests.served import nip11

NOW = int(time.time())


async def connect(relay: Relay) -> Client:
    """A client whose first frame, the relay's challenge (sent on connect), is read into `client.challenge`."""
    client = await Client.connect(relay.url)
    first = orjson.loads(await asyncio.wait_for(client.ws.recv(), 5))
    assert first[0] == "AUTH" and type(first[1]) is str and len(first[1]) >= 16, first
    client.challenge = first[1]
    return client


def auth_event(keys: Keys, relay_url: str, challenge: str, created_at: int | None = None,
               kind: int = 22242) -> dict:
    return keys.sign(kind=kind, tags=[["relay", relay_url], ["challenge", challenge]], created_at=created_at)


async def authenticate(client: Client, keys: Keys, relay_url: str) -> list:
    """Send AUTH for `keys` and return the OK reply."""
    event = auth_event(keys, relay_url, client.challenge)
    await client.send(["AUTH", event])
    return await _ok(client, event["id"])


async def _ok(client: Client, event_id: str) -> list:
    while True:
        reply = await client.recv()
        if reply[0] == "OK" and reply[1] == event_id:
            return reply


async def closed_or_events(client: Client, verb: str, sub_id: str, *filters: dict):
    """Send REQ or COUNT; return ("CLOSED", message), ("EVENTS", [events]) or ("COUNT", n).

    A REQ stays open for live events only when `sub_id` is "live".
    """
    await client.send([verb, sub_id, *filters])
    events = []
    while True:
        reply = await client.recv()
        if reply[0] == "CLOSED" and reply[1] == sub_id:
            return "CLOSED", reply[2]
        if reply[0] == "COUNT" and reply[1] == sub_id:
            return "COUNT", reply[2]["count"]
        if reply[0] == "EVENT" and reply[1] == sub_id:
            events.append(reply[2])
        if reply[0] == "EOSE" and reply[1] == sub_id:
            if sub_id != "live":
                await client.send(["CLOSE", sub_id])
            return "EVENTS", events


async def neg_need(client: Client, sub_id: str, filter_obj: dict) -> set[str] | str:
    """Reconcile an empty local set with the relay (our NIP-77 engine): the ids it offers, or the NEG-ERR text."""
    neg = Negentropy(SortedVector.from_items([]), 0)
    await client.send(["NEG-OPEN", sub_id, filter_obj, neg.initiate().hex()])
    need: set[str] = set()
    while True:
        reply = await client.recv()
        if reply[0] == "NEG-ERR":
            return reply[2]
        assert reply[0] == "NEG-MSG", reply
        next_msg, _, needed = neg.reconcile_with_ids(bytes.fromhex(reply[2]))
        need |= {i.hex() for i in needed}
        if next_msg is None:
            await client.send(["NEG-CLOSE", sub_id])
            return need
        await client.send(["NEG-MSG", sub_id, next_msg.hex()])


# --- AUTH itself -------------------------------------------------------------------------------------------


async def test_auth_accepted_and_each_bad_auth_refused_with_invalid(start, alice, bob):
    """A challenge comes on connect; wrong challenge, wrong relay, stale, future, bad signature and wrong kind are
    each refused with OK false "invalid:", and the connection still authenticates two pubkeys afterwards."""
    relay = await start()
    client = await connect(relay)
    url, ch = relay.url, client.challenge
    bad_sig = auth_event(alice, url, ch)
    bad_sig["sig"] = auth_event(bob, url, ch)["sig"]
    cases = {
        "does not answer this connection's challenge": auth_event(alice, url, "not-the-challenge"),
        "relay tag does not name this relay": auth_event(alice, "ws://other.example:1234", ch),
        "more than 600 seconds from now": auth_event(alice, url, ch, created_at=NOW - 700),
        "too far in the future": auth_event(alice, url, ch, created_at=NOW + 3600),
        "bad signature": bad_sig,
        "must be of kind 22242": auth_event(alice, url, ch, kind=22243),
    }
    for reason, event in cases.items():
        await client.send(["AUTH", event])
        ok = await _ok(client, event["id"])
        assert ok[2] is False and ok[3].startswith("invalid: ") and reason in ok[3], (reason, ok)
    await client.send(["AUTH", "not an event"])
    assert (await client.recv())[0] == "NOTICE"
    # Lenient URL match: other scheme, default-less port, trailing slash.
    lenient = auth_event(alice, url.replace("ws://", "wss://") + "/", ch)
    await client.send(["AUTH", lenient])
    assert await _ok(client, lenient["id"]) == ["OK", lenient["id"], True, ""]
    assert (await authenticate(client, bob, url))[2] is True
    await client.close()


async def test_configured_relay_url_is_the_one_the_relay_tag_must_name(start, alice):
    """With `server.public_url`, the tag must name that URL (any trailing slash), not the address connected to."""
    relay = await start(server={"public_url": "wss://Relay.Example.com"})
    client = await connect(relay)
    assert (await authenticate(client, alice, relay.url))[2] is False
    assert (await authenticate(client, alice, "wss://relay.example.com:443/"))[2] is True
    await client.close()


async def test_auth_kind_is_never_accepted_as_an_event(start, alice):
    """A kind-22242 EVENT is refused (NIP-42: AUTH events are never broadcast)."""
    relay = await start()
    client = await connect(relay)
    ok = await client.publish(auth_event(alice, relay.url, client.challenge))
    assert ok[2] is False and ok[3].startswith("invalid: kind 22242")
    await client.close()


async def test_auth_kind_as_an_event_is_refused_before_its_signature_is_checked(start, alice):
    """A kind-22242 EVENT with a bad signature gets the kind refusal, not "invalid: bad signature": it is refused
    before the signature check, the costliest step (any relay would refuse it anyway)."""
    relay = await start()
    client = await connect(relay)
    event = auth_event(alice, relay.url, client.challenge)
    event["sig"] = ("0" if event["sig"][0] != "0" else "1") + event["sig"][1:]
    ok = await client.publish(event)
    assert ok[2] is False and ok[3] == "invalid: kind 22242 is sent with AUTH, not EVENT (NIP-42)"
    await client.close()


# --- write rules -------------------------------------------------------------------------------------------


async def test_listed_writers_and_authenticated_listed_users(start, alice, bob):
    """write = listed: a listed author publishes without AUTH; others get auth-required:, then restricted: once
    authenticated as an unlisted key; a connection authenticated as a listed key may publish anyone's event."""
    relay = await start(auth={"write": "listed", "write_pubkeys": [alice.pubkey]})
    client = await connect(relay)
    assert (await client.publish(alice.sign(content="listed")))[2] is True
    ok = await client.publish(bob.sign(content="unlisted"))
    assert ok[2] is False and ok[3].startswith("auth-required: ")
    assert (await authenticate(client, bob, relay.url))[2] is True
    ok = await client.publish(bob.sign(content="unlisted, authenticated"))
    assert ok[2] is False and ok[3].startswith("restricted: ")
    assert (await authenticate(client, alice, relay.url))[2] is True
    assert (await client.publish(bob.sign(content="brought by alice")))[2] is True
    await client.close()


async def test_authenticated_writes_and_kind_rules(start, alice, bob):
    """write = authenticated needs AUTH first; allow_kinds / deny_kinds refuse other kinds with blocked:."""
    relay = await start(auth={"write": "authenticated", "allow_kinds": [1, 7], "deny_kinds": [7]})
    client = await connect(relay)
    ok = await client.publish(alice.sign(content="before auth"))
    assert ok[2] is False and ok[3].startswith("auth-required: ")
    assert (await authenticate(client, bob, relay.url))[2] is True
    assert (await client.publish(alice.sign(content="after auth")))[2] is True
    for kind in (7, 30023):
        ok = await client.publish(alice.sign(kind=kind, tags=[["d", "x"]]))
        assert ok == ["OK", ok[1], False, f"blocked: kind {kind} is not accepted here"]
    await client.close()


async def test_nip11_reflects_auth_config(start):
    """NIP-11 lists 42; auth_required and restricted_writes follow [auth]."""
    open_doc = await nip11(await start("open"))
    closed_doc = await nip11(await start("closed", auth={"write": "authenticated"}))
    assert 42 in open_doc["supported_nips"]
    assert (open_doc["limitation"]["auth_required"], open_doc["limitation"]["restricted_writes"]) == (False, False)
    assert (closed_doc["limitation"]["auth_required"], closed_doc["limitation"]["restricted_writes"]) == (True, True)


# --- private kinds -----------------------------------------------------------------------------------------


async def test_private_kinds_only_reach_their_author_or_recipient(start, alice, bob):
    """Kinds 4 and 1059 are hidden from REQ, COUNT and NEG-OPEN of others (CLOSED / NEG-ERR auth-required: when
    named unauthenticated), and served to their author and `p`-tagged recipient, stored and live."""
    carol = Keys(0xCA201)
    relay = await start()
    public = alice.sign(content="public", created_at=NOW - 10)
    dm = alice.sign(kind=4, content="to bob", tags=[["p", bob.pubkey]], created_at=NOW - 9)
    wrap = bob.sign(kind=1059, content="to carol", tags=[["p", carol.pubkey]], created_at=NOW - 8)
    writer = await connect(relay)
    for e in (public, dm, wrap):
        assert (await writer.publish(e))[2] is True

    stranger = await connect(relay)
    for verb in ("REQ", "COUNT"):
        kind, message = await closed_or_events(stranger, verb, "dm", {"kinds": [1, 4]})
        assert kind == "CLOSED" and message.startswith("auth-required: "), message
    assert await closed_or_events(stranger, "REQ", "all", {}) == ("EVENTS", [public])
    assert await closed_or_events(stranger, "COUNT", "n", {"authors": [alice.pubkey, bob.pubkey]}) == ("COUNT", 1)
    assert (await neg_need(stranger, "neg-dm", {"kinds": [4]})).startswith("auth-required: ")
    assert await neg_need(stranger, "neg", {}) == {public["id"]}

    assert (await authenticate(stranger, carol, relay.url))[2] is True
    assert await closed_or_events(stranger, "REQ", "dm", {"kinds": [4, 1059]}) == ("EVENTS", [wrap])
    assert await neg_need(stranger, "neg", {}) == {public["id"], wrap["id"]}

    reader = await connect(relay)
    assert (await authenticate(reader, bob, relay.url))[2] is True  # bob: recipient of dm, author of wrap
    assert await closed_or_events(reader, "COUNT", "n", {"kinds": [4, 1059]}) == ("COUNT", 2)
    assert await neg_need(reader, "neg", {"since": NOW - 9}) == {dm["id"], wrap["id"]}

    # Live: the stranger (now carol) and bob both subscribe to everything; a new DM to bob reaches bob only.
    for client in (stranger, reader):
        assert await closed_or_events(client, "REQ", "live", {"since": NOW - 5}) == ("EVENTS", [])
    new_dm = alice.sign(kind=4, content="again", tags=[["p", bob.pubkey]], created_at=NOW - 4)
    after = alice.sign(content="after the dm", created_at=NOW - 3)
    for e in (new_dm, after):
        assert (await writer.publish(e))[2] is True
    assert await reader.recv() == ["EVENT", "live", new_dm]
    assert await reader.recv() == ["EVENT", "live", after]
    assert await stranger.recv() == ["EVENT", "live", after]  # the DM never came before it
    for client in (writer, stranger, reader):
        await client.close()


async def test_without_challenge_on_connect_the_first_auth_required_brings_it(start, alice):
    """challenge_on_connect = false: nothing on connect; an auth-required: answer comes with the challenge."""
    relay = await start(auth={"challenge_on_connect": False})
    client = await Client.connect(relay.url)
    await client.send(["COUNT", "n", {}])
    assert orjson.loads(await asyncio.wait_for(client.ws.recv(), 5)) == ["COUNT", "n", {"count": 0}]
    kind, message = await closed_or_events(client, "REQ", "dm", {"kinds": [4]})
    assert kind == "CLOSED" and message.startswith("auth-required: ")
    while not client.challenge:  # the challenge travels in the send queue, maybe after the CLOSED
        await client.send(["COUNT", "n", {}])
        await client.recv()
    assert (await authenticate(client, alice, relay.url))[2] is True
    assert await closed_or_events(client, "REQ", "dm", {"kinds": [4]}) == ("EVENTS", [])
    await client.close()


async def _read_json_frame(reader: asyncio.StreamReader) -> list:
    """One unmasked text frame from the relay on a `raw_websocket` connection, decoded."""
    head = await asyncio.wait_for(reader.readexactly(2), 5)
    size = head[1] & 0x7F
    if size >= 126:
        size = int.from_bytes(await reader.readexactly(2 if size == 126 else 8), "big")
    return orjson.loads(await reader.readexactly(size))


async def test_replies_keep_the_order_of_decisions_when_an_event_and_auth_come_together(start, alice):
    """A client that sends an EVENT and, in the same TCP write, its AUTH: the EVENT is refused "auth-required:"
    (it came first) and its OK is written before the AUTH's OK, never after.  nostr-sdk waits for an
    "authenticated" notice after an "auth-required:" OK and then resends; an AUTH OK that overtook the
    refusal was consumed before it waited, so it timed out (seen with worker processes)."""
    relay = await start(auth={"write": "authenticated"})
    reader, writer = await raw_websocket(relay.port)
    try:
        challenge = await _read_json_frame(reader)
        assert challenge[0] == "AUTH", challenge
        event, auth = alice.sign(content="pipelined"), auth_event(alice, "ws://relay", challenge[1])  # raw_websocket sends Host: relay
        writer.write(b"".join(Frame(Opcode.TEXT, orjson.dumps(message)).serialize(mask=True, extensions=[])
                              for message in (["EVENT", event], ["AUTH", auth])))
        first, second = await _read_json_frame(reader), await _read_json_frame(reader)
        assert first[:3] == ["OK", event["id"], False] and first[3].startswith("auth-required: "), first
        assert second == ["OK", auth["id"], True, ""], second
    finally:
        writer.close()
