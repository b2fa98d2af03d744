"""The assembly: each relay process builds its parts here, once, each with what it needs passed in.

Three kinds of process (`Role`) share one start sequence (`Node.start`) and one stop sequence (`Node.stop`):

- `ONE` (`server.workers` = 0): the store and its one writer, the moderation rules, the ingest path with its one
  signature pool, the server (relay/server/), the background tasks (expiry purge, moderation refresh, retention,
  memory trim, shard claims, projector builds) and peer sync (relay/sync/); with `channel`, the local channel
  (relay/channel/writer.py) that command-line writes reach the writer through.
- `WRITER` (the writer of `server.workers` > 0, relay/supervisor.py): the same without a server; its channel
  takes its workers' events and jobs and hands them each commit and ephemeral event.
- `WORKER` (relay/worker.py): a read pool (relay/store/reads.py) instead of the store, the channel to the writer
  process as the write path of its ingest and moderation, its server on its share of the port, and the change
  feed's follower (relay/channel/follower.py) for its live subscriptions.

Each commit is counted and fanned out to live subscriptions (and the workers), then offered to peers.
`open_store(config)` opens the store with the transaction hooks the configuration asks for (relay/hooks.py), for
`relay serve` and every offline command that writes: no other module calls `Store.open` with hooks, so no writer
can forget them (derived tables written without their hook would no longer agree with the events; `relay
verify` tells).  `run(config)` is `relay serve`: the database's and the port's locks (relay/locks.py), the stop
signals (relay/signals.py), process tuning (relay/tuning.py), then one process or a writer and its workers.
"""

from __future__ import annotations

import asyncio
import enum
import errno
import os
import socket
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path

import structlog

from relay.channel.follower import FeedFollower
from relay.channel.frames import socket_path
from relay.channel.worker import WriterChannel
from relay.channel.writer import ChannelServer
from relay.config import Config, shards_of
from relay.hooks import hooks
from relay.ingest import Ingest
from relay.ingest.moderation import Moderation
from relay.ingest.records import RecordApi
from relay.keys import NodeKeyError
from relay.locks import PORT_ADVICE, LockHeld, hold_locks, is_served
from relay.metrics import CONTENT_TYPE, Metrics
from relay.protocol.event import Event
from relay.retention import is_configured, protection, retention_forever
from relay.runtime import runtime_dir
from relay.server.app import RelayServer
from relay.server.iptable import IpTable
from relay.server.ratelimit import open_ip_table
from relay.signals import stop_on_signals
from relay.status_page import StatusPage
from relay.store.location import DatabaseUnusable, check_location
from relay.store.projectors.background import build_in_background
from relay.store.projectors.engine import ProjectorHook
from relay.store.reads import ReadPool
from relay.store.store import Store
from relay.store.writes import Changes
from relay.sync.claims import ShardKeeper
from relay.sync.scheduler import Scheduler, node_key, start_sync
from relay.tuning import start_memory_trim, tune_after_start, unmap_large_blocks_when_freed
from relay.wire.http import HttpRequest, HttpResponse

log = structlog.get_logger(__name__)

HEALTHY_WITHIN_SECONDS = 1.0  # a worker's /health: a frame from the writer this recently


class Role(enum.Enum):
    """What a relay process does (see the module)."""

    ONE = "one"  # serves clients and writes
    WRITER = "writer"  # writes; its workers serve
    WORKER = "worker"  # serves; the writer process writes


@dataclass(frozen=True)
class Seat:
    """A worker's place: `index` of `count` workers, on the `port` the writer process reserved."""

    index: int
    count: int
    port: int


async def open_store(config: Config, read_connections: int | None = None, background_builds: bool = False,
                     bulk: bool = False, on_batch: Callable[[int, float], None] | None = None) -> Store:
    """The store of `config` (`[store] path`), with its transaction hooks, for writing.

    `read_connections` overrides `[store] read_connections` (offline commands
    need one or two).  Each hook's `setup` runs here: a projector that is new
    or changed is built first, which can take a while on a large store, unless
    `background_builds` (`Node`) leaves its build for later (`ProjectorHook.builds`).  An offline writer beside
    a relay that serves the database (relay/locks.py) leaves a build in progress to that relay: a step here
    would hold the write lock the relay's writer waits for.  `bulk`: the options of a bulk load
    (`StoreOptions.bulk`: `relay import`).  `on_batch(events, seconds)`: told of each write transaction.
    """
    s = config.store
    served = not background_builds and is_served(s.path)
    options = s.options(read_connections, config.server.public_url)
    return await Store.open(s.path, options.bulk() if bulk else options, hooks(config, background_builds, served),
                            on_batch)


async def open_read_pool(config: Config, read_connections: int | None = None) -> ReadPool:
    """The database of `config` for reading only (a worker, a command writing through the running relay), its
    hooks' indexes found (NIP-77, NIP-50); `read_connections` overrides `[store] read_connections`.

    Raises:
        DatabaseUnusable: the database cannot be opened.
    """
    options = config.store.options(read_connections, config.server.public_url)
    return await ReadPool.open(config.store.path, options, hooks(config))


class Node:
    """One relay process of `role`: `await start()`, then `await stop()`; the parts are attributes once started.

    `store` (the `Store`; a worker's `ReadPool`), `ingest` (every event's way in, relay/ingest/), `moderation`
    (bans and allow lists of config and database, relay/ingest/moderation.py), `records` (the Python API of
    records, relay/ingest/records.py; None in a worker), `server` (the port, relay/server/app.py; None in the
    writer of workers), `sync` (the `[[sync.peers]]` scheduler, None without peers or in a worker), `shards`
    (with `[[shards]]`: claims and the guard, relay/sync/claims.py), `metrics` (served at /metrics; the writer of
    workers and each worker are given their multiprocess one), `channel` (the local channel's writer side: the
    writer of workers, or one process with `channel`), `forward` (a worker's channel to the writer process).
    `seat`: a worker's place.  `port()`: the writer of workers' port, which its workers share (reserved before
    it starts; the URL its shard claims name).
    """

    def __init__(self, config: Config, role: Role = Role.ONE, metrics: Metrics | None = None,
                 seat: Seat | None = None, channel: bool = False, port: Callable[[], int] | None = None) -> None:
        self.config = config
        self.role = role
        self.seat = seat
        self._reserved_port = port
        self.writes = role is not Role.WORKER
        self.metrics = metrics or Metrics()
        self.store: Store | ReadPool | None = None
        self.records: RecordApi | None = None
        self.ingest: Ingest | None = None
        self.moderation: Moderation | None = None
        self.server: RelayServer | None = None
        self.sync: Scheduler | None = None
        self.shards: ShardKeeper | None = None
        self.channel: ChannelServer | None = None
        self._serves_commands = channel or role is Role.WRITER
        self.forward: WriterChannel | None = None
        self._follower: FeedFollower | None = None
        self._ip_table: IpTable | None = None
        self._reading: asyncio.Task | None = None  # a worker's reader of its channel: it ends when the writer goes
        self._background: list[asyncio.Task] = []

    async def start(self) -> None:
        """Build and start every part of this process (see the module), listening on `config.server` (port 0: any
        free port) or, in a worker, on its share of the port (SO_REUSEPORT).

        Raises:
            DatabaseUnusable: the database cannot be opened (nothing listens).
            OSError: the address cannot be bound, or a worker cannot reach the writer process (what opened is
                closed again).
            NodeKeyError: the node key cannot be created or read while peers are configured (nothing opened).
            ConfigError: a `[[policies]]` module cannot be loaded (the store is closed again).
        Whatever fails, what had opened is closed again (the port, the store's threads), so the process can exit.
        """
        if self.config.sync.peers and self.writes:  # the key peers' AUTH needs, before anything opens or listens
            node_key(self.config)
        await self._open_store()
        try:
            await self._build()
        except BaseException:
            await self._abandon()
            raise

    async def _build(self) -> None:
        """Every part after the store, in order (see `start`)."""
        config = self.config
        self.moderation = await Moderation.open(self.store, config, runs_purges=self.writes, writer=self.forward)
        self.ingest = Ingest.from_config(config, self.store, self._ephemeral if self.writes else None,
                                         self.moderation, self.forward)  # (a worker's come back from the writer)
        if self.writes:
            self.records = RecordApi.from_config(config, self.store, self.ingest)  # get, query, put, delete rows
        if self.role is not Role.WRITER:
            await self._listen()
        if self._serves_commands:  # command-line writes, and a writer's workers, reach this writer
            self.channel = ChannelServer(socket_path(config.store.path), self.ingest)
            await self.channel.start()
        projectors = _projector_hook(self.store) if self.writes else None
        self._start_background(projectors)
        self.metrics.watch(self.store, self.server, projectors)
        self.metrics.watch_policies(self.ingest.policies)
        if self.writes:
            self.sync = await start_sync(config, self.store, self.ingest)
            if self.sync is not None:
                self.metrics.watch_peers(self.sync)
        if self.forward is not None:
            self.forward.hello(self.seat.index)

    async def _open_store(self) -> None:
        """The store and its writer, or (a worker) the read pool and the channel to the writer process."""
        config = self.config
        if self.writes:
            self.store = await open_store(config, background_builds=True, on_batch=self.metrics.writer_batch)
            self.store.add_listener(self._on_commit)
            return
        self.store = await open_read_pool(config)
        self.forward = WriterChannel(socket_path(config.store.path), config.store.writer_queue_size,
                                     self._wake_follower, self._fan_out_ephemeral, self._reload_moderation)
        try:
            await self.forward.connect()
        except OSError:
            await self.store.close()
            raise

    async def _listen(self) -> None:
        """Build the server and listen (OSError: it cannot)."""
        config, seat = self.config, self.seat
        worker = {}
        if seat is not None:
            self._ip_table = open_ip_table(runtime_dir(config.store.path), config.rate_limits, seat.index)
            worker = {"ip_table": self._ip_table, "health": self._health, "server_header": f"relay worker {seat.index}"}
        self.server = RelayServer(config, self.store, self.ingest, self.metrics, self._metrics_page, **worker)
        add_status_page(self.server, self.moderation)
        if self.forward is not None:  # the feed's head, before any subscription can exist here
            self._follower = FeedFollower(self.store, self.server.fanout, self.server.subscriptions.empty)
            await self._follower.start()
        await self.server.listen(reuseport_socket(config.server.host, seat.port) if seat is not None else None)

    def _start_background(self, projectors: ProjectorHook | None) -> None:
        """The moderation refresh, memory trim and (multiprocess metrics) the metrics refresh; in a worker, the
        reader of its channel; in a writer, the expiry purge, retention, this node's coverage claims (with
        `[[shards]]`) and the background builds of new or changed projectors."""
        config, store = self.config, self.store
        tasks = [asyncio.create_task(self.moderation.refresh_forever(), name="moderation-refresh")]
        if (trim := start_memory_trim(config.server.memory_trim_seconds)) is not None:
            tasks.append(trim)
        if self.metrics.multiprocess_dir is not None:
            tasks.append(asyncio.create_task(self.metrics.refresh_forever(), name="metrics-refresh"))
        if self.forward is not None:
            self._reading = asyncio.create_task(self.forward.run(), name="channel")
        if self.writes:
            tasks.append(asyncio.create_task(self._purge_expired_forever(), name="expiry-purge"))
            if is_configured(config):
                tasks.append(asyncio.create_task(retention_forever(store, config), name="retention"))
            if shards_of(config):
                port = self.server.port if self.server is not None else \
                    self._reserved_port() if self._reserved_port is not None else config.server.port
                self.shards = ShardKeeper(config, store, self.ingest, lambda: self.records.node_key,
                                          config.server.public_url or f"ws://{config.server.host}:{port}",
                                          protection(config))
                self.metrics.watch_shards(self.shards)
                tasks.append(asyncio.create_task(self.shards.run(), name="shards"))
            if projectors is not None and projectors.builds:  # new or changed projectors, built while serving
                tasks.append(asyncio.create_task(build_in_background(store, projectors.builds),
                                                 name="projector-builds"))
        self._background = tasks

    @property
    def port(self) -> int:
        """The TCP port actually bound."""
        assert self.server is not None
        return self.server.port

    @property
    def url(self) -> str:
        """ws://host:port of this relay."""
        assert self.server is not None
        return self.server.url

    @property
    def failure(self) -> asyncio.Task:
        """The task whose end means this process cannot go on: the store's writer (it ends with `StoreFailed`),
        or a worker's reader of its channel (the writer process is gone)."""
        return self._reading if self._reading is not None else self.store.writer_task

    async def stop(self, drain: bool = True) -> None:
        """Graceful shutdown within `server.shutdown_timeout_seconds` (no wait for the connections to drain when
        not `drain`: a worker whose writer is gone can acknowledge nothing), then close the store.

        Peer sync stops first (it releases its leases and stops writing), then
        the server drains and closes its connections (`RelayServer.close`; a worker's channel still answers
        their events), then the channels close and the store commits whatever is still queued (peer sync,
        stragglers, commands).
        """
        timeout = self.config.server.shutdown_timeout_seconds
        deadline = asyncio.get_running_loop().time() + (timeout if drain else 0.0)
        for task in self._background:
            task.cancel()
        if self.sync is not None and self.server is None:  # the writer process: no server to time the steps
            try:
                await asyncio.wait_for(self.sync.stop(), timeout)
            except TimeoutError:
                log.warning("shutdown_timeout", step="sync", waited_seconds=timeout)
        elif self.sync is not None:
            await self.server.within(deadline, self.sync.stop(), "sync", timeout)
        if self.server is not None:
            await self.server.close(deadline)
        await self._close_parts()
        if self.writes:
            log.info("relay_stopped")

    async def _abandon(self) -> None:
        """A start that failed part way: stop what started, at once (no connection to drain yet)."""
        for task in self._background:
            task.cancel()
        if self.sync is not None:
            await self.sync.stop()
        if self.server is not None:
            await self.server.close(asyncio.get_running_loop().time())
        await self._close_parts()

    async def _close_parts(self) -> None:
        """Close what `start` opened after the server: the channels, moderation, the store, ingest's pool."""
        if self._reading is not None:
            self._reading.cancel()
        if self._follower is not None:
            self._follower.stop()
        if self.forward is not None:
            self.forward.close()
        if self.channel is not None:
            await self.channel.close()
        if self.moderation is not None:
            self.moderation.close()
        if self.store is not None:
            await self.store.close()
        if self.ingest is not None:
            await self.ingest.aclose()
        if self._ip_table is not None:
            self._ip_table.close()

    async def _metrics_page(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse(HTTPStatus.OK, await self.metrics.render(), CONTENT_TYPE)

    def _ephemeral(self, event: Event) -> None:
        """An ephemeral event accepted by this writer: fanned out here and to the workers, never stored (NIP-01)."""
        self.metrics.events_ephemeral.inc()
        self._fan_out_ephemeral(event)
        if self.channel is not None:
            self.channel.broadcast_ephemeral(event)

    def _fan_out_ephemeral(self, event: Event) -> None:
        """To this process's live subscriptions (a worker: as the writer hands it on, to every worker at once)."""
        if self.server is not None:
            self.server.fanout([event])

    def _on_commit(self, changes: Changes) -> None:
        self.metrics.events_stored.inc(len(changes.inserted))
        if self.server is not None:  # (the workers read the change feed: relay/channel/follower.py)
            self.server.fanout(changes.inserted, changes.seqs)
        if self.channel is not None:
            self.channel.on_commit(changes)

    def _wake_follower(self, head: int | None) -> None:
        """A worker: the writer committed (up to `head`) or beat (None): its follower reads the change feed."""
        if self._follower is not None:
            self._follower.wake(head)

    async def _reload_moderation(self) -> None:
        """A worker: the writer changed the moderation lists; read them again before answering it."""
        await self.moderation.load()

    def _health(self) -> tuple[bool, dict]:
        """A worker's `GET /health`: whether it heard from the writer process within HEALTHY_WITHIN_SECONDS."""
        healthy = self.forward.reached_within(HEALTHY_WITHIN_SECONDS)
        return healthy, {"writer": "ok" if healthy else "unreachable", "workers": self.seat.count,
                         "worker": self.seat.index}

    async def _purge_expired_forever(self) -> None:
        """Every `store.expiry_purge_interval_seconds`, remove expired events (NIP-40) in batches until none is left."""
        store = self.store
        while True:
            await asyncio.sleep(self.config.store.expiry_purge_interval_seconds)
            try:
                while await store.purge_expired() >= store.options.purge_batch:
                    pass
            except Exception as exc:  # the one place this task catches: log, try again next interval
                log.error("expiry_purge_failed", error=repr(exc), exc_info=exc)


def reuseport_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to `host`:`port` with SO_REUSEPORT, not listening (port 0: a free one).

    The writer process holds one, never listening, so that the port stays the relay's (port 0 gives one
    port to every worker); each worker binds its own and listens.

    Raises:
        OSError: the address cannot be bound.
    """
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def add_status_page(server: RelayServer, moderation: Moderation) -> None:
    """With `[http] status_page`, the page for browsers at the relay's endpoints (relay/status_page.py)."""
    config = server.config
    if config.http.status_page:
        page = StatusPage(config, time.monotonic(), moderation)
        for path in config.server.paths:
            server.routes.add("GET", path, page.answer, accept="text/html")


def _projector_hook(store: ReadPool) -> ProjectorHook | None:
    """The store's projector hook (None when no projector is declared)."""
    return next((h for h in store.hooks if isinstance(h, ProjectorHook)), None)


async def run(config: Config, serve: Callable[[Config, asyncio.Event], Awaitable[int]] | None = None) -> int:
    """`relay serve`: serve until SIGINT/SIGTERM or until the store fails; returns the process exit code.

    Exits 2, printing one line naming the holder's pid, when another relay serves the database or holds the port.
    `serve(config, stop)` runs once the locks are held, `stop` set by SIGINT or SIGTERM (None: this process
    serves alone; relay/supervisor.py gives the writer and its worker processes).
    """
    try:
        check_location(Path(config.store.path))  # before the lock file beside it: one line, not an OSError
        locks = hold_locks(config.store.path, config.server.port)
    except DatabaseUnusable as exc:  # a bad path or file mode: as a bad config, before listening
        log.error("database_unusable", path=exc.path, error=exc.reason)
        return 2
    except LockHeld as exc:
        print(f"relay: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # e.g. a read-only directory
        print(f"relay: cannot lock the database or port: {exc}", file=sys.stderr)
        return 1
    try:
        stop = stop_on_signals()
        if stop.is_set():  # asked while the process started: nothing is started
            return 0
        return await (serve or _serve)(config, stop)
    finally:
        for lock in locks:
            lock.release()


async def start_or_exit_code(node: Node) -> int | None:
    """`await node.start()`: None once started, else the exit code of `relay serve` (the failure logged)."""
    config = node.config
    try:
        await node.start()
    except DatabaseUnusable as exc:  # a bad path or file mode: as a bad config, before listening
        log.error("database_unusable", path=exc.path, error=exc.reason)
        return 2
    except OSError as exc:
        return listen_failed(config, exc)
    except NodeKeyError as exc:  # peers configured, but no key to answer their AUTH with: as a bad config
        log.error("node_key_unavailable", error=str(exc))
        return 2
    return None


def listen_failed(config: Config, exc: OSError) -> int:
    """Log `listen_failed` for `config.server`'s address, with how to choose another port when another process
    holds it; the exit code, 1.  The same line whichever socket failed (one process's server, or the port a
    writer reserves for its workers): the error as its errno names it."""
    named = exc.errno and not isinstance(exc, socket.gaierror)  # (asyncio's bind errors add to the kernel's words)
    error = f"[Errno {exc.errno}] {os.strerror(exc.errno)}" if named else str(exc)
    hint = {"hint": f"another process listens there: {PORT_ADVICE}"} if exc.errno == errno.EADDRINUSE else {}
    log.error("listen_failed", host=config.server.host, port=config.server.port, error=error, **hint)
    return 1


async def serve_until_stopped(node: Node, stop: asyncio.Event, lost: asyncio.Event | None = None) -> int:
    """Wait for `stop` (exit code 0), or for `node`'s failure (logged, 1): its store's writer failed, or (a
    worker) its writer process is gone (its channel closed, or `lost`: the parent-death signal)."""
    waits = {asyncio.create_task(stop.wait())} | ({asyncio.create_task(lost.wait())} if lost is not None else set())
    await asyncio.wait(waits | {node.failure}, return_when=asyncio.FIRST_COMPLETED)
    for wait in waits:
        wait.cancel()
    if stop.is_set():
        return 0
    if node.writes:
        log.error("store_failed", error=repr(node.failure.exception()))
    else:
        log.error("writer_lost", hint="the writer process is gone: this worker stops, as nothing it takes could "
                                      "be acknowledged")
    return 1


async def _serve(config: Config, stop: asyncio.Event) -> int:
    """One process (`server.workers` = 0) until `stop`; the exit code."""
    unmap_large_blocks_when_freed()
    node = Node(config, channel=True)
    if (code := await start_or_exit_code(node)) is not None:
        return code
    if not stop.is_set():  # (a stop asked while it started: it is not said to have started)
        tune_after_start()
        log.info("relay_started", url=node.url, db=str(config.store.path))
    code = await serve_until_stopped(node, stop)
    await node.stop()
    return code
