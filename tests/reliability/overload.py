"""Overload soak: about 1,000 WebSocket connections to one `relay serve` subprocess, from one asyncio process.

How this works
--------------
`soak` opens the connections of a `Plan` (at most `CONNECTING` at once, so
the listen backlog never overflows) and gives each a role:

* holders: 20 subscriptions each (20 REQs, mostly matching nothing, one
  matching the events tagged for it), reading what comes;
* slow readers: a REQ for the notes tagged for ten of the holders, then one
  frame per `SLOW_READ_SECONDS` (they must still get every one);
* non-readers: a REQ for every note, then never read (a 4 KiB receive buffer
  and a one-frame client queue);
* publishers: their events pipelined at full speed, OKs counted, in rounds
  until the relay has dropped every non-reader (the kernel's socket buffers
  absorb a few MB first, depending on its TCP tuning), at most `max_rounds`.

Then the relay's peak RSS (VmHWM) is read from /proc, each non-reader reads
its socket until it finds it closed (bounded), the relay's count of slow
readers is read from its JSON log, and a fresh client asks for every note.
Loopback only.
"""

from __future__ import annotations

import asyncio
import random
import resource
import time
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import websockets
from websockets.exceptions import ConnectionClosed

from relay.config import Config
from tests.helpers import Client, Keys, eventually, small_buffer_socket
from tests.served import Served

OVERLOAD_TOML = """\
[limits]                       # small frames, queues and commits make the memory bound tight
max_message_bytes = 6144
max_live_queue = 64
max_live_queue_bytes = 16384
max_events_in_flight = 32
max_limit = 100000             # the final REQ gets every note
default_limit = 100000

[store]
max_batch = 16                 # one commit's fan-out reaches a reader at once (a burst)
writer_queue_size = 1024

[negentropy]
enabled = false                # else limits.max_message_bytes >= 2 * frame_size_limit + 512 >= 8704

[rate_limits]
enabled = false                # every connection comes from 127.0.0.1 (18,000 REQs, publishers at full speed)
"""
CONNECTING = 50  # connections being opened at once
SLOW_READ_SECONDS = 0.02  # a slow reader's pause after each frame
SLOW_TAGS = [f"h{i}" for i in range(10)]  # what slow readers subscribe to: about 1% of the notes
CLOSE_WAIT_SECONDS = 30.0  # bound for live deliveries to arrive and for a non-reader to find its socket closed
FIXED_BYTES_PER_CONNECTION = 96 * 1024  # relay objects, websockets protocol, asyncio transport, 20 subscriptions
WEBSOCKETS_MAX_QUEUE = 16  # frames websockets buffers per incoming connection (relay/server/app.py: max_queue)
WEBSOCKETS_WRITE_LIMIT = 32 * 1024  # bytes websockets lets the transport buffer before a send waits
PYTHON_OVERHEAD = 2  # a message held twice: queued bytes and its frame in the transport, or raw and parsed


@dataclass(frozen=True)
class Plan:
    """How many connections of each role, and what the publishers send (bytes, counts)."""

    publishers: int = 50
    events_per_round: int = 10  # per publisher
    max_rounds: int = 10
    holders: int = 900
    subscriptions_per_holder: int = 20
    slow_readers: int = 25
    non_readers: int = 25
    content_bytes: int = 4000

    @property
    def connections(self) -> int:
        return self.publishers + self.holders + self.slow_readers + self.non_readers


def rss_bound(config: Config, plan: Plan, idle_bytes: int) -> int:
    """The most RSS (bytes) the relay may use under `plan`: what its configured queues let it hold.

    idle + connections * (FIXED + WRITE_LIMIT
                          + (max_live_queue_bytes + min(max_batch * max_message_bytes, max_batch_bytes))
                          * PYTHON_OVERHEAD)
         + publishers * (WEBSOCKETS_MAX_QUEUE + max_events_in_flight) * max_message_bytes * PYTHON_OVERHEAD
         + writer_queue_size * max_message_bytes * PYTHON_OVERHEAD

    Per connection, live messages wait in the relay's queue up to
    `max_live_queue_bytes` while the socket is busy, plus one commit's
    events (at most `max_batch` events and `max_batch_bytes`) handed to it
    at once; per publisher, websockets buffers up to 16 incoming frames and the relay holds
    `max_events_in_flight` events awaiting their OK; the writer queue is shared.
    """
    limits, store = config.limits, config.store
    one_commit = min(store.max_batch * limits.max_message_bytes, store.max_batch_bytes)
    live = (limits.max_live_queue_bytes + one_commit) * PYTHON_OVERHEAD
    return (idle_bytes
            + plan.connections * (FIXED_BYTES_PER_CONNECTION + WEBSOCKETS_WRITE_LIMIT + live)
            + plan.publishers * (WEBSOCKETS_MAX_QUEUE + limits.max_events_in_flight) * limits.max_message_bytes
            * PYTHON_OVERHEAD
            + store.writer_queue_size * limits.max_message_bytes * PYTHON_OVERHEAD)


def raise_open_files_limit(needed: int) -> str | None:
    """Raise RLIMIT_NOFILE of this process (and the children it starts) to at least `needed`, up to the hard limit.

    Returns None when done, else why it cannot be (the hard limit is lower).
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < needed:
        return f"the open-files hard limit is {hard}, below the {needed} this soak needs (ulimit -Hn)"
    if soft != resource.RLIM_INFINITY and soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed if hard == resource.RLIM_INFINITY else hard, hard))
    return None


def status_bytes(pid: int, field_name: str) -> int:
    """A memory field of /proc/PID/status (VmRSS, VmHWM, ...) in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field_name + ":"):
            return int(line.split()[1]) * 1024  # the kernel writes kB
    raise KeyError(field_name)


@dataclass
class SoakResult:
    """What `soak` saw: OKs, deliveries, closures, the relay's memory and its slow-reader count."""

    rounds: int = 0
    acked: set[str] = field(default_factory=set)
    refused: list[str] = field(default_factory=list)
    served: set[str] = field(default_factory=set)
    connections: int = 0
    subscriptions: int = 0
    holder_events: int = 0
    slow_matches: int = 0  # notes published that match the slow readers' filter
    slow_reader_frames: int = 0
    non_readers_closed: int = 0
    non_reader_close_codes: list[int | None] = field(default_factory=list)
    slow_readers_counted: int = 0
    idle_rss: int = 0
    connected_rss: int = 0
    peak_rss: int = 0
    connect_seconds: float = 0.0
    publish_seconds: float = 0.0
    seconds: float = 0.0


async def _connect(url: str, gate: asyncio.Semaphore, small_receive_buffer: bool = False):
    async with gate:
        # A non-reader: a small kernel buffer, so the relay's side fills after a few frames.
        sock = await small_buffer_socket(url) if small_receive_buffer else None
        return await websockets.connect(url, sock=sock, max_size=None, max_queue=1 if small_receive_buffer else 16,
                                        compression=None, ping_interval=None, proxy=None, open_timeout=60,
                                        close_timeout=2)


async def _subscribe(ws, filters_by_sub: dict[str, dict]) -> None:
    """Send one REQ per subscription and wait for all their EOSE."""
    for sub_id, f in filters_by_sub.items():
        await ws.send(orjson.dumps(["REQ", sub_id, f]).decode())
    waiting = set(filters_by_sub)
    while waiting:
        message = orjson.loads(await ws.recv())
        if message[0] == "EOSE":
            waiting.discard(message[1])
        elif message[0] == "CLOSED":
            raise AssertionError(f"subscription refused: {message}")


async def _read_forever(ws, counter: list[int], pause: float = 0.0) -> bool:
    """Count frames until the socket closes (returns True) or the task is cancelled."""
    try:
        async for _ in ws:
            counter[0] += 1
            if pause:
                await asyncio.sleep(pause)
    except ConnectionClosed:
        pass
    return True


async def _publish(ws, events: list[dict], result: SoakResult) -> None:
    """Send every event at once (the relay's back-pressure paces them) and collect their OKs."""
    async def send_all() -> None:
        for event in events:
            await ws.send(orjson.dumps(["EVENT", event]).decode())

    sender = asyncio.create_task(send_all())
    waiting = {e["id"] for e in events}
    while waiting:
        message = orjson.loads(await ws.recv())
        if message[0] == "OK" and message[1] in waiting:
            waiting.discard(message[1])
            if message[2]:
                result.acked.add(message[1])
            else:
                result.refused.append(message[3])
    await sender


async def _drain_until_closed(ws) -> int | None:
    """Read a non-reader's socket until the relay's close shows; its close code (None: closed without one)."""
    try:
        while True:
            await ws.recv()
    except ConnectionClosed as closed:
        return closed.rcvd.code if closed.rcvd is not None else None


def _round(plan: Plan, number: int, rng: random.Random) -> list[list[dict]]:
    """Each publisher's events of one round: kind 1 notes of `content_bytes`, each tagged for one random holder."""
    filler = "x" * plan.content_bytes
    return [[Keys(0x50A4 + p).sign(1, f"{number} {n} {filler}", [["t", f"h{rng.randrange(plan.holders)}"]])
             for n in range(plan.events_per_round)] for p in range(plan.publishers)]


def slow_readers_counted(served: Served) -> int:
    """The relay's count of readers disconnected for not keeping up (its `slow_reader_disconnected` log lines)."""
    return max((e.get("total", 0) for e in served.log_events() if e.get("event") == "slow_reader_disconnected"),
               default=0)


def _holder_filters(plan: Plan, number: int, rng: random.Random) -> dict[str, dict]:
    # limit 0: live only (NIP-01), so that opening 17,000 subscriptions costs no stored query
    filters = {"mine": {"kinds": [1], "#t": [f"h{number}"], "limit": 0}}
    for i in range(plan.subscriptions_per_holder - 1):
        filters[f"s{i}"] = rng.choice([{"authors": [f"{rng.getrandbits(256):064x}"], "limit": 0},
                                       {"kinds": [rng.randrange(40000, 50000)], "limit": 0},
                                       {"#e": [f"{rng.getrandbits(256):064x}"], "limit": 0}])
    return filters


async def soak(served: Served, config: Config, plan: Plan, seed: int = 1) -> SoakResult:
    """Run `plan` against the started relay `served` (see the module docstring); every socket closed on return."""
    started = time.monotonic()
    url = served.started_url()
    result = SoakResult(idle_rss=status_bytes(served.proc.pid, "VmRSS"))
    rng, gate = random.Random(seed), asyncio.Semaphore(CONNECTING)
    sockets, readers, slow, silent = [], [], [], []
    holder_count, slow_count = [0], [0]
    try:
        async def holder(number: int) -> None:
            ws = await _connect(url, gate)
            sockets.append(ws)
            await _subscribe(ws, _holder_filters(plan, number, rng))
            readers.append(asyncio.create_task(_read_forever(ws, holder_count)))

        async def slow_reader() -> None:
            ws = await _connect(url, gate)
            sockets.append(ws)
            await _subscribe(ws, {"notes": {"kinds": [1], "#t": SLOW_TAGS, "limit": 0}})
            slow.append(asyncio.create_task(_read_forever(ws, slow_count, SLOW_READ_SECONDS)))

        async def non_reader() -> None:
            ws = await _connect(url, gate, small_receive_buffer=True)
            sockets.append(ws)
            await _subscribe(ws, {"notes": {"kinds": [1], "limit": 0}})
            silent.append(ws)

        await asyncio.gather(*[holder(i) for i in range(plan.holders)],
                             *[slow_reader() for _ in range(plan.slow_readers)],
                             *[non_reader() for _ in range(plan.non_readers)])
        result.connected_rss = status_bytes(served.proc.pid, "VmRSS")
        result.connect_seconds = time.monotonic() - started
        publishers = await asyncio.gather(*[_connect(url, gate) for _ in range(plan.publishers)])
        sockets.extend(publishers)
        result.connections = len(sockets)
        result.subscriptions = plan.holders * plan.subscriptions_per_holder + plan.slow_readers + plan.non_readers
        publish_started = time.monotonic()
        while result.rounds < plan.max_rounds and slow_readers_counted(served) < plan.non_readers:
            events = _round(plan, result.rounds, rng)
            result.slow_matches += sum(e["tags"][0][1] in SLOW_TAGS for batch in events for e in batch)
            await asyncio.gather(*[_publish(ws, batch, result) for ws, batch in zip(publishers, events)])
            result.rounds += 1
        result.publish_seconds = time.monotonic() - publish_started
        result.peak_rss = status_bytes(served.proc.pid, "VmHWM")
        await eventually(lambda: holder_count[0] >= len(result.acked)  # live delivery is asynchronous
                         and slow_count[0] >= plan.slow_readers * result.slow_matches, CLOSE_WAIT_SECONDS, 0.05)
        codes = await asyncio.wait_for(asyncio.gather(*[_drain_until_closed(ws) for ws in silent]),
                                       CLOSE_WAIT_SECONDS)
        result.non_readers_closed = len(codes)
        result.non_reader_close_codes = list(codes)
        result.holder_events, result.slow_reader_frames = holder_count[0], slow_count[0]
        client = await Client.connect(url)
        try:
            result.served = {e["id"] for e in await client.req("all", {"kinds": [1]})}
        finally:
            await client.close()
        result.slow_readers_counted = slow_readers_counted(served)
    finally:
        for task in readers + slow:
            task.cancel()
        await asyncio.gather(*[ws.close() for ws in sockets], return_exceptions=True)
    result.seconds = time.monotonic() - started
    return result
