"""Command-line writes through the running relay: `relay import`, `relay sync`, `relay ban` and `relay record` on a
database that `relay serve` serves hand their events and store jobs to its writer process.

How this works: when the relay's channel socket (relay/channel/, in its
runtime directory) accepts a connection, the command opens the store for
reading only (`ReadPool.open`) and writes through the channel, as a
worker does: events go through the command's own `Ingest` (parse, rules,
signatures on its pool, NIP-70) and then to the writer (`WriterChannel.submit`),
which runs the `[[policies]]`, commits, and fans them out to its live
subscribers (and peers); store jobs (bans, record clocks) run on the writer
(`WritePath.writer`, the channel's `run_job`).  With no relay running (no socket, or nobody
listening), the command opens the store for writing itself, as before; but
while a relay holds the database's lock and its socket cannot be reached
(it is starting, or a cleaner of the temporary directory removed it), the
command waits up to CHANNEL_WAIT_SECONDS for it, then refuses rather than
write beside the relay's writer and its `[[policies]]`.
A relay of one process (`server.workers` = 0) listens on the channel too.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from dataclasses import dataclass

from relay.channel.frames import socket_path
from relay.channel.worker import WriterChannel
from relay.config import Config
from relay.ingest import Ingest
from relay.ingest.moderation import Moderation
from relay.locks import is_served
from relay.assembly import open_read_pool, open_store
from relay.store.bulk import defer_indexes, restore_indexes
from relay.store.location import DatabaseUnusable
from relay.store.reads import ReadPool
from relay.store.store import Jobs


CHANNEL_WAIT_SECONDS = 5.0  # how long a command waits for the channel of a relay that holds the lock (starting)
_CHANNEL_RETRY_SECONDS = 0.25


@dataclass
class WritePath:
    """Where a command writes: `store` (its reads; a `Store` when it writes itself), and the running relay's
    `channel` (None: the store's own writer); `deferred`: the events' secondary indexes wait for `close()` (a
    bulk load into an empty store)."""

    store: ReadPool
    channel: WriterChannel | None = None
    _reading: asyncio.Task | None = None
    # Set by close(): the running relay's writer went away while this command wrote through it (its events
    # since then were answered "error:" and may or may not be stored).
    writer_lost: bool = False
    deferred: bool = False

    async def ingest(self, config: Config) -> Ingest:
        """The command's `Ingest` on `store` with the bans of config and database, its last stage sent to the
        running relay's writer if there is one."""
        moderation = await Moderation.open(self.store, config, writer=self.channel)
        return Ingest.from_config(config, self.store, moderation=moderation, forward=self.channel)

    @property
    def writer(self) -> Jobs:
        """Where the command's store jobs run: the running relay's writer (the channel), or its own `Store`."""
        return self.channel or self.store

    async def unless_writer_lost(self, work: Awaitable[object]) -> None:
        """Await `work`, cancelled if the running relay's writer goes away first (the relay stopped: a pipe
        kept open would otherwise be read on with nobody to store its lines; `writer_lost` tells, after
        `close()`).  Cancelled itself (SIGINT), it cancels `work` and waits for it."""
        if self._reading is None:
            await work
            return
        task = asyncio.ensure_future(work)
        try:
            await asyncio.wait({task, self._reading}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not task.done():
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):  # (this task's own cancellation goes on up)
                await task

    async def close(self) -> None:
        """Build the deferred indexes, if any; close the store (its writer drains first), then the channel."""
        if self.deferred:
            await self.writer.run_job(restore_indexes)
        await self.store.close()
        if self.channel is not None:
            self.writer_lost = self.channel.closed
            self.channel.close()
            await self._reading


async def open_write_path(config: Config, read_connections: int, bulk: bool = False) -> WritePath:
    """The running relay's writer when it serves the database of `config`, else the store opened for writing
    (`bulk`: with `StoreOptions.bulk`, and into an empty store the events' secondary indexes built at `close()`
    (relay/store/bulk.py), for `relay import` and `relay sync`; a serving relay keeps its own).

    Raises:
        DatabaseUnusable: the database cannot be opened, or a relay serves it and its channel cannot be reached.
    """
    socket = socket_path(config.store.path)
    channel = WriterChannel(socket, config.store.writer_queue_size, _nothing, _nothing, _nothing)
    waited = 0.0
    while True:
        try:
            await channel.connect()
            break
        except OSError as exc:  # no relay serves it (a socket file of one that died refuses connections)
            if not is_served(config.store.path):
                store = await open_store(config, read_connections, bulk=bulk)
                return WritePath(store, deferred=bulk and await store.run_job(defer_indexes))
            if waited >= CHANNEL_WAIT_SECONDS:  # a relay holds the lock: starting, or its socket was removed
                raise DatabaseUnusable(config.store.path, f"a relay serves it, but its writer's channel {socket} "
                                       f"cannot be reached ({exc.strerror or exc}) after {waited:.0f} s; if it is "
                                       f"starting, try again, else restart it") from None
            await asyncio.sleep(_CHANNEL_RETRY_SECONDS)
            waited += _CHANNEL_RETRY_SECONDS
    store = await open_read_pool(config, read_connections)  # (sync reads the NIP-77 index)
    return WritePath(store, channel, asyncio.create_task(channel.run()))


def _nothing(*args) -> None:
    """A command gets no commits, heartbeats or ephemeral events (it never says hello)."""
