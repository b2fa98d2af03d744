"""One commit's live fan-out: a subscriber that keeps up is never dropped because it is large, and one that
reads nothing is handed at most one (bounded) commit at a time."""

from __future__ import annotations

import asyncio
import json
import tracemalloc

import pytest

from relay.config import ConfigError
from relay.protocol import envelopes
from tests.conftest import make_config
from tests.helpers import Client, eventually, non_reader, store_events
from tests.inprocess import Relay


@pytest.mark.single_process  # reads the server's slow_readers count
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


@pytest.mark.single_process  # reads the server's connection objects
async def test_a_non_reading_subscriber_is_handed_one_transaction_of_live_events_at_a_time(tmp_path, alice):
    """`store.max_batch_bytes` (1 MiB here) caps a transaction: 100 events of 100 kB queued at once are
    committed about ten at a time, and a live subscriber that reads nothing has at most one transaction's
    events in its transport buffer (before the cap: all 10 MB at once)."""
    relay = Relay(make_config(tmp_path, store={"max_batch_bytes": 1_048_576}, negentropy={"enabled": False}))
    await relay.start()
    batches: list[int] = []
    relay.store.add_listener(lambda changes: batches.append(len(changes.inserted)))  # one call per transaction
    stalled = await non_reader(relay.url)
    buffered: list[int] = []
    try:
        await stalled.send(json.dumps(["REQ", "live", {"kinds": [1]}]))
        await stalled.recv()  # EOSE: the subscription is live
        (connection,) = relay.connections
        sampling = asyncio.create_task(_sample(connection.wire.unsent_bytes, buffered))
        await store_events(relay.store, [alice.sign(content=f"{i} " + "x" * 100_000) for i in range(100)])
        await asyncio.sleep(0.2)
        sampling.cancel()
        assert sum(batches) == 100 and max(batches) <= 10, batches
        assert 0 < max(buffered) <= 1_048_576 + 65_536
    finally:
        stalled.transport.abort()
        await relay.stop()


@pytest.mark.single_process  # reads the server's connection objects and this process's memory
async def test_live_frames_waiting_for_a_non_reader_are_held_once(tmp_path, alice):
    """80 events of 100 kB (two transactions of at most 4 MiB) to a subscriber that reads nothing: while the
    first transaction's write waits for the socket, its frames live only in the transport's buffer (one joined
    copy), and the relay's own frames are just the second transaction's, queued. Before, the first
    transaction's 4 MB of frames were also kept in the sender's list: 8.0 MB of frames instead of 3.9."""
    relay = Relay(make_config(tmp_path, negentropy={"enabled": False}))
    await relay.start()
    stalled = await non_reader(relay.url)
    events = [alice.sign(content=f"{i} " + "x" * 100_000) for i in range(80)]
    tracemalloc.start()
    try:
        await stalled.send(json.dumps(["REQ", "live", {"kinds": [1]}]))
        await stalled.recv()  # EOSE: the subscription is live
        (connection,) = relay.connections
        await store_events(relay.store, events)
        assert await eventually(lambda: connection.outbox.writing and connection.outbox.queued_bytes(), timeout=10)
        frames = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(True, envelopes.__file__)])
        held = sum(stat.size for stat in frames.statistics("filename"))
        queued = connection.outbox.queued_bytes()
        assert queued > 1_000_000 and held < queued + 100_000, (held, queued)
    finally:
        tracemalloc.stop()
        stalled.transport.abort()
        await relay.stop()


def test_a_transaction_cap_below_one_event_is_refused(tmp_path):
    """`store.max_batch_bytes` below `limits.max_message_bytes` would cap a transaction below one event's
    size: a configuration error."""
    with pytest.raises(ConfigError, match=r"store.max_batch_bytes: must be at least limits.max_message_bytes"):
        make_config(tmp_path, store={"max_batch_bytes": 1_000_000})
    assert make_config(tmp_path, store={"max_batch_bytes": 1_048_576}).store.max_batch_bytes == 1_048_576


async def _sample(measure, into: list[int]) -> None:
    """Append `measure()` to `into` every millisecond until cancelled."""
    while True:
        into.append(measure())
        await asyncio.sleep(0.001)
