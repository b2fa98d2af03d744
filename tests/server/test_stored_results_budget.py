"""Stored REQ results held in memory until their sockets take them are bounded relay-wide
(`[limits] max_stored_results_bytes`): a REQ whose results do not fit gets CLOSED "rate-limited:"."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket

import websockets
from websockets.exceptions import ConnectionClosed

from relay.server.app import Relay
from tests.conftest import make_config
from tests.helpers import Client, eventually


async def test_results_past_the_budget_are_refused_and_every_byte_comes_back(tmp_path, alice):
    """10 events of ~1.3 kB under a 6 kB budget: a REQ for 4 is served, one for all 10 is refused
    (rate-limited:), the connection keeps working, and nothing stays held."""
    relay = Relay(make_config(tmp_path, limits={"max_stored_results_bytes": 6_000}))
    await relay.start()
    client = await Client.connect(relay.url)
    try:
        events = [alice.sign(content=f"{i} " + "x" * 1000, created_at=1_700_000_000 + i) for i in range(10)]
        for e in events:
            assert (await client.publish(e))[2] is True
        assert [e["id"] for e in await client.req("few", {"limit": 4})] == [e["id"] for e in events[::-1][:4]]
        assert relay.stored_results.held == 0

        await client.send(["REQ", "all", {"limit": 10}])
        reply = await client.recv()
        assert reply[:2] == ["CLOSED", "all"] and reply[2].startswith("rate-limited: "), reply
        assert relay.stored_results.held == 0
        assert len(await client.req("again", {"limit": 3})) == 3  # the connection is still served
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


async def test_a_reader_that_never_reads_its_stored_results_is_dropped_and_frees_the_budget(tmp_path, alice):
    """A client whose REQ holds most of the budget and that never reads: after `stored_results_timeout_seconds`
    with its socket full it is closed (1008) and counted, and another client's large REQ is then served."""
    relay = Relay(make_config(tmp_path, limits={"max_stored_results_bytes": 12_000_000,
                                                "max_query_bytes": 8_000_000,
                                                "stored_results_timeout_seconds": 0.5}))
    await relay.start()
    try:
        writer = await Client.connect(relay.url)
        for i in range(300):  # 9 MB, more than the kernel's socket buffers take: the relay's writes stall
            assert (await writer.publish(alice.sign(content=f"{i} " + "z" * 30_000, created_at=1_700_000_000 + i)))[2]
        await writer.close()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", relay.port))
        stalled = await websockets.connect(relay.url, sock=sock, max_size=None, max_queue=1, ping_interval=None)
        await stalled.send(json.dumps(["REQ", "big", {"limit": 5000}]))  # 8 MB of the 12 MB budget; never read
        assert await eventually(lambda: relay.stored_results.held > 4_000_000)
        reader = await Client.connect(relay.url)

        async def served() -> bool:
            await reader.send(["REQ", "again", {"limit": 5000}])
            got = 0
            while (message := await reader.recv())[0] == "EVENT":
                got += 1
            return message[0] == "EOSE" and got > 200

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
