"""One WebSocket client: frames in, replies out.

How this works: the read loop parses each frame and dispatches it by verb.
EVENTs run as tasks, at most `max_events_in_flight` at once; a task's slot is
freed only when its OK has been written to the socket, so a client that
publishes faster than the relay stores, or does not read its OKs, stops
being read (back-pressure).  A REQ registers its live subscription first,
then a task sends the stored results (paced by the socket's send buffer) and
EOSE, then the live events that arrived meanwhile, de-duplicated.  OKs and
live events wait in one outgoing queue that a sender task writes in batches;
a reader that lets more than `max_live_queue` live events (or
`max_live_queue_bytes` of them) pile up while the socket is not taking what
the sender gave it is disconnected and counted, so it slows no one else
(one commit's events arrive at once: a burst while the socket drains is not
slowness).  Other replies (NOTICE,
CLOSED, COUNT) are written by the read loop itself, which waits for them.
Access control (NIP-42 AUTH, write rules, private kinds) is `self.access`
(relay/server/access.py); rate limits are `self.rate` (relay/server/ratelimit.py,
None when this connection is not limited).
"""

from __future__ import annotations

import asyncio
import socket
import struct
import time
from collections import deque
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TYPE_CHECKING

import structlog
from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed
from websockets.protocol import State

from relay.protocol.envelopes import (
    AuthEnvelope,
    CloseEnvelope,
    CountEnvelope,
    EventEnvelope,
    MessageError,
    NegCloseEnvelope,
    NegMsgEnvelope,
    NegOpenEnvelope,
    ReqEnvelope,
    encode_auth,
    encode_closed,
    encode_count,
    encode_eose,
    encode_event,
    encode_notice,
    encode_ok,
    parse_client_message,
)
from relay.ingest import Outcome, Source
from relay.protocol.event import Event
from relay.protocol.filters import Filter
from relay.protocol.rejection import Rejection
from relay.server.access import ConnectionAccess
from relay.server.budget import ByteBudget
from relay.server.ratelimit import EVENTS, NEG_OPENS, REFUSALS, REQS

if TYPE_CHECKING:
    from relay.server.app import Relay

log = structlog.get_logger(__name__)

_ID_SLICE = slice(7, 71)  # the id inside our canonical JSON: {"id":"<64 hex>",...
# stored events written per flow-control wait: a write's copies (framing, the socket's buffer) stay small
_STORED_CHUNK = 64
_STORED_CHUNK_BYTES = 262_144
# RFC 6455 section 5.2: FIN + text opcode, then the payload length in 7, 7+16 or 7+64 bits;
# a server's frames are not masked, and no extension is negotiated (compression=None).
_TEXT_FRAME = 0x81
_LENGTH_16 = struct.Struct("!BBH")
_LENGTH_64 = struct.Struct("!BBQ")
_PROGRESS_CHECK_SECONDS = 0.5  # how often a stored-results write waiting on the socket looks for progress
# Linux's struct tcp_info (netinet/tcp.h): tcpi_bytes_acked, the bytes the peer has acknowledged, is a u64 at 120
_TCP_INFO = getattr(socket, "TCP_INFO", None)
_TCP_INFO_BYTES = 256  # room for the whole struct, of whichever kernel version
_BYTES_ACKED = struct.Struct("=Q")
_BYTES_ACKED_OFFSET = 120
_LINGER_RESET = struct.pack("ii", 1, 0)  # struct linger {l_onoff, l_linger}
# recv() returns buffered frames without suspending: a connection with a backlog yields to the
# event loop after this long, so other connections' REQs are not queued behind its whole backlog
_TIME_SLICE_SECONDS = 0.001


def _is_utf8(data: str | bytes) -> bool:
    if isinstance(data, str):
        return True
    try:
        data.decode()
    except UnicodeDecodeError:
        return False
    return True


def _ok(ref: object, accepted: bool, message: str) -> bytes:
    """The OK answering an EVENT or AUTH whose id is `ref` (NIP-01: every EVENT gets one).

    A 64-character string is echoed even when it is not a valid id (e.g.
    uppercase hex), so the client can match the refusal to what it sent; a
    NOTICE when `ref` is not such a string (missing, another type or size).
    """
    return encode_ok(ref, accepted, message) if type(ref) is str and len(ref) == 64 else encode_notice(message)


def _text_frame_header(size: int) -> bytes:
    """The header of an unmasked, final text frame carrying `size` bytes (RFC 6455 section 5.2)."""
    if size < 126:
        return bytes((_TEXT_FRAME, size))
    if size < 65536:
        return _LENGTH_16.pack(_TEXT_FRAME, 126, size)
    return _LENGTH_64.pack(_TEXT_FRAME, 127, size)


def reset(ws: ServerConnection) -> None:
    """End `ws`'s TCP connection now (RST), discarding whatever it has not sent, whatever its WebSocket state
    (a peer leaving, or shutdown's deadline passed); nothing when it has ended already."""
    _discard_unsent_on_close(ws)
    ws.transport.abort()


def _discard_unsent_on_close(ws: ServerConnection) -> None:
    # SO_LINGER on, 0 s: closing the socket resets the connection and frees its send queue at once.
    sock = ws.transport.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
        except (OSError, ValueError):
            pass  # closed already (uvloop's socket object raises ValueError: negative file descriptor)


class _RateWindow:
    """Whether a peer takes one stored answer at `min_rate` bytes per second at least, over windows of
    `seconds`: when the current window began (loop seconds; None before the first look) and the
    taken-bytes count then (`Connection._taken_bytes`)."""

    __slots__ = ("seconds", "min_rate", "start", "taken")

    def __init__(self, seconds: float, min_rate: float) -> None:
        self.seconds = seconds
        self.min_rate = min_rate
        self.start: float | None = None
        self.taken = 0

    def too_slow(self, now: float, taken: int) -> bool:
        """True when the window has lasted `seconds` and less than `min_rate` bytes per second were taken in it;
        a window that has lasted that long and was fast enough is begun again at `now`."""
        if self.start is not None and now - self.start < self.seconds:
            return False
        if self.start is not None and taken - self.taken < self.min_rate * (now - self.start):
            return True
        self.start, self.taken = now, taken
        return False


class _StalledReader(Exception):
    """The peer took nothing of its stored results for `limits.stored_results_timeout_seconds`, or less than
    `limits.stored_results_min_bytes_per_second` over that long: it is dropped."""


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
            self.connection.push_live(encode_event(self.sub_id, event.raw))
        elif len(self.pending) < self.connection.relay.config.limits.max_live_queue:
            self.pending.append(event)
        else:
            self.connection.drop_slow_reader()


class Connection:
    """Serves one client socket until it closes; `run()` is the whole life."""

    def __init__(self, ws: ServerConnection, relay: Relay, ip: str, relay_url: str) -> None:
        self.ws = ws
        self.relay = relay
        self.access = ConnectionAccess(relay.access, relay_url)
        self.rate = relay.rate_limits.open(ip)
        self.source = Source.client(self.access.check_write if self.access.checks_writes else None,
                                    None if self.rate is None else partial(self.rate.allow, EVENTS))
        self._log_fields = structlog.contextvars.get_contextvars()  # conn_id, remote: bound by Relay._handle
        self.subscriptions: dict[str, LiveSubscription] = {}
        self._limits = relay.config.limits
        self._in_flight = 0  # EVENTs whose OK has not been written yet
        self._slot_free = asyncio.Event()
        self._query_slot = asyncio.Semaphore(1)
        self._out: deque[bytes] = deque()
        self._out_ready = asyncio.Event()
        self._queued_live = 0
        self._queued_live_bytes = 0
        self._queued_oks = 0
        self._sending = False  # the sender is writing or waits for the socket to take its last batch
        self._written = 0  # bytes of frames given to the transport (`_taken_bytes` where TCP_INFO is missing)
        self._closing = False
        self._draining = False  # the relay is shutting down: frames are read and dropped
        self.negentropy = relay.negentropy.sessions_for(self.send, self.access)  # NIP-77 (relay/server/negentropy.py)

    async def run(self) -> None:
        """Read frames until the socket closes, then release everything held."""
        sender = asyncio.create_task(self._send_queued())
        keepalive = asyncio.create_task(self._keepalive())
        try:
            if self.relay.access.config.challenge_on_connect:
                self._challenge()
            loop = asyncio.get_running_loop()
            slice_end = loop.time() + _TIME_SLICE_SECONDS
            while True:
                # Bytes, not str: orjson checks UTF-8 itself, so websockets need not decode.
                message = await self.ws.recv(decode=False)
                if not self._draining:
                    await self._dispatch(message)
                if loop.time() > slice_end:
                    await asyncio.sleep(0)
                    slice_end = loop.time() + _TIME_SLICE_SECONDS
        except ConnectionClosed:
            pass
        finally:
            self._closing = True
            self._slot_free.set()  # wakes a drain() waiting for OKs that will never be written
            sender.cancel()
            keepalive.cancel()
            for sub_id in list(self.subscriptions):
                self._unsubscribe(sub_id)
            self.negentropy.close_all()
            self.relay.rate_limits.close(self.rate)

    async def drain(self) -> None:
        """Graceful shutdown: take no more frames, wait until every EVENT taken has its OK written, close 1001.

        Frames still arriving are read and dropped unanswered (so the close
        handshake is read too); an EVENT that was waiting for room is dropped.
        """
        self._draining = True
        while self._in_flight and not self._closing:
            self._slot_free.clear()
            await self._slot_free.wait()
        await self.ws.close(1001, "relay shutting down")

    async def _dispatch(self, message: str | bytes) -> None:
        # The one broad catch of the message loop: a bug answers NOTICE, never kills the socket.
        try:
            envelope = parse_client_message(message, self._limits.max_filters, self._limits.max_filter_items)
            if type(envelope) is EventEnvelope:
                if self._in_flight >= self._limits.max_events_in_flight:
                    self._slot_free.clear()
                    await self._slot_free.wait()
                await self.relay.store.wait_for_room()
                if self._closing or self._draining:
                    return  # the socket is gone or the relay is stopping: not taken, never answered
                self._in_flight += 1
                self._event(envelope.event)
            elif type(envelope) is ReqEnvelope:
                await self._req(envelope)
            elif type(envelope) is CountEnvelope:
                await self._count(envelope)
            elif type(envelope) is CloseEnvelope:
                self._unsubscribe(envelope.sub_id)
            elif type(envelope) is NegOpenEnvelope and (refusal := self._read_refusal([envelope.filter], NEG_OPENS)):
                await self.negentropy.refuse(envelope.sub_id, refusal)
            elif type(envelope) in (NegOpenEnvelope, NegMsgEnvelope, NegCloseEnvelope):
                await self.negentropy.handle(envelope)  # NIP-77, answered in order
            elif type(envelope) is AuthEnvelope:
                await self._auth(envelope.event)
        except MessageError as err:
            if not err.verb and not _is_utf8(message):
                # RFC 6455 7.1.7/8.1: a message that is not UTF-8 fails the connection with 1007. Checked only
                # here, after the JSON decoders failed, so valid frames are never decoded twice.
                await self.ws.close(1007, "invalid UTF-8")
                return
            await self._answer_error(err)
        except ConnectionClosed:
            raise
        except Exception:
            log.exception("message_failed")
            await self.send(encode_notice("error: internal"))

    async def _answer_error(self, err: MessageError) -> None:
        if err.verb in ("EVENT", "AUTH") and err.ref is not None:
            await self.send(encode_ok(err.ref, False, str(err)))
        elif err.verb in ("REQ", "COUNT") and err.ref is not None:
            if err.verb == "REQ":  # it replaces a subscription of the same id (NIP-01), which CLOSED ends
                self._unsubscribe(err.ref)
            await self.send(encode_closed(err.ref, str(err)))
        elif err.verb in ("NEG-OPEN", "NEG-MSG") and err.ref is not None:
            await self.negentropy.refuse(err.ref, str(err))  # NIP-77: NEG-ERR, and the session ends
        else:
            await self.send(encode_notice(str(err)))

    async def send(self, message: bytes) -> None:
        """Send one UTF-8 JSON message as a text frame (waits while the send buffer is full)."""
        await self.send_many([message])

    async def send_many(self, messages: list[bytes]) -> None:
        """Write UTF-8 JSON messages as text frames, then wait while the send buffer is full; `messages` is
        emptied once written, so while the socket is slow they are held once (in the transport), not twice.

        websockets' `send_context` is the primitive its own `send` uses; one
        context per batch pays the flow-control wait once, not per message,
        and the frames go to the socket in one write.  The frames are built
        here: websockets' frame object costs about 3 µs per frame, a tenth of
        a 500-event answer's time on the event loop.

        Raises:
            ConnectionClosed: the socket is closed.
        """
        async with self.ws.send_context():  # enters only while the connection is open
            data = b"".join([piece for message in messages
                             for piece in (_text_frame_header(len(message)), message)])
            messages.clear()
            self._written += len(data)
            self.ws.transport.write(data)
            del data  # while the socket is slow, what it has not taken stays in the transport only

    def _event(self, obj: object) -> None:
        # EVENT pipeline without a task per event: the one ingest path (relay/ingest/), ending in `_event_done`.
        self.relay.metrics.events_received.inc()
        ref = obj.get("id") if type(obj) is dict else None
        self.relay.ingest.submit(obj, self.source, partial(self._event_done, ref))

    def _event_done(self, ref: object, outcome: Outcome) -> None:
        if outcome.prefix == "auth-required":
            self._challenge()
        self.relay.metrics.event_answered(outcome)
        self._push_ok(_ok(ref, outcome.accepted, outcome.message))

    def _challenge(self) -> None:
        """Queue `["AUTH", <challenge>]` (NIP-42), once per connection."""
        if not self.access.challenged:
            self.access.challenged = True
            self._out.append(encode_auth(self.access.challenge))
            self._out_ready.set()

    async def _auth(self, obj: dict) -> None:
        ref = obj.get("id")
        if self.rate is not None and not self.rate.allow(EVENTS):  # an AUTH costs a signature check, as an EVENT
            await self.send(_ok(ref, False, REFUSALS[EVENTS]))
            return
        try:
            pubkey = self.access.authenticate(obj, self.relay.event_limits, time.time())
        except Rejection as rejection:
            await self.send(_ok(ref, False, str(rejection)))
            return
        if self.access.origin:  # a configured peer: sync traffic is not rate limited
            self.relay.rate_limits.close(self.rate)
            self.rate = None
            self.source = Source.client(peer=self.access.origin)
        log.info("authenticated", pubkey=pubkey, peer=self.access.origin or None)
        await self.send(encode_ok(ref, True, ""))

    def _read_refusal(self, filters: list[Filter], action: int) -> str | None:
        """Why a REQ, COUNT (action REQS) or NEG-OPEN (NEG_OPENS) is refused: rate limit, NIP-42; None: go ahead."""
        if self.rate is not None and not self.rate.allow(action):
            return REFUSALS[action]
        try:
            self.access.check_read(filters)
        except Rejection as rejection:
            self._challenge()
            return str(rejection)
        return None

    async def _req(self, req: ReqEnvelope) -> None:
        self._unsubscribe(req.sub_id)
        if refusal := self._read_refusal(req.filters, REQS):
            await self.send(encode_closed(req.sub_id, refusal))
            return
        limit = self._limits.max_subscriptions
        if len(self.subscriptions) >= limit:
            await self.send(encode_closed(req.sub_id, f"rate-limited: too many subscriptions (max {limit})"))
            return
        sub = LiveSubscription(req.sub_id, req.filters, self)
        # Registered before the stored query runs, so nothing written meanwhile is missed.
        self.relay.subscriptions.add(sub, req.filters)
        self.subscriptions[req.sub_id] = sub
        sub.task = asyncio.create_task(self._serve_stored(sub))

    async def _serve_stored(self, sub: LiveSubscription) -> None:
        stored: list[bytes] = []
        try:
            # One stored answer at a time per connection, from query to last chunk sent: a client
            # cannot hold every read connection, nor more than one answer of the budget.
            async with self._query_slot:
                budget = self._stored_results_budget()
                if refusal := self._over_budget(budget, 1):  # full: refused before the query, not after it
                    raise refusal
                with self.relay.metrics.req_seconds.time():
                    stored = await self.relay.store.query(sub.filters, self._limits.default_limit,
                                                          self._limits.max_limit, self.access.private,
                                                          self._limits.max_query_rows,
                                                          self._limits.query_timeout_seconds,
                                                          self._limits.max_query_bytes)
                sent = await self._send_stored(sub.sub_id, stored, budget)
            stored = None
            await self.send(encode_eose(sub.sub_id))
            pending, sub.pending = sub.pending, None
            if pending:
                for event in pending:
                    if event.id.encode() not in sent:
                        self.push_live(encode_event(sub.sub_id, event.raw))
        except (ConnectionClosed, _StalledReader):
            pass
        except Exception as exc:
            message = self._query_failure("req_failed", exc, sub_id=sub.sub_id)
            self._unsubscribe(sub.sub_id)
            try:
                await self.send(encode_closed(sub.sub_id, message))
            except ConnectionClosed:
                pass
        finally:
            # A cancelled task keeps its frame alive through the exception: let go of the results now.
            stored = None

    def _stored_results_budget(self) -> ByteBudget:
        # A limited client's bytes come from its IP's share, and through it from the relay's budget.
        return self.relay.stored_results if self.rate is None else self.rate.stored_results

    def _over_budget(self, budget: ByteBudget, size: int) -> Rejection | None:
        """The "rate-limited:" refusal when `size` more bytes would pass the client IP's share or the relay's
        budget; None when they fit."""
        short = budget.short_of(size)
        if short is None:
            return None
        if short is self.relay.stored_results:
            return Rejection("rate-limited", "the relay holds too many unsent results, try again later")
        return Rejection("rate-limited", "too many unsent results held for this address, read them first")

    async def _send_stored(self, sub_id: str, stored: list[bytes], budget: ByteBudget) -> set[bytes]:
        """Send stored results in chunks under `budget` (the relay's, or the client IP's share of it),
        letting go of each chunk once sent; returns the ids sent (to skip live events already among them).

        Raises:
            Rejection: "rate-limited:", nothing sent: the results do not fit in the budget.
            _StalledReader: the peer took nothing for `limits.stored_results_timeout_seconds` (or too
                little: `limits.stored_results_min_bytes_per_second`); the connection is being dropped as a
                slow reader and its bytes are given back.
        """
        held = sum(map(len, stored))
        if refusal := self._over_budget(budget, held):
            raise refusal
        budget.take(held)
        try:
            sent = {raw[_ID_SLICE] for raw in stored}
            stored.reverse()  # chunks are popped from the end, so each is freed once sent
            # One rate window over the whole answer: one chunk may take less than a window.
            min_rate = self._limits.stored_results_min_bytes_per_second
            window = _RateWindow(self._limits.stored_results_timeout_seconds, min_rate) if min_rate else None
            while stored:
                chunk = [stored.pop()]  # one event at least, however large
                size = len(chunk[0])
                while stored and len(chunk) < _STORED_CHUNK and size + len(stored[-1]) <= _STORED_CHUNK_BYTES:
                    chunk.append(stored.pop())
                    size += len(chunk[-1])
                await self._send_while_read([encode_event(sub_id, raw) for raw in chunk], window)
                budget.release(size)
                held -= size
            return sent
        finally:
            budget.release(held)

    async def _send_while_read(self, messages: list[bytes], window: _RateWindow | None) -> None:
        """`send_many`, dropping the connection as a slow reader once its peer has taken nothing of what
        was written for `limits.stored_results_timeout_seconds`, or less than
        `limits.stored_results_min_bytes_per_second` over that long: a client that asks and never reads,
        or reads a trickle, must not keep its share of the stored-results budget. `window` carries the rate
        measure from one call to the next of the same answer (None: no minimum rate).

        Raises:
            _StalledReader: the connection is being dropped.
            ConnectionClosed: the socket is closed.
        """
        if not await self._while_taking(self.send_many(messages), self.ws.drain,
                                        self._limits.stored_results_timeout_seconds, window):
            self.drop_slow_reader("slow reader: stored events not read in time")
            raise _StalledReader

    async def _while_taking(self, waiting: Awaitable, then: Callable[[], Awaitable], seconds: float,
                            window: _RateWindow | None = None) -> bool:
        """Await `waiting`, looking every 0.5 s whether the peer takes what was written to it: False,
        `waiting` cancelled, once it has taken nothing for `seconds`, or too little for `window` (which
        begins at its first look and may span several calls); True when `waiting` is done.
        After each look `then()` is awaited in its place (`waiting` is cancelled by the look).

        Progress is the bytes the peer's TCP acknowledges. Waiting for the socket to become writable
        is no measure: the kernel reports that only once a third of its send buffer (grown up to 4 MiB)
        is free, and a client reading a steady 64 kB/s was dropped after about 70 s when each 256 KiB
        chunk had 15 s to be written. Nor are the unsent bytes going down: other writes (live events, the
        answer beside a ping) add to them.

        Raises:
            ConnectionClosed: the socket is closed.
        """
        taken, still = None, 0.0  # no baseline before the first look: most writes never wait that long
        loop = asyncio.get_running_loop()
        while True:
            try:
                async with asyncio.timeout(_PROGRESS_CHECK_SECONDS):
                    await waiting
                return True
            except TimeoutError:  # what was written stays with the transport
                pass
            now = self._taken_bytes()
            still = 0.0 if taken is None or now > taken else still + _PROGRESS_CHECK_SECONDS
            taken = now
            if still >= seconds or (window is not None and window.too_slow(loop.time(), now)):
                return False
            waiting = then()

    async def _keepalive(self) -> None:
        """Ping the peer every `server.ping_interval_seconds` (RFC 6455 section 5.5.2) and close it (1011) when it
        neither answers nor takes any of what was written to it for `server.ping_timeout_seconds`.

        A ping waits behind every byte written before it, so a client steadily reading a large answer
        at 60 kB/s got its pong too late for websockets' own keepalive and was cut after 80-108 s.
        """
        server = self.relay.config.server
        while True:
            await asyncio.sleep(server.ping_interval_seconds)
            pong = asyncio.ensure_future(self._pong())
            if not await self._while_taking(asyncio.shield(pong), partial(asyncio.shield, pong),
                                            server.ping_timeout_seconds):
                pong.cancel()
                if self._drop(1011, "keepalive ping timeout"):  # not when dropped already as a slow reader
                    self.relay.keepalive_timed_out()
                return

    async def _pong(self) -> None:
        try:
            await (await self.ws.ping())
        except ConnectionClosed:
            pass  # run() ends too, and cancels the keepalive

    def _taken_bytes(self) -> int:
        """A count of bytes that grows as the peer takes what was written to it: its TCP acknowledged
        bytes (`tcp_info.tcpi_bytes_acked`, Linux 4.1+); elsewhere, the bytes the transport has handed to
        the kernel (written by `send_many`, less those still unsent): it never falls when more is written."""
        transport = self.ws.transport
        sock = transport.get_extra_info("socket")
        if _TCP_INFO is not None and sock is not None:
            try:
                info = sock.getsockopt(socket.IPPROTO_TCP, _TCP_INFO, _TCP_INFO_BYTES)
            except OSError:
                info = b""
            if len(info) >= _BYTES_ACKED.size + _BYTES_ACKED_OFFSET:
                return _BYTES_ACKED.unpack_from(info, _BYTES_ACKED_OFFSET)[0]
        return self._written - transport.get_write_buffer_size()

    async def _count(self, req: CountEnvelope) -> None:
        if refusal := self._read_refusal(req.filters, REQS):
            await self.send(encode_closed(req.sub_id, refusal))
            return
        try:
            async with self._query_slot:
                with self.relay.metrics.count_seconds.time():
                    count = await self.relay.store.count(req.filters, self.access.private,
                                                         self._limits.query_timeout_seconds)
        except Exception as exc:
            await self.send(encode_closed(req.sub_id, self._query_failure("count_failed", exc)))
            return
        await self.send(encode_count(req.sub_id, count))

    def _query_failure(self, what: str, exc: Exception, **fields) -> str:
        # A Rejection is a query past its time bound (relay/store/bounds.py); anything else is a bug.
        return str(exc) if isinstance(exc, Rejection) else self.relay.internal_error(what, exc, **fields)

    def _unsubscribe(self, sub_id: str) -> None:
        sub = self.subscriptions.pop(sub_id, None)
        if sub is None:
            return
        self.relay.subscriptions.remove(sub, sub.filters)
        if sub.task is not None and not sub.task.done():
            sub.task.cancel()
        sub.task = None  # no task <-> subscription cycle left for the GC

    def _push_ok(self, message: bytes) -> None:
        # The EVENT's in-flight slot is freed when this reply has been written (see _send_queued).
        self._out.append(message)
        self._queued_oks += 1
        self._out_ready.set()

    def push_live(self, message: bytes) -> None:
        """Queue a live message; past `max_live_queue` messages or `max_live_queue_bytes` waiting
        while the socket has not taken the previous batch, drop this slow reader."""
        if self._closing:
            return
        self._out.append(message)
        self._queued_live += 1
        self._queued_live_bytes += len(message)
        if self._sending and (self._queued_live > self._limits.max_live_queue
                              or self._queued_live_bytes > self._limits.max_live_queue_bytes):
            self.drop_slow_reader()
        else:
            self._out_ready.set()

    def drop_slow_reader(self, reason: str = "slow reader: live events not read in time") -> None:
        """Disconnect a reader that does not read what it asked for in time (counted once, and only while its
        peer has not begun to close); `reason` goes in the close frame."""
        if self._drop(1008, reason):
            self.relay.slow_reader_dropped(**self._log_fields)

    def _drop(self, code: int, reason: str) -> bool:
        """Close this connection for not reading or not answering in time; True when that is to be counted:
        False when it is closing already, or its WebSocket is no longer open: its peer is leaving (it sent
        its close frame or FIN), or the relay is closing it (shutdown).

        Its subscriptions end and its queued messages go now. The close frame waits behind what the
        socket holds; when the close handshake has not ended within websockets' close timeout (10 s),
        the TCP connection is reset and its unsent bytes discarded. Left to websockets, a dropped
        non-reader stayed connected until it read (the close waits for the socket to drain), and then
        its socket held 3 MB in the kernel (FIN-WAIT-1) for minutes. A connection no longer open is
        reset at once: what its peer did not read is of no use to it.
        """
        if self._closing:
            return False
        self._closing = True
        self._out.clear()
        for sub_id in list(self.subscriptions):
            self._unsubscribe(sub_id)
        if self.ws.state is not State.OPEN:
            reset(self.ws)
            return False
        _discard_unsent_on_close(self.ws)
        asyncio.create_task(self._close_or_reset(code, reason))
        return True

    async def _close_or_reset(self, code: int, reason: str) -> None:
        try:
            async with asyncio.timeout(self.ws.close_timeout):
                await self.ws.close(code, reason)
        except TimeoutError:
            reset(self.ws)

    async def _send_queued(self) -> None:
        try:
            while True:
                await self._out_ready.wait()
                self._out_ready.clear()
                while self._out:
                    batch = list(self._out)
                    self._out.clear()
                    oks, self._queued_oks, self._queued_live, self._queued_live_bytes = self._queued_oks, 0, 0, 0
                    self._sending = True
                    await self.send_many(batch)
                    self._sending = False
                    self._in_flight -= oks
                    self._slot_free.set()
        except ConnectionClosed:
            # Wake a read loop waiting for in-flight slots, or it would wait forever.
            self._closing = True
            self._slot_free.set()
