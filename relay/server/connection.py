"""One WebSocket client: read a message, parse it, hand it to its verb's handler; until the socket closes.

How this works: the layers of a connection live apart.  `Wire`
(relay/wire/) is its socket: frames, keepalive, the peer's progress.
`Outbox` (relay/server/outbox.py) queues OKs and live events for one sender
task and decides when a reader is too slow.  Each verb has its handler
(relay/server/handlers/), given a `Context` with what it may use rather than
the whole relay.  This module is the loop between them: it reads, dispatches,
maps a message that cannot be parsed to its reply (the one broad catch of
the message loop), and ends the connection: a peer leaving, a slow reader
(1008), a keepalive timeout (1011) or shutdown (1001).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

import structlog
from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from relay.protocol.envelopes import (
    MessageError,
    encode_closed,
    encode_notice,
    encode_ok,
    parse_client_message,
)
from relay.server.access import AccessPolicy, ConnectionAccess
from relay.server.handlers import HANDLERS
from relay.server.handlers.context import Context, Services
from relay.server.keepalive import Keepalive
from relay.server.negentropy import NegentropyService
from relay.server.outbox import Outbox
from relay.server.subscriptions import SubscriptionIndex, Subscriptions
from relay.wire.websocket import Wire

log = structlog.get_logger(__name__)

# recv() returns buffered frames without suspending: a connection with a backlog yields to the
# event loop after this long, so other connections' REQs are not queued behind its whole backlog
_TIME_SLICE_SECONDS = 0.001
BLOCKED = "blocked: this address is blocked here"
"""The close reason (code 1008) of a connection from a blocked IP (NIP-86 `blockip`)."""


@dataclass(frozen=True, slots=True)
class ConnectionServices:
    """What every connection shares beyond its handlers' `Services` (built once, at start).

    `live` is the relay's index of live subscriptions; `keepalive` pings every connection;
    `slow_reader_dropped(**log_fields)` and `keepalive_timed_out()` count a
    connection closed with 1008 or 1011; `blocked(ip)` is read before each message.
    """

    handlers: Services
    live: SubscriptionIndex
    keepalive: Keepalive
    access: AccessPolicy
    negentropy: NegentropyService
    slow_reader_dropped: Callable[..., None]
    keepalive_timed_out: Callable[[], None]
    blocked: Callable[[str], bool] = lambda ip: False  # NIP-86 `blockip`: the client IP may no longer talk to us


def _is_utf8(data: str | bytes) -> bool:
    if isinstance(data, str):
        return True
    try:
        data.decode()
    except UnicodeDecodeError:
        return False
    return True


class Connection:
    """Serves one client socket until it closes; `run()` is the whole life.

    `ip` is the client's address (rate limits, blocked IPs); `relay_url` what its NIP-42
    AUTH events must name; `proxied`: its request carried X-Forwarded-For or Forwarded.  `wire`, `outbox`, `subscriptions` (its live REQs)
    and `negentropy` (its NIP-77 sessions) are its parts.
    """

    def __init__(self, ws: ServerConnection, services: ConnectionServices, ip: str, relay_url: str,
                 proxied: bool = False) -> None:
        self._services = services
        self.ip = ip
        self._log_fields = structlog.contextvars.get_contextvars()  # conn_id, remote: bound by RelayServer._handle
        handlers, limits = services.handlers, services.handlers.limits
        self.wire = Wire(ws)
        self.outbox = Outbox(limits.max_live_queue, limits.max_live_queue_bytes, self.drop_slow_reader)
        self.subscriptions = Subscriptions(services.live)
        access = ConnectionAccess(services.access, relay_url)
        self.negentropy = services.negentropy.sessions_for(self.wire.send, access)
        self._context = Context(handlers, self.wire.send, self.wire.send_watched, self.outbox, access,
                                handlers.rate_limits.open(ip, proxied), self.subscriptions, self.negentropy,
                                self.drop_slow_reader, ip)

    async def run(self) -> None:
        """Read and answer messages until the socket closes, then release everything held."""
        sender = asyncio.create_task(self._send_queued())
        self._services.keepalive.watch(self.wire, self._keepalive_timeout)
        ctx, recv, limits = self._context, self.wire.recv, self._context.limits
        try:
            if self._services.access.config.challenge_on_connect:
                ctx.challenge()
            loop = asyncio.get_running_loop()
            slice_end = loop.time() + _TIME_SLICE_SECONDS
            blocked = self._services.blocked
            while True:
                message = await recv()
                if blocked(self.ip):  # blocked while connected: from its next message on
                    await self.wire.close(1008, BLOCKED)
                    break
                if not ctx.draining:
                    # The one broad catch of the message loop: a bug answers NOTICE, never kills the socket.
                    try:
                        envelope = parse_client_message(message, limits.max_filters, limits.max_filter_items,
                                                        limits.max_search_bytes)
                        await HANDLERS[type(envelope)](ctx, envelope)
                    except MessageError as err:
                        await self._refuse(message, err)
                    except ConnectionClosed:
                        raise
                    except Exception:
                        log.exception("message_failed")
                        await ctx.send(encode_notice("error: internal"))
                if loop.time() > slice_end:
                    await asyncio.sleep(0)
                    slice_end = loop.time() + _TIME_SLICE_SECONDS
        except ConnectionClosed:
            pass
        finally:
            self.outbox.close()  # wakes a drain() waiting for OKs that will never be written
            sender.cancel()
            self._services.keepalive.forget(self.wire)
            self.subscriptions.close_all()
            self.negentropy.close_all()
            self._services.handlers.rate_limits.close(ctx.rate)

    async def drain(self) -> None:
        """Graceful shutdown: take no more frames, wait until every EVENT taken has its OK written, close 1001.

        Frames still arriving are read and dropped unanswered (so the close
        handshake is read too); an EVENT that was waiting for room is dropped.
        """
        self._context.draining = True
        while self.outbox.in_flight and not self.outbox.closed:
            await self.outbox.slot_freed()
        await self.wire.close(1001, "relay shutting down")

    async def _refuse(self, message: bytes, err: MessageError) -> None:
        """Answer a message that could not be parsed, in kind where its verb and reference allow."""
        send = self._context.send
        if not err.verb and not _is_utf8(message):
            # RFC 6455 7.1.7/8.1: a message that is not UTF-8 fails the connection with 1007. Checked only
            # here, after the JSON decoders failed, so valid frames are never decoded twice.
            await self.wire.close(1007, "invalid UTF-8")
        elif err.verb in ("EVENT", "AUTH") and err.ref is not None:
            await send(encode_ok(err.ref, False, str(err)))
        elif err.verb in ("REQ", "COUNT") and err.ref is not None:
            if err.verb == "REQ":  # it replaces a subscription of the same id (NIP-01), which CLOSED ends
                self.subscriptions.close(err.ref)
            await send(encode_closed(err.ref, str(err)))
        elif err.verb in ("NEG-OPEN", "NEG-MSG") and err.ref is not None:
            await self.negentropy.refuse(err.ref, str(err))  # NIP-77: NEG-ERR, and the session ends
        else:
            await send(encode_notice(str(err)))

    def drop_slow_reader(self, reason: str = "slow reader: live events not read in time") -> None:
        """Disconnect a reader that does not read what it asked for in time (counted once, and only while its
        peer has not begun to close); `reason` goes in the close frame (1008)."""
        if self._drop(1008, reason):
            self._services.slow_reader_dropped(**self._log_fields)

    def _drop(self, code: int, reason: str) -> bool:
        """End this connection for not reading or not answering in time: its subscriptions end and its
        queued messages go now (see `Wire.drop`). True when that is to be counted: False when it is
        closing already, or its peer or the relay began closing it."""
        if self.outbox.closed:
            return False
        self.outbox.close()
        self.subscriptions.close_all()
        return self.wire.drop(code, reason)

    def _keepalive_timeout(self) -> None:
        if self._drop(1011, "keepalive ping timeout"):  # not when dropped already as a slow reader
            self._services.keepalive_timed_out()

    async def _send_queued(self) -> None:
        try:
            await self.outbox.run(self.wire.send_many)
        except ConnectionClosed:
            self.outbox.close()  # wakes a read loop waiting for in-flight slots, or it would wait forever
