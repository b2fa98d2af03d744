"""Graceful shutdown of `relay serve` (a subprocess) on SIGTERM and SIGINT in the middle of a publishing burst."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Callable

import orjson
import pytest
import structlog.testing
from websockets.exceptions import ConnectionClosed
from websockets.frames import Close, Opcode

from tests.conftest import make_config
from tests.helpers import Client, Keys, eventually, raw_websocket, read_until_reset, send_masked
from tests.inprocess import Relay
from tests.served import Served, clean_env, free_port

PUBLISHERS = 3
BURST = 500  # events per publisher
IN_FLIGHT = 64  # limits.max_events_in_flight: the relay takes a burst a little at a time, so the signal lands mid-burst
SIGNAL_AFTER_OKS = 100


async def _publish(port: int, events: list[dict], acked: set[str], signal_once) -> int:
    """Send `events` as fast as the socket takes them while reading OKs; returns the close code received."""
    client = await Client.connect(f"ws://127.0.0.1:{port}", open_timeout=10)

    async def send_all() -> None:
        try:
            for event in events:
                await client.send(["EVENT", event])
        except ConnectionClosed:
            pass

    sender = asyncio.create_task(send_all())
    try:
        async for frame in client.ws:
            reply = orjson.loads(frame)
            if reply[0] == "AUTH":  # the NIP-42 challenge sent on connect
                continue
            assert reply[0] == "OK", reply
            assert reply[2] is True, reply
            acked.add(reply[1])
            signal_once()
    finally:
        sender.cancel()
    return client.ws.close_code


async def _burst(port: int, bursts: list[list[dict]], pid: int, sig: int) -> tuple[set[str], list[int]]:
    acked: set[str] = set()
    sent = []

    def signal_once() -> None:
        if not sent and len(acked) >= SIGNAL_AFTER_OKS:
            sent.append(sig)
            os.kill(pid, sig)

    codes = await asyncio.gather(*(_publish(port, events, acked, signal_once) for events in bursts))
    return acked, list(codes)


async def _served_ids(tmp_path, keys: list[Keys]) -> set[str]:
    """Restart the relay (in-process) on the same database and REQ every publisher's events."""
    relay = Relay(make_config(tmp_path))
    await relay.start()
    try:
        client = await Client.connect(relay.url)
        ids = set()
        for i, k in enumerate(keys):
            ids |= {e["id"] for e in await client.req(f"a{i}", {"authors": [k.pubkey], "limit": BURST})}
        await client.close()
    finally:
        await relay.stop()
    return ids


@pytest.mark.single_process  # reads the server's connections
async def test_past_the_shutdown_timeout_a_peer_that_never_closes_is_reset(tmp_path):
    """A client that completed the handshake and then reads nothing (so never answers the 1001 close): with
    shutdown_timeout_seconds = 1 its connection ends when stop() returns, not at websockets' close timeout (10 s)."""
    relay = Relay(make_config(tmp_path, server={"shutdown_timeout_seconds": 1.0}))
    await relay.start()
    reader, writer = await raw_websocket(relay.port)
    assert await eventually(lambda: len(relay.connections) == 1)
    await asyncio.wait_for(relay.stop(), 30)  # a bound for a hang, not a speed target
    assert not relay.connections
    await read_until_reset(reader, 2)  # (the 1001 close frame, unread, comes first)
    writer.close()


async def test_past_the_shutdown_timeout_opening_handshakes_are_reset_too(tmp_path):
    """20 clients that sent half of their opening handshake and then nothing: with shutdown_timeout_seconds = 1
    their connections end when stop() returns, not at websockets' open timeout (10 s after they connected)."""
    relay = Relay(make_config(tmp_path, server={"shutdown_timeout_seconds": 1.0}))
    await relay.start()
    half_open = [await asyncio.open_connection("127.0.0.1", relay.port) for _ in range(20)]
    for _, writer in half_open:
        writer.write(b"GET / HTTP/1.1\r\nHost: relay\r\n")
        await writer.drain()
    await asyncio.wait_for(relay.stop(), 30)  # a bound for a hang, not a speed target
    for reader, writer in half_open:
        with contextlib.suppress(ConnectionResetError):
            assert await asyncio.wait_for(reader.read(), 2) == b""  # ended: a reset, or an end of stream
        writer.close()


def test_sigterm_after_a_connection_was_reset_exits_0(tmp_path):
    """`relay serve` (uvloop) resets a client that sent its close frame mid-answer and then read nothing; a
    later SIGTERM still stops cleanly (exit 0, relay_stopped). Resetting that ended connection again at
    shutdown raised ValueError from uvloop's socket object ("negative file descriptor") and exited 1."""
    writer_keys = Keys(0x6000)
    port = free_port()
    env = clean_env(RELAY_LIMITS__STORED_RESULTS_TIMEOUT_SECONDS="1", RELAY_RATE_LIMITS__ENABLED="false")

    async def leave_mid_answer(closed: Callable[[], bool]) -> None:
        client = await Client.connect(f"ws://127.0.0.1:{port}")
        for i in range(300):  # 9 MB: more than the kernel's socket buffers take
            assert (await client.publish(writer_keys.sign(content=f"{i} " + "z" * 30_000)))[2] is True
        await client.close()
        reader, writer = await raw_websocket(port, receive_buffer=4096)
        send_masked(writer, Opcode.TEXT, b'["REQ","big",{"limit":5000}]')
        await asyncio.sleep(0.5)
        send_masked(writer, Opcode.CLOSE, Close(1000, "bye").serialize())
        assert await eventually(closed, timeout=30)  # reset once it has taken nothing for 1 s
        writer.transport.abort()

    with Served(tmp_path, "--db", tmp_path / "relay.db", "--port", port, env=env) as served:
        served.wait_health(port)
        asyncio.run(leave_mid_answer(lambda: sum(e.get("event") == "connection_closed"
                                                 for e in served.log_events()) == 2))
        os.kill(served.proc.pid, signal.SIGTERM)
        exit_code = served.proc.wait(timeout=30)
        log = served.log_events()
    assert exit_code == 0, served.stderr
    assert any(e.get("event") == "relay_stopped" for e in log)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_mid_burst_keeps_every_acknowledged_event_and_closes_1001(tmp_path, sig):
    """Exit 0, close code 1001 to every client, and the stored events are exactly those acknowledged with OK true."""
    keys = [Keys(0x5000 + i) for i in range(PUBLISHERS)]
    bursts = [[k.sign(content=f"burst {i}") for i in range(BURST)] for k in keys]
    port = free_port()
    env = clean_env(RELAY_LIMITS__MAX_EVENTS_IN_FLIGHT=str(IN_FLIGHT), RELAY_RATE_LIMITS__ENABLED="false")
    with Served(tmp_path, "--db", tmp_path / "relay.db", "--port", port, env=env) as served:
        served.wait_health(port)
        acked, codes = asyncio.run(_burst(port, bursts, served.proc.pid, sig))
        exit_code = served.proc.wait(timeout=30)
        log = served.log_events()
    assert exit_code == 0, served.stderr
    assert codes == [1001] * PUBLISHERS
    assert SIGNAL_AFTER_OKS <= len(acked) < PUBLISHERS * BURST  # the signal came mid-burst
    assert not any(e.get("event") == "shutdown_timeout" for e in log)
    stored = asyncio.run(_served_ids(tmp_path, keys))
    assert acked <= stored  # every acknowledged event survived
    assert stored == acked  # and every event taken before the signal got its OK


@pytest.mark.single_process  # captures the server's shutdown log in this process
async def test_past_the_shutdown_timeout_connections_are_closed_1001_anyway(tmp_path, alice):
    """shutdown_timeout_seconds = 0: no waiting for anyone, a `shutdown_timeout` log line, and still close code 1001."""
    relay = Relay(make_config(tmp_path, server={"shutdown_timeout_seconds": 0.0}))
    await relay.start()
    client = await Client.connect(relay.url)
    assert (await client.publish(alice.sign(content="before the stop")))[2] is True
    with structlog.testing.capture_logs() as logs:
        await asyncio.wait_for(relay.stop(), 30)  # a bound for a hang, not a speed target
    with pytest.raises(ConnectionClosed):
        await client.recv()
    assert client.ws.close_code == 1001
    assert {entry["step"] for entry in logs if entry["event"] == "shutdown_timeout"} >= {"drain"}


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_as_soon_as_health_answers_still_stops_cleanly_with_peers(tmp_path, sig):
    """With a peer configured (set up after the port listens), a signal right after /health answers exits 0."""
    port, peer_port = free_port(), free_port()  # nothing listens on the peer's port
    config = tmp_path / "relay.toml"
    config.write_text(f'[[sync.peers]]\nurl = "ws://127.0.0.1:{peer_port}"\n')
    env = clean_env(RELAY_RATE_LIMITS__ENABLED="false")
    with Served(tmp_path, "--config", config, "--db", tmp_path / "relay.db", "--port", port, env=env) as served:
        served.wait_health(port)
        os.kill(served.proc.pid, sig)
        exit_code = served.proc.wait(timeout=30)
        log = served.log_events()
    assert exit_code == 0, served.stderr
    assert any(e.get("event") == "relay_stopped" for e in log)
