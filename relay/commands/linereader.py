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

PAUSED = object()
"""Yielded by `LineReader.lines` in place of a line when a read waited `idle_seconds`: what came may be used now."""


class LineReader:
    """The lines of the open file descriptor `fd`, each at most `limit` bytes (without its newline).

    `consumed` is the number of bytes read so far; `first_byte` the first
    one that is not white space (b"" until one is read: b"[" for a JSON array).  A longer line is not
    held in memory: it comes out as `too_long` (an `Outcome` refusing it,
    "invalid: line longer than N bytes") where it ends.  `fd` is not closed.
    """

    def __init__(self, fd: int, limit: int, idle_seconds: float | None = None) -> None:
        self.limit = limit
        self.idle_seconds = idle_seconds
        self.consumed = 0
        self.first_byte = b""
        self.too_long = Outcome(False, "invalid", f"line longer than {limit} bytes")
        self._fd = fd
        self._asks: queue.SimpleQueue[asyncio.Future | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name="import-reader", daemon=True)
        self._thread.start()

    async def lines(self) -> AsyncIterator[bytes | Outcome | object]:
        """Each line without its newline (the last may lack one), or `too_long` in its place, until end of input;
        `PAUSED` once when a read waited `idle_seconds` (a pipe with nothing to give yet), if given.

        Raises:
            OSError: a read failed.
        """
        pending = bytearray()  # the current line's bytes so far
        overlong = False  # the current line is past `limit`: its bytes are dropped as they come
        try:
            while True:
                future = self._ask()
                if self.idle_seconds is not None and not (await asyncio.wait({future}, timeout=self.idle_seconds))[0]:
                    yield PAUSED
                if not (block := await future):
                    break
                self.consumed += len(block)
                self.first_byte = self.first_byte or block.lstrip()[:1]
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

    def _ask(self) -> asyncio.Future:
        """The next block, read by the thread (b"": end of input)."""
        future = asyncio.get_running_loop().create_future()
        self._asks.put(future)
        return future

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
