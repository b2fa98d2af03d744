"""Process tuning of a relay process: the C library's heap (large blocks unmapped when freed, a periodic trim),
the garbage collector and the interpreter's switch interval.  `relay serve` only: tests share their process."""

from __future__ import annotations

import asyncio
import ctypes
import gc
import sys
from collections.abc import Callable

_SWITCH_INTERVAL_SECONDS = 0.0005
_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter (malloc.h)
_MMAP_THRESHOLD_BYTES = 1_048_576


def unmap_large_blocks_when_freed() -> None:
    """Blocks of 1 MiB and more (a large REQ answer on its way) get pages of their own, unmapped when freed.

    glibc raises this threshold after each such block is freed (up to 32 MiB) and then keeps later ones in
    heaps it seldom gives back: after 100 concurrent REQs for 16 MiB answers, the relay stayed about 80 MB
    larger once its clients had gone (bench/big_answers.py).  Setting the threshold stops that adjustment;
    the price is fresh pages for each such block (those rounds took 2.8-3.0 s instead of 1.9-2.2 s).
    Nothing happens where the C library has no `mallopt`.
    """
    if (mallopt := _libc("mallopt")) is not None:
        mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_BYTES)


def _libc(name: str) -> Callable | None:
    """The C library's function `name` (glibc's `mallopt`, `malloc_trim`), or None where it has none."""
    try:
        return getattr(ctypes.CDLL(None), name)
    except (OSError, AttributeError):
        return None


def start_memory_trim(seconds: float) -> asyncio.Task | None:
    """The task that trims this process's heap every `seconds` (`server.memory_trim_seconds`: one process, the
    writer of workers and each worker: a worker holds its clients' frames); None when that is 0 or there is no
    glibc."""
    if (trim := _libc("malloc_trim")) is None or seconds <= 0:
        return None
    return asyncio.create_task(_trim_memory_forever(trim, seconds), name="memory-trim")


async def _trim_memory_forever(trim: Callable[[int], int], seconds: float) -> None:
    """Every `seconds`, hand the heap memory freed since back to the OS (`trim(0)`, on a worker thread).

    glibc keeps freed blocks under 1 MiB in its heaps: after 10 non-reading subscribers were sent 300
    events of 100 kB (and dropped), the relay stayed at 351 MB, then 435, 475 and 511 MB over three more
    rounds, with 16 MB of live Python objects; trimmed, 95-130 MB. A trim took 27-35 ms after such a round
    and under 1 ms otherwise; ctypes lets go of the GIL meanwhile.
    """
    while True:
        await asyncio.sleep(seconds)
        await asyncio.to_thread(trim, 0)


def tune_after_start(serves_clients: bool = True) -> None:
    """Process settings for a relay process that has started: one process, each worker, or (`serves_clients`
    False) the writer of workers (`relay serve` only: tests share their process)."""
    # Start-up objects never die: keep them out of GC passes, and collect the young generation less often
    # (every event allocates a few containers).  The writer of workers answers no client, so it trades longer
    # pauses for fewer: a batch of 1,000 queued for it outlives a young collection, and at 10,000 each pass
    # walked the queue again (66 passes in 8 s of ingest, 0.37 s holding the GIL the write transaction waits
    # for); 100,000 gave it 3-5% more events/s.  A process with clients keeps pauses short for their REQs.
    gc.freeze()
    gc.set_threshold(*((10_000, 10, 10) if serves_clients else (100_000, 20, 100)))
    # The writer and verifier threads drop the GIL inside SQLite and secp256k1;
    # a short switch interval lets them take it back without waiting 5 ms.
    sys.setswitchinterval(_SWITCH_INTERVAL_SECONDS)
