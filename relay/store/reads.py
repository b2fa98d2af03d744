"""The read pool: read connections to one SQLite file (WAL) and every read the relay makes of it.

How this works: `options.read_connections` read-only connections wait in a
queue; each read borrows one for one whole job (WAL: they never wait on the
writer), so a read job sees one snapshot.  A worker process and a command
that writes through the running relay hold a `ReadPool` alone (`ReadPool.open`:
their writes go to the writer process, relay/channel/); the writer's `Store`
(relay/store/store.py) is a `ReadPool` with the one write connection beside it.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import aiosqlite

from relay.protocol.auth import PrivateKinds
from relay.protocol.filters import Filter
from relay.store import db, feed
from relay.store.bounds import run_with_deadline
from relay.store.location import DatabaseUnusable
from relay.store.options import StoreOptions
from relay.store.queries import compile_count, compile_filter, run_count, run_query
from relay.store.writes import TransactionHook


class ReadPool:
    """Reads of the events in one SQLite file: `query`, `count`, `scan`, `items`, the change feed; never writes.

    Open with `await ReadPool.open(path, options, hooks)`; close with `await close()`.
    """

    def __init__(self, path: Path, options: StoreOptions, hooks: Sequence[TransactionHook] = ()) -> None:
        self.path = path
        self.options = options
        self.hooks = tuple(hooks)
        self._readers: asyncio.Queue[aiosqlite.Connection] = asyncio.Queue()

    @classmethod
    async def open(cls, path: Path | str, options: StoreOptions, hooks: Sequence[TransactionHook] = ()) -> ReadPool:
        """The database at `path` for reading only (a worker process, a command writing through the running
        relay): `options.read_connections` read connections.  `hooks` are never set up nor run here (the
        writer does); those with an `attach(conn)` find their tables, for the readers of their indexes
        (NIP-77, NIP-50).

        Raises:
            DatabaseUnusable: the database cannot be opened (e.g. absent: the writer creates it).
        """
        pool = cls(Path(path), options, hooks)
        try:
            await pool._connect_readers()
            for hook in pool.hooks:
                if hasattr(hook, "attach"):
                    await pool._read(hook.attach)
        except (OSError, sqlite3.Error) as exc:
            await pool.close()
            raise DatabaseUnusable(pool.path, str(exc)) from exc
        return pool

    async def _connect_readers(self) -> None:
        for _ in range(self.options.read_connections):
            self._readers.put_nowait(await db.connect(self.path, readonly=True,
                                                      mmap_bytes=self.options.read_mmap_bytes))

    async def _read(self, fn, *args):
        conn = await self._readers.get()
        try:
            return await db.run(conn, fn, *args)
        finally:
            self._readers.put_nowait(conn)

    async def read_snapshot(self, fn, *args):
        """Run `fn(sqlite3_conn, *args)` on a read connection inside ONE read transaction, ended on return.

        For a job whose statements must all see one state (a NIP-77 message
        answered from the negentropy index); no snapshot outlives the job.
        """
        def in_transaction(conn, *fn_args):
            with db.read_transaction(conn):
                return fn(conn, *fn_args)

        return await self._read(in_transaction, *args)

    async def head(self) -> int:
        """The change feed's head: the position of the newest change (0: none yet)."""
        return await self.read_snapshot(feed.head)

    async def changes(self, since: int, limit: int) -> list[feed.Change]:
        """The first `limit` changes of the change feed after cursor `since` (relay/store/feed.py), in one snapshot.

        Raises:
            feed.StaleCursor: `since` is older than the removal log keeps.
        """
        return await self.read_snapshot(feed.read, since, limit)

    async def query(self, filters: list[Filter], default_limit: int, max_limit: int,
                    private: PrivateKinds | None = None, max_rows: int | None = None,
                    timeout_seconds: float = 0.0, max_bytes: int | None = None) -> list[bytes]:
        """Raw JSON of the live events matching any filter, newest first (ties: lowest id).

        Each filter keeps its own `limit` (`default_limit` when absent,
        clamped to `max_limit`); `limit: 0` and empty filters select nothing.
        `private` hides what the reader may not see of the private kinds (NIP-42).
        All filters together return at most `max_rows` events and `max_bytes`
        bytes of events (the newest that fit; an event larger than `max_bytes`
        is left out).

        Raises:
            Rejection: "error:" when the statements ran past `timeout_seconds` (0: no bound).
        """
        compiled = _compile_query(filters, default_limit, max_limit, private, max_rows)
        if not compiled:
            return []
        return await self._read(run_with_deadline, timeout_seconds, run_query, compiled, max_rows, max_bytes)

    async def query_at_head(self, filters: list[Filter], default_limit: int, max_limit: int,
                            private: PrivateKinds | None = None, max_rows: int | None = None,
                            timeout_seconds: float = 0.0, max_bytes: int | None = None) -> tuple[list[bytes], int]:
        """`query`, and the change feed's head read in the same read transaction: (raw events, head).

        Every event committed at a position up to `head` is in the snapshot the
        events came from, so a live subscription skips those (relay/server/).

        Raises:
            Rejection: "error:" when the statements ran past `timeout_seconds` (0: no bound).
        """
        compiled = _compile_query(filters, default_limit, max_limit, private, max_rows)

        def query_and_head(conn: sqlite3.Connection) -> tuple[list[bytes], int]:
            rows = run_query(conn, compiled, max_rows, max_bytes) if compiled else []
            return rows, feed.head(conn)

        return await self.read_snapshot(run_with_deadline, timeout_seconds, query_and_head)

    async def count(self, filters: list[Filter], private: PrivateKinds | None = None,
                    timeout_seconds: float = 0.0) -> int:
        """NIP-45: how many distinct live events match any of `filters` (and are visible, given `private`).

        Raises:
            Rejection: "error:" when the count ran past `timeout_seconds` (0: no bound).
        """
        now = int(time.time())
        compiled = [compile_count(f, now, private) for f in filters if not f.is_empty()]
        if not compiled:
            return 0
        return await self._read(run_with_deadline, timeout_seconds, run_count, compiled)

    async def scan(self, f: Filter, chunk_rows: int = 1000) -> AsyncIterator[bytes]:
        """Yield the raw JSON of every live event matching `f`, newest first, up to `f.limit` if it has one.

        Unlike `query`, no default or maximum limit applies.  Holds one read
        connection (one snapshot) until the iteration ends.
        """
        conn = await self._readers.get()
        # SQLite: a negative LIMIT is no limit.
        compiled = compile_filter(f, -1 if f.limit is None else f.limit, int(time.time()))
        cursor = None
        try:
            cursor = await db.run(conn, lambda c: c.execute(compiled.sql, compiled.params))
            while rows := await db.run(conn, lambda c: cursor.fetchmany(chunk_rows)):
                for row in rows:
                    yield row[2]
        finally:
            if cursor is not None:
                await db.run(conn, lambda c: cursor.close())
            self._readers.put_nowait(conn)

    async def items(self, f: Filter) -> list[tuple[int, bytes]]:
        """(created_at, 32-byte id) of every live event matching `f`, ignoring its `limit`.

        The local side of a NIP-77 reconciliation (relay/sync/); one read job, one snapshot.
        """
        if f.is_empty():
            return []
        compiled = compile_filter(f, -1, int(time.time()))  # SQLite: a negative LIMIT is no limit
        sql = f"SELECT created_at, id FROM ({compiled.sql})"  # raw is not read: the subquery is flattened
        return await self._read(lambda c: c.execute(sql, compiled.params).fetchall())

    async def close(self) -> None:
        """Close every read connection."""
        while not self._readers.empty():
            await self._readers.get_nowait().close()


def _compile_query(filters: list[Filter], default_limit: int, max_limit: int, private: PrivateKinds | None,
                   max_rows: int | None) -> list:
    """The statements of a REQ's `filters` (see `Store.query`); empty ones and `limit: 0` select nothing."""
    now = int(time.time())
    cap = max_limit if max_rows is None else min(max_limit, max_rows)
    return [compile_filter(f, min(cap, default_limit if f.limit is None else f.limit), now, private)
            for f in filters if not f.is_empty() and f.limit != 0]
