"""Ctrl-C in a long command (`relay import`, `relay sync`): stop, say what was done, exit 130.

`asyncio.run` answers the first SIGINT by cancelling the main task, and
raises KeyboardInterrupt once it ends cancelled (a traceback, no summary).
`interruptible` takes that cancellation back where the command can still
close its store and print its summary; a second SIGINT interrupts at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

EXIT_INTERRUPTED = 130
"""The exit code of a command stopped by SIGINT (128 + 2, as shells report it)."""


async def interruptible(work: Awaitable[object]) -> bool:
    """Await `work` in the main task; True when SIGINT cancelled it (the cancellation is then taken back),
    False when it finished.  Its exceptions propagate.

    Raises:
        asyncio.CancelledError: the task was cancelled by something else too.
    """
    try:
        await work
    except asyncio.CancelledError:
        if asyncio.current_task().uncancel() > 0:
            raise
        return True
    return False
