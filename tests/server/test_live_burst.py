"""A live subscriber that keeps up is never dropped as a slow reader because one commit is large."""

from __future__ import annotations


from relay.server.app import Relay
from tests.conftest import make_config
from tests.helpers import Client, store_events


async def test_a_reader_keeping_up_gets_a_commit_larger_than_its_live_queue(tmp_path, alice):
    """One commit fanning out 220 kB to a reader (max_live_queue_bytes 64 KiB) reaches it whole; nobody is dropped."""
    relay = Relay(make_config(tmp_path, limits={"max_live_queue_bytes": 65_536, "max_message_bytes": 16_384},
                              negentropy={"frame_size_limit": 4096}))
    await relay.start()
    reader = await Client.connect(relay.url)
    try:
        await reader.req("r", {"kinds": [1]})
        events = [alice.sign(content=f"{i} " + "x" * 1000) for i in range(200)]
        # Queued together before the writer wakes: one transaction, so one fan-out of all 200 to the reader.
        await store_events(relay.store, events)
        got = [await reader.recv(timeout=30) for _ in events]
        assert sorted(m[2]["id"] for m in got) == sorted(e["id"] for e in events)
        assert relay.slow_readers == 0
    finally:
        await reader.close()
        await relay.stop()
