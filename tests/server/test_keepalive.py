"""The relay's keepalive (`[server] ping_interval_seconds`, `ping_timeout_seconds`; RFC 6455 section 5.5.2):
a client that neither answers pings nor reads is closed (1011) and counted; one that answers stays."""

from __future__ import annotations

import struct

import pytest

from tests.conftest import make_config
from tests.helpers import Client, raw_websocket, read_until_reset
from tests.inprocess import Relay


def _frames(data: bytes) -> list[tuple[int, bytes]]:
    """(opcode, payload) of each unmasked frame from a server (payloads under 126 bytes: pings, closes, AUTH)."""
    frames = []
    while data:
        opcode, size = data[0] & 0x0F, data[1] & 0x7F
        assert size < 126, data[:4]
        frames.append((opcode, data[2:2 + size]))
        data = data[2 + size:]
    return frames


@pytest.mark.single_process  # reads the server's keepalive_timeouts count
async def test_a_client_that_never_answers_a_ping_is_closed_and_one_that_does_stays(tmp_path, alice):
    """Pings every 0.5 s, 1 s to answer: a peer that completed the handshake and then reads nothing gets
    pings, then a close frame 1011 "keepalive ping timeout", and the relay resets the connection (when it
    has not answered the close within websockets' close timeout, 10 s); a websockets
    client (it answers pings) connected as long is still served."""
    relay = Relay(make_config(tmp_path, server={"ping_interval_seconds": 0.5, "ping_timeout_seconds": 1.0}))
    await relay.start()
    try:
        answering = await Client.connect(relay.url)
        reader, writer = await raw_websocket(relay.port)
        frames = _frames(await read_until_reset(reader, 15))
        writer.close()
        opcode, payload = frames[-1]
        assert opcode == 0x8 and struct.unpack("!H", payload[:2])[0] == 1011, frames
        assert payload[2:] == b"keepalive ping timeout"
        assert 0x9 in {op for op, _ in frames[:-1]} <= {0x1, 0x9}  # pings (and an AUTH challenge) before it
        assert relay.keepalive_timeouts == 1
        assert (await answering.publish(alice.sign(content="still here")))[2] is True
        await answering.close()
    finally:
        await relay.stop()
