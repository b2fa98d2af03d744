"""Freed heap memory goes back to the OS (server.memory_trim_seconds): RSS falls after a burst."""

from __future__ import annotations

import asyncio
import json
import time


from tests.helpers import Client, Keys, non_reader
from tests.reliability.overload import status_bytes
from tests.served import Served, clean_env, free_port

SUBSCRIBERS = 10
EVENTS = 300
CONTENT_BYTES = 100_000
MIB_100 = 100 * 2**20  # how far above its size before the burst the relay may stay


async def _burst_to_non_readers(port: int) -> None:
    """SUBSCRIBERS live subscribers that never read, then EVENTS events of 100 kB published at once; the
    subscribers are dropped as slow readers (or gone when this returns)."""
    url = f"ws://127.0.0.1:{port}"
    subscribers = []
    for _ in range(SUBSCRIBERS):
        ws = await non_reader(url)
        await ws.send(json.dumps(["REQ", "live", {"kinds": [1], "limit": 0}]))
        await ws.recv()  # EOSE
        subscribers.append(ws)
    publisher = await Client.connect(url)
    keys = Keys(0x7000)
    for i in range(EVENTS):
        await publisher.send(["EVENT", keys.sign(content=f"{i} " + "x" * CONTENT_BYTES)])
    for _ in range(EVENTS):
        assert (await publisher.recv(timeout=30))[2] is True
    await publisher.close()
    for ws in subscribers:
        ws.transport.abort()


def test_rss_falls_back_after_a_burst_of_large_events_to_non_readers(tmp_path):
    """After 300 events of 100 kB fanned out to 10 subscribers that never read (about 300 MB of frames, then
    dropped), `relay serve` with memory_trim_seconds = 1 is back within 100 MB of its size before the burst.
    Without the trim glibc kept the freed frames: 351 MB after one such round, 511 MB after four."""
    port = free_port()
    env = clean_env(RELAY_SERVER__MEMORY_TRIM_SECONDS="1", RELAY_RATE_LIMITS__ENABLED="false")
    with Served(tmp_path, "--db", tmp_path / "relay.db", "--port", port, env=env) as served:
        served.wait_health(port)
        before = status_bytes(served.proc.pid, "VmRSS")
        asyncio.run(_burst_to_non_readers(port))
        deadline = time.monotonic() + 30
        while (after := status_bytes(served.proc.pid, "VmRSS")) > before + MIB_100 and time.monotonic() < deadline:
            time.sleep(0.5)
        dropped = sum(e.get("event") == "slow_reader_disconnected" for e in served.log_events())
    assert dropped >= 1  # the frames were held for them, then freed
    assert after <= before + MIB_100, (before, after)
