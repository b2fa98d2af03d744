"""The lines of `relay import`'s input, read once, bounded, and without blocking the event loop.

The input may be a regular file, a pipe, a FIFO or a terminal: it is read
once, front to back (never counted first: that would empty a pipe).  Reads
happen in a daemon thread, so a stalled pipe never blocks the event loop:
SIGINT still cancels the import at once, and the process can exit while the
thread waits on the pipe.
"""

from __future__ import annotations

import asyncio
import os
import queue
import threading
from collections.abc import AsyncIterator

from relay.ingest.outcome import Outcome

BLOCK_BYTES = 1 << 20
"""Bytes asked of one read (a pipe gives what it holds, up to its size, typically 64 KiB)."""


class LineReader:
    """The lines of the open file descriptor `fd`, each at most `limit` bytes (without its newline).

    `consumed` is the number of bytes read so far.  A longer line is not
    held in memory: it comes out as `too_long` (an `Outcome` refusing it,
    "invalid: line longer than N bytes") where it ends.  `fd` is not closed.
    """

    def __init__(self, fd: int, limit: int) -> None:
        self.limit = limit
        self.consumed = 0
        self.too_long = Outcome(False, "invalid", f"line longer than {limit} bytes")
        self._fd = fd
        self._asks: queue.SimpleQueue[asyncio.Future | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name="import-reader", daemon=True)
        self._thread.start()

    async def lines(self) -> AsyncIterator[bytes | Outcome]:
        """Each line without its newline (the last may lack one), or `too_long` in its place, until end of input.

        Raises:
            OSError: a read failed.
        """
        pending = bytearray()  # the current line's bytes so far
        overlong = False  # the current line is past `limit`: its bytes are dropped as they come
        try:
            while block := await self._read():
                self.consumed += len(block)
                *ended, rest = block.split(b"\n")
                for piece in ended:
                    too_long = overlong or len(pending) + len(piece) > self.limit
                    yield self.too_long if too_long else bytes(pending + piece)
                    pending.clear()
                    overlong = False
                if not overlong:
                    pending += rest
                    if len(pending) > self.limit:
                        overlong = True
                        pending.clear()
            if overlong or pending:
                yield self.too_long if overlong else bytes(pending)
        finally:
            self._asks.put(None)  # the thread ends after the read under way, if any

    async def _read(self) -> bytes:
        future = asyncio.get_running_loop().create_future()
        self._asks.put(future)
        return await future

    def _serve(self) -> None:
        while (future := self._asks.get()) is not None:
            try:
                result, error = os.read(self._fd, BLOCK_BYTES), None
            except OSError as exc:
                result, error = b"", exc
            try:
                future.get_loop().call_soon_threadsafe(_settle, future, result, error)
            except RuntimeError:  # the loop closed while this read waited (the import was interrupted)
                return


def _settle(future: asyncio.Future, result: bytes, error: OSError | None) -> None:
    if future.done():  # cancelled by SIGINT while the read waited
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
