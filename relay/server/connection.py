"""One WebSocket client: frames in, replies out.

How this works: the read loop parses each frame and dispatches it by verb.
EVENTs run as tasks, at most `max_events_in_flight` at once; when that many
wait (for signature checks or a full writer queue) the loop stops reading,
which is the back-pressure.  A REQ registers its live subscription first,
then a task sends the stored results (paced by the socket's send buffer) and
EOSE, then the live events that arrived meanwhile, de-duplicated.  Live
events go through a bounded queue drained by a sender task; a reader that
lets it overflow is disconnected and counted, so it slows no one else.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import TYPE_CHECKING

import structlog
from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from relay.protocol.envelopes import (
    CloseEnvelope,
    CountEnvelope,
    EventEnvelope,
    MessageError,
    ReqEnvelope,
    encode_closed,
    encode_count,
    encode_eose,
    encode_event,
    encode_notice,
    encode_ok,
    parse_client_message,
)
from relay.protocol.event import Event, is_hex64, parse_event
from relay.protocol.filters import Filter
from relay.protocol.rejection import Rejection
from relay.server import policies

if TYPE_CHECKING:
    from relay.server.app import Relay

log = structlog.get_logger(__name__)

_ID_SLICE = slice(7, 71)  # the id inside our canonical JSON: {"id":"<64 hex>",...


class LiveSubscription:
    """A REQ's live side; holds events in `pending` until its EOSE is sent."""

    __slots__ = ("sub_id", "filters", "connection", "pending", "task")

    def __init__(self, sub_id: str, filters: list[Filter], connection: Connection) -> None:
        self.sub_id = sub_id
        self.filters = filters
        self.connection = connection
        self.pending: list[Event] | None = []
        self.task: asyncio.Task | None = None

    def deliver(self, event: Event) -> None:
        """Take a matching new event without blocking (buffered until EOSE)."""
        if self.pending is None:
            self.connection.push(encode_event(self.sub_id, event.raw))
        elif len(self.pending) < self.connection.relay.config.limits.max_live_queue:
            self.pending.append(event)
        else:
            self.connection.drop_slow_reader()


class Connection:
    """Serves one client socket until it closes; `run()` is the whole life."""

    def __init__(self, ws: ServerConnection, relay: Relay) -> None:
        self.ws = ws
        self.relay = relay
        limits = relay.config.limits
        self.subscriptions: dict[str, LiveSubscription] = {}
        self._event_slots = asyncio.Semaphore(limits.max_events_in_flight)
        self._live: deque[bytes] = deque()
        self._live_ready = asyncio.Event()
        self._closing = False

    async def run(self) -> None:
        """Read frames until the socket closes, then release everything held."""
        sender = asyncio.create_task(self._send_live())
        try:
            async for message in self.ws:
                await self._dispatch(message)
        except ConnectionClosed:
            pass
        finally:
            sender.cancel()
            for sub_id in list(self.subscriptions):
                self._unsubscribe(sub_id)

    async def _dispatch(self, message: str | bytes) -> None:
        # The one broad catch of the message loop: a bug answers NOTICE, never kills the socket.
        try:
            envelope = parse_client_message(message, self.relay.config.limits.max_filters,
                                            self.relay.config.limits.max_filter_items)
            if type(envelope) is EventEnvelope:
                await self._event_slots.acquire()
                task = asyncio.create_task(self._event(envelope.event))
                task.add_done_callback(lambda _: self._event_slots.release())
            elif type(envelope) is ReqEnvelope:
                await self._req(envelope)
            elif type(envelope) is CountEnvelope:
                await self._count(envelope)
            elif type(envelope) is CloseEnvelope:
                self._unsubscribe(envelope.sub_id)
        except MessageError as err:
            await self._answer_error(err)
        except ConnectionClosed:
            raise
        except Exception:
            log.exception("message_failed")
            await self.send(encode_notice("error: internal"))

    async def _answer_error(self, err: MessageError) -> None:
        if err.verb == "EVENT" and err.ref is not None:
            await self.send(encode_ok(err.ref, False, str(err)))
        elif err.verb in ("REQ", "COUNT") and err.ref is not None:
            await self.send(encode_closed(err.ref, str(err)))
        else:
            await self.send(encode_notice(str(err)))

    async def send(self, message: bytes) -> None:
        """Send one UTF-8 JSON message as a text frame (waits while the send buffer is full)."""
        await self.ws.send(message, text=True)

    async def _event(self, obj: object) -> None:
        ref = obj.get("id") if type(obj) is dict else None
        try:
            event = parse_event(obj, self.relay.event_limits, time.time())
            policies.check_event(event, time.time())
            if not await self.relay.verifier.verify(event):
                raise Rejection("invalid", "bad signature")
            accepted, message = await self.relay.accept(event)
        except Rejection as rejection:
            accepted, message = False, str(rejection)
        except ConnectionClosed:
            return
        except Exception as exc:
            accepted, message = False, self.relay.internal_error("event_failed", exc, event_id=ref)
        try:
            if is_hex64(ref):
                await self.send(encode_ok(ref, accepted, message))
            else:
                await self.send(encode_notice(message))
        except ConnectionClosed:
            pass

    async def _req(self, req: ReqEnvelope) -> None:
        self._unsubscribe(req.sub_id)
        limit = self.relay.config.limits.max_subscriptions
        if len(self.subscriptions) >= limit:
            await self.send(encode_closed(req.sub_id, f"rate-limited: too many subscriptions (max {limit})"))
            return
        sub = LiveSubscription(req.sub_id, req.filters, self)
        # Registered before the stored query runs, so nothing written meanwhile is missed.
        self.relay.subscriptions.add(sub, req.filters)
        self.subscriptions[req.sub_id] = sub
        sub.task = asyncio.create_task(self._serve_stored(sub))

    async def _serve_stored(self, sub: LiveSubscription) -> None:
        limits = self.relay.config.limits
        try:
            stored = await self.relay.store.query(sub.filters, limits.default_limit, limits.max_limit)
            for raw in stored:
                await self.send(encode_event(sub.sub_id, raw))
            await self.send(encode_eose(sub.sub_id))
        except ConnectionClosed:
            return
        except Exception as exc:
            message = self.relay.internal_error("req_failed", exc, sub_id=sub.sub_id)
            self._unsubscribe(sub.sub_id)
            await self._send_quietly(encode_closed(sub.sub_id, message))
            return
        pending, sub.pending = sub.pending, None
        if pending:
            sent = {raw[_ID_SLICE] for raw in stored}
            for event in pending:
                if event.id.encode() not in sent:
                    self.push(encode_event(sub.sub_id, event.raw))

    async def _send_quietly(self, message: bytes) -> None:
        try:
            await self.send(message)
        except ConnectionClosed:
            pass

    async def _count(self, req: CountEnvelope) -> None:
        try:
            count = await self.relay.store.count(req.filters)
        except Exception as exc:
            await self.send(encode_closed(req.sub_id, self.relay.internal_error("count_failed", exc)))
            return
        await self.send(encode_count(req.sub_id, count))

    def _unsubscribe(self, sub_id: str) -> None:
        sub = self.subscriptions.pop(sub_id, None)
        if sub is None:
            return
        self.relay.subscriptions.remove(sub, sub.filters)
        if sub.task is not None and not sub.task.done():
            sub.task.cancel()

    def push(self, message: bytes) -> None:
        """Queue a live message; a queue past `max_live_queue` disconnects this slow reader."""
        if self._closing:
            return
        self._live.append(message)
        if len(self._live) > self.relay.config.limits.max_live_queue:
            self.drop_slow_reader()
        else:
            self._live_ready.set()

    def drop_slow_reader(self) -> None:
        """Disconnect a reader that cannot keep up with live events (counted)."""
        if self._closing:
            return
        self._closing = True
        self._live.clear()
        self.relay.slow_reader_dropped()
        for sub_id in list(self.subscriptions):
            self._unsubscribe(sub_id)
        asyncio.create_task(self.ws.close(1008, "slow reader: live events not read in time"))

    async def _send_live(self) -> None:
        try:
            while True:
                await self._live_ready.wait()
                self._live_ready.clear()
                while self._live:
                    await self.send(self._live.popleft())
        except ConnectionClosed:
            pass
