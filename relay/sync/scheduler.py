"""The configured peers (`[[sync.peers]]`): reconcile at start and every interval, stream in between.

How this works
--------------
`Scheduler` runs one `PeerSync` task per configured peer.  A task first
takes the peer's lease in the database (state.py), so that two processes
on one database never sync one peer at once, then connects and:

1. opens a live `REQ` (the peer's filter with `limit: 0`: new events only,
   whatever their created_at) before reconciling, so nothing the peer
   accepts from then on is missed;
2. reconciles (session.py: NIP-77, fetch, push);
3. streams until the next reconciliation is due (`interval_seconds`): events
   from the live REQ are validated and stored with origin = the peer's URL;
   events newly committed here (`Store.add_listener`) are pushed to the peer,
   except those whose origin is that peer, so nothing is echoed back.

A live queue that overflows (`live_queue`) is dropped and the next
reconciliation is started at once; it finds whatever was dropped.  Any
failure (connection lost, NOTICE, timeout, refused AUTH) is recorded in
`sync_peers.last_error`, the lease is released, and the task reconnects
after an exponential backoff with jitter.  Counts of events in and out are
written to `sync_peers` after each reconciliation (an interrupted one too:
every event the peer acknowledged counts) and every few seconds.
"""

from __future__ import annotations

import asyncio
import json
import random
import sqlite3
import time
from collections import deque

import structlog

from relay.config import Config, PeerConfig
from relay.ingest import Ingest
from relay.protocol.event import Event, event_ref
from relay.protocol.filters import Filter, parse_filter
from relay.protocol.rejection import invalid
from relay.store.store import Store
from relay.store.writes import Changes
from relay.sync.differences import LOGGED_IDS, LastingDifferences
from relay.keys import NodeKey, NodeKeyError, key_path, load_or_create
from relay.sync.peer import PeerConnection, PeerError
from relay.sync.session import (ERROR, REFUSED, STORED, Intake, SyncOptions, SyncReport, classify, push_chunk,
                                sync_with_peer)
from relay.sync.state import LeaseBusy, LeaseLost, PeerStates, new_owner

log = structlog.get_logger(__name__)

FLUSH_SECONDS = 2.0  # how often live counts reach sync_peers (when they changed)


def sync_options(config: Config, direction: str, frame_size_limit: int | None = None) -> SyncOptions:
    """The `SyncOptions` of `[sync]`, for `direction` ("down", "up", "both")."""
    s = config.sync
    return SyncOptions(direction=direction, frame_size_limit=frame_size_limit or s.frame_size_limit,
                       fetch_batch=s.fetch_batch, fetch_in_flight=s.fetch_in_flight, push_in_flight=s.push_in_flight)


def max_frame_bytes(config: Config, frame_size_limit: int) -> int:
    """Largest incoming WebSocket frame (bytes) accepted from a peer: an event, or a hex NEG-MSG.

    A peer's NEG-MSG size follows its own frame size limit, not ours, so at least 4 MiB.
    """
    return max(config.limits.max_message_bytes, 2 * frame_size_limit + 4096, 4 * 1024 * 1024)


def node_key(config: Config) -> NodeKey:
    """This node's key from `[sync] secret_key_file` (created with mode 0600 if absent).

    Raises:
        NodeKeyError: the file cannot be created or read, or holds no valid key.
    """
    return load_or_create(key_path(config.sync.secret_key_file, config.store.path))


class Scheduler:
    """Keeps every `[[sync.peers]]` peer in sync while the relay serves; `start()`, then `stop()`.

    Events from peers go through `ingest` (the relay's, with its one signature pool).
    """

    def __init__(self, config: Config, store: Store, key: NodeKey, ingest: Ingest) -> None:
        self.config = config
        self.store = store
        self.key = key
        self.ingest = ingest
        self.owner = new_owner()
        self.states: PeerStates | None = None
        self.peers: list[PeerSync] = []
        self._tasks: list[asyncio.Task] = []

    async def start(self) -> None:
        """Open the state connection, listen to commits, and start one task per peer."""
        self.states = await PeerStates.open(self.config.store.path)
        self.peers = [PeerSync(p, self) for p in self.config.sync.peers]
        self.store.add_listener(self._on_commit)
        self._tasks = [asyncio.create_task(p.run(), name=f"sync {p.url}") for p in self.peers]
        log.info("sync_started", peers=[p.url for p in self.peers], node_pubkey=self.key.pubkey, owner=self.owner)

    def _on_commit(self, changes: Changes) -> None:
        for event in changes.inserted:
            origin = changes.origins.get(event.id, "")
            for peer in self.peers:
                peer.offer(event, origin)

    def stats(self) -> dict[str, int]:
        """Failed attempts since start, by peer URL (in `[[sync.peers]]` order)."""
        return {peer.url: peer.errors for peer in self.peers}

    async def stop(self) -> None:
        """Cancel the peer tasks (each releases its lease), then close the state connection."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.states is not None:
            await self.states.close()


class PeerSync:
    """One configured peer's life: lease, connect, reconcile, stream, back off; see the module comment."""

    def __init__(self, peer: PeerConfig, scheduler: Scheduler) -> None:
        self.peer = peer
        self.url = peer.url
        self.scheduler = scheduler
        self.config = scheduler.config.sync
        self.filter_obj = json.loads(peer.filter)
        self.filter: Filter = parse_filter(self.filter_obj)
        self.up = peer.direction in ("up", "both")
        self.down = peer.direction in ("down", "both")
        self.options = sync_options(scheduler.config, peer.direction)
        self.intake = Intake(scheduler.ingest, self.url)
        self.events_in = 0  # not yet written to sync_peers
        self.events_out = 0
        self.errors = 0  # failed attempts since start (metrics)
        self._conn: PeerConnection | None = None
        self._outgoing: deque[Event] = deque()
        self._outgoing_ready = asyncio.Event()
        self._incoming: list[object] = []
        self._incoming_ready = asyncio.Event()
        self._reconcile_now = asyncio.Event()
        self._synced = False  # the current attempt reconciled at least once (resets the backoff)
        self._lasting = LastingDifferences()

    # --- feeding the live streams (called from the event loop, never blocking) ----------------------

    def offer(self, event: Event, origin: str) -> None:
        """A newly stored event: queue it for the peer unless it came from the peer or is out of scope."""
        if not self.up or self._conn is None or origin == self.url or not self.filter.matches(event):
            return
        if len(self._outgoing) >= self.config.live_queue:
            self._overflow("outgoing")
            return
        self._outgoing.append(event)
        self._outgoing_ready.set()

    def _on_live_event(self, obj: object) -> None:
        if len(self._incoming) >= self.config.live_queue:
            self._overflow("incoming")
            return
        self._incoming.append(obj)
        self._incoming_ready.set()

    def _overflow(self, which: str) -> None:
        if not self._reconcile_now.is_set():
            log.warning("sync_live_queue_overflow", peer=self.url, queue=which, size=self.config.live_queue)
        self._outgoing.clear()
        self._incoming.clear()
        self._reconcile_now.set()

    # --- the task ------------------------------------------------------------------------------------

    async def run(self) -> None:
        """Sync this peer until cancelled: lease, session, backoff, again."""
        states = self.scheduler.states
        backoff = self.config.backoff_initial_seconds
        while True:
            self._synced = False
            try:
                async with states.hold(self.url, self.scheduler.owner, self.config.lease_seconds):
                    await self._session()
            except LeaseBusy as busy:
                log.info("sync_lease_busy", peer=self.url, reason=str(busy))
                await asyncio.sleep(self.config.lease_seconds / 2 * (0.5 + random.random()))
                continue
            except LeaseLost as lost:
                log.warning("sync_lease_lost", peer=self.url, reason=str(lost))
            except (PeerError, sqlite3.Error, OSError) as exc:
                log.warning("sync_peer_failed", peer=self.url, error=str(exc))
                await self._record_error(str(exc))
            except Exception as exc:  # the one broad catch of this task: a bug is logged and retried
                log.error("sync_peer_crashed", peer=self.url, error=repr(exc), exc_info=exc)
                await self._record_error(f"internal error: {exc!r}")
            finally:
                self._conn = None
            if self._synced:
                backoff = self.config.backoff_initial_seconds
            await asyncio.sleep(backoff * (0.75 + random.random() / 2))
            backoff = min(backoff * 2, self.config.backoff_max_seconds)

    async def _record_error(self, error: str) -> None:
        self.errors += 1
        try:
            await self.scheduler.states.record_error(self.url, error)
        except sqlite3.Error as exc:
            log.warning("sync_state_write_failed", peer=self.url, error=repr(exc))

    async def _flush_counts(self) -> None:
        events_in, events_out, self.events_in, self.events_out = self.events_in, self.events_out, 0, 0
        await self.scheduler.states.add_counts(self.url, events_in, events_out)

    async def _session(self) -> None:
        """One connection: live REQ, reconcile, stream; ends only by raising (sets `_synced` on success)."""
        s = self.scheduler
        await s.states.record_attempt(self.url)
        conn = await PeerConnection.open(self.url, s.key, self.config.connect_timeout_seconds,
                                         self.config.timeout_seconds,
                                         max_frame_bytes(s.config, self.options.frame_size_limit))
        helpers: list[asyncio.Task] = []
        try:
            self._outgoing.clear()
            self._incoming.clear()
            self._conn = conn
            if self.down:
                await conn.subscribe({**self.filter_obj, "limit": 0}, self._on_live_event)
                helpers.append(asyncio.create_task(self._store_live(), name=f"sync-in {self.url}"))
            if self.up:
                helpers.append(asyncio.create_task(self._push_live(conn), name=f"sync-out {self.url}"))
            while True:
                self._reconcile_now.clear()
                report = SyncReport()
                try:
                    await sync_with_peer(conn, s.store, self.filter_obj, self.options, self.intake, report)
                except BaseException:  # failed, cancelled or lease lost: what it did, and for how long, is known
                    log.info("sync_reconcile_interrupted", peer=self.url, **report.as_dict())
                    raise
                finally:  # the events an interrupted reconciliation moved are counted too
                    self.events_in += report.fetched
                    self.events_out += report.pushed
                await self._flush_counts()
                await s.states.record_run(self.url, sum(report.refused.values()), report.error_text())
                if report.errors:  # a failed attempt for metrics too; the stream goes on
                    self.errors += 1
                self._synced = True
                log.info("sync_reconciled", peer=self.url, **report.as_dict())
                await self._note_lasting(report)
                await self._stream(conn, helpers)
        finally:
            self._conn = None
            for task in helpers:
                task.cancel()
            await asyncio.gather(*helpers, return_exceptions=True)
            await conn.close()
            try:
                await self._flush_counts()
            except sqlite3.Error as exc:
                log.warning("sync_state_write_failed", peer=self.url, error=repr(exc))

    async def _note_lasting(self, report: SyncReport) -> None:
        """Count the ids this run found different as the run before did, and log the new ones once."""
        lasting = self._lasting.update(report.differences)
        if lasting is None:
            return
        count, new = lasting
        await self.scheduler.states.set_lasting_differences(self.url, count)
        if new:
            log.warning("sync_lasting_differences", peer=self.url, count=count, new=len(new), ids=new[:LOGGED_IDS])

    async def _stream(self, conn: PeerConnection, helpers: list[asyncio.Task]) -> None:
        """Wait until a reconciliation is due, flushing counts; raise if the connection or a helper fails."""
        due = time.monotonic() + self.config.interval_seconds
        reconcile_now = asyncio.ensure_future(self._reconcile_now.wait())
        try:
            while (remaining := due - time.monotonic()) > 0:
                done, _ = await asyncio.wait({conn.failure, reconcile_now, *helpers},
                                             timeout=min(remaining, FLUSH_SECONDS),
                                             return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    if task is not reconcile_now:
                        raise task.exception() or PeerError(f"live stream with {self.url} ended")
                if reconcile_now in done:
                    return
                if self.events_in or self.events_out:
                    await self._flush_counts()
        finally:
            reconcile_now.cancel()

    async def _store_live(self) -> None:
        """Validate and store the events of the live REQ, in batches as they come."""
        def in_filter(event: Event) -> None:
            if not self.filter.matches(event):
                raise invalid("event outside the sync filter")

        while True:
            await self._incoming_ready.wait()
            self._incoming_ready.clear()
            while self._incoming:
                batch = self._incoming[:self.config.fetch_batch]
                del self._incoming[:len(batch)]
                for obj, (outcome, message) in zip(batch, await self.intake.accept(batch, in_filter)):
                    if outcome == STORED:
                        self.events_in += 1
                    elif outcome == ERROR:
                        log.warning("sync_live_event_refused", peer=self.url, message=message,
                                    event_id=event_ref(obj))

    async def _push_live(self, conn: PeerConnection) -> None:
        """Send newly stored events to the peer in writes of up to `push_chunk`, at most `push_in_flight` awaiting OK."""
        chunk = push_chunk(self.config.push_in_flight)
        slots = asyncio.Semaphore(max(1, self.config.push_in_flight // chunk))
        failures: list[BaseException] = []
        tasks: set[asyncio.Task] = set()

        def on_answer(event_id: str, accepted: bool, message: str) -> None:
            outcome, message = classify(accepted, message)
            if outcome == STORED:
                self.events_out += 1
            elif outcome in (ERROR, REFUSED):
                log.warning("sync_live_push_refused", peer=self.url, event_id=event_id, message=message)

        async def push(events: list[Event]) -> None:
            try:
                await conn.publish_many([(e.id, e.raw) for e in events], on_answer)
            except PeerError as exc:
                failures.append(exc)
            finally:
                slots.release()

        try:
            while True:
                await self._outgoing_ready.wait()
                self._outgoing_ready.clear()
                while self._outgoing:
                    await slots.acquire()
                    if failures:
                        raise failures[0]
                    events = [self._outgoing.popleft() for _ in range(min(chunk, len(self._outgoing)))]
                    if not events:  # cleared by an overflow meanwhile
                        slots.release()
                        break
                    task = asyncio.create_task(push(events))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
        finally:
            for task in tasks:
                task.cancel()


async def start_sync(config: Config, store: Store, ingest: Ingest) -> Scheduler | None:
    """At `relay serve` start: make sure the node key exists; start a Scheduler when peers are configured,
    taking their events through `ingest`.

    Raises:
        NodeKeyError: the key cannot be created or read while peers are configured.
    """
    try:
        key = node_key(config)
    except NodeKeyError as exc:
        if config.sync.peers:
            raise
        log.error("node_key_unavailable", error=str(exc))
        return None
    if not config.sync.peers:
        return None
    scheduler = Scheduler(config, store, key, ingest)
    await scheduler.start()
    return scheduler
