"""The store: one writer task with group commit, beside its pool of read connections (relay/store/reads.py).

How this works: `enqueue` puts a validated event on the writer queue with a
callback (`submit` is the awaitable form).  The writer task takes everything
queued (up to `max_batch` items and `max_batch_bytes` of event JSON), applies it with `writes.apply_batch` in one
transaction on the single write connection, and only after COMMIT calls each
callback with its (accepted, message) outcome and hands the `Changes` to
listeners (live fan-out).  A queue at `writer_queue_size` clears `room`:
connections `await wait_for_room()` before reading more (back-pressure).
Reads borrow a connection from the pool for one whole job (WAL: they never
wait on the writer): `Store` is a `ReadPool` with the writer beside it.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol
from pathlib import Path

import aiosqlite
import structlog

from relay.failing import FailingSteps
from relay.protocol.event import Event
from relay.store import bulk, db, feed
from relay.store.checkpoint import checkpoint
from relay.store.location import DatabaseUnusable, check_location
from relay.store.options import StoreOptions
from relay.store.reads import ReadPool
from relay.store.writes import Changes, TransactionHook, Write, apply_batch, purge_expired

log = structlog.get_logger(__name__)


RETRY_FIRST_SECONDS = 1.0  # `run_retried`: the first wait after a failure, doubled at each failure in a row
RETRY_MAX_SECONDS = 300.0  # ... up to this


class StoreFailed(RuntimeError):
    """The writer cannot write at all (see `is_fatal`); the store accepts nothing more."""


class JobFailed(RuntimeError):
    """One job raised on the writer: its caller's answer; the writer and every other job and event go on."""


# SQLite's primary result codes that mean the database cannot be written at all (disk full, I/O error, a
# corrupt or foreign file, a read-only file, no memory): the writer stops rather than accept what it can
# never acknowledge.  Any other error belongs to the one job or event that raised it.
_FATAL_CODES = frozenset({sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR, sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB,
                          sqlite3.SQLITE_READONLY, sqlite3.SQLITE_NOMEM})


def is_fatal(exc: BaseException) -> bool:
    """Whether `exc` means the writer cannot write at all: an `sqlite3.Error` whose primary result code (the
    low byte of an extended code) is FULL, IOERR, CORRUPT, NOTADB, READONLY or NOMEM, or a `MemoryError`."""
    if isinstance(exc, MemoryError):
        return True
    code = getattr(exc, "sqlite_errorcode", None)
    return isinstance(exc, sqlite3.Error) and code is not None and code & 0xFF in _FATAL_CODES


def _purge_job(conn, hooks: Sequence[TransactionHook], max_rows: int) -> tuple[Changes, int]:
    # `run_job` form of NIP-40's purge: the removals, and how many.
    changes = purge_expired(conn, int(time.time()), max_rows, hooks)
    return changes, len(changes.removed)


class Jobs(Protocol):
    """Where store jobs go: this process's `Store`, or the channel to the writer process (relay/channel/worker.py
    `WriterChannel`: a worker's, or a command's writing through the running relay)."""

    async def run_job(self, job: Callable, *args) -> object:
        """`Store.run_job`."""

    async def wait_for_room(self) -> None:
        """`Store.wait_for_room`."""


class Store(ReadPool):
    """The writer of one SQLite file (WAL): `submit` writes, `run_job` runs maintenance; the reads of its
    `ReadPool` beside it.

    Open with `await Store.open(path, options)`; close with `await close()`,
    which first drains the writer queue.
    """

    def __init__(self, path: Path, options: StoreOptions, hooks: Sequence[TransactionHook] = (),
                 on_batch: Callable[[int, float], None] | None = None) -> None:
        super().__init__(path, options, hooks)
        self._writer_conn: aiosqlite.Connection | None = None
        self._loop = asyncio.get_running_loop()
        # A Write, or a maintenance job (see `run_job`), with the callback of its outcome.
        self._pending: deque[tuple[Write | Callable, Callable[[object, str], None]]] = deque()
        self._wakeup = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self._idle = asyncio.Event()
        self._writer_task: asyncio.Task | None = None
        self._checkpoint_conn: aiosqlite.Connection | None = None
        self._checkpoint_task: asyncio.Task | None = None
        self._listeners: list[Callable[[Changes], None]] = []
        # Told (events, seconds) of every write transaction: the relay's metrics (relay/metrics.py).
        self._on_batch = on_batch or (lambda events, seconds: None)
        self._failure: BaseException | None = None
        self._answered = 0  # entries of the batch being written that were answered (see `_writer_loop`)
        # Background steps failing now, listed for `relay status` (see `run_retried`).
        self.failing = FailingSteps(path)

    @classmethod
    async def open(cls, path: Path | str, options: StoreOptions = StoreOptions(),
                   hooks: Sequence[TransactionHook] = (), on_batch: Callable[[int, float], None] | None = None
                   ) -> Store:
        """Open (creating and migrating) the database at `path`, set up `hooks`, and start the writer.

        `hooks` run inside every write transaction (see `writes.TransactionHook`); `on_batch(events, seconds)`
        is told of each write transaction (the relay's metrics, relay/metrics.py).

        Raises:
            DatabaseUnusable: this process cannot read and write a database at `path` (it names why).
        """
        store = cls(Path(path), options, hooks, on_batch)
        check_location(store.path)
        try:
            store.path.parent.mkdir(parents=True, exist_ok=True)
            store._writer_conn = await db.connect(
                store.path, options.synchronous, cache_kib=options.writer_cache_kib,
                autocheckpoint_pages=db.FALLBACK_AUTOCHECKPOINT_PAGES if options.checkpoint_interval_seconds > 0
                else 1000)
            await db.run(store._writer_conn, db.migrate)
            await db.run(store._writer_conn, feed.set_max_entries, options.change_log_max_entries)
            # a bulk load that died before building its deferred indexes (relay/store/bulk.py): build them now
            if (await db.run(store._writer_conn, bulk.restore_indexes))[1]:
                log.warning("deferred_indexes_built", note="a bulk load (relay import) had not built them: it "
                                                               "ended early, or is still loading")
        except (OSError, sqlite3.Error) as exc:  # e.g. not a database, or a read-only file system
            raise DatabaseUnusable(store.path, str(exc)) from exc
        for hook in store.hooks:
            await db.run(store._writer_conn, hook.setup)
        await store._connect_readers()
        store._writer_task = asyncio.create_task(store._writer_loop(), name="store-writer")
        if options.checkpoint_interval_seconds > 0:
            store._checkpoint_conn = await db.connect(store.path, options.synchronous)
            store._checkpoint_task = asyncio.create_task(store._checkpoint_loop(), name="store-checkpoint")
        return store

    async def _checkpoint_loop(self) -> None:
        # WAL checkpoints write pages back and fsync; done here, on a connection
        # of their own, the writer never waits for them (see checkpoint.py).
        o = self.options
        while True:
            await asyncio.sleep(o.checkpoint_interval_seconds)
            try:
                await db.run(self._checkpoint_conn, checkpoint, self.path, o.checkpoint_mode,
                             o.checkpoint_truncate_wal_bytes)
            except sqlite3.Error as exc:
                log.warning("checkpoint_failed", error=repr(exc))

    @property
    def writer_task(self) -> asyncio.Task:
        """The writer task; it ends with `StoreFailed` when the database fails."""
        assert self._writer_task is not None
        return self._writer_task

    def add_listener(self, listener: Callable[[Changes], None]) -> None:
        """Call `listener(changes)` on the event loop after every commit."""
        self._listeners.append(listener)

    def enqueue(self, event: Event, origin: str, done: Callable[[bool, str], None]) -> None:
        """Queue a validated event without waiting; `done(accepted, message)` runs after its COMMIT.

        `done` is called on the event loop with the NIP-01 OK outcome, or with
        (False, "error: ...") if the writer has failed.  The queue may pass
        `writer_queue_size` by what callers already hold: callers that can wait
        should `await wait_for_room()` first.
        """
        if self._failure is not None:
            self._loop.call_soon(done, False, "error: the relay cannot store events now")
            return
        self._pending.append((Write(event, origin), done))
        if len(self._pending) >= self.options.writer_queue_size:
            self._room.clear()
        self._wakeup.set()

    async def wait_for_room(self) -> None:
        """Wait while the writer queue is full (the back-pressure that stops connections reading)."""
        if not self._room.is_set():
            await self._room.wait()

    async def submit(self, event: Event, origin: str = "") -> tuple[bool, str]:
        """Queue a validated event and wait until its transaction has committed.

        Returns (accepted, message) for the NIP-01 OK reply.
        """
        await self.wait_for_room()
        future = self._loop.create_future()
        self.enqueue(event, origin, lambda accepted, message: future.done() or future.set_result((accepted, message)))
        return await future

    async def purge_expired(self) -> int:
        """NIP-40: remove events whose expiration has passed, through the writer. Returns how many."""
        return await self.run_retried("expiry purge", _purge_job, self.options.purge_batch)

    async def run_job(self, job: Callable, *args) -> object:
        """Run `job(conn, hooks, *args) -> (Changes, result)` on the writer, between two batches; return `result`.

        For maintenance (NIP-40 purge, retention): the job runs ONE short
        transaction of its own on the write connection, handing every removal
        to `hooks` as `writes.purge_expired` does, so client writes interleave
        with a long job split into many.  Listeners get its `Changes`.

        A job that raises is rolled back alone (its transaction) and logged with what it was; the writer
        goes on.

        Raises:
            JobFailed: the job raised (its error is the message); nothing of it was kept.
            StoreFailed: the writer has failed (before or while running it).
        """
        if self._failure is not None:
            raise StoreFailed("the relay cannot store events now")
        future = self._loop.create_future()

        def done(result: object, failure: Exception | None) -> None:
            if not future.done():
                future.set_exception(failure) if failure is not None else future.set_result(result)

        self._pending.append((_Job(job, self.hooks, args), done))
        self._wakeup.set()
        return await future

    async def run_retried(self, step: str, job: Callable, *args) -> object:
        """`run_job`, tried again while it fails alone (`JobFailed`), for a background step that must be done
        (a projector build step, a purge or retention step); its result.

        Each failure is logged (`step_failing`) and `step` (what it is, for people) is listed as failing for
        `relay status` until it succeeds; the next try waits RETRY_FIRST_SECONDS, then twice as long after
        each failure in a row, up to RETRY_MAX_SECONDS, so a step that keeps failing costs the writer little.

        Raises:
            StoreFailed: the writer has failed.
        """
        delay, attempts = RETRY_FIRST_SECONDS, 0
        while True:
            try:
                result = await self.run_job(job, *args)
            except JobFailed as exc:
                attempts += 1
                log.warning("step_failing", step=step, attempts=attempts, retry_in_seconds=delay, error=str(exc))
                self.failing.failed(step, str(exc), attempts, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX_SECONDS)
                continue
            if attempts:
                log.info("step_recovered", step=step, attempts=attempts)
                self.failing.recovered(step)
            return result

    async def _writer_loop(self) -> None:
        pending = self._pending
        while True:
            if not pending:
                self._idle.set()
                self._wakeup.clear()
                await self._wakeup.wait()
            self._idle.clear()
            batch = self._take_batch()
            if len(pending) < self.options.writer_queue_size:
                self._room.set()
            writes = [e for e in batch if isinstance(e[0], Write)]
            jobs = [e for e in batch if not isinstance(e[0], Write)]
            self._answered = 0
            try:
                await self._write(writes, jobs)
            except Exception as exc:  # only what `is_fatal` lets through: the database cannot be written
                self._failure = exc
                log.error("writer_failed", error=repr(exc))
                # writes are answered first, then jobs, each in order: the rest still wait
                self._fail_waiters((writes + jobs)[self._answered:])
                raise StoreFailed(f"database write failed: {exc!r}") from exc

    def _take_batch(self) -> list:
        # The byte cap bounds one commit's live fan-out, which each subscriber's connection gets at once.
        pending, max_count, max_bytes = self._pending, self.options.max_batch, self.options.max_batch_bytes
        batch: list = []
        size = 0
        while pending and len(batch) < max_count:
            item = pending[0][0]
            if isinstance(item, Write):
                size += len(item.event.raw)
                if size > max_bytes and batch:
                    break
            batch.append(pending.popleft())
        return batch

    async def _write(self, writes: list, jobs: list) -> None:
        """Apply `writes`, then run `jobs`, answering each in order; raise only what `is_fatal` says."""
        if writes:
            try:
                await self._apply(writes)
            except Exception as exc:
                if is_fatal(exc):
                    raise
                # One event the transaction cannot take (a hook's bug, an unexpected value): find it by
                # trying each event alone, so it is refused alone and the others are stored.
                log.error("batch_failed", events=len(writes), error=repr(exc), exc_info=exc)
                await db.run(self._writer_conn, db.rollback_open_transaction)
                for write in writes:
                    await self._apply_alone(write)
        for job, done in jobs:
            try:
                changes, result = await db.run(self._writer_conn, job)
            except Exception as exc:
                if is_fatal(exc):
                    raise
                log.error("job_failed", job=_job_name(job), error=repr(exc), exc_info=exc)
                await db.run(self._writer_conn, db.rollback_open_transaction)
                self._answered += 1
                done(None, JobFailed(f"{_job_name(job)}: {exc!r}"))
                continue
            self._notify(changes)
            self._answered += 1
            done(result, None)

    async def _apply(self, writes: list) -> None:
        """Apply `writes` in one transaction, then answer each after the COMMIT and tell the listeners."""
        started = time.perf_counter()
        outcomes, changes = await db.run(self._writer_conn, apply_batch, [w for w, _ in writes], self.hooks,
                                         self.options.relay_urls)
        self._on_batch(len(writes), time.perf_counter() - started)
        # call_soon: a failing callback is logged by the loop and never stops the writer.
        for (_, done), outcome in zip(writes, outcomes):
            self._loop.call_soon(done, *outcome)
        self._answered += len(writes)
        self._notify(changes)

    async def _apply_alone(self, write: tuple) -> None:
        """`_apply` of one write; an event that still fails is refused alone with "error: internal" (logged)."""
        try:
            await self._apply([write])
        except Exception as exc:
            if is_fatal(exc):
                raise
            log.error("event_failed", event_id=write[0].event.id, error=repr(exc), exc_info=exc)
            await db.run(self._writer_conn, db.rollback_open_transaction)
            self._answered += 1
            self._loop.call_soon(write[1], False, "error: internal")

    def _notify(self, changes: Changes) -> None:
        for listener in self._listeners:
            listener(changes)

    def _fail_waiters(self, unanswered: list) -> None:
        unanswered.extend(self._pending)
        self._pending.clear()
        self._room.set()
        self._idle.set()
        message = "error: the relay cannot store events now"
        for item, done in unanswered:
            if isinstance(item, Write):
                self._loop.call_soon(done, False, message)
            else:
                self._loop.call_soon(done, None, StoreFailed(message))

    async def close(self) -> None:
        """Drain the writer queue, stop the writer and close every connection."""
        if self._writer_task is not None and not self._writer_task.done():
            while self._pending or not self._idle.is_set():
                await self._idle.wait()
                await asyncio.sleep(0)
            self._writer_task.cancel()
            try:
                await self._writer_task
            except (asyncio.CancelledError, StoreFailed):
                pass
        if self._checkpoint_task is not None:
            self._checkpoint_task.cancel()
            await self._checkpoint_conn.close()
        await super().close()
        if self._writer_conn is not None:
            await self._writer_conn.close()


@dataclass(frozen=True, slots=True)
class _Job:
    """A queued `run_job`: `job(conn, hooks, *args)` when called with the write connection."""

    job: Callable
    hooks: tuple
    args: tuple

    def __call__(self, conn: sqlite3.Connection) -> tuple[Changes, object]:
        return self.job(conn, self.hooks, *self.args)


def _job_name(job: _Job) -> str:
    """What a failed job was, for the log and its caller: the function's qualified name."""
    return getattr(job.job, "__qualname__", repr(job.job))
