"""The client of another relay: one WebSocket, relay messages routed to whoever waits for them.

How this works
--------------
`PeerConnection.open` connects and starts one reader task.  The reader
parses each frame (relay/protocol/client.py, which also encodes what we
send) and routes the message by its type:

- `OK` resolves the future of the EVENT (or AUTH) with that id;
- `EVENT`, `EOSE`, `CLOSED` go to the subscription with that sub_id (a
  fetch by ids, collected until EOSE, or the live stream, handed to a
  callback);
- `NEG-MSG`, `NEG-ERR` go to the queue of the negentropy session (NIP-77);
- `AUTH` challenges are answered at once with the node key (NIP-42);
- `NOTICE` breaks the connection: every wait fails with `PeerNotice`, since
  a peer that answers NOTICE did not understand or refused what we sent.

A frame that is no relay message is logged and ignored, unless it names a
request of ours, which then fails naming it (`_on_malformed`).

A request refused with `auth-required:` waits until the peer accepts one of
our AUTH events, then is sent once more; if the peer refused our AUTH, the
request fails with that refusal.  Every wait ends with `PeerError` after
`reply_timeout_seconds` without any message from the peer, or when the
connection is lost.
"""

from __future__ import annotations

import asyncio
import http.client
import itertools
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable

import orjson
import structlog
import websockets
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI

from relay.keys import NodeKey
from relay.protocol.client import (RelayAuth, RelayClosed, RelayEose, RelayEvent, RelayMessage, RelayMessageError,
                                   RelayNegErr, RelayNegMsg, RelayNotice, RelayOk, encode_auth_response, encode_close,
                                   encode_neg_close, encode_neg_msg, encode_neg_open, encode_publish, encode_req,
                                   parse_relay_message)
from relay.protocol.negentropy import Negentropy, NegentropyError
from relay.wire.websocket import send_texts

log = structlog.get_logger(__name__)

AUTH_REQUIRED = "auth-required:"
RATE_LIMITED = "rate-limited:"
# A refusal with "rate-limited:" is retried after a pause that doubles up to 2 s; the request
# fails after this many pauses in a row that settled nothing (about a minute in all).
RATE_LIMIT_PAUSES = 30


class _RateLimitPauses:
    """The pauses of one request after "rate-limited:" answers: 0.25 s doubling to 2 s, at most
    `RATE_LIMIT_PAUSES` in a row that settled nothing."""

    def __init__(self) -> None:
        self.fruitless = 0

    async def wait(self, progress: bool = False) -> bool:
        """Pause before sending again (`progress`: the last round settled something); False, without
        pausing, once the pauses are used up."""
        if progress:
            self.fruitless = 0
        if self.fruitless >= RATE_LIMIT_PAUSES:
            return False
        await asyncio.sleep(min(2.0, 0.25 * 2 ** self.fruitless))
        self.fruitless += 1
        return True


class PeerError(Exception):
    """The peer cannot be synced with now; `str()` says why, for the operator."""


class PeerNotice(PeerError):
    """The peer answered with `["NOTICE", message]`; `message` is its text."""

    def __init__(self, message: str) -> None:
        super().__init__(f"peer sent NOTICE: {message!r}")
        self.message = message


class _Subscription:
    """A REQ: a fetch collects `events` until EOSE; a live one passes each event to `on_event`."""

    __slots__ = ("filter_obj", "events", "done", "on_event", "last")

    def __init__(self, filter_obj: dict, done: asyncio.Future | None,
                 on_event: Callable[[object], None] | None) -> None:
        self.filter_obj = filter_obj
        self.events: list[object] = []
        self.done = done
        self.on_event = on_event
        self.last = 0.0  # loop time of the REQ or of its last EVENT


_INFORMATION_BYTES = 65_536  # a NIP-11 document read at most


def _fetch_information(url: str, timeout_seconds: float) -> dict:
    """NIP-11: GET the document of the relay at ws(s) `url` from http(s) on the same host and path; {} on any
    failure (no document, not JSON, not an object, unreachable)."""
    request = urllib.request.Request("http" + url[2:], headers={"Accept": "application/nostr+json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_seconds) as response:
            document = orjson.loads(response.read(_INFORMATION_BYTES))
    except (OSError, ValueError, http.client.HTTPException):  # URLError, HTTPError: OSErrors; bad JSON: ValueError
        return {}
    return document if isinstance(document, dict) else {}


class PeerConnection:
    """One open WebSocket to a peer relay; see the module comment.  Close with `close()`."""

    def __init__(self, url: str, ws, key: NodeKey | None, reply_timeout_seconds: float) -> None:
        self.url = url
        self.key = key
        self.reply_timeout_seconds = reply_timeout_seconds
        self._ws = ws
        self._loop = asyncio.get_running_loop()
        self._last_received = self._loop.time()
        self._ids = itertools.count(1)
        self._oks: dict[str, list[Callable[[str, bool, str], None]]] = {}  # event id -> who waits for its OK
        self._subs: dict[str, _Subscription] = {}
        self._negs: dict[str, asyncio.Queue] = {}
        self._auth_ids: set[str] = set()
        self._authed = False
        self._auth_refusal: str | None = None
        self._auth_changed = asyncio.Event()
        self._failed: asyncio.Future = self._loop.create_future()
        self._failed.add_done_callback(lambda f: f.exception())  # retrieved: no "never retrieved" warning
        self._reader = asyncio.create_task(self._read_loop(), name=f"peer-reader {url}")
        self._information: dict | None = None

    async def information(self) -> dict:
        """The peer's NIP-11 document (fetched once, over HTTP(S) on the same host and path); {} when it has none.

        Read only when needed (relay/sync/session.py sends a deleted version only to our own software).
        """
        if self._information is None:
            self._information = await asyncio.to_thread(_fetch_information, self.url, self.reply_timeout_seconds)
        return self._information

    @classmethod
    async def open(cls, url: str, key: NodeKey | None, connect_timeout_seconds: float = 10.0,
                   reply_timeout_seconds: float = 30.0, max_message_bytes: int = 4 * 1024 * 1024) -> PeerConnection:
        """Connect to `url` (ws:// or wss://) within `connect_timeout_seconds`.

        `max_message_bytes` bounds one incoming frame.

        Raises:
            PeerError: bad URL, refused or failed connection, handshake timeout.
        """
        try:
            ws = await websockets.connect(url, open_timeout=connect_timeout_seconds, max_size=max_message_bytes,
                                          compression=None, ping_interval=20, ping_timeout=20, close_timeout=2)
        except InvalidURI as exc:
            raise PeerError(f"not a WebSocket URL: {url!r} ({exc})") from None
        except (OSError, InvalidHandshake, TimeoutError) as exc:
            raise PeerError(f"cannot connect to {url}: {exc or type(exc).__name__}") from None
        return cls(url, ws, key, reply_timeout_seconds)

    @property
    def failure(self) -> asyncio.Future:
        """A future that fails with `PeerError` when the connection breaks (never succeeds)."""
        return self._failed

    async def close(self) -> None:
        """Close the socket and stop the reader; pending waits fail with PeerError."""
        self._fail(PeerError("connection closed by us"))
        try:
            await self._ws.close()
        except Exception:  # closing a broken socket: nothing left to do
            pass
        self._reader.cancel()
        await asyncio.wait({self._reader})  # unlike `await`, never mistakes the reader's cancellation for ours

    # --- sending and waiting ------------------------------------------------------------------------

    async def _send(self, message: bytes) -> None:
        await self._send_many((message,))

    async def _send_many(self, messages) -> None:
        """Write UTF-8 JSON messages as text frames, paying websockets' flow-control wait once (`send_texts`)."""
        if self._failed.done():
            raise self._failed.exception()
        try:
            await send_texts(self._ws, messages)
        except ConnectionClosed as exc:
            self._fail(self._closed_error(exc))
            raise self._failed.exception() from None

    async def _wait(self, awaitable: Awaitable, what: str, progress: Callable[[], float] | None = None):
        """Await `awaitable`, failing when it sees no progress for `reply_timeout_seconds`, or the connection breaks.

        `progress()` is the loop time of the last sign of progress on this
        request (default: of the last message from the peer, or the request's start if later).
        """
        task = asyncio.ensure_future(awaitable)
        started = self._loop.time()  # a quiet link before the request is no sign of a dead peer
        progress = progress or (lambda: max(self._last_received, started))
        try:
            while True:
                remaining = progress() + self.reply_timeout_seconds - self._loop.time()
                if remaining <= 0:
                    raise PeerError(f"timed out: no answer from {self.url} to {what} "
                                    f"within {self.reply_timeout_seconds:g} s")
                done, _ = await asyncio.wait((task, self._failed), timeout=remaining,
                                             return_when=asyncio.FIRST_COMPLETED)
                if task in done:
                    return task.result()
                if self._failed.done():
                    raise self._failed.exception()
        finally:
            if not task.done():
                task.cancel()

    def _fail(self, error: PeerError) -> None:
        if not self._failed.done():
            self._failed.set_exception(error)

    # --- reading ------------------------------------------------------------------------------------

    async def _read_loop(self) -> None:
        try:
            async for frame in self._ws:
                self._last_received = self._loop.time()
                try:
                    message = parse_relay_message(frame)
                except RelayMessageError as exc:
                    log.warning("peer_bad_message", peer=self.url, size=len(frame), error=str(exc))
                    self._on_malformed(exc)
                    continue
                self._route(message)
            self._fail(self._closed_error(None))
        except ConnectionClosed as exc:
            self._fail(self._closed_error(exc))
        except Exception as exc:  # the one broad catch of the reader: a bug ends this connection only
            log.error("peer_reader_failed", peer=self.url, error=repr(exc), exc_info=exc)
            self._fail(PeerError(f"internal error reading from {self.url}: {exc!r}"))

    def _closed_error(self, exc: ConnectionClosed | None) -> PeerError:
        if self._ws.close_code is not None and self._ws.close_code != 1006:
            reason = f", reason {self._ws.close_reason!r}" if self._ws.close_reason else ""
            return PeerError(f"{self.url} closed the connection (code {self._ws.close_code}{reason})")
        return PeerError(f"connection to {self.url} lost{f': {exc}' if exc else ''}")

    def _route(self, message: RelayMessage) -> None:
        match message:
            case RelayNotice(text):
                self._fail(PeerNotice(text))
            case RelayEvent(sub_id, event):
                sub = self._subs.get(sub_id)
                if sub is not None and sub.on_event is not None:
                    sub.on_event(event)
                elif sub is not None:
                    sub.events.append(event)
                    sub.last = self._last_received
            case RelayOk(event_id, accepted, text):
                self._on_ok(event_id, accepted, text)
            case RelayEose(sub_id):
                sub = self._subs.get(sub_id)
                if sub is not None and sub.done is not None and not sub.done.done():
                    sub.done.set_result(sub.events)
            case RelayClosed(sub_id, text):
                self._on_closed(sub_id, text)
            case RelayNegMsg(sub_id) | RelayNegErr(sub_id):
                if (queue := self._negs.get(sub_id)) is not None:
                    queue.put_nowait(message)
            case RelayAuth(challenge):
                self._answer_challenge(challenge)
            # a COUNT answers no request of ours

    def _on_malformed(self, error: RelayMessageError) -> None:
        """A frame that is no relay message is ignored, unless it is a NOTICE (of any shape, it breaks the
        connection) or names a request of ours, which then ends as if refused, naming the error: an OK's
        event, a CLOSED's subscription, a NEG-MSG's or NEG-ERR's reconciliation."""
        if error.verb == "NOTICE":
            self._fail(PeerNotice(str(error)))
        elif error.ref is None:
            return
        elif error.verb == "OK":
            self._on_ok(error.ref, False, f"malformed OK: {error}")
        elif error.verb == "CLOSED":
            self._on_closed(error.ref, f"malformed CLOSED: {error}")
        elif error.verb in ("NEG-MSG", "NEG-ERR") and (queue := self._negs.get(error.ref)) is not None:
            queue.put_nowait(error)

    def _on_ok(self, event_id: str, accepted: bool, message: str) -> None:
        if event_id in self._auth_ids:
            self._auth_ids.discard(event_id)
            if accepted:
                self._authed = True
            else:
                self._auth_refusal = message or "(no reason given)"
            log.info("peer_auth_answered", peer=self.url, accepted=accepted, message=message)
            self._auth_changed.set()
            self._auth_changed = asyncio.Event()
            return
        for waiter in self._oks.pop(event_id, ()):
            waiter(event_id, accepted, message)

    def _on_closed(self, sub_id: str, message: str) -> None:
        sub = self._subs.get(sub_id)
        if sub is None:
            return
        if sub.done is not None:
            if not sub.done.done():
                sub.done.set_exception(_Closed(message))
        elif message.startswith(AUTH_REQUIRED):
            asyncio.create_task(self._resubscribe_after_auth(sub_id, message))
        else:
            self._fail(PeerError(f"{self.url} closed the live subscription: {message!r}"))

    # --- NIP-42 -------------------------------------------------------------------------------------

    def _answer_challenge(self, challenge: str) -> None:
        if self.key is None:
            return
        event = self.key.auth_event(self.url, challenge)
        self._auth_ids.add(event["id"])
        asyncio.create_task(self._send_quietly(encode_auth_response(event)))

    async def _send_quietly(self, message: bytes) -> None:
        try:
            await self._send(message)
        except PeerError:
            pass  # the failure is already recorded in self._failed

    async def authenticated(self, seconds: float) -> bool:
        """Whether the peer accepted our AUTH (NIP-42) within `seconds`: a relay that challenges at connection
        has our answer's OK in a round trip; one that never challenges (or with no node key, or our AUTH
        refused) gives False, after `seconds` at most.  For a request whose answer depends on who asks (a REQ
        for events of private kinds, which a relay filters out of an unauthenticated answer without a word)."""
        try:
            await asyncio.wait_for(self._await_auth("", "a REQ for events of private kinds"), seconds)
        except (PeerError, TimeoutError):
            return False
        return True

    async def _await_auth(self, refusal: str, what: str) -> None:
        """After `refusal` ("auth-required: ..."): wait until the peer accepts our AUTH.

        Raises:
            PeerError: no node key, our AUTH was refused, or no AUTH accepted in time.
        """
        if self.key is None:
            raise PeerError(f"{self.url} requires authentication ({refusal!r}) and no node key is set")
        started = self._loop.time()
        while not self._authed:
            if self._auth_refusal is not None:
                raise PeerError(f"{self.url} refused our NIP-42 AUTH as node {self.key.pubkey}: "
                                f"{self._auth_refusal!r} (it requires it: {refusal!r})")
            try:
                await self._wait(self._auth_changed.wait(), f"our AUTH (needed for {what})", lambda: started)
            except PeerError as exc:
                if self._failed.done():
                    raise
                raise PeerError(f"{self.url} requires authentication ({refusal!r}) but accepted no AUTH "
                                f"from us: {exc}") from None

    async def _resubscribe_after_auth(self, sub_id: str, refusal: str) -> None:
        try:
            await self._await_auth(refusal, "the live subscription")
            sub = self._subs.get(sub_id)
            if sub is not None and sub.on_event is not None:
                await self._send(encode_req(sub_id, sub.filter_obj))
        except PeerError as exc:
            self._fail(exc)

    # --- requests -----------------------------------------------------------------------------------

    async def publish_many(self, events: list[tuple[str, bytes]],
                           on_answer: Callable[[str, bool, str], None]) -> None:
        """Send `["EVENT", raw]` for each (id, raw JSON) in one write and wait for every OK.

        `on_answer(event_id, accepted, message)` is called once per event with its last answer, as soon as
        it is in: an accepted or final answer received before a failure is never lost.  Events refused with
        "auth-required:" are sent once more after our AUTH is accepted; events refused with "rate-limited:"
        are sent again after a pause (`RATE_LIMIT_PAUSES`); their refusal is answered only when not sent again.

        Raises:
            PeerError: no OK for `reply_timeout_seconds` since the last one, lost connection, NOTICE, refused AUTH.
        """
        outcomes: dict[str, tuple[bool, str]] = {}
        todo, authenticated, pauses = events, False, _RateLimitPauses()
        while todo:
            done = self._loop.create_future()
            left = len(todo)
            last = self._loop.time()

            def on_ok(event_id: str, accepted: bool, message: str) -> None:
                nonlocal left, last
                outcomes[event_id] = (accepted, message)
                left -= 1
                last = self._loop.time()
                if accepted or not message.startswith((AUTH_REQUIRED, RATE_LIMITED)):
                    on_answer(event_id, accepted, message)  # never sent again: final now
                if left <= 0 and not done.done():
                    done.set_result(None)

            for event_id, _ in todo:
                self._oks.setdefault(event_id, []).append(on_ok)
            try:
                await self._send_many([encode_publish(raw) for _, raw in todo])
                await self._wait(done, f"{len(todo)} EVENTs (OK replies)", lambda: last)
            finally:
                for event_id, _ in todo:
                    waiters = self._oks.get(event_id)
                    if waiters and on_ok in waiters:
                        waiters.remove(on_ok)
                        if not waiters:
                            del self._oks[event_id]
            refused = [i for i, _ in todo if not outcomes[i][0] and outcomes[i][1].startswith(AUTH_REQUIRED)]
            limited = [i for i, _ in todo if not outcomes[i][0] and outcomes[i][1].startswith(RATE_LIMITED)]
            retry: set[str] = set()
            if refused and not authenticated:
                authenticated = True
                await self._await_auth(outcomes[refused[0]][1], "EVENT")
                retry.update(refused)
            if limited and await pauses.wait(progress=len(limited) < len(todo)):
                retry.update(limited)
            for event_id in refused + limited:
                if event_id not in retry:
                    on_answer(event_id, *outcomes[event_id])
            todo = [item for item in todo if item[0] in retry]

    async def fetch(self, ids: list[str]) -> list[object]:
        """Ask for events by id with one REQ (`limit` = len(ids)); return what came before EOSE, unvalidated.

        Raises:
            PeerError: CLOSED (other than a satisfied auth-required, or a rate-limited: that passed
                within `RATE_LIMIT_PAUSES`), timeout, lost connection, NOTICE.
        """
        return await self.query({"ids": ids, "limit": len(ids)}, f"REQ of {len(ids)} ids")

    async def query(self, filter_obj: dict, what: str = "REQ") -> list[object]:
        """One REQ of `filter_obj`; what came before EOSE, unvalidated.  `what` names it in errors.

        Raises:
            PeerError: as `fetch`.
        """
        authenticated, pauses = False, _RateLimitPauses()
        while True:
            sub_id = f"fetch-{next(self._ids)}"
            sub = _Subscription(filter_obj, self._loop.create_future(), None)
            self._subs[sub_id] = sub
            try:
                await self._send(encode_req(sub_id, filter_obj))
                sub.last = self._loop.time()
                try:
                    return await self._wait(sub.done, what, lambda: sub.last)
                except _Closed as closed:
                    reason = closed.message
                    if reason.startswith(AUTH_REQUIRED) and not authenticated:
                        authenticated = True
                        await self._await_auth(reason, "REQ")
                    elif not (reason.startswith(RATE_LIMITED) and await pauses.wait()):
                        raise PeerError(f"{self.url} refused {what}: CLOSED {reason!r}") from None
            finally:
                self._subs.pop(sub_id, None)
                if not self._failed.done():
                    await self._send_quietly(encode_close(sub_id))

    async def subscribe(self, filter_obj: dict, on_event: Callable[[object], None]) -> str:
        """Open a live REQ with `filter_obj`; `on_event(obj)` gets every event (unvalidated). Returns the sub_id.

        A CLOSED (other than auth-required, which is retried after AUTH) breaks the connection.
        """
        sub_id = f"live-{next(self._ids)}"
        sub = _Subscription(filter_obj, None, on_event)
        self._subs[sub_id] = sub
        await self._send(encode_req(sub_id, filter_obj))
        return sub_id

    async def reconcile(self, filter_obj: dict, neg: Negentropy,
                        on_round: Callable[[list[bytes], list[bytes]], None]) -> int:
        """Run one NIP-77 reconciliation as initiator; returns the number of rounds.

        `on_round(have_ids, need_ids)` is called after each reply; ids are
        32-byte values and may repeat across rounds (see `Negentropy`).

        Raises:
            PeerError: the peer lacks NIP-77 (NOTICE, NEG-ERR, silence, or a closed connection in
            answer to NEG-OPEN), refused it, sent a malformed message, or timed out.
        """
        sub_id = f"neg-{next(self._ids)}"
        queue: asyncio.Queue[RelayNegMsg | RelayNegErr | RelayMessageError] = asyncio.Queue()
        self._negs[sub_id] = queue
        first = neg.initiate()
        opened = False
        try:
            await self._send(encode_neg_open(sub_id, filter_obj, first))
            opened = True
            answered, retried, rounds = False, False, 0
            while True:
                answer = await self._first_answer(queue) if not answered else \
                    await self._wait(queue.get(), "NEG-MSG")
                answered = True
                if isinstance(answer, RelayMessageError):
                    raise PeerError(f"{self.url} sent a malformed {answer.verb}: {answer}")
                if isinstance(answer, RelayNegErr):
                    if answer.reason.startswith(AUTH_REQUIRED) and not retried:
                        retried, answered = True, False
                        await self._await_auth(answer.reason, "NEG-OPEN")
                        await self._send(encode_neg_open(sub_id, filter_obj, first))
                        continue
                    opened = False  # NIP-77: NEG-ERR closes the session
                    raise PeerError(f"{self.url} refused negentropy sync: NEG-ERR {answer.reason!r}")
                try:
                    next_msg, have, need = neg.reconcile_with_ids(answer.message)
                except NegentropyError as exc:
                    raise PeerError(f"{self.url} sent a malformed NEG-MSG: {exc}") from None
                rounds += 1
                on_round(have, need)
                if next_msg is None:
                    return rounds
                await self._send(encode_neg_msg(sub_id, next_msg))
        finally:
            self._negs.pop(sub_id, None)
            if opened and not self._failed.done():
                await self._send_quietly(encode_neg_close(sub_id))

    async def _first_answer(self, queue: asyncio.Queue) -> RelayNegMsg | RelayNegErr | RelayMessageError:
        try:
            return await self._wait(queue.get(), "NEG-OPEN")
        except PeerNotice as notice:
            raise PeerError(f"{self.url} does not support NIP-77 negentropy: it answered NEG-OPEN with "
                            f"NOTICE {notice.message!r}") from None
        except PeerError as exc:
            raise PeerError(f"{exc} (does the peer support NIP-77 negentropy?)") from None


class _Closed(Exception):
    """A fetch REQ answered with CLOSED; `message` is the peer's reason."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
