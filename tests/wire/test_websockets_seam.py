"""The websockets seam: what relay/wire/ uses of websockets beyond its documented API, each checked by name.

relay/wire/ writes frames inside `send_context`, overrides the server connection's
protocol callbacks and handshake, and asks websockets' HTTP parser whether it would
refuse a request.  None of that is websockets' documented API, so an upgrade may
rename, remove or re-sign any of it; each test here names the attribute it checks,
and fails with that name.  The last test keeps the seam in one place: no module of
relay/ outside relay/wire/ touches these names.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
from dataclasses import dataclass
from pathlib import Path

import pytest
import websockets
import websockets.http11
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.connection import Connection
from websockets.asyncio.server import ServerConnection
from websockets.datastructures import Headers
from websockets.exceptions import InvalidHeaderValue
from websockets.http11 import Request
from websockets.protocol import Protocol
from websockets.server import ServerProtocol
from websockets.streams import StreamReader

import relay
from relay.wire.handshake import _WEBSOCKETS_REFUSAL, RoutedServerConnection

RELAY = Path(relay.__file__).parent
WIRE = RELAY / "wire"


@dataclass(frozen=True)
class Call:
    """websockets' `owner.name`, which relay/wire/ (`where`) calls with `args` (self not counted)."""

    owner: type
    name: str
    args: tuple
    where: str

    def __str__(self) -> str:
        return f"{self.owner.__module__}.{self.owner.__qualname__}.{self.name}"


CALLS = [
    Call(Connection, "send_context", (), "websocket.py: Wire.send_many, send_texts"),
    Call(Connection, "drain", (), "websocket.py: Wire.send_watched"),
    Call(Connection, "send_data", (), "handshake.py: RoutedServerConnection.handshake"),
    Call(Connection, "data_received", (b"",), "handshake.py: RoutedServerConnection.data_received"),
    Call(Connection, "eof_received", (), "handshake.py: RoutedServerConnection.eof_received"),
    Call(ServerConnection, "handshake", (None, None, "relay"), "handshake.py: RoutedServerConnection.handshake"),
    Call(Protocol, "send_text", (b"",), "websocket.py: send_texts"),
    Call(ServerProtocol, "send_response", (None,), "handshake.py: RoutedServerConnection.handshake"),
    Call(StreamReader, "feed_data", (b"",), "http.py: _websockets_refuses"),
    Call(StreamReader, "feed_eof", (), "http.py: _websockets_refuses"),
    Call(StreamReader, "read_line", (websockets.http11.MAX_LINE_LENGTH,), "http.py: Request.parse calls it"),
    Call(Request, "parse", (StreamReader().read_line,), "http.py: _websockets_refuses"),
]
"""websockets' methods relay/wire/ calls or overrides, and how it calls them."""

OVERRIDES = ["data_received", "eof_received", "handshake"]
"""`RoutedServerConnection`'s methods that websockets calls in place of its own: their parameters must match."""

CONNECTION_ATTRIBUTES = {
    "transport": "websocket.py: Wire (write, buffer size, socket), reset; handshake.py",
    "protocol": "websocket.py: send_texts; handshake.py",
    "loop": "handshake.py: RoutedServerConnection.__init__",
    "close_timeout": "websocket.py: Wire.drop; handshake.py",
    "connection_lost_waiter": "handshake.py: RoutedServerConnection.handshake",
    "response": "handshake.py: RoutedServerConnection.handshake",
}
"""Attributes of an open connection (set by websockets' `__init__` or `connection_made`) that relay/wire/ reads."""

PROTOCOL_ATTRIBUTES = {
    "eof_sent": "handshake.py: RoutedServerConnection.eof_received",
    "handshake_exc": "handshake.py: RoutedServerConnection._refusal",
}
"""Attributes of websockets' Sans-I/O protocol object (`connection.protocol`) that relay/wire/ reads."""

HTTP11_CONSTANTS = {"MAX_LINE_LENGTH": int, "MAX_NUM_HEADERS": int, "SERVER": str}
"""websockets.http11's bounds (http.py reads requests within them) and default Server header (handshake.py)."""


def _signature(owner: type, name: str) -> inspect.Signature:
    method = inspect.getattr_static(owner, name)
    bound = isinstance(method, classmethod)  # its `cls` is not passed by the caller
    return inspect.signature(getattr(owner, name) if bound else method)


@pytest.mark.parametrize("call", CALLS, ids=str)
def test_each_method_the_wire_calls_is_there_with_its_parameters(call: Call):
    """Each method exists, and the call relay/wire/ makes binds to its signature."""
    # websockets' own: asyncio.Protocol has a data_received and an eof_received too, which do nothing
    defined = next((c for c in call.owner.__mro__ if call.name in vars(c)), None)
    assert defined is not None and defined.__module__.startswith("websockets."), (
        f"{call} is gone (relay/wire/{call.where})")
    signature = _signature(call.owner, call.name)
    self = () if isinstance(inspect.getattr_static(call.owner, call.name), classmethod) else (None,)
    try:
        signature.bind(*self, *call.args)
    except TypeError as exc:
        pytest.fail(f"{call}{signature} no longer takes relay/wire/{call.where}'s call ({exc})")


@pytest.mark.parametrize("name", OVERRIDES)
def test_the_overrides_take_what_websockets_passes(name: str):
    """`RoutedServerConnection` overrides these; websockets' own have the same parameters, in the same order."""
    theirs = inspect.signature(getattr(ServerConnection, name)).parameters
    ours = inspect.signature(getattr(RoutedServerConnection, name)).parameters
    assert [(p.name, p.kind) for p in theirs.values()] == [(p.name, p.kind) for p in ours.values()], (
        f"websockets.asyncio.server.ServerConnection.{name}{inspect.signature(getattr(ServerConnection, name))} "
        f"differs from relay/wire/handshake.py's override")


def test_connections_are_fed_by_data_received():
    """A connection is an asyncio.Protocol fed through `data_received` (which handshake.py intercepts), not a
    BufferedProtocol, whose `buffer_updated` would pass the request around it."""
    assert issubclass(ServerConnection, asyncio.Protocol) and not issubclass(ServerConnection,
                                                                             asyncio.BufferedProtocol), (
        "websockets.asyncio.server.ServerConnection is no longer fed by data_received")


async def test_an_open_connection_has_the_attributes_the_wire_reads():
    """On both ends of a real connection: each attribute in CONNECTION_ATTRIBUTES and PROTOCOL_ATTRIBUTES."""
    accepted: asyncio.Future[ServerConnection] = asyncio.get_running_loop().create_future()

    async def handler(ws: ServerConnection) -> None:
        accepted.set_result(ws)
        await ws.wait_closed()

    async with websockets.serve(handler, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        async with websockets.connect(f"ws://127.0.0.1:{port}") as client:
            ends: list[Connection] = [await accepted, client]
            missing = [f"{type(end).__name__}.{name} (relay/wire/{where})" for end in ends
                       for name, where in CONNECTION_ATTRIBUTES.items() if not hasattr(end, name)]
            missing += [f"{type(end.protocol).__name__}.{name} (relay/wire/{where})" for end in ends
                        for name, where in PROTOCOL_ATTRIBUTES.items() if not hasattr(end.protocol, name)]
            assert not missing, f"websockets' connections lack: {', '.join(missing)}"
            server_end = ends[0]
            assert isinstance(server_end.connection_lost_waiter, asyncio.Future), \
                "ServerConnection.connection_lost_waiter is no longer a future"
            assert type(server_end.protocol.eof_sent) is bool, "ServerProtocol.eof_sent is no longer a bool"
            assert isinstance(client, ClientConnection) and isinstance(client.protocol, Protocol)
            for method in ("write", "abort", "close", "get_extra_info", "get_write_buffer_size"):
                assert callable(getattr(server_end.transport, method, None)), f"ServerConnection.transport.{method}"


@pytest.mark.parametrize("name, kind", HTTP11_CONSTANTS.items())
def test_http11_constants(name: str, kind: type):
    """websockets.http11's bounds and Server header are still there, of their type."""
    assert isinstance(getattr(websockets.http11, name, None), kind), f"websockets.http11.{name}"


def test_a_refused_handshake_names_its_header_behind_the_prefix_handshake_py_strips():
    """ServerProtocol.accept: a refusal's body begins with `_WEBSOCKETS_REFUSAL`, and an unsupported
    Sec-WebSocket-Version leaves `handshake_exc` an InvalidHeaderValue naming that header (its `name`)."""
    headers = Headers({"Host": "relay", "Upgrade": "websocket", "Connection": "Upgrade",
                       "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==", "Sec-WebSocket-Version": "12"})
    protocol = ServerProtocol()
    response = protocol.accept(Request("/", headers))
    assert response.body.decode().startswith(_WEBSOCKETS_REFUSAL), (
        f"websockets.server.ServerProtocol.accept's refusal body no longer begins {_WEBSOCKETS_REFUSAL!r}")
    exc = protocol.handshake_exc
    assert isinstance(exc, InvalidHeaderValue) and exc.name == "Sec-WebSocket-Version", (
        f"websockets.server.ServerProtocol.handshake_exc for a bad version: {exc!r}, not "
        f"InvalidHeaderValue with name 'Sec-WebSocket-Version'")


def test_every_name_checked_here_is_used_in_the_wire():
    """The lists above are what relay/wire/ uses: a name no longer used there is removed from them."""
    source = "\n".join(path.read_text() for path in WIRE.glob("*.py"))
    names = [c.name for c in CALLS] + [*CONNECTION_ATTRIBUTES, *PROTOCOL_ATTRIBUTES, *HTTP11_CONSTANTS]
    unused = [name for name in names if name not in source]
    assert not unused, f"not used in relay/wire/ any more: {', '.join(unused)}"


SEAM_ONLY = {"send_context", "send_text", "send_data", "send_response", "connection_lost_waiter", "eof_sent",
             "handshake_exc"}
"""Names only websockets' internals have in relay/ (others, like `drain` or `data_received`, asyncio's have too)."""
CONNECTION_NAMES = {"ws", "_ws"}  # what relay/ calls a websockets connection: its `.transport` and `.protocol`
PUBLIC_MODULES = {"websockets", "websockets.exceptions", "websockets.asyncio.server", "websockets.asyncio.client"}


def test_outside_the_wire_relay_uses_websockets_documented_api_only():
    """No module of relay/ outside relay/wire/ reads a SEAM_ONLY name, a connection's `transport` or `protocol`,
    or imports a websockets module other than PUBLIC_MODULES."""
    found = []
    for path in sorted(RELAY.rglob("*.py")):
        if WIRE in path.parents:
            continue
        where = path.relative_to(RELAY.parent)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute):
                owner = node.value.attr if isinstance(node.value, ast.Attribute) else getattr(node.value, "id", "")
                if node.attr in SEAM_ONLY or (node.attr in ("transport", "protocol") and owner in CONNECTION_NAMES):
                    found.append(f"{where}:{node.lineno}: .{node.attr}")
            modules = ([a.name for a in node.names] if isinstance(node, ast.Import)
                       else [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
            found += [f"{where}:{node.lineno}: import {m}" for m in modules
                      if m.split(".")[0] == "websockets" and m not in PUBLIC_MODULES]
    assert not found, "websockets' internals outside relay/wire/:\n" + "\n".join(found)
