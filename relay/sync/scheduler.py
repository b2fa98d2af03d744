"""The configured peers (`[[sync.peers]]`): reconcile at start and every interval, stream in between.

How this works
--------------
`Scheduler` runs one `PeerSync` task per configured peer.  A task first
takes the peer's lease in the database (state.py), so that two processes
on one database never sync one peer at once, then connects and:

1. opens a live `REQ` (the peer's filter with `limit: 0`: new events only,
   whatever their created_at) before reconciling, so nothing the peer
   accepts from then on is missed;
2. (up) pushes what was committed here since the peer's push cursor (below);
3. reconciles (session.py: NIP-77, fetch, push), except at the start of a
   session of an `up` peer whose push cursor is valid: step 2 did its part;
4. streams until the next reconciliation is due (`interval_seconds`): events
   from the live REQ are validated and stored with origin = the peer's URL;
   events newly committed here are pushed to the peer from the change feed
   (relay/store/feed.py), except those whose origin is that peer, so nothing
   is echoed back.

With a peer of the fleet whose claims are known (it syncs by shard: its `scope`), no live REQ is opened: the
peer pushes what it commits, as this node does.  An event that came from another peer is pushed on all the
same: the node that took it may remove it (outside its shards) before its own push reached every holder.

The push cursor (`sync_peers.push_cursor`) is the feed position up to which
every event was pushed and answered; it is stored after each batch is
answered, so events committed while the peer was unreachable, or while we
were stopped, are pushed as soon as it is reached again, and a crash resends
at most the batch in flight.  A peer never pushed to, or one whose cursor is
older than the feed keeps (`feed.StaleCursor`, logged), starts from the
feed's head with a reconciliation, which finds what came before.  The feed
is read when a commit here wakes the push, and every `PUSH_POLL_SECONDS`
for commits made by another process on this database.

An incoming live queue that overflows (`live_queue`) is dropped and the next
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

import structlog

from relay.config import Config, PeerConfig
from relay.ingest import Ingest
from relay.protocol.claims import CLAIM_KIND
from relay.protocol.event import Event, event_ref
from relay.protocol.filters import Filter, parse_filter
from relay.protocol.rejection import invalid
from relay.store import feed
from relay.store.projectors.rows import stored_event
from relay.store.store import Store
from relay.store.writes import Changes
from relay.sync.differences import LOGGED_IDS, LastingDifferences
from relay.keys import NodeKey, NodeKeyError, key_path, load_or_create
from relay.sync.peer import PeerConnection, PeerError
from relay.sync.session import ERROR, REFUSED, STORED, Intake, SyncOptions, SyncReport, classify, sync_with_peer
from relay.sync.claims import read_claims
from relay.sync.scope import Scope, peer_scope
from relay.sync.state import LeaseBusy, LeaseLost, PeerStates, new_owner

log = structlog.get_logger(__name__)

FLUSH_SECONDS = 2.0  # how often live counts reach sync_peers (when they changed)
PUSH_POLL_SECONDS = 1.0  # the live push reads the change feed at least this often (commits of other processes)


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


class ScopeChanged(Exception):
    """The peer's claims changed what is synced with it: the session ends and a new one starts at once."""

    def __init__(self, shards: list[str]) -> None:
        super().__init__(f"the peer's shards are now {shards}")
        self.shards = shards


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
        if changes.inserted:
            claims = any(e.kind == CLAIM_KIND for e in changes.inserted)
            for peer in self.peers:
                peer.committed.set()
                if claims:
                    peer.claims_committed.set()

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
        self.scope: Scope | None = None  # the peer's shards, read at the start of each session (scope.py)
        self.up = peer.direction in ("up", "both")
        self.down = peer.direction in ("down", "both")
        self.options = sync_options(scheduler.config, peer.direction)
        self.intake = Intake(scheduler.ingest, self.url)
        self.events_in = 0  # not yet written to sync_peers
        self.events_out = 0
        self.errors = 0  # failed attempts since start (metrics)
        self.committed = asyncio.Event()  # set on each commit here: the live push reads the change feed
        self.claims_committed = asyncio.Event()  # set on each commit of a claim: the peer's shards may change
        self._incoming: list[object] = []
        self._incoming_ready = asyncio.Event()
        self._reconcile_now = asyncio.Event()
        self._synced = False  # the current attempt reconciled at least once (resets the backoff)
        self._lasting = LastingDifferences()

    # --- feeding the live streams (called from the event loop, never blocking) ----------------------

    def _on_live_event(self, obj: object) -> None:
        if len(self._incoming) >= self.config.live_queue:
            if not self._reconcile_now.is_set():
                log.warning("sync_live_queue_overflow", peer=self.url, queue="incoming", size=self.config.live_queue)
            self._incoming.clear()
            self._reconcile_now.set()
            return
        self._incoming.append(obj)
        self._incoming_ready.set()

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
            except ScopeChanged as changed:
                log.info("sync_shards_changed", peer=self.url, shards=changed.shards)
                continue  # a new session at once, with the new scope
            except (PeerError, sqlite3.Error, OSError) as exc:
                log.warning("sync_peer_failed", peer=self.url, error=str(exc))
                await self._record_error(str(exc))
            except Exception as exc:  # the one broad catch of this task: a bug is logged and retried
                log.error("sync_peer_crashed", peer=self.url, error=repr(exc), exc_info=exc)
                await self._record_error(f"internal error: {exc!r}")
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
            self._incoming.clear()
            self.scope = await self._read_scope()
            if self.scope is not None:
                log.info("sync_by_shard", peer=self.url, shards=list(self.scope.shards),
                         sessions=[(x.filter, x.direction) for x in self.scope.sessions])
            if self.down and self.scope is None:  # (a fleet node pushes what it commits: see the module)
                await conn.subscribe({**self.filter_obj, "limit": 0}, self._on_live_event)
                helpers.append(asyncio.create_task(self._store_live(), name=f"sync-in {self.url}"))
            reconcile = True
            if self.up:
                cursor, reconcile = await self._catch_up(conn)
                reconcile = reconcile or self.down
                helpers.append(asyncio.create_task(self._push_live(conn, cursor), name=f"sync-out {self.url}"))
            while True:
                self._reconcile_now.clear()
                if reconcile:
                    await self._reconcile(conn)
                reconcile = True
                await self._stream(conn, helpers)
        finally:
            for task in helpers:
                task.cancel()
            await asyncio.gather(*helpers, return_exceptions=True)
            await conn.close()
            try:
                await self._flush_counts()
            except sqlite3.Error as exc:
                log.warning("sync_state_write_failed", peer=self.url, error=repr(exc))

    async def _read_scope(self) -> Scope | None:
        """The peer's shards as its stored claims say (scope.py), or None: a full replica."""
        return peer_scope(self.scheduler.config, self.peer, await self.scheduler.store.read_snapshot(read_claims))

    def _pushed(self) -> list[Filter] | None:
        """The filters of what is pushed to the peer: its shards' with a scope, else the entry's; None: every
        event (then no event needs parsing)."""
        if self.scope is not None:
            return self.scope.filters("up")
        return [self.filter] if self.filter_obj else None

    async def _reconcile(self, conn: PeerConnection) -> None:
        """One reconciliation (session.py), one NIP-77 session per shard with a peer that holds shards;
        counted and logged; sets `_synced` when it succeeds.

        Raises:
            ScopeChanged: the peer's claims changed what is synced with it (a new session follows).
        """
        scope = await self._read_scope()
        if scope != self.scope:
            raise ScopeChanged(list(scope.shards) if scope else [])
        sessions = [(self.filter_obj, self.options)] if scope is None else \
            [(x.filter_obj, sync_options(self.scheduler.config, x.direction)) for x in scope.sessions]
        report = SyncReport()
        try:
            for filter_obj, options in sessions:
                await sync_with_peer(conn, self.scheduler.store, filter_obj, options, self.intake, report)
        except BaseException:  # failed, cancelled or lease lost: what it did, and for how long, is known
            log.info("sync_reconcile_interrupted", peer=self.url, **report.as_dict())
            raise
        finally:  # the events an interrupted reconciliation moved are counted too
            self.events_in += report.fetched
            self.events_out += report.pushed
        await self._flush_counts()
        await self.scheduler.states.record_run(self.url, sum(report.refused.values()), report.error_text())
        if report.errors:  # a failed attempt for metrics too; the stream goes on
            self.errors += 1
        self._synced = True
        log.info("sync_reconciled", peer=self.url, **report.as_dict())
        await self._note_lasting(report)

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
        self.claims_committed.clear()
        claims = asyncio.ensure_future(self.claims_committed.wait())
        try:
            while (remaining := due - time.monotonic()) > 0:
                done, _ = await asyncio.wait({conn.failure, reconcile_now, claims, *helpers},
                                             timeout=min(remaining, FLUSH_SECONDS),
                                             return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    if task not in (reconcile_now, claims):
                        raise task.exception() or PeerError(f"live stream with {self.url} ended")
                if reconcile_now in done:
                    return
                if claims in done:  # a new claim: reconcile at once if it changes what is synced
                    if await self._read_scope() != self.scope:
                        return
                    self.claims_committed.clear()
                    claims = asyncio.ensure_future(self.claims_committed.wait())
                if self.events_in or self.events_out:
                    await self._flush_counts()
        finally:
            reconcile_now.cancel()
            claims.cancel()

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

    async def _catch_up(self, conn: PeerConnection) -> tuple[int, bool]:
        """Push what was committed here since the stored push cursor, at the start of a session:
        (the cursor reached, whether a reconciliation must do it instead).

        The reconciliation is needed for a peer never pushed to, and for one whose cursor is older than the
        change feed keeps (logged); the cursor then starts at the feed's head.
        """
        cursor = await self.scheduler.states.push_cursor(self.url)
        if cursor is None:
            return await self._from_head(), True
        try:
            cursor = await self._push_pending(conn, cursor)
        except feed.StaleCursor as stale:
            return await self._from_head(stale), True
        self._synced = True
        return cursor, False

    async def _from_head(self, stale: feed.StaleCursor | None = None) -> int:
        """The change feed's head, stored as the push cursor (a reconciliation is to find what came before);
        logs the `stale` cursor given up, if any."""
        if stale is not None:
            log.warning("sync_push_cursor_stale", peer=self.url, cursor=stale.cursor, oldest=stale.oldest,
                        fallback="reconciliation")
        head = await self.scheduler.store.read_snapshot(feed.head)
        await self.scheduler.states.set_push_cursor(self.url, head)
        return head

    def _on_push_answer(self, event_id: str, accepted: bool, message: str) -> None:
        outcome, message = classify(accepted, message)
        if outcome == STORED:
            self.events_out += 1
        elif outcome in (ERROR, REFUSED):
            log.warning("sync_live_push_refused", peer=self.url, event_id=event_id, message=message)

    async def _push_pending(self, conn: PeerConnection, cursor: int) -> int:
        """Push every event committed after `cursor` in the peer's scope (not from it), in batches of up to
        `push_in_flight`, storing the cursor after each batch is answered; returns the cursor reached.

        Raises:
            feed.StaleCursor: the feed no longer keeps what follows `cursor` (pushing fell that far behind).
            PeerError: the peer failed to answer.
        """
        unsaved = False  # the cursor moved past changes with nothing to push: saved once, at the end
        while changes := await self.scheduler.store.changes(cursor, self.config.push_in_flight):
            pushed = self._pushed()
            events = [(c.id, c.raw) for c in changes if c.raw is not None and c.origin != self.url
                      and (pushed is None or _matches_any(pushed, stored_event(c.raw)))]
            cursor = changes[-1].cursor
            unsaved = not events
            if events:
                await conn.publish_many(events, self._on_push_answer)
                await self.scheduler.states.set_push_cursor(self.url, cursor)
        if unsaved:
            await self.scheduler.states.set_push_cursor(self.url, cursor)
        return cursor

    async def _push_live(self, conn: PeerConnection, cursor: int) -> None:
        """Push from `cursor` on as commits come (woken by `committed`, else every `PUSH_POLL_SECONDS`).

        A cursor that falls behind what the feed keeps moves to its head, and a reconciliation starts at once.
        """
        while True:
            self.committed.clear()
            try:
                cursor = await self._push_pending(conn, cursor)
            except feed.StaleCursor as stale:
                cursor = await self._from_head(stale)
                self._reconcile_now.set()
                continue
            try:
                await asyncio.wait_for(self.committed.wait(), PUSH_POLL_SECONDS)
            except TimeoutError:
                pass


def _matches_any(filters: list[Filter], event: Event) -> bool:
    return any(f.matches(event) for f in filters)


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
