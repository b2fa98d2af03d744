"""BIP-340 signature checks batched onto worker threads.

coincurve releases the GIL, so a small thread pool verifies in parallel with
the event loop.  Requests made during one loop iteration are gathered and
sent to the pool as one chunk per thread: the cost of a thread hop is paid
per chunk, not per event.  Results come back as callbacks on the loop.
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

    def verify(self, event: Event, done: Callback) -> None:
        """Check `event`'s signature on a worker thread; `done(valid: bool)` runs on the loop."""
        if not self._pending:
            if self._loop is None:
                self._loop = asyncio.get_running_loop()
            self._loop.call_soon(self._flush)
        self._pending.append((event, done))

    async def check(self, event: Event) -> bool:
        """Awaitable form of `verify`."""
        future = asyncio.get_running_loop().create_future()
        self.verify(event, future.set_result)
        return await future

    def _flush(self) -> None:
        pending, self._pending = self._pending, []
        size = -(-len(pending) // self._threads)
        for start in range(0, len(pending), size):
            chunk = pending[start:start + size]
            result = self._pool.submit(_verify_all, [e for e, _ in chunk])
            result.add_done_callback(lambda r, chunk=chunk: self._loop.call_soon_threadsafe(_resolve, chunk, r))

    def close(self) -> None:
        """Stop the worker threads (after finishing what they hold)."""
        self._pool.shutdown(wait=True)


def _resolve(chunk: list[tuple[Event, Callback]], result: Future) -> None:
    # _verify_all cannot raise on valid Event objects; a failure would be a bug
    # worth surfacing as invalid signatures rather than a lost reply.
    valid = result.result() if result.exception() is None else [False] * len(chunk)
    for (_, done), ok in zip(chunk, valid):
        done(ok)
