"""The relay process: WebSocket server, NIP-11, /health and /metrics on the same port, background tasks.

`Relay` holds what every connection shares (config, store, the ingest path
with its signature pool, live subscription index).  `run_relay` serves
until cancelled or signalled; `Relay.start`/`stop` let tests run a real
server in-process on an ephemeral port.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import itertools
import signal
import sys
import weakref
from collections.abc import Awaitable, Callable
from functools import partial
from http import HTTPStatus

import structlog
from websockets.asyncio.server import Server, ServerConnection, serve

from relay.config import Config
from relay.ingest import Ingest
from relay.metrics import CONTENT_TYPE, Metrics
from relay.protocol.event import Event
from relay.server import nip11
from relay.server.access import AccessPolicy
from relay.server.budget import ByteBudget
from relay.server.connection import Connection, ConnectionServices
from relay.server.handlers.context import Services
from relay.server.negentropy import NegentropyService
from relay.server.ratelimit import TOO_MANY_CONNECTIONS, RateLimits
from relay.server.subscriptions import SubscriptionIndex
from relay.server.wire.handshake import RoutedServerConnection
from relay.server.wire.http import ANY_PATH, HttpRequest, HttpResponse, Routes
from relay.server.wire.websocket import reset
from relay.store.store import Store
from relay.store.writes import Changes

log = structlog.get_logger(__name__)

_SWITCH_INTERVAL_SECONDS = 0.0005
_RESET_SECONDS = 1.0  # at shutdown, for reset connections' handlers to return
_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter (malloc.h)
_MMAP_THRESHOLD_BYTES = 1_048_576


class Relay:
    """Shared state of one relay process and the entry points around it."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.event_limits = config.limits.event_limits()
        self.subscriptions = SubscriptionIndex()
        self.access = AccessPolicy(config.auth, config.sync.peers)  # NIP-42 and write rules (server/access.py)
        self.store: Store | None = None
        self.ingest: Ingest | None = None  # every event's way in (relay/ingest/), from start()
        self.server: Server | None = None
        self.slow_readers = 0
        self.keepalive_timeouts = 0
        self.connections_refused = 0  # past rate_limits.ip_connections
        self._conn_ids = itertools.count(1)
        self._background: list[asyncio.Task] = []
        self.sync = None  # relay.sync.scheduler.Scheduler while [[sync.peers]] are configured
        self.negentropy: NegentropyService | None = None  # NIP-77 responder, from start()
        self.connections: set[Connection] = set()  # open ones, for shutdown and metrics
        self._sockets: weakref.WeakSet[ServerConnection] = weakref.WeakSet()  # every accepted one, from its first byte
        self.metrics = Metrics(self)  # served at /metrics (relay/metrics.py)
        self.stored_results = ByteBudget(config.limits.max_stored_results_bytes)  # unsent REQ results, all connections
        self.rate_limits = RateLimits(config.rate_limits, stored_results=self.stored_results)
        self.routes = self._routes()  # HTTP on the WebSocket port (relay/server/wire/http.py)
        self._connection_services: ConnectionServices | None = None  # from start()

    async def start(self) -> None:
        """Open the store and start listening on `config.server` (port 0: any free port)."""
        s = self.config.store
        from relay.hooks import hooks  # transaction hooks: projectors, ...

        self.store = await Store.open(s.path, s.options(relay_url=self.config.server.public_url), hooks(self.config))
        self.store.add_listener(self._on_commit)
        self.store.on_batch = self.metrics.writer_batch
        self.ingest = Ingest.from_config(self.config, self.store, self._ephemeral)
        self.negentropy = NegentropyService(self.config.negentropy, self.store, self.internal_error)
        self._connection_services = self._connection_parts()
        try:
            self.server = await serve(
                self._handle, self.config.server.host, self.config.server.port,
                max_size=self.config.limits.max_message_bytes,
                max_queue=16, compression=None, ping_interval=None,  # pings: Wire.unresponsive
                create_connection=self._server_connection,
            )
        except OSError:
            # e.g. the port is taken: release the store's threads, or the process cannot exit.
            await self.store.close()
            self.ingest.close()
            raise
        self._background = [asyncio.create_task(self._purge_expired_forever(), name="expiry-purge")]
        if (trim := _libc("malloc_trim")) is not None and self.config.server.memory_trim_seconds > 0:
            self._background.append(asyncio.create_task(
                _trim_memory_forever(trim, self.config.server.memory_trim_seconds), name="memory-trim"))
        from relay.retention import is_configured, retention_forever  # [retention] rules and max_events

        if is_configured(self.config):
            self._background.append(asyncio.create_task(retention_forever(self.store, self.config), name="retention"))
        log.info("relay_started", url=self.url, db=str(s.path))
        from relay.sync.scheduler import start_sync  # peer sync: node key, [[sync.peers]] (relay/sync/)

        self.sync = await start_sync(self.config, self.store, self.ingest)

    @property
    def port(self) -> int:
        """The TCP port actually bound."""
        assert self.server is not None
        return self.server.sockets[0].getsockname()[1]

    @property
    def url(self) -> str:
        """ws://host:port of this relay."""
        return f"ws://{self.config.server.host}:{self.port}"

    async def stop(self) -> None:
        """Graceful shutdown within `server.shutdown_timeout_seconds`, then close the store.

        Stop accepting; each connection stops reading, waits until every EVENT
        it took has been committed and its OK written, and closes with 1001;
        connections still open at the deadline are sent 1001 as they are, then
        reset without waiting for the peer's close (RST, unsent bytes dropped),
        as are those still in their opening handshake (else up to 10 s more).
        The store then commits whatever is still queued (peer sync, stragglers).
        """
        loop, timeout = asyncio.get_running_loop(), self.config.server.shutdown_timeout_seconds
        deadline = loop.time() + timeout
        for task in self._background:
            task.cancel()
        if self.sync is not None:  # peer sync first: it releases its leases and stops writing
            await self._within(deadline, self.sync.stop(), "sync", timeout)
        if self.server is not None:
            self.server.server.close()  # the listening sockets only: open connections drain first
            drains = [c.drain() for c in list(self.connections)]
            if drains:
                await self._within(deadline, asyncio.gather(*drains, return_exceptions=True), "drain", timeout)
            self.server.close(close_connections=True)  # 1001 to whoever is left
            await self._within(deadline, self.server.wait_closed(), "close", timeout)
            for ws in list(self._sockets):  # past the deadline: no more waiting for close or opening handshakes
                reset(ws)
            await self._within(loop.time() + _RESET_SECONDS, self.server.wait_closed(), "reset", _RESET_SECONDS)
        if self.store is not None:
            await self.store.close()
        if self.ingest is not None:
            self.ingest.close()
        log.info("relay_stopped")

    async def _within(self, deadline: float, step: Awaitable, name: str, seconds: float) -> None:
        """Await `step` until the loop time `deadline` (`seconds` after it began); past it, cancel it and
        log `shutdown_timeout`."""
        try:
            await asyncio.wait_for(step, max(0.0, deadline - asyncio.get_running_loop().time()))
        except TimeoutError:
            log.warning("shutdown_timeout", step=name, waited_seconds=seconds, open_connections=len(self.connections))

    def _connection_parts(self) -> ConnectionServices:
        """What connections and their handlers are given of this relay (once the store is open)."""
        handlers = Services(self.config.limits, self.event_limits, self.store, self.ingest,
                            self.stored_results, self.rate_limits, self.metrics, self.internal_error)
        return ConnectionServices(handlers, self.subscriptions, self.config.server, self.access, self.negentropy,
                                  self.slow_reader_dropped, self.keepalive_timed_out)

    def _routes(self) -> Routes:
        """The HTTP routes on the relay's port: one line each, the first that matches answers."""
        routes = Routes()
        routes.add("GET", "/health", _health)
        routes.add("GET", "/metrics", self._metrics_page)
        routes.add("GET", ANY_PATH, partial(_nip11, self.config), accept="application/nostr+json")  # NIP-11
        return routes

    async def _metrics_page(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse(HTTPStatus.OK, await self.metrics.render(), CONTENT_TYPE)

    def _ephemeral(self, event: Event) -> None:
        """An ephemeral event accepted from a client: fanned out, never stored (NIP-01)."""
        self.metrics.events_ephemeral.inc()
        self._fanout([event])

    def _on_commit(self, changes: Changes) -> None:
        self.metrics.events_stored.inc(len(changes.inserted))
        self._fanout(changes.inserted)

    def _fanout(self, events: list[Event]) -> None:
        private_kinds = self.access.private_kinds
        for event in events:
            private = event.kind in private_kinds  # NIP-42: only to their authenticated author or recipient
            for sub in self.subscriptions.match(event):
                if not private or sub.access.may_read(event):
                    sub.deliver(event)

    def slow_reader_dropped(self, **fields) -> None:
        """Count one reader disconnected for not reading live events or stored results in time; `fields`
        (conn_id, remote) go in the log line: a live event's fan-out runs outside the connection's task."""
        self.slow_readers += 1
        log.info("slow_reader_disconnected", total=self.slow_readers, **fields)

    def keepalive_timed_out(self) -> None:
        """Count one connection closed (1011) for neither answering a ping nor reading in time."""
        self.keepalive_timeouts += 1
        log.info("keepalive_timeout", total=self.keepalive_timeouts)

    def internal_error(self, what: str, exc: BaseException, **fields) -> str:
        """Log an unexpected failure with its traceback; return the client's `error:` message."""
        log.error(what, error=repr(exc), exc_info=exc, **fields)
        return "error: internal"

    def _server_connection(self, *args, **kwargs) -> ServerConnection:
        # websockets lists a connection only once its opening handshake is done; shutdown resets the others too.
        ws = RoutedServerConnection(*args, routes=self.routes,
                                    max_body_bytes=self.config.server.max_http_body_bytes, **kwargs)
        self._sockets.add(ws)
        return ws

    async def _handle(self, ws: ServerConnection) -> None:
        conn_id = next(self._conn_ids)
        headers = ws.request.headers
        forwarded = headers.get_all("X-Forwarded-For")
        remote = self.rate_limits.client_ip(ws.remote_address[0] if ws.remote_address else "",
                                            ",".join(forwarded) if forwarded else None)
        structlog.contextvars.bind_contextvars(conn_id=conn_id, remote=remote)
        if not self.rate_limits.admits(remote):
            self.connections_refused += 1
            log.info("connection_refused", reason=TOO_MANY_CONNECTIONS, total=self.connections_refused)
            await ws.close(1008, TOO_MANY_CONNECTIONS)
            return
        log.info("connection_opened")
        # NIP-42 relay tag: the configured public URL, else the one this client connected to.
        relay_url = self.config.server.public_url or f"ws://{headers.get('Host', '')}{ws.request.path}"
        connection = Connection(ws, self._connection_services, remote, relay_url)
        self.connections.add(connection)
        try:
            await connection.run()
        finally:
            self.connections.discard(connection)
            log.info("connection_closed", code=ws.close_code)

    async def _purge_expired_forever(self) -> None:
        interval = self.config.store.expiry_purge_interval_seconds
        while True:
            await asyncio.sleep(interval)
            try:
                while await self.store.purge_expired() >= self.store.options.purge_batch:
                    pass
            except Exception as exc:
                self.internal_error("expiry_purge_failed", exc)


async def _health(request: HttpRequest) -> HttpResponse:
    return HttpResponse(HTTPStatus.OK, b"ok\n", "text/plain")


async def _nip11(config: Config, request: HttpRequest) -> HttpResponse:
    return HttpResponse(HTTPStatus.OK, nip11.document(config), "application/nostr+json")


def _unmap_large_blocks_when_freed() -> None:
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


async def run_relay(config: Config) -> int:
    """Serve until SIGINT/SIGTERM or until the store fails; returns the process exit code."""
    # Handlers first: a signal during start-up (peers being set up after /health answers) must
    # still end in a clean stop, not kill the process.
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    _unmap_large_blocks_when_freed()
    relay = Relay(config)
    try:
        await relay.start()
    except OSError as exc:
        log.error("listen_failed", host=config.server.host, port=config.server.port, error=str(exc))
        return 1
    # Start-up objects never die: keep them out of GC passes, and collect the
    # young generation less often (every event allocates a few containers).
    gc.freeze()
    gc.set_threshold(10_000, 10, 10)
    # The writer and verifier threads drop the GIL inside SQLite and secp256k1;
    # a short switch interval lets them take it back without waiting 5 ms.
    sys.setswitchinterval(_SWITCH_INTERVAL_SECONDS)
    stopped = asyncio.create_task(stop.wait())
    done, _ = await asyncio.wait({stopped, relay.store.writer_task}, return_when=asyncio.FIRST_COMPLETED)
    code = 0
    if relay.store.writer_task in done:
        log.error("store_failed", error=repr(relay.store.writer_task.exception()))
        code = 1
    stopped.cancel()
    await relay.stop()
    return code
