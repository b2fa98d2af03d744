"""Stop signals of a relay process: SIGINT and SIGTERM stop `relay serve` cleanly, at any moment of start-up
(docs/operating.md, "Shutdown")."""

from __future__ import annotations

import asyncio
import signal

STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


def stop_on_signals() -> asyncio.Event:
    """An event set by SIGINT or SIGTERM, taken by the running loop; set at once if one came before.

    A stop signal that came while the process started waits, blocked, until now: `relay serve` blocks
    SIGINT and SIGTERM before its imports (relay/__main__.py) and a writer starts its workers with them
    blocked (relay/supervisor.py), where Python would raise KeyboardInterrupt wherever start-up was (a
    traceback).  Installed first in each process: a stop asked at any moment of start-up ends in a clean stop.
    """
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, stop.set)
    held_back = signal.sigpending() & STOP_SIGNALS  # (the loop runs its handler later: set it now)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    if held_back:
        stop.set()
    return stop
