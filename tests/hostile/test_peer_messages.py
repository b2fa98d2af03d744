"""A hostile peer: relay messages with the wrong types are ignored by the sync client, not an internal error; one
that answers a request of ours ends that request at once."""

from __future__ import annotations

import asyncio
import json

import pytest
import websockets

from relay.protocol.negentropy import Negentropy, SortedVector
from relay.sync.peer import PeerConnection, PeerError

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



async def test_a_malformed_answer_to_a_request_of_ours_ends_it_at_once():
    """An OK whose acceptance is no boolean answers its EVENT as refused, naming it; a NEG-MSG that is no hex fails
    the reconciliation naming it: neither waits for the reply timeout."""
    async def handler(ws):
        async for frame in ws:
            m = json.loads(frame)
            await ws.send(json.dumps(["OK", m[1]["id"], "yes", ""] if m[0] == "EVENT" else
                                     ["NEG-MSG", m[1], "not hex"]))

    async with websockets.serve(handler, "127.0.0.1", 0) as server:
        peer = await PeerConnection.open(f"ws://127.0.0.1:{server.sockets[0].getsockname()[1]}", None,
                                         reply_timeout_seconds=60)
        try:
            answers = []
            event_id = "ab" * 32
            await asyncio.wait_for(peer.publish_many([(event_id, b'{"id":"%s"}' % event_id.encode())],
                                                     lambda *answer: answers.append(answer)), 5)
            assert answers == [(event_id, False, "malformed OK: OK acceptance must be true or false")]
            with pytest.raises(PeerError, match="sent a malformed NEG-MSG: NEG-MSG message must be a hex string"):
                await asyncio.wait_for(peer.reconcile({}, Negentropy(SortedVector.from_items([])),
                                                      lambda have, need: None), 5)
        finally:
            await peer.close()
