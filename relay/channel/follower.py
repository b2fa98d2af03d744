"""A worker process's live fan-out: the events the writer committed, read from the change feed by cursor.

How this works: the cursor starts at the feed's head when the worker starts
(its connections are new: no subscription of theirs wants anything older).
Each wake-up (a `commit` frame, or a heartbeat: a missed frame costs at most
one beat) sets an event; one task then reads `ReadPool.changes(cursor, BATCH)`
until it has caught up, turns each insertion still stored into an `Event`
(trusted: the writer's process checked it) and hands them, with their
positions, to `deliver` (`RelayServer.fanout`), which drops an event a
subscription's stored query already saw.  Removals need no fan-out.  While
the worker has no live subscription (`idle()`), the cursor moves to the head
a commit frame names without reading anything: a subscription opened later
runs its stored query after that commit, so it drops every event up to that
head anyway (a pure ingest load costs workers no feed reads).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import structlog

from relay.protocol.event import Event, trusted_event
from relay.store.feed import StaleCursor
from relay.store.reads import ReadPool

log = structlog.get_logger(__name__)

BATCH = 1000  # changes read per feed query


class FeedFollower:
    """Follows the change feed of `store` from its head; `start()`, `wake(head)` on commits, `stop()`.

    `idle()` says whether no live subscription exists in this process.
    """

    def __init__(self, store: ReadPool, deliver: Callable[[list[Event], list[int]], None],
                 idle: Callable[[], bool]) -> None:
        self.store = store
        self.deliver = deliver
        self.idle = idle
        self.cursor = 0
        self._head = 0  # the largest committed position a commit frame named
        self._woken = asyncio.Event()
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        """Take the feed's head as the cursor and start following."""
        self.cursor = await self.store.head()
        self._task = asyncio.create_task(self._follow_forever(), name="feed-follower")

    def wake(self, head: int | None = None) -> None:
        """Something may have been committed (up to position `head`, when known): read the feed from the cursor."""
        if head is not None and head > self._head:
            self._head = head
        self._woken.set()

    def stop(self) -> None:
        """Stop following."""
        if self._task is not None:
            self._task.cancel()

    async def _follow_forever(self) -> None:
        while True:
            await self._woken.wait()
            self._woken.clear()
            try:
                await self._catch_up()
            except StaleCursor as exc:  # behind by more than the removal log keeps: its subscribers miss events
                log.error("feed_follower_behind", error=str(exc))
                self.cursor = await self.store.head()
            except Exception as exc:  # the one place this task catches: the next wake-up reads again
                log.error("feed_follow_failed", error=repr(exc), cursor=self.cursor)

    async def _catch_up(self) -> None:
        while True:
            if self.idle():  # checked after every await: see the module comment
                self.cursor = max(self.cursor, self._head)
                return
            changes = await self.store.changes(self.cursor, BATCH)
            if not changes:
                return
            inserted = [c for c in changes if c.op == "insert" and c.raw is not None]
            if inserted:
                self.deliver([trusted_event(c.raw) for c in inserted], [c.cursor for c in inserted])
            self.cursor = changes[-1].cursor
            if len(changes) < BATCH:
                return
