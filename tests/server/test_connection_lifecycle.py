"""A connection's resources are released when the client goes away, whatever it left unread."""

from __future__ import annotations

import asyncio
import gc

import pytest

from relay.server.subscriptions import LiveSubscription
from tests.helpers import Client

# Both tests read the server's connections and this process's live subscription objects.
pytestmark = pytest.mark.single_process


def _live_subscriptions() -> list[LiveSubscription]:
    return [o for o in gc.get_objects() if type(o) is LiveSubscription]


async def _until(predicate, seconds: float = 10.0) -> bool:
    for _ in range(int(seconds / 0.05)):
        if predicate():
            return True
        await asyncio.sleep(0.05)
    return predicate()


async def test_client_that_never_reads_its_oks_is_released_on_close(relay, alice):
    """A client that pipelines thousands of EVENTs, reads no OK and disconnects leaves no connection behind."""
    events = [alice.sign(content=f"{i} " + "x" * 900) for i in range(3000)]
    client = await Client.connect(relay.url, max_queue=1)
    for e in events:
        await client.send(["EVENT", e])
    client.ws.transport.abort()
    assert await _until(lambda: len(relay.server.connections) == 0)


async def test_unread_req_results_are_freed_without_the_cycle_collector(relay, alice):
    """Subscriptions whose stored results were never read are freed by reference counting once the client leaves."""
    loader = await Client.connect(relay.url)
    for i in range(300):
        await loader.send(["EVENT", alice.sign(content=f"{i} " + "y" * 2000, created_at=1000 + i)])
    for _ in range(300):
        assert (await loader.recv())[2] is True
    await loader.close()
    gc.disable()
    try:
        reader = await Client.connect(relay.url, max_queue=1)
        for i in range(10):
            await reader.send(["REQ", f"r{i}", {"limit": 5000, "since": i}])
        assert await _until(lambda: len(_live_subscriptions()) == 10)
        reader.ws.transport.abort()
        assert await _until(lambda: len(relay.server.connections) == 0)
        # With the cycle collector off, only reference counting can free them.
        assert await _until(lambda: len(_live_subscriptions()) == 0)
    finally:
        gc.enable()
