"""Each TCP connection's opening: its HTTP request meets the route table before websockets sees it.

websockets reads the opening request itself, and refuses one with a body
before its `process_request` hook runs.  Here its server connection is given
the request only when it is a WebSocket upgrade no route answers and its
parser reads, byte for byte as received (relay/wire/http.py decides).
A route's answer or a refusal is serialized by websockets (as its own
answers are, `Connection: close` included) and ends the same way: EOF after
the response, then the client's close awaited (at most websockets' close
timeout), all within its `open_timeout`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from http import HTTPStatus
from typing import Any

import structlog
from websockets.asyncio.server import ServerConnection
from websockets.exceptions import InvalidHeaderValue
from websockets.http11 import SERVER, Response
from websockets.protocol import State

from relay.wire.http import HANDOFF, Answer, Decision, HttpResponse, RequestReader, Routes

log = structlog.get_logger(__name__)

_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"  # RFC 9110 section 15.2.1
_WEBSOCKETS_REFUSAL = "Failed to open a WebSocket connection: "  # how websockets begins a refusal's body


class RoutedServerConnection(ServerConnection):
    """websockets' connection for one TCP connection, whose opening request goes to `routes` first.

    `max_body_bytes` bounds a routed request's body (`server.max_http_body_bytes`).  Made by
    `serve(create_connection=...)` with websockets' own arguments.
    """

    # Kept out of the instance dict, which websockets' own attributes fill: six more made it grow to the
    # next size, 1.5 kB on every connection.
    __slots__ = ("_routes", "_reader", "_decided", "_continued", "_client_ended", "_head")

    def __init__(self, *args: Any, routes: Routes, max_body_bytes: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._routes = routes
        self._reader: RequestReader | None = RequestReader(routes, max_body_bytes)
        self._decided: asyncio.Future[Decision] = self.loop.create_future()
        self._continued = False
        self._client_ended = False  # the client sent EOF before the answer to its request was written
        self._head = False  # the request is a HEAD: answered without a body

    def data_received(self, data: bytes) -> None:
        """Feed the request reader until it decides; then websockets, if the request is its own."""
        reader = self._reader
        if reader is None:
            if self._decided.result() is HANDOFF:
                super().data_received(data)
            return  # a route's request is read: what follows it is not
        decision = reader.feed(data)
        if decision is not None:
            self._decide(decision)
        elif reader.waits_for_continue and not self._continued:
            self._continued = True
            self.transport.write(_CONTINUE)

    def eof_received(self) -> bool | None:
        """A request cut short goes to websockets, which ends it as it always did (`RequestReader.end`);
        a route's answer not yet written still is (True keeps the transport open for it)."""
        if self._reader is not None:
            self._decide(self._reader.end())
        if self._decided.result() is HANDOFF or self.protocol.eof_sent:
            return super().eof_received()
        self._client_ended = True
        return True

    def _decide(self, decision: Decision) -> None:
        received, self._head, self._reader = self._reader.received, self._reader.head, None
        self._decided.set_result(decision)
        if decision is HANDOFF:
            super().data_received(bytes(received))

    async def handshake(self, process_request: Any = None, process_response: Any = None,
                        server_header: str | None = SERVER) -> None:
        """Answer a routed request, or perform websockets' opening handshake (see `ServerConnection`)."""
        await asyncio.wait([self._decided, self.connection_lost_waiter], return_when=asyncio.FIRST_COMPLETED)
        if not self._decided.done():
            return  # the connection ended before its request did
        decision = self._decided.result()
        if decision is HANDOFF:
            await super().handshake(process_request, process_response or self._refusal, server_header)
            return
        answer = await self._answer(decision) if type(decision) is Answer else decision  # or a refusal
        self.response = self._routes.response(answer, head=self._head)
        if server_header is not None:
            self.response.headers["Server"] = server_header
        if self.state is not State.CONNECTING:
            return  # the connection ended meanwhile
        self.protocol.send_response(self.response)  # the response, then EOF
        self.send_data()
        if self._client_ended:
            self.transport.close()  # once written: the client will not close a connection it has ended
        with contextlib.suppress(TimeoutError):  # then websockets' handler resets it
            async with asyncio.timeout(self.close_timeout):
                await asyncio.shield(self.connection_lost_waiter)

    def _refusal(self, connection: ServerConnection, request: Any, response: Response) -> Response | None:
        """websockets' `process_response` hook: a handshake websockets refuses is answered as the routes answer
        (its reason behind `invalid: `, the CORS headers); an unsupported `Sec-WebSocket-Version` is 426
        (`upgrade required: `) naming the one supported (RFC 6455 section 4.4), not 400.  None (keep it) for an
        accepted handshake."""
        if response.status_code == HTTPStatus.SWITCHING_PROTOCOLS:
            return None
        # its first line: websockets adds a second, for browsers, to a 426
        reason = response.body.decode("utf-8", "replace").removeprefix(_WEBSOCKETS_REFUSAL).strip().split("\n")[0]
        exc = self.protocol.handshake_exc
        if isinstance(exc, InvalidHeaderValue) and exc.name == "Sec-WebSocket-Version":
            refusal = HttpResponse(HTTPStatus.UPGRADE_REQUIRED, f"upgrade required: {reason} (13 is)\n".encode(),
                                   "text/plain", headers=(("Sec-WebSocket-Version", "13"),))
        else:  # the prefix of its status, as the routes' refusals have (relay/wire/http.py)
            prefix = "upgrade required" if response.status_code == HTTPStatus.UPGRADE_REQUIRED else "invalid"
            refusal = HttpResponse(HTTPStatus(response.status_code), f"{prefix}: {reason}\n".encode(), "text/plain")
        answer = self._routes.response(refusal)
        if "Server" in response.headers:
            answer.headers["Server"] = response.headers["Server"]
        return answer

    async def _answer(self, decision: Answer) -> HttpResponse:
        try:
            peer = self.remote_address[0] if self.remote_address else ""  # the client's IP, for rate limits
            return await decision.route.handler(dataclasses.replace(decision.request, peer=peer))
        except Exception as exc:  # the one broad catch of an HTTP request: a bug answers 500
            log.error("http_request_failed", path=decision.request.path, error=repr(exc), exc_info=exc)
            return HttpResponse(HTTPStatus.INTERNAL_SERVER_ERROR, b"internal error\n", "text/plain")
