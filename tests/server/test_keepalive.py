"""The relay's keepalive (`[server] ping_interval_seconds`, `ping_timeout_seconds`; RFC 6455 section 5.5.2):
a client that neither answers pings nor reads is closed (1011) and counted; one that answers stays."""

from __future__ import annotations

import asyncio
import struct

import pytest

from relay.server.keepalive import Keepalive
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


class _FakeWire:
    """A wire whose peer answers pings when `answers`, and whose TCP has acknowledged `taken` bytes."""

    def __init__(self, answers: bool) -> None:
        self.answers, self.taken, self.pings = answers, 0, 0

    async def ping(self) -> None:
        self.pings += 1
        if not self.answers:
            await asyncio.Event().wait()

    def taken_bytes(self) -> int:
        return self.taken


async def test_one_keepalive_pings_every_wire_and_gives_up_only_on_one_silent_and_not_reading():
    """`Keepalive.look` (interval 1 s, timeout 2 s): a wire that answers is pinged again an interval after its
    pong; one that does not answer but whose TCP keeps acknowledging bytes stays; one that neither answers nor
    reads is given up once, after 2 s of looks without progress, and no longer pinged."""
    keepalive = Keepalive(1.0, 2.0)
    answering, reading, silent = _FakeWire(True), _FakeWire(False), _FakeWire(False)
    timed_out: list[_FakeWire] = []
    for wire in (answering, reading, silent):
        keepalive.watch(wire, lambda wire=wire: timed_out.append(wire))
    start = asyncio.get_running_loop().time()
    for step in range(1, 21):  # 10 s of looks, every 0.5 s
        keepalive.look(start + step * 0.5)
        reading.taken += 100
        await asyncio.sleep(0)
    assert timed_out == [silent] and silent.pings == 1
    assert reading.pings == 1  # its one ping still waits behind what it reads
    assert answering.pings >= 4
    pings = answering.pings
    keepalive.forget(answering)
    keepalive.forget(reading)
    keepalive.look(start + 30)
    await asyncio.sleep(0)
    assert answering.pings == pings  # forgotten: no more pings
