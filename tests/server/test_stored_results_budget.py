"""Stored REQ results held in memory until their sockets take them are bounded relay-wide
(`[limits] max_stored_results_bytes`): a REQ whose results do not fit gets CLOSED "rate-limited:"."""

from __future__ import annotations

from relay.server.app import Relay
from tests.conftest import make_config
from tests.helpers import Client


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
