"""BIP-340 signature checks batched onto worker threads.

coincurve releases the GIL, so a small thread pool verifies in parallel with
the event loop.  Requests made during one loop iteration are gathered and
sent to the pool as one chunk per thread: the cost of a thread hop is paid
per chunk, not per event.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import Future, ThreadPoolExecutor

from relay.protocol.event import Event, verify_signature


def _verify_all(events: list[Event]) -> list[bool]:
    return [verify_signature(e) for e in events]


class Verifier:
    """`await verifier.verify(event)` -> True when the signature is valid."""

    def __init__(self, threads: int) -> None:
        self._threads = threads
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="verify")
        self._pending: list[tuple[Event, asyncio.Future]] = []
        self._loop: asyncio.AbstractEventLoop | None = None

    def verify(self, event: Event) -> asyncio.Future:
        """A future resolved with `verify_signature(event)`, computed on a worker thread."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        if not self._pending:
            self._loop = loop
            loop.call_soon(self._flush)
        self._pending.append((event, future))
        return future

    def _flush(self) -> None:
        pending, self._pending = self._pending, []
        size = -(-len(pending) // self._threads)
        for start in range(0, len(pending), size):
            chunk = pending[start:start + size]
            done = self._pool.submit(_verify_all, [e for e, _ in chunk])
            done.add_done_callback(lambda result, chunk=chunk: self._loop.call_soon_threadsafe(_resolve, chunk, result))

    def close(self) -> None:
        """Stop the worker threads (after finishing what they hold)."""
        self._pool.shutdown(wait=True)


def _resolve(chunk: list[tuple[Event, asyncio.Future]], result: Future) -> None:
    error = result.exception()
    for index, (_, future) in enumerate(chunk):
        if future.done():
            continue
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result.result()[index])
