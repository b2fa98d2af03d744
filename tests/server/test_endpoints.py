"""NIP-01's single endpoint (`[server] paths`), NIP-11's Accept header in any case, and CORS preflights
(relay/wire/http.py: `Routes`, `RequestReader`)."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from http import HTTPStatus

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from relay.wire.http import (HANDOFF, UPGRADE_REQUIRED, Answer, HttpRequest, HttpResponse, RequestReader,
                                    Routes, quality)
from tests.conftest import make_config
from tests.helpers import Client
from tests.inprocess import Relay

UPGRADE = (b"GET %s HTTP/1.1\r\nHost: relay\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
           b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
PREFLIGHT = (b"OPTIONS %s HTTP/1.1\r\nHost: relay\r\nOrigin: https://app.example\r\n"
             b"Access-Control-Request-Method: POST\r\n"
             b"Access-Control-Request-Headers: authorization, content-type\r\n\r\n")


async def _ok(request: HttpRequest) -> HttpResponse:
    return HttpResponse(HTTPStatus.OK, b"ok\n", "text/plain")


def _decide(request: bytes, endpoints: tuple[str, ...] | None = ("/",)):
    routes = Routes(endpoints)
    routes.add("GET", "/health", _ok)
    routes.add("GET", "/", _ok, accept="application/nostr+json")
    routes.add("POST", "/", _ok)  # as NIP-86's management route will be
    return RequestReader(routes, 1000).feed(request)


@pytest.mark.parametrize("accept", ["Application/Nostr+JSON", "application/nostr+json; q=0.9",
                                    "text/html, APPLICATION/NOSTR+JSON"])
def test_the_accept_header_names_a_media_type_in_any_case(accept):
    """Media types are case-insensitive (RFC 9110 8.3.1), parameters aside; a mere substring or */* is not it."""
    assert quality(accept, "application/nostr+json") > 0
    assert quality("application/nostr+jsonx, */*", "application/nostr+json") == 0
    decision = _decide(b"GET / HTTP/1.1\r\nHost: relay\r\nAccept: %s\r\n\r\n" % accept.encode())
    assert type(decision) is Answer and decision.route.accept == "application/nostr+json"


def test_a_websocket_on_another_path_is_refused_404_before_the_upgrade():
    """Only the endpoints' paths go to websockets (query strings aside); any other gets 404 (NIP-01)."""
    assert _decide(UPGRADE % b"/") is HANDOFF and _decide(UPGRADE % b"/?x=1") is HANDOFF
    for path in (b"/x5ab6", b"/npub1qqqq", b"//"):
        decision = _decide(UPGRADE % path)
        assert type(decision) is HttpResponse and decision.status == HTTPStatus.NOT_FOUND
    assert _decide(UPGRADE % b"/x5ab6", endpoints=None) is HANDOFF  # a table without endpoints: any path
    assert _decide(UPGRADE % b"/nostr", endpoints=("/nostr",)) is HANDOFF
    assert _decide(UPGRADE % b"/", endpoints=("/nostr",)).status == HTTPStatus.NOT_FOUND


def test_a_cors_preflight_is_answered_with_the_methods_of_its_path():
    """OPTIONS with Access-Control-Request-Method: 204 naming the methods routed for that path, Authorization
    among the allowed headers; a path no route serves is not preflighted; OPTIONS without it gets 405."""
    decision = _decide(PREFLIGHT % b"/")
    assert type(decision) is HttpResponse and decision.status == HTTPStatus.NO_CONTENT
    headers = dict(Routes().response(decision).headers.raw_items())
    assert headers["Access-Control-Allow-Methods"] == "GET, POST"
    assert headers["Access-Control-Allow-Origin"] == "*" and "Authorization" in headers["Access-Control-Allow-Headers"]
    assert "Content-Type" in headers["Access-Control-Allow-Headers"] and headers["Access-Control-Max-Age"]
    health = Routes().response(_decide(PREFLIGHT % b"/health"))
    assert health.headers["Access-Control-Allow-Methods"] == "GET"
    assert _decide(PREFLIGHT % b"/elsewhere").status == HTTPStatus.NOT_FOUND
    plain = _decide(b"OPTIONS / HTTP/1.1\r\nHost: relay\r\n\r\n")
    assert plain.status == HTTPStatus.METHOD_NOT_ALLOWED and dict(plain.headers)["Allow"] == "GET, POST, HEAD"


@pytest.mark.parametrize("accept, route", [
    ("application/nostr+json;q=0.1, text/html", "text/html"),
    ("text/html;q=0.5, application/nostr+json;q=0.9", "application/nostr+json"),
    ("application/nostr+json, text/html", "application/nostr+json"),  # a tie: the first route added
    ("text/html; Q=0.000, application/nostr+json; q=0", None),  # q=0: not acceptable
    ("text/html;q=2", "text/html"),  # not a qvalue: ignored, as other parameters are
])
def test_the_route_of_the_highest_quality_answers(accept, route):
    """Of the routes that match, the one whose media type the Accept header weighs most answers (RFC 9110
    12.5.1), the first on a tie; q=0 means not acceptable (a walkthrough got HTML for `text/html;q=0`)."""
    routes = Routes(("/",))
    routes.add("GET", "/", _ok, accept="application/nostr+json")
    routes.add("GET", "/", _ok, accept="text/html")
    decision = RequestReader(routes, 1000).feed(b"GET / HTTP/1.1\r\nHost: relay\r\nAccept: %s\r\n\r\n"
                                                % accept.encode())
    assert (decision.route.accept if type(decision) is Answer else None) == route
    assert decision is UPGRADE_REQUIRED or route is not None  # nothing acceptable: the relay's 426


# --- through a real relay ---------------------------------------------------------------------------------


def _request(port: int, path: str, method: str = "GET", headers: dict | None = None) -> tuple[int, dict, bytes]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


async def test_a_relay_serves_nip11_and_preflights_as_browsers_send_them(relay):
    """`Accept: Application/Nostr+JSON` gets the NIP-11 document (it got 426); a preflight gets 204 with the CORS
    headers (it got 405 without them)."""
    status, _, body = await asyncio.to_thread(_request, relay.port, "/", "GET", {"Accept": "Application/Nostr+JSON"})
    assert status == 200 and json.loads(body)["supported_nips"]
    status, headers, body = await asyncio.to_thread(_request, relay.port, "/", "OPTIONS", {
        "Origin": "https://app.example", "Access-Control-Request-Method": "GET",
        "Access-Control-Request-Headers": "accept"})
    assert (status, body) == (204, b"") and headers["Access-Control-Allow-Origin"] == "*"
    assert "GET" in headers["Access-Control-Allow-Methods"].split(", ")


async def test_a_relay_accepts_websockets_on_its_configured_paths_only(tmp_path):
    """`[server] paths = ["/nostr"]`: a client connects on /nostr (NIP-11 is served there), any other path,
    "/" included, is refused 404 before the upgrade."""
    relay = Relay(make_config(tmp_path, server={"paths": ["/nostr"]}))
    await relay.start()
    try:
        client = await Client.connect(relay.url + "/nostr")
        assert await client.req("s", {"limit": 1}) == []
        await client.close()
        for path in ("/", "/x5ab6", "/nostr/npub1x"):
            with pytest.raises(InvalidStatus) as refused:
                async with connect(relay.url + path, open_timeout=5):
                    pass
            assert refused.value.response.status_code == 404
        status, _, body = await asyncio.to_thread(_request, relay.port, "/nostr", "GET",
                                                  {"Accept": "application/nostr+json"})
        assert status == 200 and json.loads(body)["name"]
    finally:
        await relay.stop()


async def test_by_default_only_the_root_path_is_the_relay(relay):
    """The default endpoint is "/": /x5ab6 is refused 404 (it was the same relay)."""
    with pytest.raises(InvalidStatus) as refused:
        async with connect(relay.url + "/x5ab6", open_timeout=5):
            pass
    assert refused.value.response.status_code == 404
    client = await Client.connect(relay.url + "/")
    await client.close()
