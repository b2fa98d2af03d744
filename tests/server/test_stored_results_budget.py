"""Stored REQ results held in memory until their sockets take them are bounded relay-wide
(`[limits] max_stored_results_bytes`): a REQ whose results do not fit gets CLOSED "rate-limited:"."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.frames import Close, Opcode
from websockets.protocol import State

from relay.wire import websocket
from tests.conftest import make_config
from tests.helpers import Client, eventually, non_reader, raw_websocket, send_masked, store_events, tcp_sockets
from tests.inprocess import Relay

# Every test reads the server's stored-results budget, slow-reader and keepalive counts, or connections.
pytestmark = pytest.mark.single_process


async def test_results_past_the_budget_are_refused_and_every_byte_comes_back(tmp_path, alice):
    """10 events of ~1.3 kB under a 6 kB budget (and a 6 kB answer bound): a REQ for 4 is served; while
    5 kB of the budget is held elsewhere, a REQ for 2 is refused (rate-limited:) and the connection keeps
    working; a REQ for all 10 gets the newest that fit in 6 kB; nothing stays held."""
    relay = Relay(make_config(tmp_path, limits={"max_stored_results_bytes": 6_000, "max_query_bytes": 6_000,
                                                "max_message_bytes": 4_096},
                              negentropy={"enabled": False}))  # else max_message_bytes must hold a NEG frame
    await relay.start()
    client = await Client.connect(relay.url)
    try:
        events = [alice.sign(content=f"{i} " + "x" * 1000, created_at=1_700_000_000 + i) for i in range(10)]
        for e in events:
            assert (await client.publish(e))[2] is True
        newest = [e["id"] for e in events[::-1]]
        assert [e["id"] for e in await client.req("few", {"limit": 4})] == newest[:4]
        assert relay.stored_results.held == 0

        assert relay.stored_results.take(5_000)  # another connection's answer on its way
        await client.send(["REQ", "two", {"limit": 2}])
        reply = await client.recv()
        assert reply[:2] == ["CLOSED", "two"] and reply[2].startswith("rate-limited: "), reply
        relay.stored_results.release(5_000)
        assert relay.stored_results.held == 0
        assert [e["id"] for e in await client.req("all", {"limit": 10})] == newest[:4]  # 4 x ~1.3 kB fit
        assert len(await client.req("again", {"limit": 3})) == 3  # the connection is still served
        assert relay.stored_results.held == 0
    finally:
        await client.close()
        await relay.stop()


async def test_a_client_gone_mid_send_gives_its_bytes_back(tmp_path, alice):
    """A client that closes right after its REQ: once the relay has dropped it, the budget holds nothing."""
    relay = Relay(make_config(tmp_path))
    await relay.start()
    try:
        writer = await Client.connect(relay.url)
        for i in range(300):
            assert (await writer.publish(alice.sign(content=f"{i} " + "y" * 2000, created_at=1_700_000_000 + i)))[2]
        await writer.close()
        leaver = await Client.connect(relay.url)
        await leaver.send(["REQ", "big", {"limit": 300}])
        await leaver.ws.close()
        probe = await Client.connect(relay.url)
        assert len(await probe.req("p", {"limit": 300})) == 300  # served after the leaver's query
        await probe.close()
        assert relay.stored_results.held == 0
    finally:
        await relay.stop()


async def _big_answers_relay(tmp_path, alice, **sections) -> Relay:
    """A started relay (`sections` as for make_config) holding 300 events of ~30 kB (9 MB: more than the
    kernel's socket buffers take)."""
    relay = Relay(make_config(tmp_path, **sections))
    await relay.start()
    writer = await Client.connect(relay.url)
    for i in range(300):
        assert (await writer.publish(alice.sign(content=f"{i} " + "z" * 30_000, created_at=1_700_000_000 + i)))[2]
    await writer.close()
    return relay


async def _answer(client: Client, sub_id: str) -> tuple[str, int]:
    """REQ everything; (EOSE or CLOSED, events received)."""
    await client.send(["REQ", sub_id, {"limit": 5000}])
    got = 0
    while (message := await client.recv())[0] == "EVENT":
        got += 1
    return message[0], got


async def test_a_reader_that_never_reads_its_stored_results_is_dropped_and_frees_the_budget(tmp_path, alice):
    """A client whose REQ holds most of the budget and that never reads: after `stored_results_timeout_seconds`
    with its socket full it is closed (1008) and counted, and another client's large REQ is then served."""
    relay = await _big_answers_relay(tmp_path, alice, limits={"max_stored_results_bytes": 12_000_000,
                                                              "max_query_bytes": 8_000_000,
                                                              "stored_results_timeout_seconds": 2.0})
    try:
        stalled = await non_reader(relay.url)
        await stalled.send(json.dumps(["REQ", "big", {"limit": 5000}]))  # 8 MB of the 12 MB budget; never read
        assert await eventually(lambda: relay.stored_results.held > 4_000_000)
        reader = await Client.connect(relay.url)

        async def served() -> bool:
            verb, got = await _answer(reader, "again")
            return verb == "EOSE" and got > 200

        assert await eventually(served, timeout=20, every=0.5)
        assert relay.slow_readers == 1

        async def read_to_the_end() -> None:  # what was buffered, then the close frame
            with contextlib.suppress(ConnectionClosed):
                async for _ in stalled:
                    pass

        await asyncio.wait_for(read_to_the_end(), 30)
        assert stalled.close_code == 1008 and stalled.close_reason == "slow reader: stored events not read in time"
        await reader.close()
    finally:
        await relay.stop()


async def test_one_address_holds_its_share_of_the_budget_and_others_are_served(tmp_path, alice):
    """Rate-limited clients (behind a trusted proxy, by X-Forwarded-For): a non-reader from one address holds
    a 6 MB answer, its address's whole share (`rate_limits.ip_stored_results_bytes`); that address's next REQ
    is refused (rate-limited:) though the relay's budget has room, while another address is served."""
    relay = await _big_answers_relay(tmp_path, alice,
                                     limits={"max_stored_results_bytes": 20_000_000, "max_query_bytes": 6_000_000,
                                             "stored_results_timeout_seconds": 60.0},
                                     rate_limits={"exempt": [], "trusted_proxies": ["127.0.0.1"],
                                                  "events_per_second": 0.0, "ip_events_per_second": 0.0,
                                                  "ip_stored_results_bytes": 6_000_000})
    try:
        stalled = await non_reader(relay.url, additional_headers={"X-Forwarded-For": "198.51.100.1"})
        await stalled.send(json.dumps(["REQ", "big", {"limit": 5000}]))
        assert await eventually(lambda: relay.stored_results.held > 1_000_000)  # past what the kernel takes
        same = await Client.connect(relay.url, additional_headers={"X-Forwarded-For": "198.51.100.1"})
        await same.send(["REQ", "same", {"limit": 5000}])
        reply = await same.recv()
        assert reply == ["CLOSED", "same",
                         "rate-limited: too many unsent results held for this address, read them first"]
        assert relay.stored_results.held + 6_000_000 <= relay.stored_results.max_bytes  # the relay's has room
        other = await Client.connect(relay.url, additional_headers={"X-Forwarded-For": "198.51.100.2"})
        verb, got = await _answer(other, "other")
        assert verb == "EOSE" and 150 < got < 200  # the newest events of ~30.3 kB that fit in 6 MB
        assert 0 < relay.stored_results.held <= 6_000_000
        for client in (same, other):
            await client.close()
        stalled.transport.abort()  # a close handshake would wait behind the megabytes still unsent
    finally:
        await relay.stop()


async def test_a_dropped_non_reader_is_counted_once_and_its_unsent_bytes_are_discarded(tmp_path, alice):
    """A client that asks for 8 MB and never reads is overdue both for its stored results (1 s) and for its
    pongs (pings every 0.5 s, 1 s to answer): it is dropped and counted once, as one or the other. When
    the relay stops waiting for its close handshake (websockets' close timeout, 10 s), the connection is
    reset: no socket is left in the kernel holding the megabytes it never took."""
    relay = await _big_answers_relay(tmp_path, alice,
                                     server={"ping_interval_seconds": 0.5, "ping_timeout_seconds": 1.0},
                                     limits={"max_stored_results_bytes": 12_000_000, "max_query_bytes": 8_000_000,
                                             "stored_results_timeout_seconds": 1.0})
    try:
        stalled = await non_reader(relay.url)
        client_port = stalled.transport.get_extra_info("sockname")[1]
        await stalled.send(json.dumps(["REQ", "big", {"limit": 5000}]))
        assert await eventually(lambda: relay.slow_readers + relay.keepalive_timeouts > 0)
        assert await eventually(lambda: not relay.connections, timeout=30)
        assert relay.slow_readers + relay.keepalive_timeouts == 1
        assert tcp_sockets(relay.port, client_port) == []
        stalled.transport.abort()
    finally:
        await relay.stop()


@pytest.mark.parametrize("leaving", ["close frame", "FIN"])
async def test_a_client_leaving_mid_answer_is_reset_and_not_counted_as_a_slow_reader(tmp_path, alice, leaving):
    """A client that asks for 8 MB, then sends its close frame (or shuts its side of TCP) and reads nothing
    more is leaving, not slow: once it has taken nothing for `stored_results_timeout_seconds` its connection
    is reset and its share of the budget freed, and `relay_slow_readers_total` does not count it."""
    relay = await _big_answers_relay(tmp_path, alice, limits={"max_stored_results_bytes": 12_000_000,
                                                              "max_query_bytes": 8_000_000,
                                                              "stored_results_timeout_seconds": 1.0})
    reader, writer = await raw_websocket(relay.port)
    try:
        send_masked(writer, Opcode.TEXT, json.dumps(["REQ", "big", {"limit": 5000}]).encode())
        assert await eventually(lambda: relay.stored_results.held > 1_000_000)  # past what the kernel takes
        if leaving == "FIN":
            writer.write_eof()
        else:
            send_masked(writer, Opcode.CLOSE, Close(1000, "bye").serialize())
        assert await eventually(lambda: not relay.connections, timeout=30)
        assert relay.stored_results.held == 0
        assert relay.slow_readers == 0 and relay.keepalive_timeouts == 0
    finally:
        writer.transport.abort()
        await relay.stop()


async def test_one_connection_holds_one_answer_of_the_budget_at_a_time(tmp_path, alice):
    """Four 6 MB REQs on one connection that never reads hold one answer's bytes at a time, not 12 MB of the
    budget: another client's REQ of the same size is served at once (long before any timeout)."""
    relay = await _big_answers_relay(tmp_path, alice, limits={"max_stored_results_bytes": 12_000_000,
                                                              "max_query_bytes": 6_000_000,
                                                              "stored_results_timeout_seconds": 60.0})
    try:
        stalled = await non_reader(relay.url)
        for k in range(4):
            await stalled.send(json.dumps(["REQ", f"big{k}", {"limit": 5000}]))
        assert await eventually(lambda: relay.stored_results.held > 1_000_000)  # past what the kernel takes
        reader = await Client.connect(relay.url)
        verb, got = await _answer(reader, "other")
        assert verb == "EOSE" and 150 < got < 200  # the newest events of ~30.3 kB that fit in 6 MB
        assert 0 < relay.stored_results.held <= 6_000_000
        await reader.close()
    finally:
        await relay.stop()


async def test_a_slow_reader_that_keeps_reading_is_not_dropped(tmp_path, alice):
    """A client taking one 30 kB event every 0.25 s (about 120 kB/s; its reads reach the socket in bursts
    up to ~3 s apart) of a 9 MB answer is not dropped with `stored_results_timeout_seconds` = 8, over 20 s:
    the relay's writes wait longer than that on the socket (the kernel reports it writable only once a third
    of its send buffer is free), but the bytes it has not delivered keep going down."""
    relay = await _big_answers_relay(tmp_path, alice, limits={"max_query_bytes": 9_500_000,
                                                              "max_stored_results_bytes": 20_000_000,
                                                              "stored_results_timeout_seconds": 8.0})
    try:
        slow = await non_reader(relay.url, receive_buffer=212_992)
        await slow.send(json.dumps(["REQ", "slow", {"limit": 5000}]))
        got, deadline = 0, time.monotonic() + 20
        while time.monotonic() < deadline:
            message = json.loads(await asyncio.wait_for(slow.recv(), 10))  # raises once the relay drops it
            got += message[0] == "EVENT"  # (an AUTH challenge comes first: the REQ could match private kinds)
            await asyncio.sleep(0.25)
        assert got > 60 and relay.slow_readers == 0
        await slow.close()
    finally:
        await relay.stop()


async def test_a_slow_reader_is_not_closed_by_the_keepalive_while_it_reads(tmp_path, alice):
    """A client taking one 30 kB event every 0.25 s of a 9 MB answer answers a ping only once it has read the
    megabytes written before it (over 30 s here). With pings every 1 s and 3 s to answer, the relay keeps
    its connection open over 30 s: the bytes it acknowledges keep growing. (websockets' own keepalive, which
    times the pong alone, closed it after about 23 s; the client saw that only 20 s later, having read what
    the kernel still held.)"""
    relay = await _big_answers_relay(tmp_path, alice,
                                     server={"ping_interval_seconds": 1.0, "ping_timeout_seconds": 3.0},
                                     limits={"max_query_bytes": 9_500_000, "max_stored_results_bytes": 20_000_000})
    try:
        slow = await non_reader(relay.url, receive_buffer=65_536)
        await slow.send(json.dumps(["REQ", "slow", {"limit": 5000}]))
        got, deadline = 0, time.monotonic() + 30
        while time.monotonic() < deadline:
            message = json.loads(await asyncio.wait_for(slow.recv(), 10))
            got += message[0] == "EVENT"
            await asyncio.sleep(0.25)
        (served,) = relay.connections
        assert served.wire.ws.state is State.OPEN and got > 90
        assert relay.keepalive_timeouts == 0 and relay.slow_readers == 0
        slow.transport.abort()  # a close handshake would wait behind the megabytes still unsent
    finally:
        await relay.stop()


@pytest.mark.parametrize("event_bytes, per_second, window", [(30_000, 1, 4.0), (1_000, 30, 10.0)],
                         ids=["30kB", "1kB"])
async def test_a_reader_taking_its_answer_slower_than_the_minimum_rate_is_dropped(tmp_path, alice, event_bytes,
                                                                                   per_second, window):
    """A client taking about 30 kB/s of its answer, steadily (never `window` seconds without taking anything),
    reads below `stored_results_min_bytes_per_second` (64 KiB/s here): after one window
    (`stored_results_timeout_seconds`) it is dropped (1008) and counted, so a few steady trickles cannot hold
    the stored-results budget for as long as they like. With 1 kB events and the relay's socket send buffer
    at 64 KiB, no single 64-event chunk waits a whole 10 s window, so the window must span chunks (measured
    per chunk, it never ended and this reader was kept)."""
    relay = Relay(make_config(tmp_path, limits={"max_query_bytes": 9_500_000, "max_stored_results_bytes": 20_000_000,
                                                "stored_results_timeout_seconds": window,
                                                "stored_results_min_bytes_per_second": 65_536}))
    await relay.start()
    count = 6_000_000 // event_bytes
    await store_events(relay.store, [alice.sign(content=f"{i} " + "z" * event_bytes, created_at=1_700_000_000 + i)
                                     for i in range(count)])
    slow = await non_reader(relay.url, receive_buffer=65_536)
    (served,) = relay.connections  # a kernel send buffer of 64 KiB (no autotuning): each chunk waits ~2 s
    served.wire.ws.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 65_536)

    async def trickle() -> None:
        with contextlib.suppress(ConnectionClosed):
            while True:
                await slow.recv()
                await asyncio.sleep(1 / per_second)

    reading = asyncio.create_task(trickle())
    try:
        await slow.send(json.dumps(["REQ", "slow", {"limit": count}]))
        assert await eventually(lambda: relay.slow_readers == 1, timeout=30)
        assert await eventually(lambda: not relay.connections, timeout=30)
        assert relay.stored_results.held == 0
    finally:
        reading.cancel()
        slow.transport.abort()
        await relay.stop()


async def test_without_tcp_info_a_reader_above_the_minimum_rate_gets_its_answer(tmp_path, alice, monkeypatch):
    """Where the kernel has no TCP_INFO (macOS, for one), progress is the bytes handed to the kernel. A client
    taking 30 kB every 0.05 s (about 600 kB/s) of a 9 MB answer, above a 16 KiB/s minimum over 3 s windows,
    gets it all. (Counted as minus the transport's unsent bytes, which grow with every chunk written, it was
    dropped as too slow within about 5 s.)"""
    monkeypatch.setattr(websocket, "TCP_INFO", None)
    relay = await _big_answers_relay(tmp_path, alice, limits={"max_query_bytes": 9_500_000,
                                                              "max_stored_results_bytes": 20_000_000,
                                                              "stored_results_timeout_seconds": 3.0,
                                                              "stored_results_min_bytes_per_second": 16_384})
    reader = await non_reader(relay.url, receive_buffer=65_536)
    try:
        await reader.send(json.dumps(["REQ", "all", {"limit": 5000}]))
        got = 0
        while (message := json.loads(await asyncio.wait_for(reader.recv(), 10)))[0] in ("EVENT", "AUTH"):
            got += message[0] == "EVENT"
            await asyncio.sleep(0.05)
        assert message[0] == "EOSE" and got == 300
        assert relay.slow_readers == 0
    finally:
        reader.transport.abort()
        await relay.stop()
