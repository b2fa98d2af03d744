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
* a method no route answers on a path some route serves or on an endpoint:
  405, whose `Allow` names the methods that path answers;
* a path that is not one of the relay's endpoints (`[server] paths`): 404
  (NIP-01: a relay accepts connections on a single endpoint when extra path
  segments do not change its behaviour);
* a GET of an endpoint with an `Upgrade` header and no body that websockets'
  own parser reads: `HANDOFF`, and the bytes received so far
  (`RequestReader.received`) go to websockets unchanged, which upgrades (or
  refuses a bad upgrade with its own 400);
* any other GET or HEAD of an endpoint: the relay's 426 (`UPGRADE_REQUIRED`),
  400 to an upgrade with a body or one websockets' parser refuses (a bare LF,
  a folded line).

Before any of these, a request is refused 400 when a header field value holds
a control character other than HTAB (RFC 9110 5.5), and 413 when its
Content-Length is past `max_body_bytes`, whatever its path.  Every request is
answered: websockets sends nothing at all to a request it cannot parse, so
none reaches it.  Every answer says `Connection: close`: the connection ends
after it, and a request sent behind the first one is not read.

Plain-text refusals begin with a machine-readable prefix, as the relay's
NIP-01 messages do: "invalid: " (400, 413, 414, 431), "not found: " (404),
"method not allowed: " (405), "upgrade required: " (426).

A route matches a method and a path (`route_path`: the request target
without its query string, the one accepted-paths check), and optionally a
media type the Accept header must name with a quality above 0 (`quality`:
case-insensitive, as media types are); of the routes that match, the one
whose media type has the highest quality answers, the first one on a tie.  A
HEAD is answered as a GET without the body (RFC 9110 9.3.2).
`Routes.response` gives every answer the same CORS headers.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
import re
from dataclasses import dataclass
from http import HTTPStatus
from urllib.parse import urlsplit

import h11
from websockets.datastructures import Headers
from websockets.http11 import MAX_LINE_LENGTH, MAX_NUM_HEADERS, Request, Response
from websockets.streams import StreamReader

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

    @property
    def query(self) -> str:
        """The target's query string, without its "?" ("" when none)."""
        return self.target.partition("?")[2].partition("#")[0]


@dataclass(frozen=True, slots=True)
class HttpResponse:
    """What a route answers: `status`, `body` and its media type; `cors`: its CORS header fields, when not
    those of the whole table (a preflight's name the methods of one path); `headers`: other fields (Allow)."""

    status: HTTPStatus
    body: bytes
    content_type: str
    cors: tuple[tuple[str, str], ...] | None = None
    headers: tuple[tuple[str, str], ...] = ()


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

    def quality(self, method: str, path: str, accept: str) -> float:
        """How well this route answers a `method` request for `path` with that Accept header: the quality
        the header gives its media type (1.0 for a route of any type), 0.0 when it does not answer it."""
        if method != self.method or not self.serves(path):
            return 0.0
        return 1.0 if self.accept is None else quality(accept, self.accept)

    def serves(self, path: str) -> bool:
        """Whether this route is for `path` (whatever the method)."""
        return self.path in (path, ANY_PATH) or (self.prefix and path.startswith(self.path))


_QVALUE = re.compile(r"0(\.[0-9]{0,3})?|1(\.0{0,3})?")  # RFC 9110 12.4.2


def quality(accept: str, media_type: str) -> float:
    """The quality (0.0 to 1.0) the Accept header value `accept` gives `media_type`: its `q` parameter,
    1.0 without one; 0.0 when `accept` does not name it (RFC 9110 12.5.1: media types are case-insensitive,
    `q=0` means "not acceptable").  Wildcards like `*/*` name no media type here: a browser's `*/*;q=0.8`
    is no request for NIP-11.  A `q` that is not a qvalue is ignored, as every other parameter is."""
    wanted, best = media_type.lower(), 0.0
    for item in accept.split(","):
        name, *params = item.split(";")
        if name.strip().lower() == wanted:
            q = next((value.strip() for key, _, value in (p.partition("=") for p in params)
                      if key.strip().lower() == "q"), "1")
            best = max(best, float(q) if _QVALUE.fullmatch(q) else 1.0)
    return best



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
        """The route that answers `request` (its body is not needed; a HEAD is a GET's): of those that
        match, the one of the highest quality (`Route.quality`), the first on a tie; None: no route does."""
        method = "GET" if request.method == "HEAD" else request.method
        path, accept = request.path, request.header("accept")
        best, found = 0.0, None
        for route in self._routes:
            if (q := route.quality(method, path, accept)) > best:
                best, found = q, route
        return found

    def allowed(self, path: str) -> list[str]:
        """The methods a request for `path` may use: those routed for it, GET for an endpoint (WebSocket),
        and HEAD wherever GET is."""
        methods = dict.fromkeys(route.method for route in self._routes if route.serves(path))
        if self.is_endpoint(path):
            methods["GET"] = None
        if "GET" in methods:
            methods["HEAD"] = None
        return list(methods)

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

    def response(self, answer: HttpResponse, head: bool = False) -> Response:
        """`answer` as websockets' `Response`, with its length, the CORS headers and `Connection: close`; to a
        HEAD request (`head`), without its body but with the length it has (RFC 9110 9.3.2)."""
        # Connection: close, as the connection ends after one answer: a keep-alive client opens a new one
        # rather than send its next request where nothing reads it (RFC 9112 9.6).
        headers = Headers([("Content-Type", answer.content_type), ("Content-Length", str(len(answer.body))),
                           *(answer.cors or self.cors_headers()), *answer.headers, ("Connection", "close")])
        return Response(answer.status.value, answer.status.phrase, headers, b"" if head else answer.body)


@dataclass(frozen=True, slots=True)
class Answer:
    """The request is `route`'s to answer."""

    route: Route
    request: HttpRequest


HANDOFF = object()
"""The request is websockets' (a bodiless GET of an endpoint with an `Upgrade` header, that no route
answers): give it `RequestReader.received`."""

Decision = Answer | HttpResponse | object
"""`Answer`, an `HttpResponse` refusing the request, or `HANDOFF`."""


def _plain(status: HTTPStatus, reason: str, headers: tuple[tuple[str, str], ...] = ()) -> HttpResponse:
    return HttpResponse(status, f"{reason}\n".encode(), "text/plain", headers=headers)


def _invalid(status: HTTPStatus, reason: str) -> HttpResponse:
    """A refusal of a malformed or oversized request: `status` (400, 413, 414 or 431), "invalid: `reason`"."""
    return _plain(status, f"invalid: {reason}")


_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")  # CTL but HTAB: not in an RFC 9110 field-value (5.5)


def _websockets_refuses(received: bytes) -> bool:
    """Whether websockets' own parser refuses the request whose header block `received` begins with (it
    would close the connection without a word): a bare LF, a folded line, ... that h11 reads."""
    stream = StreamReader()
    stream.feed_data(received)
    stream.feed_eof()
    try:
        for _ in Request.parse(stream.read_line):  # (never waits: EOF follows the bytes)
            pass
    except Exception:  # its refusals: ValueError, SecurityError, EOFError, NotImplementedError
        return True
    return False


UPGRADE_REQUIRED = _plain(HTTPStatus.UPGRADE_REQUIRED, "upgrade required: this is a WebSocket endpoint "
                          "(a Nostr relay); NIP-11 needs Accept: application/nostr+json",
                          (("Upgrade", "websocket"),))
"""The answer to a GET or HEAD of an endpoint that is no WebSocket upgrade (nor a route's)."""


class RequestReader:
    """Reads the one HTTP/1.1 request a connection begins with; `feed` its bytes until it decides.

    `received` keeps the bytes fed so far until the decision, so that a request handed to websockets is
    given to it exactly as sent; it is None once the request is a route's.  `head`: the request is a HEAD,
    whose answer goes without its body (`Routes.response`).
    """

    def __init__(self, routes: Routes, max_body_bytes: int) -> None:
        self._routes = routes
        self._max_body_bytes = max_body_bytes
        self._h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEADER_BYTES)
        self.received: bytearray | None = bytearray()
        self._answer: Answer | None = None
        self._body = bytearray()
        self.head = False

    @property
    def waits_for_continue(self) -> bool:
        """The client sent `Expect: 100-continue` and waits for "100 Continue" before its body (RFC 9110 10.1.1)."""
        return self._answer is not None and self._h11.they_are_waiting_for_100_continue

    def end(self) -> Decision:
        """The decision when the client ends its side first: websockets' while no route has the request
        (it ends it as it always did); a 400 when a route's body is cut short."""
        if self.received is not None:
            return HANDOFF
        return _invalid(HTTPStatus.BAD_REQUEST, "request body cut short")

    def feed(self, data: bytes) -> Decision | None:
        """Take the next bytes received; the decision once there is one (then feed no more), else None."""
        if self.received is not None:
            self.received += data
        self._h11.receive_data(data)
        try:
            return self._next()
        except h11.RemoteProtocolError as exc:  # (its message may quote the request: not echoed)
            status = HTTPStatus(exc.error_status_hint)
            return _invalid(status, status.phrase.lower())

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
            return _invalid(HTTPStatus.REQUEST_URI_TOO_LONG, f"request line too long (max {MAX_LINE_LENGTH} bytes)")
        if len(headers) > MAX_NUM_HEADERS or any(len(n) + len(v) + 2 > MAX_LINE_LENGTH for n, v in headers):
            return _invalid(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE,
                            f"header fields too large (max {MAX_NUM_HEADERS} fields of {MAX_LINE_LENGTH} bytes)")
        self.head = method == "HEAD"
        # h11 checks names (tokens) but lets control characters through in values; websockets does not.
        if (bad := next((name for name, value in headers if _CONTROL.search(value)), None)) is not None:
            return _invalid(HTTPStatus.BAD_REQUEST, f"control character in header field {bad:.40}")
        request = HttpRequest(method, route_path(target), target, headers)
        length = request.header("content-length")
        if length.isdigit() and int(length) > self._max_body_bytes:  # (h11 has checked its syntax)
            return self._too_large()
        route = self._routes.find(request)
        if route is None:
            return self._unrouted(request)
        self.received = None  # a route's: never handed to websockets
        self._answer = Answer(route, request)
        return None

    def _unrouted(self, request: HttpRequest) -> Decision:
        """A CORS preflight's answer; 405 to a method the path does not answer; 404 off the relay's
        endpoints and routes; websockets' request when it is a GET with an `Upgrade` and no body that its
        parser reads; else 426 to a GET or HEAD, 400 to an upgrade with a body or one websockets refuses."""
        if (preflight := self._routes.preflight(request)) is not None:
            return preflight
        allowed = self._routes.allowed(request.path)
        if not allowed:
            return _plain(HTTPStatus.NOT_FOUND, "not found: not this relay's endpoint")
        if request.method not in allowed:
            return _plain(HTTPStatus.METHOD_NOT_ALLOWED, f"method not allowed: {request.method:.20}",
                          (("Allow", ", ".join(allowed)),))
        if not self._routes.is_endpoint(request.path):  # a GET or HEAD no route's media type matched
            return _plain(HTTPStatus.NOT_FOUND, "not found: not this relay's endpoint")
        # (websockets takes Content-Length fields of 0 as no body, as some devices send them)
        has_body = any(name == "transfer-encoding" or (name == "content-length" and value != "0")
                       for name, value in request.headers)
        if request.method != "GET" or not request.header("upgrade"):
            return UPGRADE_REQUIRED  # a HEAD, or a GET that asks for no WebSocket, of an endpoint
        if has_body:
            return _invalid(HTTPStatus.BAD_REQUEST, "a WebSocket opening request has no body")
        if _websockets_refuses(bytes(self.received)):
            return _invalid(HTTPStatus.BAD_REQUEST, "malformed WebSocket opening request")
        return HANDOFF

    def _too_large(self) -> HttpResponse:
        return _invalid(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                        f"request body too large (max {self._max_body_bytes} bytes)")
