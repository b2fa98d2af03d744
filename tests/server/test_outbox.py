"""The outbox and the slow-reader rules, without a socket: a fake writer stands for it (relay/server/outbox.py)."""

from __future__ import annotations

import asyncio

import pytest

from relay.server.budget import ByteBudget
from relay.server.outbox import STORED_CHUNK, STORED_CHUNK_BYTES, Outbox, Signal, chunks, stored_results_refusal
from relay.wire.websocket import RateWindow


class FakeSocket:
    """A writer whose socket takes nothing until `take()`: records each batch, empties it as the wire does."""

    def __init__(self) -> None:
        self.batches: list[list[bytes]] = []
        self._taken = asyncio.Event()

    async def write(self, batch: list[bytes]) -> None:
        self.batches.append(list(batch))
        batch.clear()
        await self._taken.wait()
        self._taken.clear()

    def take(self) -> None:
        self._taken.set()


async def _started(outbox: Outbox, socket: FakeSocket) -> asyncio.Task:
    task = asyncio.create_task(outbox.run(socket.write))
    await asyncio.sleep(0)
    return task


async def test_a_signal_wakes_every_waiter_and_a_cancelled_one_leaves_the_others_waiting():
    """`Signal` behaves as `asyncio.Event`: set wakes all waiters; a cancelled waiter is forgotten; once set,
    `wait` returns at once until `clear`."""
    signal = Signal()
    first, second, cancelled = (asyncio.create_task(signal.wait()) for _ in range(3))
    await asyncio.sleep(0)
    cancelled.cancel()
    await asyncio.sleep(0)
    assert not first.done() and not second.done() and cancelled.cancelled()
    signal.set()
    await asyncio.wait_for(asyncio.gather(first, second), 1)
    await asyncio.wait_for(signal.wait(), 1)  # set: no wait
    signal.clear()
    later = asyncio.create_task(signal.wait())
    await asyncio.sleep(0.01)
    assert not later.done()
    signal.set()
    await asyncio.wait_for(later, 1)


async def test_queued_frames_go_out_in_one_batch_in_order():
    """An AUTH, two OKs and a live event queued at once are written as one batch, in the order queued."""
    outbox, socket = Outbox(10, 10_000, lambda: None), FakeSocket()
    outbox.push(b"auth")
    outbox.push_ok(b"ok1")
    outbox.push_live(b"live")
    outbox.push_ok(b"ok2")
    sender = await _started(outbox, socket)
    assert socket.batches == [[b"auth", b"ok1", b"live", b"ok2"]]
    sender.cancel()


async def test_an_event_slot_is_freed_only_once_its_ok_is_taken():
    """`in_flight` counts EVENTs taken; their slots come back when the socket has taken the batch holding
    their OKs, not when the OKs are queued (back-pressure on a client that does not read them)."""
    outbox, socket = Outbox(10, 10_000, lambda: None), FakeSocket()
    sender = await _started(outbox, socket)
    outbox.take_slot()
    outbox.take_slot()
    outbox.push_ok(b"ok1")
    outbox.push_ok(b"ok2")
    freed = asyncio.create_task(outbox.slot_freed())
    await asyncio.sleep(0)
    assert outbox.writing and outbox.in_flight == 2 and not freed.done()
    socket.take()
    await asyncio.wait_for(freed, 1)
    assert outbox.in_flight == 0 and not outbox.writing
    sender.cancel()


async def test_frames_being_written_are_held_by_the_writer_only():
    """While a batch waits for the socket, the outbox holds only what was queued after it."""
    outbox, socket = Outbox(10, 10_000, lambda: None), FakeSocket()
    sender = await _started(outbox, socket)
    outbox.push_live(b"x" * 100)
    await asyncio.sleep(0)
    assert outbox.writing and outbox.queued_bytes() == 0
    outbox.push_live(b"y" * 30)
    assert outbox.queued_bytes() == 30
    sender.cancel()


@pytest.mark.parametrize("max_live, max_live_bytes, sizes", [(2, 10_000, [10, 10, 10]), (100, 25, [10, 10, 10])],
                         ids=["count", "bytes"])
async def test_live_events_piling_up_while_the_socket_is_full_drop_the_reader(max_live, max_live_bytes, sizes):
    """Past `max_live` events, or `max_live_bytes` of them, queued while a batch waits for the socket, the
    reader is dropped (once per event past the bound: the connection counts it once)."""
    dropped: list[int] = []
    outbox, socket = Outbox(max_live, max_live_bytes, lambda: dropped.append(1)), FakeSocket()
    sender = await _started(outbox, socket)
    outbox.push_ok(b"ok")
    await asyncio.sleep(0)
    for size in sizes[:-1]:
        outbox.push_live(b"e" * size)
    assert not dropped
    outbox.push_live(b"e" * sizes[-1])
    assert dropped == [1]
    sender.cancel()


async def test_a_burst_while_nothing_is_being_written_is_not_slowness():
    """One commit's events arrive at once: queued while the socket has taken everything, any number is fine."""
    dropped: list[int] = []
    outbox, socket = Outbox(2, 25, lambda: dropped.append(1)), FakeSocket()
    for i in range(50):
        outbox.push_live(b"e" * 10)
    sender = await _started(outbox, socket)
    assert not dropped and len(socket.batches[0]) == 50
    sender.cancel()


async def test_a_closed_outbox_drops_what_it_holds_takes_no_live_event_and_wakes_slot_waiters():
    """`close()`: queued frames are dropped, later live events ignored, and an EVENT waiting for a slot wakes."""
    outbox = Outbox(10, 10_000, lambda: None)
    outbox.take_slot()
    outbox.push_live(b"queued")
    waiting = asyncio.create_task(outbox.slot_freed())
    await asyncio.sleep(0)
    outbox.close()
    await asyncio.wait_for(waiting, 1)
    outbox.push_live(b"late")
    assert outbox.closed and outbox.queued_bytes() == 0


async def test_a_failing_write_ends_the_sender():
    """What `write` raises (the socket closed) propagates out of `run`, for the connection to handle."""
    outbox = Outbox(10, 10_000, lambda: None)

    async def broken(batch: list[bytes]) -> None:
        raise ConnectionError

    outbox.push_ok(b"ok")
    with pytest.raises(ConnectionError):
        await asyncio.wait_for(outbox.run(broken), 1)


def test_rate_window_drops_a_reader_below_the_minimum_rate_over_a_whole_window():
    """The first look opens a window; a window that lasted `seconds` with enough bytes taken opens the next;
    one with fewer than `min_rate` bytes per second is too slow. Looks inside a window decide nothing."""
    window = RateWindow(seconds=10.0, min_rate=1000.0)
    assert not window.too_slow(100.0, 0)  # opens the window at 100 s
    assert not window.too_slow(105.0, 0)  # half a window: too early to tell
    assert not window.too_slow(110.0, 10_000)  # 1000 B/s: fast enough, a new window begins
    assert not window.too_slow(115.0, 10_000)
    assert window.too_slow(120.0, 19_000)  # 900 B/s over the second window


def test_chunks_hold_at_most_64_events_or_256_kib_and_at_least_one_event():
    """Results split in order into chunks bounded by count and bytes; an event larger than a chunk is one."""
    small = [bytes([i % 256]) * 100 for i in range(200)]
    got = list(chunks(list(small)))
    assert [len(chunk) for chunk, _ in got] == [STORED_CHUNK, STORED_CHUNK, STORED_CHUNK, 200 - 3 * STORED_CHUNK]
    assert [raw for chunk, _ in got for raw in chunk] == small
    assert all(size == sum(map(len, chunk)) for chunk, size in got)
    big = [b"a" * 200_000, b"b" * 100_000, b"c" * STORED_CHUNK_BYTES * 2]
    assert [[raw[:1] for raw in chunk] for chunk, _ in chunks(list(big))] == [[b"a"], [b"b"], [b"c"]]


def test_chunks_let_go_of_each_chunk_as_it_is_taken():
    """Each chunk leaves the list it came from, so a chunk sent and dropped is freed."""
    stored = [b"x" * 100_000 for _ in range(6)]
    taken = chunks(stored)
    next(taken)
    assert len(stored) == 4


def test_stored_results_refusal_names_the_budget_that_lacks_room():
    """Within the IP's share but past the relay's budget, or past the share: two different rate-limited:
    messages; None when both have room."""
    relay = ByteBudget(1_000)
    share = ByteBudget(600, within=relay)
    assert stored_results_refusal(share, relay, 600) is None
    assert "for this address" in str(stored_results_refusal(share, relay, 601))
    relay.take(500)
    refusal = stored_results_refusal(share, relay, 501)
    assert refusal.prefix == "rate-limited" and "the relay holds" in str(refusal)
    assert "the relay holds" in str(stored_results_refusal(relay, relay, 501))
