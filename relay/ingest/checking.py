"""Event checks in processes of their own, for bulk sources (`relay import`): the writer's process keeps its cores.

How this works: `CheckingPool(processes)` runs `check_lines` in a pool of
processes (stdlib `ProcessPoolExecutor`), forked when made: make it before
the command starts any thread (the store's, the signature threads), so a
child holds no lock another thread held.  Each takes a chunk of JSONL lines and does, per line,
what needs nothing of the relay's state: JSON, the NIP-01 shape and limits,
the id, the event rules (NIP-40 expiry, the AUTH kind) and the BIP-340
signature.  It returns, per line, the `Event` or the refusal's message; the
parent then runs what needs its own state (bans, kind rules, policies, the
writer queue) with `Ingest.submit_checked`.  In one process, the checks of
a chunk would share the interpreter lock with the writer's own Python work.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import time
from concurrent.futures import ProcessPoolExecutor

from relay.ingest.outcome import BAD_SIGNATURE, Outcome
from relay.processes import die_with_parent
from relay.protocol import rules
from relay.protocol.envelopes import loads
from relay.protocol.event import Event, EventLimits, parse_event, verify_signature
from relay.protocol.rejection import Rejection


def check_lines(lines: list[bytes], limits: EventLimits) -> list[Event | Outcome]:
    """Per line of `lines` (one event's JSON each): its `Event`, or the `Outcome` refusing it, checked as
    `Ingest.submit` would but for the relay's state (see module)."""
    now = time.time()
    checked: list[Event | Outcome] = []
    for line in lines:
        try:
            event = parse_event(loads(line), limits, now)
            rules.check_event(event, now)
        except Rejection as rejection:
            checked.append(Outcome.refused(rejection))
            continue
        checked.append(event if verify_signature(event) else BAD_SIGNATURE)
    return checked


def default_processes() -> int:
    """The CPUs this process may use (its affinity): one checking process each."""
    return len(os.sched_getaffinity(0))


class CheckingPool:
    """`await pool.check(lines, limits)` in one of `processes` processes; `close()` ends them."""

    def __init__(self, processes: int) -> None:
        self.processes = processes
        # Forked now with SIGINT blocked, which they keep: a Ctrl-C reaches the whole foreground process group,
        # and only the command (the parent) answers it; they end when it closes the pool.
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            self._pool = ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("fork"),
                                             initializer=_die_with_parent)
            for started in [self._pool.submit(os.getpid) for _ in range(processes)]:
                started.result()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)

    async def check(self, lines: list[bytes], limits: EventLimits) -> list[Event | Outcome]:
        """`check_lines(lines, limits)` in a checking process."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, check_lines, lines, limits)

    def close(self) -> None:
        """Stop the processes: what they hold is dropped, and they exit once their current chunk is done."""
        self._pool.shutdown(wait=False, cancel_futures=True)


def _die_with_parent() -> None:
    """In a checking process: SIGKILL when the command that made it dies, so that none is left blocked on a
    pipe nobody reads."""
    die_with_parent(signal.SIGKILL)
