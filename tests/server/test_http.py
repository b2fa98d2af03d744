"""HTTP/1.1 on the relay's port: the request reader and route table alone, then through a real relay
(relay/wire/http.py, relay/wire/handshake.py)."""

from __future__ import annotations

import asyncio
import http.client
import json
import urllib.error
import urllib.request
from http import HTTPStatus

import pytest

from relay.wire.http import (ANY_PATH, HANDOFF, UPGRADE_REQUIRED, Answer, HttpRequest, HttpResponse,
                                    RequestReader, Routes)
from tests.helpers import Client, eventually
from tests.served import healthy

UPGRADE = (b"GET /any?x HTTP/1.1\r\nHost: relay\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
           b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")


async def _echo(request: HttpRequest) -> HttpResponse:
    """A test route: answers the JSON body it was given, wrapped."""
    return HttpResponse(HTTPStatus.OK, json.dumps({"got": json.loads(request.body)}).encode(), "application/json")


async def _ok(request: HttpRequest) -> HttpResponse:
    return HttpResponse(HTTPStatus.OK, b"ok\n", "text/plain")


def _routes() -> Routes:
    routes = Routes()
    routes.add("GET", "/health", _ok)
    routes.add("POST", "/echo", _echo)  # what a later route with a JSON body (NIP-86) looks like
    routes.add("GET", ANY_PATH, _ok, accept="application/nostr+json")
    return routes


def _feed(data: bytes, max_body_bytes: int = 100, pieces: int = 1):
    """The reader's decision on `data` fed in `pieces` parts (None: still undecided)."""
    reader = RequestReader(_routes(), max_body_bytes)
    step = -(-len(data) // pieces)
    decision = None
    for start in range(0, len(data), step):
        decision = reader.feed(data[start:start + step])
        if decision is not None:
            break
    return reader, decision


@pytest.mark.parametrize("pieces", [1, 7])
def test_a_routed_request_with_a_body_is_read_whole(pieces):
    """A POST with a JSON body, however it arrives, is the route's, with its body, path and headers."""
    body = b'{"method":"supportedmethods","params":[]}'
    _, decision = _feed(b"POST /echo?v=1 HTTP/1.1\r\nHost: relay\r\nContent-Type: application/json\r\n"
                        b"Content-Length: %d\r\n\r\n%s" % (len(body), body), pieces=pieces)
    assert type(decision) is Answer and decision.route.path == "/echo"
    request = decision.request
    assert (request.method, request.path, request.target, request.body) == ("POST", "/echo", "/echo?v=1", body)
    assert request.header("content-type") == "application/json"


def test_a_chunked_body_is_read_too():
    """Transfer-Encoding: chunked (which websockets refuses outright) is read by h11."""
    _, decision = _feed(b"POST /echo HTTP/1.1\r\nHost: relay\r\nTransfer-Encoding: chunked\r\n\r\n"
                        b"3\r\n[1,\r\n2\r\n2]\r\n0\r\n\r\n")
    assert type(decision) is Answer and decision.request.body == b"[1,2]"


@pytest.mark.parametrize("framing", [b"Content-Length: 101\r\n\r\n", b"Transfer-Encoding: chunked\r\n\r\n65\r\n"])
def test_a_body_past_the_bound_is_refused_413(framing):
    """A body over `max_body_bytes` (100 here) gets 413, whether its length is announced or found out."""
    _, decision = _feed(b"POST /echo HTTP/1.1\r\nHost: relay\r\n" + framing + b"x" * 101)
    assert type(decision) is HttpResponse and decision.status == HTTPStatus.REQUEST_ENTITY_TOO_LARGE


def test_upgrades_no_route_answers_go_to_websockets_as_received():
    """An upgrade: handed off, with every byte received so far (even a frame sent behind the upgrade request),
    for websockets to parse unchanged; so is one with `Content-Length: 0`."""
    reader, decision = _feed(UPGRADE + b"\x81\x00")
    assert decision is HANDOFF and bytes(reader.received) == UPGRADE + b"\x81\x00"
    assert _feed(UPGRADE.replace(b"\r\n\r\n", b"\r\nContent-Length: 0\r\n\r\n"))[1] is HANDOFF


@pytest.mark.parametrize("request_bytes, status, body", [
    (b"GET /x HTTP/1.1\r\nHost: relay\r\nX-A: \x01\r\n\r\n", 400,
     b"invalid: control character in header field x-a\n"),
    (b"GET / HTTP/1.1\r\nHost: relay\r\nAccept: text/html\x7f\r\n\r\n", 400,
     b"invalid: control character in header field accept\n"),
    (b"GET /health HTTP/1.1\r\nHost: relay\r\nX-A: a\x1bb\r\n\r\n", 400,
     b"invalid: control character in header field x-a\n"),
    (UPGRADE.replace(b"\r\n", b"\n"), 400, b"invalid: malformed WebSocket opening request\n"),
    (UPGRADE.replace(b"Upgrade\r\n", b"Upgrade\r\n\tx\r\n"), 400, b"invalid: malformed WebSocket opening request\n"),
    (b"GET / HTTP/1.1\r\nHost: relay\r\nX-A: a\tb\r\n\r\n", 426, None),
], ids=["ctl", "del", "esc-routed", "bare-lf", "folded", "htab"])
def test_requests_websockets_parser_refuses_are_answered_400_here(request_bytes, status, body):
    """A header value with a control character but HTAB (RFC 9110 5.5), on any path; an upgrade with bare LF
    line ends or a folded line: 400 "invalid: ...".  websockets closed the connection on these without a word
    (curl: "Empty reply from server"), and /health answered 200."""
    _, decision = _feed(request_bytes)
    assert type(decision) is HttpResponse and decision.status == status
    assert body is None or decision.body == body


@pytest.mark.parametrize("request_bytes", [
    b"GET / HTTP/1.1\r\nHost: relay\r\n\r\n",
    b"GET /nope?x HTTP/1.1\r\nHost: relay\r\nContent-Length: 0\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: relay\r\nConnection: Upgrade\r\n\r\n",
    b"HEAD / HTTP/1.1\r\nHost: relay\r\n\r\n",
], ids=["get", "get-length-0", "no-upgrade-header", "head"])
def test_a_get_or_head_of_an_endpoint_without_upgrade_gets_the_relays_426(request_bytes):
    """The relay's own 426 (its text, `Upgrade: websocket`), not websockets' ("Failed to open a WebSocket
    connection: invalid Connection header", without CORS), for GET as for HEAD."""
    _, decision = _feed(request_bytes)
    assert decision is UPGRADE_REQUIRED and ("Upgrade", "websocket") in decision.headers
    assert decision.body.startswith(b"upgrade required: ")


@pytest.mark.parametrize("request_bytes", [
    b"GET / HTTP/1.1\r\nHost: relay\r\nContent-Length: 101\r\n\r\n",
    b"GET /nope HTTP/1.1\r\nHost: relay\r\nContent-Length: 2000000\r\n\r\n",
    UPGRADE.replace(b"\r\n\r\n", b"\r\nContent-Length: 101\r\n\r\n"),
    b"PUT / HTTP/1.1\r\nHost: relay\r\nContent-Length: 101\r\n\r\n",
], ids=["get", "get-other-path", "upgrade", "put"])
def test_a_body_past_the_bound_is_refused_413_on_every_path(request_bytes):
    """A Content-Length past `max_body_bytes` gets 413 whatever the request (a GET of / got 426)."""
    _, decision = _feed(request_bytes)
    assert type(decision) is HttpResponse and decision.status == HTTPStatus.REQUEST_ENTITY_TOO_LARGE
    assert decision.body == b"invalid: request body too large (max 100 bytes)\n"


@pytest.mark.parametrize("request_bytes, status, allow", [
    (b"POST /health HTTP/1.1\r\nHost: relay\r\nContent-Length: 2\r\n\r\n{}", 405, "GET, HEAD"),
    (b"PUT / HTTP/1.1\r\nHost: relay\r\nContent-Length: 7\r\n\r\n{\"a\":1}", 405, "GET, HEAD"),
    (b"DELETE /x HTTP/1.1\r\nHost: relay\r\n\r\n", 405, "GET, HEAD"),
    (b"PATCH /echo HTTP/1.1\r\nHost: relay\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nx\r\n0\r\n\r\n", 405,
     "POST, GET, HEAD"),
    (b"GET / HTTP/1.1\r\nHost: relay\r\nContent-Length: 2\r\n\r\n{}", 426, None),
    (UPGRADE.replace(b"\r\n\r\n", b"\r\nContent-Length: 2\r\n\r\n{}"), 400, None),
    (b"HEAD / HTTP/1.1\r\nHost: relay\r\n\r\n", 426, None),
], ids=["post-get-route", "put-body", "delete", "patch-chunked", "get-body", "upgrade-body", "head"])
def test_requests_websockets_would_not_answer_are_answered_here(request_bytes, status, allow):
    """A method a path does not answer: 405 naming those it does; a GET with a body, or a HEAD, of an endpoint:
    426 (400 to an upgrade with a body).  websockets sent nothing at all to any of these (a walkthrough's curl
    read "Empty reply from server")."""
    _, decision = _feed(request_bytes)
    assert type(decision) is HttpResponse and decision.status == status
    assert dict(decision.headers).get("Allow") == allow


def test_a_head_is_answered_by_the_get_route_without_a_body():
    """HEAD /health is /health's GET route's (it got 404); its answer keeps the body's length, not the body."""
    _, decision = _feed(b"HEAD /health HTTP/1.1\r\nHost: relay\r\n\r\n")
    assert type(decision) is Answer and decision.route.path == "/health"
    response = _routes().response(HttpResponse(HTTPStatus.OK, b"ok\n", "text/plain"), head=True)
    assert response.body == b"" and response.headers["Content-Length"] == "3"


def test_routes_match_the_path_without_its_query_and_the_accept_header():
    """/health?probe is /health; a NIP-11 style route answers any path whose Accept names its media type."""
    assert _feed(b"GET /health?probe HTTP/1.1\r\nHost: relay\r\n\r\n")[1].route.path == "/health"
    decision = _feed(b"GET /x HTTP/1.1\r\nHost: relay\r\nAccept: text/html, application/nostr+json\r\n\r\n")[1]
    assert decision.route.path == ANY_PATH
    assert _feed(b"GET /x HTTP/1.1\r\nHost: relay\r\nAccept: text/html\r\n\r\n")[1] is UPGRADE_REQUIRED


@pytest.mark.parametrize("request_bytes, status", [
    (b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", HTTPStatus.BAD_REQUEST),  # RFC 9112 section 3.2
    (b"\x16\x03\x01\x02\x00 not HTTP\r\n\r\n", HTTPStatus.BAD_REQUEST),
    (b"GET / HTTP/1.1\r\nHost: a\r\nX: " + b"y" * 100_000 + b"\r\n\r\n", HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE),
], ids=["two-hosts", "not-http", "huge-headers"])
def test_a_request_that_is_not_http_1_1_is_refused_without_quoting_it(request_bytes, status):
    """What h11 cannot read is answered with its status and "invalid: " the status phrase, never the bytes
    sent; a header block arriving in pieces is refused once more than `MAX_HEADER_BYTES` of it wait."""
    _, decision = _feed(request_bytes, pieces=10)
    assert type(decision) is HttpResponse and decision.status == status
    assert decision.body == f"invalid: {status.phrase.lower()}\n".encode()


@pytest.mark.parametrize("request_bytes, status", [
    (b"GET /health?" + b"q" * 70_000 + b" HTTP/1.1\r\nHost: a\r\n\r\n", HTTPStatus.REQUEST_URI_TOO_LONG),
    (b"GET /health HTTP/1.1\r\nHost: a\r\nX: " + b"y" * 9_000 + b"\r\n\r\n",
     HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE),
    (b"GET /health HTTP/1.1\r\nHost: a\r\n" + b"X: y\r\n" * 2_000 + b"\r\n", HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE),
], ids=["long-line", "long-header", "many-headers"])
def test_a_routed_request_is_held_to_the_bounds_websockets_applies_to_the_rest(request_bytes, status):
    """A request line or header line over websockets' MAX_LINE_LENGTH, or more than MAX_NUM_HEADERS fields: 414
    or 431 on a routed path too, as before the reader (a walkthrough saw 200 for 70 kB lines and 2,000 headers)."""
    _, decision = _feed(request_bytes)
    assert type(decision) is HttpResponse and decision.status == status
    assert decision.body.startswith(b"invalid: ")


def test_a_request_cut_short_goes_to_websockets_unless_it_is_a_routes():
    """EOF before the request is read: websockets ends it as it always did; within a route's body: 400."""
    reader, _ = _feed(b"GET /health HTTP/1.1\r\nHo")
    assert reader.end() is HANDOFF
    reader, _ = _feed(b"POST /echo HTTP/1.1\r\nHost: relay\r\nContent-Length: 10\r\n\r\n{}")
    assert reader.end().body == b"invalid: request body cut short\n"


def test_every_answer_carries_the_cors_headers_of_the_table():
    """One CORS policy: any origin and header (Authorization named: `*` does not cover it), and every method
    the table routes (GET, POST here); and `Connection: close`, as the connection ends after one answer."""
    response = _routes().response(HttpResponse(HTTPStatus.OK, b"{}", "application/json"))
    assert response.status_code == 200 and response.body == b"{}"
    assert list(response.headers.raw_items()) == [
        ("Content-Type", "application/json"), ("Content-Length", "2"), ("Access-Control-Allow-Origin", "*"),
        ("Access-Control-Allow-Headers", "Authorization, Content-Type, *"),
        ("Access-Control-Allow-Methods", "GET, POST"), ("Connection", "close")]


# --- through a real relay ---------------------------------------------------------------------------------


def _post(port: int, path: str, body: bytes) -> tuple[int, str, bytes]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.headers["Access-Control-Allow-Methods"], response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Access-Control-Allow-Methods"], exc.read()


@pytest.mark.single_process  # adds a route to the running server's Routes
async def test_a_route_added_to_a_running_relay_takes_a_json_body(relay):
    """One line adds a POST route; a JSON body reaches it (websockets alone refused any body), CORS names
    the new method, a body past `server.max_http_body_bytes` gets 413, and WebSocket clients are served."""
    relay.routes.add("POST", "/echo", _echo)
    status, methods, body = await asyncio.to_thread(_post, relay.port, "/echo", b'{"a":[1,2]}')
    assert (status, methods, json.loads(body)) == (200, "GET, POST", {"got": {"a": [1, 2]}})
    limit = relay.config.server.max_http_body_bytes
    status, _, body = await asyncio.to_thread(_post, relay.port, "/echo", b"[" + b"0," * limit + b"0]")
    assert status == 413 and body == f"invalid: request body too large (max {limit} bytes)\n".encode()
    client = await Client.connect(relay.url)
    assert await client.req("after", {"limit": 1}) == []
    await client.close()


@pytest.mark.single_process  # adds a route to the running server's Routes
async def test_a_client_waiting_for_100_continue_gets_it_before_sending_its_body(relay):
    """`Expect: 100-continue` (curl's way with bodies over 1 kB): 100 Continue, then the route's answer."""
    relay.routes.add("POST", "/echo", _echo)
    reader, writer = await asyncio.open_connection("127.0.0.1", relay.port)
    writer.write(b"POST /echo HTTP/1.1\r\nHost: relay\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n")
    assert await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5) == b"HTTP/1.1 100 Continue\r\n\r\n"
    writer.write(b"[]")
    answer = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n") and answer.endswith(b'{"got": []}')


@pytest.mark.single_process  # reads the server's handler tasks
async def test_an_answered_request_leaves_no_handler_behind(relay):
    """Once a client has read its answer and closed, its connection is gone at once (a handler waiting on it
    would hold shutdown for the close timeout), also when it ended its side before the answer."""
    for half_close in (False, True):
        reader, writer = await asyncio.open_connection("127.0.0.1", relay.port)
        writer.write(b"GET /health HTTP/1.1\r\nHost: relay\r\n\r\n")
        if half_close:
            writer.write_eof()
        assert (await asyncio.wait_for(reader.read(), 5)).endswith(b"\r\n\r\nok\n")
        writer.close()
        assert await eventually(lambda: not relay.server.handler_tasks, timeout=2)


async def _raw(port: int, request: bytes) -> bytes:
    """Everything a relay sends back to `request` on a fresh connection, until it closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    try:
        return await asyncio.wait_for(reader.read(), 5)
    finally:
        writer.close()


@pytest.mark.parametrize("request_bytes, status_line", [
    (b"PUT / HTTP/1.1\r\nHost: relay\r\nContent-Type: application/json\r\nContent-Length: 7\r\n\r\n{\"a\":1}",
     b"HTTP/1.1 405 Method Not Allowed\r\n"),
    (b"PATCH / HTTP/1.1\r\nHost: relay\r\nContent-Length: 7\r\n\r\n{\"a\":1}", b"HTTP/1.1 405 Method Not Allowed\r\n"),
    (b"DELETE / HTTP/1.1\r\nHost: relay\r\nContent-Length: 7\r\n\r\n{\"a\":1}", b"HTTP/1.1 405 Method Not Allowed\r\n"),
    (b"POST / HTTP/1.1\r\nHost: relay\r\nContent-Type: application/nostr+json+rpc\r\nContent-Length: 2\r\n\r\n{}",
     b"HTTP/1.1 405 Method Not Allowed\r\n"),  # NIP-86 on a relay without [admin] pubkeys
    (b"GET / HTTP/1.1\r\nHost: relay\r\nContent-Length: 7\r\n\r\n{\"a\":1}", b"HTTP/1.1 426 Upgrade Required\r\n"),
    (b"PUT /nope HTTP/1.1\r\nHost: relay\r\nContent-Length: 7\r\n\r\n{\"a\":1}", b"HTTP/1.1 404 Not Found\r\n"),
    (b"HEAD / HTTP/1.1\r\nHost: relay\r\n\r\n", b"HTTP/1.1 426 Upgrade Required\r\n"),
], ids=["put", "patch", "delete", "nip86-off", "get-body", "put-elsewhere", "head"])
async def test_every_request_with_or_without_a_body_gets_an_answer(relay, request_bytes, status_line):
    """Over a raw socket: each request is answered with a status (websockets closed the connection without a
    word on a body or another method than GET); a 405 names the methods of the path in `Allow`."""
    answer = await _raw(relay.port, request_bytes)
    assert answer.startswith(status_line)
    head, _, body = answer.partition(b"\r\n\r\n")
    if b" 405 " in status_line:
        assert b"\r\nAllow: GET, HEAD\r\n" in head
    assert body == b"" if request_bytes.startswith(b"HEAD") else body.endswith(b"\n")


_UPGRADE_HEAD = b"GET / HTTP/1.1\r\nHost: relay\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"


@pytest.mark.parametrize("fields, status_line, reason", [
    (b"Sec-WebSocket-Version: 13\r\n", b"HTTP/1.1 400 Bad Request\r\n", b"missing Sec-WebSocket-Key header"),
    (b"Sec-WebSocket-Key: bad\r\nSec-WebSocket-Version: 13\r\n", b"HTTP/1.1 400 Bad Request\r\n",
     b"invalid Sec-WebSocket-Key header: bad"),
    (b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 8\r\n",
     b"HTTP/1.1 426 Upgrade Required\r\n", b"invalid Sec-WebSocket-Version header: 8"),
], ids=["no-key", "bad-key", "version-8"])
async def test_a_refused_handshake_is_answered_as_the_routes_answer(relay, fields, status_line, reason):
    """A WebSocket upgrade websockets refuses: its reason behind `invalid: `, the CORS headers of every answer;
    an unsupported version is 426 (`upgrade required: `) naming version 13 (RFC 6455 section 4.4; it was a bare
    400 without CORS)."""
    answer = await _raw(relay.port, _UPGRADE_HEAD + fields + b"\r\n")
    assert answer.startswith(status_line), answer
    head, _, body = answer.partition(b"\r\n\r\n")
    prefix = b"upgrade required: " if b" 426 " in status_line else b"invalid: "
    assert body.startswith(prefix + reason) and body.endswith(b"\n"), body
    assert b"\r\nAccess-Control-Allow-Origin: *\r\n" in head
    assert (b"\r\nSec-WebSocket-Version: 13\r\n" in head) == (b" 426 " in status_line)


@pytest.mark.parametrize("fields, reason", [
    (b"Upgrade: foo\r\nConnection: Upgrade\r\n", b"upgrade required: invalid Upgrade header: foo"),
    (b"Upgrade: websocket\r\n", b"upgrade required: missing Connection header"),
], ids=["upgrade-foo", "no-connection"])
async def test_a_426_from_websockets_says_upgrade_required_in_one_line(relay, fields, reason):
    """websockets answers these 426 itself: the prefix of a 426 (`upgrade required: `, as docs/operating.md lists), one
    line (its second, for browsers, dropped); they said `invalid: ` over two lines."""
    answer = await _raw(relay.port, b"GET / HTTP/1.1\r\nHost: relay\r\n" + fields
                        + b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 426 Upgrade Required\r\n"), answer
    body = answer.partition(b"\r\n\r\n")[2]
    assert body.startswith(reason) and body.count(b"\n") == 1, body


def _http(port: int, method: str, path: str, body: bytes | None = None, headers: dict | None = None):
    """(status, headers, body) of one request through http.client, which reads no body after a HEAD."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        connection.request(method, path, body, headers or {})
        response = connection.getresponse()
        return response.status, response.headers, response.read()
    finally:
        connection.close()


async def test_a_real_client_reads_an_answer_to_any_method_and_head_like_get(relay):
    """http.client: PUT, PATCH, DELETE with a body get 405 with `Allow`; HEAD of /health, /metrics, NIP-11 and
    the status page answer as their GET does (status, type, length), without the body (HEAD /health got 404)."""
    for method in ("PUT", "PATCH", "DELETE"):
        status, headers, _ = await asyncio.to_thread(_http, relay.port, method, "/", b'{"a":1}')
        assert (status, headers["Allow"]) == (405, "GET, HEAD")
    for path, accept in (("/health", None), ("/metrics", None), ("/", "application/nostr+json"),
                         ("/", "text/html")):
        headers = {"Accept": accept} if accept else {}
        got = await asyncio.to_thread(_http, relay.port, "GET", path, None, headers)
        head = await asyncio.to_thread(_http, relay.port, "HEAD", path, None, headers)
        assert got[0] == head[0] == 200 and head[2] == b""
        assert head[1]["Content-Type"] == got[1]["Content-Type"] and int(head[1]["Content-Length"]) > 0
    got = await asyncio.to_thread(_http, relay.port, "GET", "/health")
    assert healthy(got[2])  # every worker's body has one length: the HEAD of any of them tells it
    assert (await asyncio.to_thread(_http, relay.port, "HEAD", "/health"))[1]["Content-Length"] == str(len(got[2]))


@pytest.mark.parametrize("request_bytes, status_line, body", [
    (b"GET / HTTP/1.1\r\nHost: relay\r\nX-A: \x01\r\n\r\n", b"HTTP/1.1 400 Bad Request\r\n",
     b"invalid: control character in header field x-a\n"),
    (b"GET / HTTP/1.1\r\nHost: relay\r\nAccept: text/html\x7f\r\n\r\n", b"HTTP/1.1 400 Bad Request\r\n",
     b"invalid: control character in header field accept\n"),
    (b"GET / HTTP/1.1\r\nHost: relay\r\n\r\n", b"HTTP/1.1 426 Upgrade Required\r\n", UPGRADE_REQUIRED.body),
    (b"GET / HTTP/1.1\r\nHost: relay\r\nContent-Length: 2000000\r\n\r\n" + b"x" * 2_000_000,
     b"HTTP/1.1 413 Request Entity Too Large\r\n", None),
], ids=["ctl", "del", "plain-get", "large-body"])
async def test_a_relay_answers_what_websockets_refused_with_its_own_words(relay, request_bytes, status_line, body):
    """Over a raw socket: a control character in a header (curl read "Empty reply from server"), a plain GET
    of / (websockets' 426 text without CORS), a 2 MB body on / (426): the relay's answer, CORS headers and
    `Connection: close` included."""
    answer = await _raw(relay.port, request_bytes)
    head, _, got = answer.partition(b"\r\n\r\n")
    assert answer.startswith(status_line)
    assert b"\r\nAccess-Control-Allow-Origin: *\r\n" in head and b"\r\nConnection: close\r\n" in head
    if body is not None:
        assert got == body
    if b" 426 " in status_line:
        assert b"\r\nUpgrade: websocket\r\n" in head


async def test_a_keep_alive_client_is_told_to_reconnect_and_a_pipelined_request_is_not_read(relay):
    """Each answer says `Connection: close`: http.client, reusing its connection, opens a new one for each
    request and reads every answer (the second was dropped unanswered); of two pipelined requests, the first
    is answered with `Connection: close`, then the connection ends."""
    def reuse() -> list[tuple[int, str | None, bytes]]:
        connection = http.client.HTTPConnection("127.0.0.1", relay.port, timeout=5)
        try:
            answers = []
            for _ in range(3):
                connection.request("GET", "/health")
                response = connection.getresponse()
                answers.append((response.status, response.headers["Connection"], response.read()))
            return answers
        finally:
            connection.close()

    answers = await asyncio.to_thread(reuse)
    assert [(status, connection) for status, connection, _ in answers] == [(200, "close")] * 3
    assert all(healthy(body) for _, _, body in answers)
    one = b"GET /health HTTP/1.1\r\nHost: relay\r\n\r\n"
    answer = await _raw(relay.port, one + one)
    assert answer.count(b"HTTP/1.1 ") == 1 and b"\r\nConnection: close\r\n" in answer
    assert healthy(answer.partition(b"\r\n\r\n")[2])
