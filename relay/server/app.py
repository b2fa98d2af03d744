"""The relay's port: WebSocket connections, NIP-11, /health and /metrics, and live fan-out.

`RelayServer` holds what every connection shares (limits, live
subscription index, NIP-42 access, rate limits, the NIP-77 responder) and is
given the rest by the assembly that builds it (relay/assembly.py): the store, the
ingest path with its signature pool, the handlers' counters and the
/metrics page.  `listen()` starts serving, `close(deadline)` drains and
closes every connection, `stats()` reports its counts to metrics.
"""

from __future__ import annotations

import asyncio
import itertools
import socket
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from http import HTTPStatus

import orjson
import structlog
from websockets.asyncio.server import Server, ServerConnection, serve

from relay.config import Config
from relay.ingest import Ingest
from relay.ingest.moderation import Moderation
from relay.protocol.event import Event
from relay.server import nip11
from relay.server.access import AccessPolicy
from relay.server.budget import ByteBudget
from relay.server.connection import BLOCKED, Connection, ConnectionServices
from relay.server.handlers.context import HandlerMetrics, Services
from relay.server.keepalive import Keepalive
from relay.server.management import ManagementApi
from relay.server.negentropy import NegentropyService
from relay.server.iptable import IpTable
from relay.server.ratelimit import TOO_MANY_CONNECTIONS, RateLimits
from relay.server.search import live_search
from relay.server.subscriptions import SubscriptionIndex
from relay.server.tables import TablesApi
from relay.wire.handshake import RoutedServerConnection
from relay.wire.http import Handler, HttpRequest, HttpResponse, Routes
from relay.wire.websocket import reset
from relay.store.reads import ReadPool

log = structlog.get_logger(__name__)

_RESET_SECONDS = 1.0  # at shutdown, for reset connections' handlers to return


@dataclass(frozen=True, slots=True)
class ServerStats:
    """What the server counts, as `stats()` reads it: open connections, their REQ subscriptions and NIP-77
    sessions, items NIP-77 sessions hold in memory, and connections closed for being slow readers (1008),
    for keepalive (1011) or refused at once (1008, per-IP limit) since start."""

    connections: int
    subscriptions: int
    negentropy_sessions: int
    negentropy_items_held: int
    slow_readers: int
    keepalive_timeouts: int
    connections_refused: int


class RelayServer:
    """The WebSocket and HTTP side of one relay process; built by relay/assembly.py once the store is open.

    `metrics` is what the handlers count (`HandlerMetrics`); `metrics_page`
    answers `GET /metrics`.  A worker process gives `ip_table` (its view of the per-IP limits every worker
    shares; None: this process's own), `health` (its `GET /health` answer: (healthy, JSON body), whether it
    reaches the writer process; None: "ok") and `server_header` (the Server header of its handshakes, naming it).
    """

    def __init__(self, config: Config, store: ReadPool, ingest: Ingest, metrics: HandlerMetrics,
                 metrics_page: Handler, ip_table: IpTable | None = None,
                 health: Callable[[], tuple[bool, dict]] | None = None, server_header: str | None = None) -> None:
        self.config = config
        self.store = store
        self.ingest = ingest
        self.metrics = metrics
        self.event_limits = config.limits.event_limits()
        self.subscriptions = SubscriptionIndex(live_search(store))  # NIP-50 live matching (server/search.py)
        self.moderation = ingest.moderation  # bans, allow lists, blocked IPs (relay/ingest/moderation.py)
        # NIP-42 and write rules (server/access.py)
        self.access = AccessPolicy(config.auth, config.sync.peers, self.moderation)
        self.server: Server | None = None  # from listen()
        self.slow_readers = 0
        self.keepalive_timeouts = 0
        self.connections_refused = 0  # past rate_limits.ip_connections
        self._conn_ids = itertools.count(1)
        self.connections: set[Connection] = set()  # open ones, for shutdown and stats()
        self._sockets: weakref.WeakSet[ServerConnection] = weakref.WeakSet()  # every accepted one, from its first byte
        self.stored_results = ByteBudget(config.limits.max_stored_results_bytes)  # unsent REQ results, all connections
        # `ip_table`: a worker process's view of the per-IP limits every worker shares (None: this process's own)
        self.rate_limits = RateLimits(config.rate_limits, stored_results=self.stored_results, table=ip_table)
        self.negentropy = NegentropyService(config.negentropy, store, self.internal_error)  # NIP-77 responder
        self.keepalive = Keepalive(config.server.ping_interval_seconds, config.server.ping_timeout_seconds)
        self._keepalive_task: asyncio.Task | None = None  # from listen()
        self._health_source = health
        self._server_header = {"server_header": server_header} if server_header is not None else {}
        self.routes = self._routes(metrics_page)  # HTTP on the WebSocket port (relay/wire/http.py)
        self._connection_services = self._connection_parts()

    async def listen(self, sock: socket.socket | None = None) -> None:
        """Start listening on `config.server` (port 0: any free port), or on `sock`, bound (a worker process's
        share of the port: SO_REUSEPORT).

        Raises:
            OSError: the address cannot be bound (e.g. the port is taken).
        """
        where = {"sock": sock} if sock is not None else {"host": self.config.server.host,
                                                         "port": self.config.server.port}
        self.server = await serve(
            self._handle, **where, **self._server_header,
            max_size=self.config.limits.max_message_bytes,
            max_queue=16, compression=None, ping_interval=None,  # pings: server/keepalive.py
            create_connection=self._server_connection,
        )
        self._keepalive_task = asyncio.create_task(self.keepalive.run(), name="keepalive")

    @property
    def port(self) -> int:
        """The TCP port actually bound."""
        assert self.server is not None
        return self.server.sockets[0].getsockname()[1]

    @property
    def url(self) -> str:
        """ws://host:port of this relay."""
        return f"ws://{self.config.server.host}:{self.port}"

    def stats(self) -> ServerStats:
        """The server's counts now (read by metrics at each scrape)."""
        connections = list(self.connections)
        return ServerStats(len(connections), sum(len(c.subscriptions) for c in connections),
                           sum(len(c.negentropy) for c in connections), self.negentropy.items_held,
                           self.slow_readers, self.keepalive_timeouts, self.connections_refused)

    async def close(self, deadline: float) -> None:
        """Stop accepting, drain every connection, and close them all by the loop time `deadline`.

        Each connection stops reading, waits until every EVENT it took has
        been committed and its OK written, and closes with 1001; connections
        still open at the deadline are sent 1001 as they are, then reset
        without waiting for the peer's close (RST, unsent bytes dropped), as
        are those still in their opening handshake (else up to 10 s more).
        """
        if self.server is None:
            return
        loop, timeout = asyncio.get_running_loop(), self.config.server.shutdown_timeout_seconds
        self.server.server.close()  # the listening sockets only: open connections drain first
        drains = [c.drain() for c in list(self.connections)]
        if drains:
            await self.within(deadline, asyncio.gather(*drains, return_exceptions=True), "drain", timeout)
        self.server.close(close_connections=True)  # 1001 to whoever is left
        await self.within(deadline, self.server.wait_closed(), "close", timeout)
        for ws in list(self._sockets):  # past the deadline: no more waiting for close or opening handshakes
            reset(ws)
        await self.within(loop.time() + _RESET_SECONDS, self.server.wait_closed(), "reset", _RESET_SECONDS)
        if self._keepalive_task is not None:
            self._keepalive_task.cancel()

    async def within(self, deadline: float, step: Awaitable, name: str, seconds: float) -> None:
        """Await a shutdown `step` until the loop time `deadline` (`seconds` after shutdown began); past it,
        cancel it and log `shutdown_timeout`."""
        try:
            await asyncio.wait_for(step, max(0.0, deadline - asyncio.get_running_loop().time()))
        except TimeoutError:
            log.warning("shutdown_timeout", step=name, waited_seconds=seconds, open_connections=len(self.connections))

    def fanout(self, events: list[Event], seqs: list[int] | None = None) -> None:
        """Deliver `events` (committed, or ephemeral) to every live subscription that matches them; `seqs`: the
        committed ones' change feed positions (None for ephemeral events), which `LiveSubscription` compares
        with its stored query's snapshot."""
        private_kinds = self.access.private_kinds
        for i, event in enumerate(events):
            private = event.kind in private_kinds  # NIP-42: only to their authenticated author or recipient
            seq = None if seqs is None else seqs[i]
            for sub in self.subscriptions.match(event):
                if not private or sub.access.may_read(event):
                    sub.deliver(event, seq)

    def _connection_parts(self) -> ConnectionServices:
        """What connections and their handlers are given of this server."""
        moderation = self.moderation
        handlers = Services(self.config.limits, self.event_limits, self.store, self.ingest,
                            self.stored_results, self.rate_limits, self.metrics, self.internal_error,
                            *([moderation.is_trusted] if moderation else []))
        return ConnectionServices(handlers, self.subscriptions, self.keepalive, self.access, self.negentropy,
                                  self.slow_reader_dropped, self.keepalive_timed_out,
                                  *([moderation.is_blocked] if moderation else []))

    def _routes(self, metrics_page: Handler) -> Routes:
        """The HTTP routes on the relay's port: one line each, the first that matches answers."""
        routes = Routes(self.config.server.paths)
        routes.add("GET", "/health", self._health)
        routes.add("GET", "/metrics", metrics_page)
        for path in self.config.server.paths:  # the relay's endpoints (NIP-01)
            routes.add("GET", path, partial(_nip11, self.config, self.moderation),
                       accept="application/nostr+json")  # NIP-11
        if self.moderation is not None and self.config.admin.pubkeys:  # NIP-86 with NIP-98 (server/management.py)
            management = ManagementApi(self.config, self.moderation, self.event_limits)
            routes.add("POST", management.path, management.handle)
        if self.config.http.tables:  # records, read-only (server/tables.py)
            TablesApi(self.config, self.store, self.rate_limits).add_routes(routes)
        return routes

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

    async def _health(self, request: HttpRequest) -> HttpResponse:
        """200 "ok"; in a worker process, 200 and {"writer": "ok", "workers": N, "worker": i}, or 503 and
        "writer": "unreachable" when it has heard nothing from the writer process for a second."""
        if self._health_source is None:
            return HttpResponse(HTTPStatus.OK, b"ok\n", "text/plain")
        healthy, body = self._health_source()
        status = HTTPStatus.OK if healthy else HTTPStatus.SERVICE_UNAVAILABLE
        return HttpResponse(status, orjson.dumps(body), "application/json")

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
        proxied = bool(forwarded or "Forwarded" in headers)
        remote = self.rate_limits.client_ip(ws.remote_address[0] if ws.remote_address else "",
                                            ",".join(forwarded) if forwarded else None)
        structlog.contextvars.bind_contextvars(conn_id=conn_id, remote=remote)
        if self.moderation is not None and self.moderation.is_blocked(remote):  # NIP-86 blockip
            log.info("connection_refused", reason=BLOCKED)
            await ws.close(1008, BLOCKED)
            return
        if not self.rate_limits.admits(remote, proxied):
            self.connections_refused += 1
            log.info("connection_refused", reason=TOO_MANY_CONNECTIONS, total=self.connections_refused)
            await ws.close(1008, TOO_MANY_CONNECTIONS)
            return
        log.info("connection_opened")
        # NIP-42 relay tag: the configured public URL, else the one this client connected to.
        relay_url = self.config.server.public_url or f"ws://{headers.get('Host', '')}{ws.request.path}"
        connection = Connection(ws, self._connection_services, remote, relay_url, proxied)
        self.connections.add(connection)
        try:
            await connection.run()
        finally:
            self.connections.discard(connection)
            log.info("connection_closed", code=ws.close_code)




async def _nip11(config: Config, moderation: Moderation | None, request: HttpRequest) -> HttpResponse:
    overrides = moderation.info() if moderation is not None else None  # NIP-86 changerelayname, ...
    kinds = moderation.kinds if moderation is not None else None  # NIP-86 allowkind, disallowkind
    return HttpResponse(HTTPStatus.OK, nip11.document(config, overrides, kinds), "application/nostr+json")
