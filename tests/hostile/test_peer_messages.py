"""A hostile peer: relay messages with the wrong types are ignored by the sync client, not an internal error."""

from __future__ import annotations

import json

import websockets

from relay.sync.peer import PeerConnection

GARBAGE = [
    ["EOSE", ["not", "a", "sub id"]],
    ["CLOSED", {"sub": 1}, "error: x"],
    ["NEG-MSG", [1], "61"],
    ["NEG-ERR", {}, "blocked: x"],
    ["EVENT", ["s"], {}],
    ["OK", ["id"], True, ""],
    ["AUTH", {"challenge": 1}],
    ["EOSE"],
]


async def test_malformed_relay_messages_are_ignored_and_the_fetch_completes():
    """Before EOSE the peer sends messages whose subscription id is not a string: the fetch still ends at EOSE."""
    async def handler(ws):
        async for frame in ws:
            message = json.loads(frame)
            if message[0] == "REQ":
                for garbage in GARBAGE:
                    await ws.send(json.dumps(garbage))
                await ws.send(json.dumps(["EOSE", message[1]]))

    async with websockets.serve(handler, "127.0.0.1", 0) as server:
        peer = await PeerConnection.open(f"ws://127.0.0.1:{server.sockets[0].getsockname()[1]}", None,
                                         reply_timeout_seconds=10)
        try:
            assert await peer.fetch(["ab" * 32]) == []
        finally:
            await peer.close()
