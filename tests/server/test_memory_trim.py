"""Freed heap memory goes back to the OS (server.memory_trim_seconds) in every process: the heap falls after bursts."""

from __future__ import annotations

import asyncio
import json
import time


from tests.helpers import Client, Keys, non_reader
from tests.reliability.overload import status_bytes
from tests.served import TEST_WORKERS, Served, clean_env, free_port

SUBSCRIBERS = 10
EVENTS = 300
CONTENT_BYTES = 100_000
ROUNDS = 3
MIB_100 = 100 * 2**20  # how far above its heap before the bursts the relay may stay
MIB_32 = 32 * 2**20  # ... and a worker


async def _burst_to_non_readers(port: int, served: Served, round_: int) -> int:
    """SUBSCRIBERS live subscribers that never read, then EVENTS new events of 100 kB (round `round_`) published
    at once; returns how many subscribers the relay dropped as slow readers (waited for, bounded: with workers
    the events reach them from the feed, after the publisher's OKs), the rest are gone when this returns."""
    url = f"ws://127.0.0.1:{port}"
    earlier, subscribers = _slow_readers_dropped(served), []
    for _ in range(SUBSCRIBERS):
        ws = await non_reader(url)
        await ws.send(json.dumps(["REQ", "live", {"kinds": [1], "limit": 0}]))
        await ws.recv()  # EOSE
        subscribers.append(ws)
    publisher = await Client.connect(url)
    keys = Keys(0x7000)
    for i in range(EVENTS):
        await publisher.send(["EVENT", keys.sign(content=f"{round_} {i} " + "x" * CONTENT_BYTES)])
    for _ in range(EVENTS):
        assert (await publisher.recv(timeout=30))[2] is True
    await publisher.close()
    deadline = time.monotonic() + 30
    while (dropped := _slow_readers_dropped(served) - earlier) == 0 and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    for ws in subscribers:
        ws.transport.abort()
    return dropped


def _slow_readers_dropped(served: Served) -> int:
    return sum(e.get("event") == "slow_reader_disconnected" for e in served.log_events())


def _heap(served: Served) -> dict[int, int]:
    """RssAnon in bytes (the heap, not the database's mapped pages) of the relay and of each of its workers, by
    pid."""
    return {pid: status_bytes(pid, "RssAnon") for pid in (served.proc.pid, *served.children())}


def test_heap_falls_back_after_bursts_of_large_events_to_non_readers(tmp_path):
    """After three rounds of 300 events of 100 kB fanned out to 10 subscribers that never read (about 300 MB of
    frames a round, then dropped), `relay serve` with memory_trim_seconds = 1 is back within 100 MB of its heap
    before the bursts, and each of its workers (RELAY_TEST_WORKERS) within 32 MB.  Untrimmed, one process grew by
    375 MB, the writer of workers by 127 MB and its workers by 47-108 MB; trimmed, one process by 70 MB and the
    writer of workers by 55 MB (SQLite's cache holds the events), each worker by 1 MB."""
    port = free_port()
    env = clean_env(RELAY_SERVER__MEMORY_TRIM_SECONDS="1", RELAY_RATE_LIMITS__ENABLED="false")
    with Served(tmp_path, "--db", tmp_path / "relay.db", "--port", port, env=env) as served:
        served.wait_health(port)
        deadline = time.monotonic() + 30  # every worker started (/health answers once one has)
        while len(served.children()) < int(TEST_WORKERS) and time.monotonic() < deadline:
            time.sleep(0.1)
        before = _heap(served)
        allowed = {pid: MIB_100 if pid == served.proc.pid else MIB_32 for pid in before}
        dropped = [asyncio.run(_burst_to_non_readers(port, served, r)) for r in range(ROUNDS)]
        deadline = time.monotonic() + 30
        while (grown := {pid: heap - before[pid] for pid, heap in _heap(served).items()
                         if pid in before and heap > before[pid] + allowed[pid]}) and time.monotonic() < deadline:
            time.sleep(0.5)
    assert len(before) == 1 + int(TEST_WORKERS) and all(dropped), (before, dropped)  # frames held, then freed
    assert not grown, (before, grown)
