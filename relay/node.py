"""The node: the one place that builds the parts of a relay process and wires them together.

`open_store(config)` opens the store with the transaction hooks the
configuration asks for (relay/hooks.py), for `relay serve` and every
offline command that writes: no other module calls `Store.open` with hooks,
so no writer can forget them (derived tables written without their hook
would no longer agree with the events; `relay verify` tells).

`Node` builds, in order: metrics, the store, the moderation rules, the ingest
path with its one signature pool, the server (relay/server/), the background tasks (expiry
purge, retention, memory trim) and peer sync (relay/sync/); each commit is
counted and fanned out to live subscriptions, then offered to peers.
`run(config)` is `relay serve`: it holds the database's and the port's locks
(relay/locks.py: one relay per database and per port), owns the process
tuning (malloc, GC, switch interval) and stops on SIGINT/SIGTERM or when the
writer fails.  One process (`server.workers` = 0) also listens on the local
channel (relay/channel/), so command-line writes go through its writer.
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import gc
import os
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from pathlib import Path

import structlog

from relay.channel.frames import socket_path
from relay.channel.writer import ChannelServer
from relay.config import Config, ConfigError, shards_of
from relay.hooks import hooks
from relay.ingest import Ingest
from relay.ingest.moderation import Moderation
from relay.ingest.records import RecordApi
from relay.keys import NodeKeyError
from relay.locks import PORT_ADVICE, InstanceLock, LockHeld, database_lock, is_served, port_lock
from relay.metrics import CONTENT_TYPE, Metrics
from relay.protocol.event import Event
from relay.retention import is_configured, protection, retention_forever
from relay.server.app import RelayServer
from relay.wire.http import HttpRequest, HttpResponse
from relay.status_page import StatusPage
from relay.store.location import DatabaseUnusable, check_location
from relay.store.projectors.background import build_in_background
from relay.store.projectors.engine import ProjectorHook
from relay.store.store import Store
from relay.store.writes import Changes
from relay.sync.claims import ShardKeeper
from relay.sync.scheduler import Scheduler, node_key, start_sync

log = structlog.get_logger(__name__)

STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}  # `relay serve` stops cleanly on either (docs/operating.md, "Shutdown")
_SWITCH_INTERVAL_SECONDS = 0.0005
_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter (malloc.h)
_MMAP_THRESHOLD_BYTES = 1_048_576


async def open_store(config: Config, read_connections: int | None = None, background_builds: bool = False,
                     bulk: bool = False) -> Store:
    """The store of `config` (`[store] path`), with its transaction hooks, for writing.

    `read_connections` overrides `[store] read_connections` (offline commands
    need one or two).  Each hook's `setup` runs here: a projector that is new
    or changed is built first, which can take a while on a large store, unless
    `background_builds` (`Node`) leaves its build for later (`ProjectorHook.builds`).  An offline writer beside
    a relay that serves the database (relay/locks.py) leaves a build in progress to that relay: a step here
    would hold the write lock the relay's writer waits for.  `bulk`: the options of a bulk load
    (`StoreOptions.bulk`: `relay import`).
    """
    s = config.store
    served = not background_builds and is_served(s.path)
    options = s.options(read_connections, config.server.public_url)
    return await Store.open(s.path, options.bulk() if bulk else options, hooks(config, background_builds, served))


class Node:
    """One relay process: `await start()`, then `await stop()`; the parts are attributes once started.

    `store`, `ingest` (every event's way in, relay/ingest/), `moderation` (bans and allow lists of
    config and database, relay/ingest/moderation.py), `server` (the
    port, relay/server/app.py), `sync` (the `[[sync.peers]]` scheduler, None
    without peers), `metrics` (served at /metrics).
    """

    def __init__(self, config: Config, serve: bool = True, metrics: Metrics | None = None) -> None:
        self.config = config
        self.serves = serve  # False: the writer process of `server.workers`, whose workers serve (relay/supervisor.py)
        self.metrics = metrics or Metrics()  # (the writer of workers gives its multiprocess one)
        self.store: Store | None = None
        self.records: RecordApi | None = None  # the Python API of records (relay/ingest/records.py), once started
        self.ingest: Ingest | None = None
        self.moderation: Moderation | None = None
        self.server: RelayServer | None = None
        self.sync: Scheduler | None = None
        self.shards: ShardKeeper | None = None  # with [[shards]]: claims and the guard (relay/sync/claims.py)
        self._background: list[asyncio.Task] = []

    async def start(self) -> None:
        """Open the store, start serving on `config.server` (port 0: any free port), then start peer sync.

        Raises:
            DatabaseUnusable: the database cannot be opened for writing (nothing listens).
            OSError: the address cannot be bound (the store is closed again).
            NodeKeyError: the node key cannot be created or read while peers are configured (nothing opened).
            ConfigError: a `[[policies]]` module cannot be loaded (the store is closed again).
        """
        config = self.config
        if config.sync.peers:  # the key peers' AUTH needs, checked before anything opens or listens
            node_key(config)
        self.store = store = await open_store(config, background_builds=True)
        store.add_listener(self._on_commit)
        store.on_batch = self.metrics.writer_batch
        self.moderation = await Moderation.open(store, config, runs_purges=True)  # (resumes purges cut short)
        try:
            self.ingest = Ingest.from_config(config, store, self._ephemeral, self.moderation)
        except ConfigError:  # a [[policies]] module that cannot be loaded: release the store's threads
            await store.close()
            raise
        self.records = RecordApi.from_config(config, store, self.ingest)  # get, query, put and delete rows
        if self.serves:
            await self._listen()
        self._start_background()
        # (the writer of workers watches no server: each worker watches its own)
        self.metrics.watch(store, self.server, _projector_hook(store))
        self.metrics.watch_policies(self.ingest.policies)
        self.sync = await start_sync(config, store, self.ingest)
        if self.sync is not None:
            self.metrics.watch_peers(self.sync)

    async def _listen(self) -> None:
        """Build the server and listen; the store released again if it cannot (then OSError)."""
        store = self.store
        self.server = RelayServer(self.config, store, self.ingest, self.metrics, self._metrics_page)
        add_status_page(self.server, self.moderation)
        try:
            await self.server.listen()
        except OSError:
            # e.g. the port is taken: release the store's threads, or the process cannot exit.
            self.moderation.close()
            await store.close()
            await self.ingest.aclose()
            raise

    def _start_background(self) -> None:
        """The expiry purge, the moderation refresh, memory trim, retention, this node's coverage claims (with
        `[[shards]]`) and the background builds of new or changed projectors (the writer's tasks)."""
        config, store = self.config, self.store
        self._background = [asyncio.create_task(self._purge_expired_forever(), name="expiry-purge"),
                            asyncio.create_task(self.moderation.refresh_forever(), name="moderation-refresh")]
        if (trim := start_memory_trim(config)) is not None:
            self._background.append(trim)
        if is_configured(config):
            self._background.append(asyncio.create_task(retention_forever(store, config), name="retention"))
        if shards_of(config):
            port = self.server.port if self.server is not None else config.server.port
            self.shards = ShardKeeper(config, store, self.ingest, lambda: self.records.node_key,
                                      config.server.public_url or f"ws://{config.server.host}:{port}", protection(config))
            self.metrics.watch_shards(self.shards)
            self._background.append(asyncio.create_task(self.shards.run(), name="shards"))
        projectors = _projector_hook(store)
        if projectors is not None and projectors.builds:  # new or changed projectors, built while serving
            self._background.append(asyncio.create_task(build_in_background(store, projectors.builds),
                                                        name="projector-builds"))

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

    async def stop(self) -> None:
        """Graceful shutdown within `server.shutdown_timeout_seconds`, then close the store.

        Peer sync stops first (it releases its leases and stops writing), then
        the server drains and closes its connections (`RelayServer.close`);
        the store then commits whatever is still queued (peer sync, stragglers).
        """
        timeout = self.config.server.shutdown_timeout_seconds
        deadline = asyncio.get_running_loop().time() + timeout
        for task in self._background:
            task.cancel()
        if self.moderation is not None:
            self.moderation.close()
        if self.sync is not None and self.server is None:  # the writer process: no server to time the steps
            try:
                await asyncio.wait_for(self.sync.stop(), timeout)
            except TimeoutError:
                log.warning("shutdown_timeout", step="sync", waited_seconds=timeout)
        elif self.sync is not None:
            await self.server.within(deadline, self.sync.stop(), "sync", timeout)
        if self.server is not None:
            await self.server.close(deadline)
        if self.store is not None:
            await self.store.close()
        if self.ingest is not None:
            await self.ingest.aclose()
        log.info("relay_stopped")

    async def _metrics_page(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse(HTTPStatus.OK, await self.metrics.render(), CONTENT_TYPE)

    def _ephemeral(self, event: Event) -> None:
        """An ephemeral event accepted from a client: fanned out, never stored (NIP-01)."""
        self.metrics.events_ephemeral.inc()
        if self.server is not None:  # (the writer process hands it to its workers: relay/channel/)
            self.server.fanout([event])

    def _on_commit(self, changes: Changes) -> None:
        self.metrics.events_stored.inc(len(changes.inserted))
        if self.server is not None:  # (the writer process's workers read the change feed: relay/channel/)
            self.server.fanout(changes.inserted, changes.seqs)

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


def add_status_page(server: RelayServer, moderation: Moderation) -> None:
    """With `[http] status_page`, the page for browsers at the relay's endpoints (relay/status_page.py)."""
    config = server.config
    if config.http.status_page:
        page = StatusPage(config, time.monotonic(), moderation)
        for path in config.server.paths:
            server.routes.add("GET", path, page.answer, accept="text/html")


def _projector_hook(store: Store) -> ProjectorHook | None:
    """The store's projector hook (None when no projector is declared)."""
    return next((h for h in store.hooks if isinstance(h, ProjectorHook)), None)


def unmap_large_blocks_when_freed() -> None:
    """Blocks of 1 MiB and more (a large REQ answer on its way) get pages of their own, unmapped when freed.

    glibc raises this threshold after each such block is freed (up to 32 MiB) and then keeps later ones in
    heaps it seldom gives back: after 100 concurrent REQs for 16 MiB answers, the relay stayed about 80 MB
    larger once its clients had gone (bench/big_answers.py).  Setting the threshold stops that adjustment;
    the price is fresh pages for each such block (those rounds took 2.8-3.0 s instead of 1.9-2.2 s).
    Nothing happens where the C library has no `mallopt`.
    """
    if (mallopt := _libc("mallopt")) is not None:
        mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_BYTES)


def _libc(name: str) -> Callable | None:
    """The C library's function `name` (glibc's `mallopt`, `malloc_trim`), or None where it has none."""
    try:
        return getattr(ctypes.CDLL(None), name)
    except (OSError, AttributeError):
        return None


def start_memory_trim(config: Config) -> asyncio.Task | None:
    """The task that trims this process's heap every `server.memory_trim_seconds` (one process, the writer of
    workers and each worker: a worker holds its clients' frames); None when that is 0 or there is no glibc."""
    if (trim := _libc("malloc_trim")) is None or config.server.memory_trim_seconds <= 0:
        return None
    return asyncio.create_task(_trim_memory_forever(trim, config.server.memory_trim_seconds), name="memory-trim")


async def _trim_memory_forever(trim: Callable[[int], int], seconds: float) -> None:
    """Every `seconds`, hand the heap memory freed since back to the OS (`trim(0)`, on a worker thread).

    glibc keeps freed blocks under 1 MiB in its heaps: after 10 non-reading subscribers were sent 300
    events of 100 kB (and dropped), the relay stayed at 351 MB, then 435, 475 and 511 MB over three more
    rounds, with 16 MB of live Python objects; trimmed, 95-130 MB. A trim took 27-35 ms after such a round
    and under 1 ms otherwise; ctypes lets go of the GIL meanwhile.
    """
    while True:
        await asyncio.sleep(seconds)
        await asyncio.to_thread(trim, 0)


def tune_after_start(serves_clients: bool = True) -> None:
    """Process settings for a relay process that has started: one process, each worker, or (`serves_clients`
    False) the writer of workers (`relay serve` only: tests share their process)."""
    # Start-up objects never die: keep them out of GC passes, and collect the young generation less often
    # (every event allocates a few containers).  The writer of workers answers no client, so it trades longer
    # pauses for fewer: a batch of 1,000 queued for it outlives a young collection, and at 10,000 each pass
    # walked the queue again (66 passes in 8 s of ingest, 0.37 s holding the GIL the write transaction waits
    # for); 100,000 gave it 3-5% more events/s.  A process with clients keeps pauses short for their REQs.
    gc.freeze()
    gc.set_threshold(*((10_000, 10, 10) if serves_clients else (100_000, 20, 100)))
    # The writer and verifier threads drop the GIL inside SQLite and secp256k1;
    # a short switch interval lets them take it back without waiting 5 ms.
    sys.setswitchinterval(_SWITCH_INTERVAL_SECONDS)


def _hold_locks(config: Config) -> list[InstanceLock]:
    """Take the database's lock, then the port's (none for port 0: the kernel picks a free one).

    Raises:
        LockHeld: the line `relay serve` prints: who holds which, and what to do.
    """
    db, port = config.store.path, config.server.port
    locks = [database_lock(db)] + ([port_lock(port)] if port != 0 else [])
    about = {"db": str(Path(db).resolve()), "port": port}
    held: list[InstanceLock] = []
    try:
        for lock in locks:
            lock.acquire(about)
            held.append(lock)
    except LockHeld:
        for lock in held:
            lock.release()
        raise
    return held


async def run(config: Config, serve: Callable[[Config, asyncio.Event], Awaitable[int]] | None = None) -> int:
    """`relay serve`: serve until SIGINT/SIGTERM or until the store fails; returns the process exit code.

    Exits 2, printing one line naming the holder's pid, when another relay serves the database or holds the port.
    `serve(config, stop)` runs once the locks are held, `stop` set by SIGINT or SIGTERM (None: this process
    serves alone; relay/supervisor.py gives the writer and its worker processes).
    """
    try:
        check_location(Path(config.store.path))  # before the lock file beside it: one line, not an OSError
        locks = _hold_locks(config)
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
        await node.stop()
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


async def serve_until_stopped(node: Node, stop: asyncio.Event) -> int:
    """Wait for `stop` (exit code 0) or for the writer of `node`'s store to fail (logged, 1)."""
    stopped = asyncio.create_task(stop.wait())
    writer = node.store.writer_task
    done, _ = await asyncio.wait({stopped, writer}, return_when=asyncio.FIRST_COMPLETED)
    stopped.cancel()
    if writer in done:
        log.error("store_failed", error=repr(writer.exception()))
        return 1
    return 0


async def _serve(config: Config, stop: asyncio.Event) -> int:
    unmap_large_blocks_when_freed()
    node = Node(config)
    if (code := await start_or_exit_code(node)) is not None:
        return code
    channel = None
    if not stop.is_set():  # (a stop asked while it started: it is not said to have started)
        tune_after_start()
        # Command-line writes (relay import, sync, ban, record) reach this process's writer and its subscribers.
        channel = ChannelServer(socket_path(config.store.path), node.ingest)
        await channel.start()
        log.info("relay_started", url=node.url, db=str(config.store.path))
    code = await serve_until_stopped(node, stop)
    if channel is not None:
        await channel.close()
    await node.stop()
    return code
