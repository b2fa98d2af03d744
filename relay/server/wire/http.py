"""HTTP/1.1 on the relay's port: one request reader, one route table, one CORS policy (no I/O here).

How this works: every TCP connection to the relay begins with an HTTP
request.  `RequestReader` parses it with h11 as its bytes arrive and decides
once, as soon as it can:

* the route table has a route for it: its body is read (at most
  `max_body_bytes`, else 413) and `Answer(route, request)` says who answers;
* it is not an HTTP/1.1 request h11 can read (two Host fields, a header block
  past `MAX_HEADER_BYTES`, ...): the `HttpResponse` refusing it, 400 or 431
  (RFC 9112), to send as it is;
* a CORS preflight (`OPTIONS` with `Access-Control-Request-Method`) for a
  path some route answers: 204 with the CORS headers, naming the methods
  routed for that path (`Routes.preflight`);
* a path that is not one of the relay's endpoints (`[server] paths`): 404
  (NIP-01: a relay accepts connections on a single endpoint when extra path
  segments do not change its behaviour);
* anything else, a WebSocket upgrade above all: `HANDOFF`, and the bytes
  received so far (`RequestReader.received`) go to websockets unchanged, which
  upgrades, or answers as it does (426 to a plain GET, 405 to another method).

A route matches a method and a path (`route_path`: the request target
without its query string, the one accepted-paths check), and optionally a
media type the Accept header must name (`accepts`: case-insensitive, as media
types are); the first route that matches answers.  `Routes.response` gives
every answer the same CORS headers.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from http import HTTPStatus
from urllib.parse import urlsplit

import h11
from websockets.datastructures import Headers
from websockets.http11 import MAX_LINE_LENGTH, MAX_NUM_HEADERS, Response

MAX_HEADER_BYTES = 65_536
"""Bytes of an unfinished request line and header fields held at most: past them, 431."""
ANY_PATH = "*"
"""A route path that matches every path."""
ALLOWED_HEADERS = "Authorization, Content-Type, *"
"""CORS request headers allowed: any (`*`), and Authorization (NIP-98), which the wildcard does not cover (Fetch)."""
PREFLIGHT_MAX_AGE = "86400"
"""Seconds a browser may keep a preflight's answer."""


@dataclass(frozen=True, slots=True)
class HttpRequest:
    """One plain HTTP request: `path` is the target without its query string; `headers` hold lowercase
    names in the order received; `body` is empty without one; `peer` is the socket's peer address ("" unknown)."""

    method: str
    path: str
    target: str
    headers: tuple[tuple[str, str], ...]
    body: bytes = b""
    peer: str = ""

    def header(self, name: str) -> str:
        """The values of the header fields called `name` (lowercase), joined with ", " ("" when absent)."""
        return ", ".join(value for key, value in self.headers if key == name)


@dataclass(frozen=True, slots=True)
class HttpResponse:
    """What a route answers: `status`, `body` and its media type; `cors`: its CORS header fields, when not
    those of the whole table (a preflight's name the methods of one path)."""

    status: HTTPStatus
    body: bytes
    content_type: str
    cors: tuple[tuple[str, str], ...] | None = None


Handler = Callable[[HttpRequest], Awaitable[HttpResponse]]
"""A route's handler: `await handler(request)` -> its response."""


@dataclass(frozen=True, slots=True)
class Route:
    """`method` requests for `path` (ANY_PATH: every path; with `prefix`, every path that starts with it)
    whose Accept header names `accept` (None: any)."""

    method: str
    path: str
    handler: Handler
    accept: str | None = None
    prefix: bool = False

    def matches(self, method: str, path: str, accept: str) -> bool:
        """Whether this route answers a `method` request for `path` with that Accept header."""
        return method == self.method and self.serves(path) and (self.accept is None or accepts(accept, self.accept))

    def serves(self, path: str) -> bool:
        """Whether this route is for `path` (whatever the method)."""
        return self.path in (path, ANY_PATH) or (self.prefix and path.startswith(self.path))


def accepts(accept: str, media_type: str) -> bool:
    """Whether the Accept header value `accept` names `media_type` (RFC 9110 12.5.1: media types are
    case-insensitive; parameters such as `;q=0.9` are ignored, and so are wildcards like `*/*`)."""
    wanted = media_type.lower()
    return any(item.partition(";")[0].strip().lower() == wanted for item in accept.split(","))


def route_path(target: str) -> str:
    """The path a request target is routed by: without its query string ("/metrics?x=1" is /metrics).

    An origin-form target is cut at "?" (urlsplit would read "//x" as a host); an absolute-form one
    ("http://host/path", RFC 9112 3.2.2) is split as a URL, its empty path being "/".
    """
    if target.startswith("/"):
        return target.partition("?")[0]
    return urlsplit(target).path or "/"


class Routes:
    """The relay's HTTP route table, tried in order; `add` one route per line.

    `endpoints` are the paths a WebSocket may connect to (`[server] paths`); None: any path.
    """

    def __init__(self, endpoints: tuple[str, ...] | None = None) -> None:
        self._routes: list[Route] = []
        self._endpoints = None if endpoints is None else frozenset(endpoints)

    def add(self, method: str, path: str, handler: Handler, accept: str | None = None, prefix: bool = False) -> None:
        """Answer `method` requests for `path` with `handler` (see `Route`); earlier routes take precedence."""
        self._routes.append(Route(method, path, handler, accept, prefix))

    def find(self, request: HttpRequest) -> Route | None:
        """The first route that answers `request` (its body is not needed); None: no route does."""
        method, path, accept = request.method, request.path, request.header("accept")
        return next((route for route in self._routes if route.matches(method, path, accept)), None)

    def is_endpoint(self, path: str) -> bool:
        """Whether a WebSocket may connect on `path` (NIP-01: one endpoint, `[server] paths`)."""
        return self._endpoints is None or path in self._endpoints

    def preflight(self, request: HttpRequest) -> HttpResponse | None:
        """The answer to a CORS preflight (`OPTIONS` with `Access-Control-Request-Method`) for a path some
        route serves: 204, whose CORS headers name that path's methods; else None."""
        if request.method != "OPTIONS" or not request.header("access-control-request-method"):
            return None
        if not any(route.serves(request.path) for route in self._routes):
            return None
        return HttpResponse(HTTPStatus.NO_CONTENT, b"", "text/plain",
                            (*self.cors_headers(request.path), ("Access-Control-Max-Age", PREFLIGHT_MAX_AGE)))

    def cors_headers(self, path: str | None = None) -> list[tuple[str, str]]:
        """The CORS headers of every answer: any origin, any header (`ALLOWED_HEADERS`), the methods the
        table routes (for `path` only, when given)."""
        methods = ", ".join(dict.fromkeys(route.method for route in self._routes
                                          if path is None or route.serves(path)))
        return [("Access-Control-Allow-Origin", "*"), ("Access-Control-Allow-Headers", ALLOWED_HEADERS),
                ("Access-Control-Allow-Methods", methods)]

    def response(self, answer: HttpResponse) -> Response:
        """`answer` as websockets' `Response`, with its length and the CORS headers."""
        headers = Headers([("Content-Type", answer.content_type), ("Content-Length", str(len(answer.body))),
                           *(answer.cors or self.cors_headers())])
        return Response(answer.status.value, answer.status.phrase, headers, answer.body)


@dataclass(frozen=True, slots=True)
class Answer:
    """The request is `route`'s to answer."""

    route: Route
    request: HttpRequest


HANDOFF = object()
"""The request is websockets' (an upgrade, or no route): give it `RequestReader.received`."""

Decision = Answer | HttpResponse | object
"""`Answer`, an `HttpResponse` refusing the request, or `HANDOFF`."""


def _plain(status: HTTPStatus, reason: str) -> HttpResponse:
    return HttpResponse(status, f"{reason}\n".encode(), "text/plain")


class RequestReader:
    """Reads the one HTTP/1.1 request a connection begins with; `feed` its bytes until it decides.

    `received` keeps the bytes fed so far until the decision, so that a request handed to websockets is
    given to it exactly as sent; it is None once the request is a route's.
    """

    def __init__(self, routes: Routes, max_body_bytes: int) -> None:
        self._routes = routes
        self._max_body_bytes = max_body_bytes
        self._h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEADER_BYTES)
        self.received: bytearray | None = bytearray()
        self._answer: Answer | None = None
        self._body = bytearray()

    @property
    def waits_for_continue(self) -> bool:
        """The client sent `Expect: 100-continue` and waits for "100 Continue" before its body (RFC 9110 10.1.1)."""
        return self._answer is not None and self._h11.they_are_waiting_for_100_continue

    def end(self) -> Decision:
        """The decision when the client ends its side first: websockets' while no route has the request
        (it ends it as it always did); a 400 when a route's body is cut short."""
        if self.received is not None:
            return HANDOFF
        return _plain(HTTPStatus.BAD_REQUEST, "request body cut short")

    def feed(self, data: bytes) -> Decision | None:
        """Take the next bytes received; the decision once there is one (then feed no more), else None."""
        if self.received is not None:
            self.received += data
        self._h11.receive_data(data)
        try:
            return self._next()
        except h11.RemoteProtocolError as exc:  # (its message may quote the request: not echoed)
            status = HTTPStatus(exc.error_status_hint)
            return _plain(status, status.phrase)

    def _next(self) -> Decision | None:
        while (event := self._h11.next_event()) not in (h11.NEED_DATA, h11.PAUSED):
            if type(event) is h11.Request:
                decision = self._route(event)
                if decision is not None:
                    return decision
            elif type(event) is h11.Data:
                self._body += event.data
                if len(self._body) > self._max_body_bytes:
                    return self._too_large()
            elif type(event) is h11.EndOfMessage:
                answer, request = self._answer, self._answer.request
                return Answer(answer.route, HttpRequest(request.method, request.path, request.target,
                                                        request.headers, bytes(self._body)))
        return None

    def _route(self, event: h11.Request) -> Decision | None:
        headers = tuple((name.decode("latin-1"), value.decode("latin-1")) for name, value in event.headers)
        method, target = event.method.decode("ascii"), event.target.decode("ascii")
        # websockets' own bounds, as for a request handed to it: h11's only bound is the whole header block.
        if len(method) + len(target) + len(" HTTP/1.1") > MAX_LINE_LENGTH:
            return _plain(HTTPStatus.REQUEST_URI_TOO_LONG, HTTPStatus.REQUEST_URI_TOO_LONG.phrase)
        if len(headers) > MAX_NUM_HEADERS or any(len(n) + len(v) + 2 > MAX_LINE_LENGTH for n, v in headers):
            status = HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE
            return _plain(status, status.phrase)
        request = HttpRequest(method, route_path(target), target, headers)
        route = self._routes.find(request)
        if route is None:
            return self._unrouted(request)
        self.received = None  # a route's: never handed to websockets
        self._answer = Answer(route, request)
        length = request.header("content-length")
        if length.isdigit() and int(length) > self._max_body_bytes:  # (h11 has checked its syntax)
            return self._too_large()
        return None

    def _unrouted(self, request: HttpRequest) -> Decision:
        """A CORS preflight's answer; 404 off the relay's endpoints; else websockets' request."""
        if (preflight := self._routes.preflight(request)) is not None:
            return preflight
        if not self._routes.is_endpoint(request.path):
            return _plain(HTTPStatus.NOT_FOUND, "not found: not this relay's endpoint")
        return HANDOFF

    def _too_large(self) -> HttpResponse:
        return _plain(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                      f"request body too large (max {self._max_body_bytes} bytes)")
