"""NIP-77 on the relay side: the NEG-OPEN / NEG-MSG / NEG-CLOSE sessions of each connection.

How this works
--------------
A session is one NEG-OPEN subscription id of one connection; these ids are a
namespace apart from REQ ids, and opening an id that is open replaces its
session.  The relay is always the responder.  A session's items come from
one of two places:

* the persisted index (relay/store/negentropy/) when the filter, once
  since/until/limit are set aside, equals an indexed filter (`{}` is the full
  set).  The session holds no items: each message is answered inside a fresh
  read transaction (`ReadPool.read_snapshot`), from the window since/until and
  the newest `limit` items, and no snapshot is held between messages;
* any other filter: a SortedVector built at NEG-OPEN by one query of
  (created_at, id), at most `max_sync_events` items (past it, NEG-ERR
  "blocked: too many query results") and counted against a relay-wide budget
  of `max_session_items` held by all sessions together (past it, NEG-ERR
  "blocked: ...").  Later messages are answered from memory.

A connection that may not read every private kind (NIP-42; see
relay/server/access.py) is never served from an index holding events it may
not see: with the full-set filter and no private event visible to it (not
authenticated), from the public set (every event but the private kinds',
indexed alongside); otherwise from a SortedVector built by a query that
leaves out the private events it may not see.

Every message re-arms the session's idle timer; after `idle_timeout_seconds`
without one the session ends with NEG-ERR "closed: ...".  Any NEG-ERR ends the
session (NIP-77).  The connection's read loop awaits each NEG message before
reading the next, so one connection's messages are answered in order.
Replies use NIP-01 prefixes: "invalid:" for a malformed message, "blocked:"
for a refused query, "closed:" for a session that is gone.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import structlog

from relay.config import NegentropyConfig
from relay.protocol.envelopes import (
    NegCloseEnvelope,
    NegMsgEnvelope,
    NegOpenEnvelope,
    encode_neg_err,
    encode_neg_msg,
)
from relay.protocol.filters import Filter
from relay.protocol.negentropy import Negentropy, NegentropyError, SortedVector
from relay.server.access import ConnectionAccess
from relay.store.negentropy import GroupCache, NegentropyIndex, query_vector, reconcile_from_index
from relay.store.reads import ReadPool

log = structlog.get_logger(__name__)

Send = Callable[[bytes], Awaitable[None]]


class NegentropyService:
    """What every connection's sessions share: config, store, the index hook and the item budget.

    `items_held` counts the items of all open sessions' SortedVectors (not
    the indexed sessions, which hold none); it never exceeds
    `config.max_session_items`.
    """

    def __init__(self, config: NegentropyConfig, store: ReadPool,
                 internal_error: Callable[..., str]) -> None:
        self.config = config
        self.store = store
        self.index = next((h for h in store.hooks if isinstance(h, NegentropyIndex)), None)
        self.cache = GroupCache(config.cache_items)
        self.items_held = 0
        self.internal_error = internal_error

    def sessions_for(self, send: Send, access: ConnectionAccess) -> ConnectionSessions:
        """The sessions of one new connection; `send` writes one message to its socket; `access` is its NIP-42 state."""
        return ConnectionSessions(self, send, access)

    def reserve(self, wanted: int) -> int:
        """Take up to `wanted` items of the budget; returns how many were granted (maybe 0)."""
        granted = max(0, min(wanted, self.config.max_session_items - self.items_held))
        self.items_held += granted
        return granted

    def release(self, items: int) -> None:
        """Give back `items` of the budget."""
        self.items_held -= items


class _Session:
    __slots__ = ("sub_id", "filter", "filter_no", "vector", "held", "timer")

    def __init__(self, sub_id: str, f: Filter, filter_no: int | None) -> None:
        self.sub_id = sub_id
        self.filter = f
        self.filter_no = filter_no  # index serving it, or None: `vector` does
        self.vector: SortedVector | None = None
        self.held = 0  # budget items reserved for `vector`
        self.timer: asyncio.TimerHandle | None = None


class _Refused(Exception):
    """A NEG-OPEN that cannot be served; the message is the NEG-ERR reason."""


class ConnectionSessions:
    """The NIP-77 sessions of one connection: `handle` each NEG envelope, `close_all` at disconnect."""

    def __init__(self, service: NegentropyService, send: Send, access: ConnectionAccess) -> None:
        self.service = service
        self._send = send
        self._access = access
        self._sessions: dict[str, _Session] = {}
        self._closed = False
        self._tasks: set[asyncio.Task] = set()

    def __len__(self) -> int:
        return len(self._sessions)

    async def handle(self, envelope: NegOpenEnvelope | NegMsgEnvelope | NegCloseEnvelope) -> None:
        """Answer one NEG-OPEN or NEG-MSG (NEG-MSG or NEG-ERR), or carry out a NEG-CLOSE (no reply).

        Raises:
            ConnectionClosed: the socket closed while replying.
        """
        if type(envelope) is NegCloseEnvelope:
            self.close(envelope.sub_id)
        elif not self.service.config.enabled:
            await self.refuse(envelope.sub_id, "blocked: negentropy (NIP-77) is disabled on this relay")
        elif type(envelope) is NegOpenEnvelope:
            await self._open(envelope)
        else:
            await self._message(envelope)

    async def refuse(self, sub_id: str, reason: str) -> None:
        """End session `sub_id` if open and send NEG-ERR with `reason` ("<prefix>: <text>")."""
        self.close(sub_id)
        await self._send(encode_neg_err(sub_id, reason))

    def close(self, sub_id: str) -> None:
        """End session `sub_id` (if open) and give back its budget; nothing is sent."""
        session = self._sessions.pop(sub_id, None)
        if session is not None:
            self._end(session)

    def close_all(self) -> None:
        """End every session (the socket closed); later NEG-OPENs are not kept."""
        self._closed = True
        for sub_id in list(self._sessions):
            self.close(sub_id)

    def _end(self, session: _Session) -> None:
        if session.timer is not None:
            session.timer.cancel()
        self.service.release(session.held)
        session.held = 0
        session.vector = None

    async def _open(self, envelope: NegOpenEnvelope) -> None:
        sub_id = envelope.sub_id
        self.close(sub_id)  # NIP-77: re-opening an id replaces its session
        cap = self.service.config.max_sessions_per_connection
        if len(self._sessions) >= cap:
            await self.refuse(sub_id, f"blocked: too many negentropy sessions (max {cap})")
            return
        index, private = self.service.index, self._access.private
        if index is None:
            filter_no = None
        elif private is None or not private.touches(envelope.filter):
            filter_no = index.filter_no(envelope.filter)
        elif not private.readers:  # sees no private event: the public set, if it is the full set asked for
            filter_no = index.public_no(envelope.filter, private.kinds)
        else:
            filter_no = None  # sees some private events: a query leaves out the others'

        session = _Session(sub_id, envelope.filter, filter_no)
        kept = False
        try:
            if session.filter_no is None:
                await self._load_vector(session)
            reply = await self._reconcile(session, envelope.initial_message)
            if self._closed:
                return
            self._sessions[sub_id] = session
            kept = True
            self._arm(session)
        except _Refused as refusal:
            await self.refuse(sub_id, str(refusal))
            return
        except NegentropyError as exc:
            await self.refuse(sub_id, f"invalid: negentropy message: {exc}")
            return
        except Exception as exc:
            await self.refuse(sub_id, self.service.internal_error("neg_open_failed", exc, sub_id=sub_id))
            return
        finally:
            if not kept:
                self._end(session)
        log.debug("neg_session_opened", sub_id=sub_id, indexed=session.filter_no is not None,
                  items=None if session.vector is None else session.vector.size())
        await self._send(encode_neg_msg(sub_id, reply))

    async def _load_vector(self, session: _Session) -> None:
        """Build the session's SortedVector from one query, within `max_sync_events` and the budget.

        Raises:
            _Refused: too many items, or the relay-wide budget is spent.
        """
        config, f = self.service.config, session.filter
        wanted = config.max_sync_events if f.limit is None else min(f.limit, config.max_sync_events)
        session.held = granted = self.service.reserve(wanted)
        # One more row than granted tells "too many" apart from "exactly enough".
        fetch = granted if f.limit is not None and f.limit <= granted else granted + 1
        vector = await self.service.store.read_snapshot(query_vector, f, fetch, int(time.time()), self._access.private)
        if vector.size() > granted:
            if granted < wanted:
                raise _Refused("blocked: the relay holds too many negentropy items now, try again later")
            raise _Refused(f"blocked: too many query results (max {config.max_sync_events})")
        self.service.release(granted - vector.size())
        session.held = vector.size()
        session.vector = vector

    async def _reconcile(self, session: _Session, message: bytes) -> bytes:
        """The responder's reply to `message` (NIP-77); a version it does not speak gets b"\\x61"."""
        frame_size_limit = self.service.config.frame_size_limit
        if session.vector is not None:
            return Negentropy(session.vector, frame_size_limit).reconcile(message)
        return await self.service.store.read_snapshot(
            reconcile_from_index, session.filter_no, session.filter, message, frame_size_limit, self.service.cache)

    async def _message(self, envelope: NegMsgEnvelope) -> None:
        sub_id = envelope.sub_id
        session = self._sessions.get(sub_id)
        if session is None:
            await self._send(encode_neg_err(sub_id, "closed: no such negentropy session"))
            return
        session.timer.cancel()
        try:
            reply = await self._reconcile(session, envelope.message)
        except NegentropyError as exc:
            await self.refuse(sub_id, f"invalid: negentropy message: {exc}")
            return
        except Exception as exc:
            await self.refuse(sub_id, self.service.internal_error("neg_msg_failed", exc, sub_id=sub_id))
            return
        if self._sessions.get(sub_id) is session:
            self._arm(session)
        await self._send(encode_neg_msg(sub_id, reply))

    def _arm(self, session: _Session) -> None:
        timeout = self.service.config.idle_timeout_seconds
        session.timer = asyncio.get_running_loop().call_later(timeout, self._expire, session)

    def _expire(self, session: _Session) -> None:
        if self._sessions.get(session.sub_id) is not session:
            return
        self.close(session.sub_id)
        timeout = self.service.config.idle_timeout_seconds
        message = encode_neg_err(session.sub_id, f"closed: no negentropy message for {timeout:g} seconds")
        task = asyncio.create_task(self._send_quietly(message))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send_quietly(self, message: bytes) -> None:
        try:
            await self._send(message)
        except Exception:  # the socket closed meanwhile: nobody to tell
            pass
