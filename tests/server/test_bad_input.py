"""Bad input gets the right NIP-01 reply with the right prefix, and the relay keeps serving."""

from __future__ import annotations

import asyncio

import pytest
import structlog.testing
import websockets

from tests.conftest import make_config
from tests.helpers import Client
from tests.inprocess import Relay


@pytest.mark.parametrize(
    "frame, reply_kind",
    [
        ("not json", "NOTICE"),
        ("{}", "NOTICE"),
        ("[]", "NOTICE"),
        ('["HELLO"]', "NOTICE"),
        ("[1, 2]", "NOTICE"),
        ('["EVENT"]', "NOTICE"),
        ('["EVENT", 5]', "NOTICE"),
        ('["REQ"]', "NOTICE"),
        ('["REQ", 7, {}]', "NOTICE"),
        ('["REQ", "' + "x" * 65 + '", {}]', "NOTICE"),
        ('["CLOSE"]', "NOTICE"),
        ('["REQ", "s"]', "CLOSED"),
        ('["REQ", "s", 5]', "CLOSED"),
        ('["REQ", "s", {"kinds": ["1"]}]', "CLOSED"),
        ('["REQ", "s", {"kinds": [1.5]}]', "CLOSED"),
        ('["REQ", "s", {"authors": ["ABC"]}]', "CLOSED"),
        ('["REQ", "s", {"ids": ["' + "A" * 64 + '"]}]', "CLOSED"),
        ('["REQ", "s", {"since": true}]', "CLOSED"),
        ('["REQ", "s", {"limit": -1}]', "CLOSED"),
        ('["REQ", "s", {"#e": [1]}]', "CLOSED"),
        ('["REQ", "s", {"#e": ["\\ud800"]}]', "CLOSED"),
        ('["COUNT", "s", {"kinds": "x"}]', "CLOSED"),
    ],
)
async def test_malformed_messages_get_invalid_prefix(client, frame, reply_kind):
    """Each malformed message is answered with NOTICE or CLOSED carrying "invalid:"; the socket stays open."""
    await client.send(frame)
    reply = await client.recv()
    assert reply[0] == reply_kind
    assert reply[-1].startswith("invalid:")
    assert await client.req("after", {"limit": 0}) == []


def _tamper(event: dict, **changes) -> dict:
    return {**event, **changes}


async def test_bad_events_get_ok_false_invalid(client, alice):
    """Wrong types, bad hex, a wrong id or signature each get OK false with "invalid:"."""
    good = alice.sign(content="hello")
    cases = [
        _tamper(good, content="changed"),
        _tamper(good, sig="0" * 128),
        _tamper(good, created_at=str(good["created_at"])),
        _tamper(good, created_at=True),
        _tamper(good, created_at=1.5),
        _tamper(good, kind=-1),
        _tamper(good, kind=70000),
        _tamper(good, tags=[["e", 5]]),
        _tamper(good, tags="x"),
        _tamper(good, content=None),
        _tamper(good, pubkey=good["pubkey"].upper()),
        _tamper(good, sig=good["sig"][:-2]),
        _tamper(good, created_at=2**70),
    ]
    for event in cases:
        reply = await client.publish(event)
        assert reply[2] is False and reply[3].startswith("invalid:"), (event, reply)
    assert (await client.publish(good))[2] is True


async def test_lone_surrogate_is_refused_with_invalid(client, alice):
    """An event whose content holds a lone surrogate is answered OK false "invalid:"."""
    event = alice.sign(content="ok")
    frame = '["EVENT", {"id": "%s", "pubkey": "%s", "created_at": %d, "kind": 1, "tags": [], ' \
            '"content": "bad \\ud800 surrogate", "sig": "%s"}]' % (
                event["id"], event["pubkey"], event["created_at"], event["sig"])
    await client.send(frame)
    reply = await client.recv()
    assert reply[:3] == ["OK", event["id"], False] and reply[3].startswith("invalid:")


async def test_event_without_readable_id_gets_notice(client):
    """An EVENT whose id cannot be read is answered with a NOTICE "invalid:"."""
    await client.send(["EVENT", {"id": "nope"}])
    reply = await client.recv()
    assert reply[0] == "NOTICE" and reply[1].startswith("invalid:")


async def test_duplicate_is_ok_true_with_duplicate_prefix(client, alice):
    """Publishing the same event twice answers OK true "duplicate:" the second time."""
    event = alice.sign(content="twice")
    assert await client.publish(event) == ["OK", event["id"], True, ""]
    again = await client.publish(event)
    assert again[2] is True and again[3].startswith("duplicate:")


async def test_expired_and_future_events_are_refused(client, alice):
    """NIP-40: an already-expired event and a created_at too far ahead are refused "invalid:"."""
    expired = alice.sign(tags=[["expiration", "1000"]], content="old")
    reply = await client.publish(expired)
    assert reply[2] is False and reply[3].startswith("invalid:")
    future = alice.sign(created_at=2**40, content="future")
    reply = await client.publish(future)
    assert reply[2] is False and reply[3].startswith("invalid:")


async def test_too_many_subscriptions_and_filters(tmp_path, alice):
    """Past max_subscriptions a REQ gets CLOSED "rate-limited:"; past max_filters, CLOSED "invalid:"."""
    relay = Relay(make_config(tmp_path, limits={"max_subscriptions": 3, "max_filters": 2}))
    await relay.start()
    client = await Client.connect(relay.url)
    try:
        for i in range(3):
            await client.req(f"s{i}", {"limit": 0})
        await client.send(["REQ", "s3", {"limit": 0}])
        reply = await client.recv()
        assert reply[:2] == ["CLOSED", "s3"] and reply[2].startswith("rate-limited:")
        await client.send(["CLOSE", "s0"])
        assert await client.req("s3", {"limit": 0}) == []
        await client.send(["REQ", "s4", {}, {}, {}])
        reply = await client.recv()
        assert reply[:2] == ["CLOSED", "s4"] and reply[2].startswith("invalid:")
    finally:
        await client.close()
        await relay.stop()


async def test_event_over_limits_gets_invalid(tmp_path, alice):
    """Events over the tag or content limits get OK false "invalid:"."""
    relay = Relay(make_config(tmp_path, limits={"max_event_tags": 3, "max_content_bytes": 10}))
    await relay.start()
    client = await Client.connect(relay.url)
    try:
        for event in (alice.sign(tags=[["t", str(i)] for i in range(4)]), alice.sign(content="é" * 6)):
            reply = await client.publish(event)
            assert reply[2] is False and reply[3].startswith("invalid:"), reply
        assert (await client.publish(alice.sign(content="é" * 5)))[2] is True
    finally:
        await client.close()
        await relay.stop()


async def test_oversized_frame_closes_with_1009_and_others_are_served(tmp_path, alice):
    """A frame over max_message_bytes is closed with code 1009; other clients keep being served."""
    # NIP-77 needs max_message_bytes >= 2 * its frame size limit (>= 4096) + 512: off for this tiny limit.
    relay = Relay(make_config(tmp_path, limits={"max_message_bytes": 4096}, negentropy={"enabled": False}))
    await relay.start()
    big = await Client.connect(relay.url)
    other = await Client.connect(relay.url)
    try:
        await big.send(["EVENT", alice.sign(content="x" * 5000)])
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await big.recv()
        assert closed.value.rcvd.code == 1009
        assert (await other.publish(alice.sign(content="still here")))[2] is True
    finally:
        await big.close()
        await other.close()
        await relay.stop()


@pytest.mark.single_process  # reads the server's slow_readers count
async def test_slow_reader_is_disconnected_and_others_keep_going(tmp_path, alice):
    """A subscriber that never reads is dropped once its live queue overflows; a normal one gets everything."""
    # Small batches let the sender drain between commits; one commit may queue a whole batch.
    relay = Relay(make_config(tmp_path, limits={"max_live_queue": 50}, store={"max_batch": 10}))
    await relay.start()
    slow = await Client.connect(relay.url, max_queue=1)
    fast = await Client.connect(relay.url)
    publisher = await Client.connect(relay.url)
    padding = "p" * 20_000
    try:
        await slow.req("s", {"kinds": [1]})
        await fast.req("f", {"kinds": [1]})
        events = [alice.sign(content=f"{i} {padding}") for i in range(400)]

        async def read_fast():
            return [await fast.recv(timeout=30) for _ in events]

        reading = asyncio.create_task(read_fast())
        for e in events:
            await publisher.send(["EVENT", e])
        for _ in events:
            assert (await publisher.recv(timeout=30))[2] is True
        got = await reading
        assert sorted(m[2]["id"] for m in got) == sorted(e["id"] for e in events)
        assert relay.slow_readers == 1
    finally:
        for c in (slow, fast, publisher):
            await c.close()
        await relay.stop()


@pytest.mark.single_process  # reads the server's slow_readers count and captures its log in this process
async def test_slow_reader_is_dropped_by_queued_bytes(tmp_path, alice):
    """A reader that never reads is dropped once its queued live bytes pass max_live_queue_bytes, even under the count limit."""
    relay = Relay(make_config(tmp_path, limits={"max_live_queue": 100_000, "max_live_queue_bytes": 200_000,
                                                "max_message_bytes": 100_000},
                              negentropy={"enabled": False}))
    await relay.start()
    slow = await Client.connect(relay.url, max_queue=1)
    publisher = await Client.connect(relay.url)
    padding = "b" * 20_000
    try:
        await slow.req("s", {"kinds": [1]})
        with structlog.testing.capture_logs() as logs:
            for i in range(600):
                await publisher.send(["EVENT", alice.sign(content=f"{i} {padding}")])
            for _ in range(600):
                assert (await publisher.recv(timeout=30))[2] is True
        assert relay.slow_readers == 1
        # dropped by the writer's fan-out, outside its connection's task: the log line still names it
        (line,) = [e for e in logs if e["event"] == "slow_reader_disconnected"]
        assert line["remote"] == "127.0.0.1" and line["conn_id"] >= 1
    finally:
        await slow.close()
        await publisher.close()
        await relay.stop()


async def test_a_handshake_with_two_host_headers_gets_400_and_others_are_served(relay, alice):
    """RFC 9112: several Host fields make the request invalid: HTTP 400, not a crashed handler; the relay serves on."""
    reader, writer = await asyncio.open_connection("127.0.0.1", relay.port)
    writer.write(b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                 b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
    await writer.drain()
    status = await asyncio.wait_for(reader.readline(), 5)
    writer.close()
    assert status.startswith(b"HTTP/1.1 400"), status
    client = await Client.connect(relay.url)
    assert (await client.publish(alice.sign(content="after the bad handshake")))[2] is True
    await client.close()
