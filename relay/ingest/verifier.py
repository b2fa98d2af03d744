"""BIP-340 signature checks batched onto worker threads: the one pool of a process, for every source.

coincurve releases the GIL, so a small thread pool verifies in parallel with
the event loop.  Requests made during one loop iteration are gathered and
sent to the pool as one chunk per thread: the cost of a thread hop is paid
per chunk, not per event.  Results come back as callbacks on the loop, in the
order the events were submitted (chunks finishing early wait for the ones
before them), so events from one connection reach the writer in the order
they arrived.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from relay.protocol.event import Event, verify_signature

Callback = Callable[[bool], None]


def _verify_all(events: list[Event]) -> list[bool]:
    return [verify_signature(e) for e in events]


class Verifier:
    """`verifier.verify(event, done)` calls `done(valid)` on the event loop once checked."""

    def __init__(self, threads: int) -> None:
        self._threads = threads
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="verify")
        self._pending: list[tuple[Event, Callback]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._next_ticket = 0  # chunks are numbered as submitted ...
        self._next_to_deliver = 0  # ... and delivered in that order
        self._finished: dict[int, tuple[list[tuple[Event, Callback]], Future]] = {}

    def verify(self, event: Event, done: Callback) -> None:
        """Check `event`'s signature on a worker thread; `done(valid: bool)` runs on the loop."""
        if not self._pending:
            if self._loop is None:
                self._loop = asyncio.get_running_loop()
            self._loop.call_soon(self._flush)
        self._pending.append((event, done))

    def _flush(self) -> None:
        pending, self._pending = self._pending, []
        size = -(-len(pending) // self._threads)
        for start in range(0, len(pending), size):
            chunk = pending[start:start + size]
            ticket, self._next_ticket = self._next_ticket, self._next_ticket + 1
            result = self._pool.submit(_verify_all, [e for e, _ in chunk])
            result.add_done_callback(
                lambda r, t=ticket, c=chunk: self._loop.call_soon_threadsafe(self._finish, t, c, r))

    def _finish(self, ticket: int, chunk: list[tuple[Event, Callback]], result: Future) -> None:
        self._finished[ticket] = (chunk, result)
        while self._next_to_deliver in self._finished:
            _resolve(*self._finished.pop(self._next_to_deliver))
            self._next_to_deliver += 1

    def close(self) -> None:
        """Stop the worker threads (after finishing what they hold)."""
        self._pool.shutdown(wait=True)


def _resolve(chunk: list[tuple[Event, Callback]], result: Future) -> None:
    # _verify_all cannot raise on valid Event objects; a failure would be a bug
    # worth surfacing as invalid signatures rather than a lost reply.
    valid = result.result() if result.exception() is None else [False] * len(chunk)
    for (_, done), ok in zip(chunk, valid):
        done(ok)
