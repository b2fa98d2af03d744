"""What waits to be written to one client, and the rules that drop a client that does not read it.

How this works: OKs, live events and AUTH challenges wait in one `Outbox`
queue; one sender task (`Outbox.run`) writes everything queued as one batch,
then waits until the socket has taken it before writing the next.  An EVENT
holds an in-flight slot until its OK is written, so a client that publishes
faster than the relay stores, or does not read its OKs, stops being read
(back-pressure).  A reader that lets more than `max_live` live events (or
`max_live_bytes` of them) pile up while the socket has not taken the last
batch is a slow reader: `on_slow_reader` drops it, so it slows no one else
(one commit's events arrive at once: a burst while the socket drains is not
slowness).

A REQ's stored results do not wait here: they are written in `chunks`
under the relay's byte budget (`stored_results_refusal`), and a reader
taking them slower than a minimum rate (`RateWindow`, relay/wire/websocket.py) is dropped too.
Nothing here touches a socket; `run` is given the function that writes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator

from relay.protocol.rejection import Rejection
from relay.server.budget import ByteBudget

# stored events written per flow-control wait: a write's copies (framing, the socket's buffer) stay small
STORED_CHUNK = 64
STORED_CHUNK_BYTES = 262_144


class Signal:
    """`asyncio.Event`'s `set`, `clear` and `wait`, with its waiters' list made only while someone waits (an
    Event keeps a deque, 0.6 kB, for every connection, idle or not)."""

    __slots__ = ("_set", "_waiters")

    def __init__(self) -> None:
        self._set = False
        self._waiters: list[asyncio.Future[None]] | None = None

    def set(self) -> None:
        """Set the flag and wake every waiter."""
        if not self._set:
            self._set = True
            waiters, self._waiters = self._waiters, None
            for waiter in waiters or ():
                if not waiter.done():
                    waiter.set_result(None)

    def clear(self) -> None:
        """Reset the flag: `wait` blocks again until the next `set`."""
        self._set = False

    async def wait(self) -> None:
        """Return at once if the flag is set, else once `set` is called."""
        if self._set:
            return
        waiter = asyncio.get_running_loop().create_future()
        if self._waiters is None:
            self._waiters = []
        self._waiters.append(waiter)
        try:
            await waiter
        finally:  # cancelled: no longer waiting
            if self._waiters is not None and waiter in self._waiters:
                self._waiters.remove(waiter)


class Outbox:
    """One client's queued frames (UTF-8 JSON messages) and in-flight EVENTs.

    `max_live` and `max_live_bytes` bound the live events queued while a
    batch is being written (`limits.max_live_queue`, `max_live_queue_bytes`);
    past either, `on_slow_reader()` is called (it must not block).  Single-threaded (event loop).
    """

    def __init__(self, max_live: int, max_live_bytes: int, on_slow_reader: Callable[[], None]) -> None:
        self.max_live = max_live
        self.max_live_bytes = max_live_bytes
        self._on_slow_reader = on_slow_reader
        self._queue: list[bytes] = []  # (a deque would hold a 0.6 kB block for every connection)
        self._ready = Signal()
        self._oks = 0  # OKs queued: their EVENTs' slots are freed once the batch holding them is written
        self._live = 0
        self._live_bytes = 0
        self._writing = False  # a batch is being written, or waits for the socket to take it
        self.in_flight = 0  # EVENTs taken whose OK has not been written yet
        self._slot_freed = Signal()
        self.closed = False  # nothing more will be written: live events are no longer queued

    @property
    def writing(self) -> bool:
        """True while a batch is being written or waits for the socket to take it."""
        return self._writing

    def queued_bytes(self) -> int:
        """Bytes of the frames queued and not yet handed to the writer (counts them: O(queued frames))."""
        return sum(map(len, self._queue))

    def push(self, message: bytes) -> None:
        """Queue a reply that holds no slot and is never dropped (NIP-42's AUTH challenge)."""
        self._queue.append(message)
        self._ready.set()

    def push_ok(self, message: bytes) -> None:
        """Queue an EVENT's OK; its in-flight slot is freed once the OK has been written."""
        self._queue.append(message)
        self._oks += 1
        self._ready.set()

    def push_live(self, message: bytes) -> None:
        """Queue a live event; past `max_live` events or `max_live_bytes` queued while a batch is being
        written, call `on_slow_reader()` instead; nothing once closed."""
        if self.closed:
            return
        self._queue.append(message)
        self._live += 1
        self._live_bytes += len(message)
        if self._writing and (self._live > self.max_live or self._live_bytes > self.max_live_bytes):
            self._on_slow_reader()
        else:
            self._ready.set()

    def slow_reader(self) -> None:
        """Drop this reader for not reading in time (`on_slow_reader()`), e.g. from a REQ's own queue."""
        self._on_slow_reader()

    def take_slot(self) -> None:
        """Count one more EVENT in flight (its OK comes through `push_ok`)."""
        self.in_flight += 1

    async def slot_freed(self) -> None:
        """Wait until an OK has been written (a slot is free) or the outbox closes."""
        self._slot_freed.clear()
        await self._slot_freed.wait()

    def close(self) -> None:
        """Write nothing more: drop what is queued and wake whoever waits for a slot."""
        self.closed = True
        self._queue.clear()
        self._slot_freed.set()

    async def run(self, write: Callable[[list[bytes]], Awaitable[None]]) -> None:
        """Write what is queued, in batches, until cancelled or `write` raises (which propagates).

        `write(batch)` sends a list of frames and returns once the socket has
        taken them; it may empty the list once they are written, so that
        while the socket is slow they are held once, not twice.
        """
        while True:
            await self._ready.wait()
            self._ready.clear()
            while self._queue:
                batch, self._queue = self._queue, []
                oks, self._oks, self._live, self._live_bytes = self._oks, 0, 0, 0
                self._writing = True
                await write(batch)
                self._writing = False
                self.in_flight -= oks
                self._slot_freed.set()


def chunks(stored: list[bytes]) -> Iterator[tuple[list[bytes], int]]:
    """Take a REQ's stored results apart, in order, into chunks of at most `STORED_CHUNK` events and
    `STORED_CHUNK_BYTES` bytes (one event at least, however large): yields (chunk, its bytes).

    Each chunk leaves `stored` as it is yielded (`stored` is reversed first and emptied from its end),
    so the caller holds every event once and frees each chunk once sent.
    """
    stored.reverse()
    while stored:
        chunk = [stored.pop()]
        size = len(chunk[0])
        while stored and len(chunk) < STORED_CHUNK and size + len(stored[-1]) <= STORED_CHUNK_BYTES:
            chunk.append(stored.pop())
            size += len(chunk[-1])
        yield chunk, size


def stored_results_refusal(budget: ByteBudget, relay_budget: ByteBudget, size: int) -> Rejection | None:
    """The "rate-limited:" refusal when `size` more bytes would pass `budget` (a client IP's share of
    `relay_budget`, or `relay_budget` itself) or the budget it is within; None when they fit."""
    short = budget.short_of(size)
    if short is None:
        return None
    if short is relay_budget:
        return Rejection("rate-limited", "the relay holds too many unsent results, try again later")
    return Rejection("rate-limited", "too many unsent results held for this address, read them first")
