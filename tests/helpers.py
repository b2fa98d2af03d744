"""Test helpers: signing keys, event construction, a small WebSocket client."""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import json
import socket
import time
from pathlib import Path

import orjson
import websockets
from coincurve import PrivateKey
from websockets.frames import Frame, Opcode

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
REAL_EVENTS = DATA / "all_real_valid_dedup.jsonl"


class Keys:
    """A BIP-340 key pair for signing test events."""

    def __init__(self, secret: int | bytes) -> None:
        raw = secret.to_bytes(32, "big") if isinstance(secret, int) else secret
        self.private = PrivateKey(raw)
        self.pubkey = self.private.public_key_xonly.format().hex()

    def sign(self, kind: int = 1, content: str = "", tags: list | None = None,
             created_at: int | None = None) -> dict:
        """A signed NIP-01 event as a JSON-ready dict."""
        tags = tags or []
        created_at = int(time.time()) if created_at is None else created_at
        preimage = json.dumps([0, self.pubkey, created_at, kind, tags, content],
                              separators=(",", ":"), ensure_ascii=False).encode()
        event_id = hashlib.sha256(preimage).hexdigest()
        sig = self.private.sign_schnorr(bytes.fromhex(event_id)).hex()
        return {"id": event_id, "pubkey": self.pubkey, "created_at": created_at, "kind": kind,
                "tags": tags, "content": content, "sig": sig}


async def eventually(check, timeout: float = 10.0, every: float = 0.2):
    """Call `check()` (plain or async; truthy when done) until it holds or `timeout` seconds pass; returns its
    last value, for the caller to assert."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if inspect.isawaitable(value):
            value = await value
        if value or time.monotonic() > deadline:
            return value
        await asyncio.sleep(every)


async def store_events(store, events: list[dict]) -> None:
    """Store `events` through `store`'s writer (a relay's `relay.store`), all queued at once (so in few
    transactions, faster than one EVENT round trip each); asserts each was accepted."""
    from relay.protocol.event import EventLimits, parse_event

    outcomes = await asyncio.gather(*(store.submit(parse_event(e, EventLimits(), time.time())) for e in events))
    assert all(accepted for accepted, _ in outcomes), outcomes


async def import_into(store, lines: list[bytes]):
    """`import_lines` of JSONL `lines` into `store` through an ingest of its own (default limits, every
    kind); returns the `ImportReport`."""
    from relay.ingest import Ingest
    from relay.commands.transfer import import_lines

    ingest = Ingest(store)
    try:
        return await import_lines(ingest, lines)
    finally:
        ingest.close()


def read_jsonl(path: Path) -> list[dict]:
    """Every non-blank line of a JSONL file, decoded."""
    # split on "\n" only: str.splitlines() would also split inside U+2028 in content
    return [json.loads(line) for line in path.read_text(encoding="utf-8").split("\n") if line.strip()]


class Client:
    """A raw NIP-01 client over a real WebSocket: send lists, receive decoded messages.

    The relay's NIP-42 `["AUTH", <challenge>]` is not returned by `recv`: the
    latest one is kept in `challenge` ("" before any).
    """

    def __init__(self, ws) -> None:
        self.ws = ws
        self.challenge = ""

    @classmethod
    async def connect(cls, url: str, **kwargs) -> Client:
        return cls(await websockets.connect(url, max_size=None, **kwargs))

    async def send(self, message) -> None:
        await self.ws.send(message if isinstance(message, (str, bytes)) else json.dumps(message))

    async def recv(self, timeout: float = 5.0):
        while True:
            message = orjson.loads(await asyncio.wait_for(self.ws.recv(), timeout))
            if message[:1] == ["AUTH"] and len(message) == 2 and type(message[1]) is str:
                self.challenge = message[1]
                continue
            return message

    async def publish(self, event: dict) -> list:
        """Send an EVENT and return its OK reply."""
        await self.send(["EVENT", event])
        while True:
            reply = await self.recv()
            if reply[0] == "OK" and reply[1] == event["id"]:
                return reply

    async def req(self, sub_id: str, *filters: dict) -> list[dict]:
        """Send a REQ and collect stored events up to EOSE (raises on CLOSED)."""
        await self.send(["REQ", sub_id, *filters])
        events = []
        while True:
            reply = await self.recv()
            if reply[0] == "EVENT" and reply[1] == sub_id:
                events.append(reply[2])
            elif reply[0] == "EOSE" and reply[1] == sub_id:
                return events
            elif reply[0] == "CLOSED" and reply[1] == sub_id:
                raise AssertionError(f"subscription closed: {reply}")

    async def close(self) -> None:
        await self.ws.close()


async def raw_websocket(port: int, receive_buffer: int = 0) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A TCP connection to the relay on loopback `port` that has done the WebSocket handshake and nothing
    else: the caller reads raw frames, or nothing at all (no pong, no close). `receive_buffer`: the kernel
    receive buffer in bytes (0: the kernel's default), small so that the relay's writes stall sooner."""
    if receive_buffer:
        reader, writer = await asyncio.open_connection(sock=await small_buffer_socket(f"ws://127.0.0.1:{port}",
                                                                                     receive_buffer))
    else:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET / HTTP/1.1\r\nHost: relay\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                 b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
    assert (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)).startswith(b"HTTP/1.1 101")
    return reader, writer


async def read_until_reset(reader: asyncio.StreamReader, timeout: float) -> bytes:
    """Every byte `reader` gets until the peer resets the connection; fails on a clean end of stream, or
    when nothing comes for `timeout` seconds."""
    data = b""
    try:
        while chunk := await asyncio.wait_for(reader.read(65536), timeout):
            data += chunk
    except ConnectionResetError:
        return data
    raise AssertionError(f"the connection ended without a reset, after {len(data)} bytes")


def tcp_sockets(local_port: int, remote_port: int) -> list[tuple[int, int]]:
    """(state, bytes in the send queue) of each kernel TCP socket from `local_port` to `remote_port`
    (/proc/net/tcp and tcp6, Linux; state 1 is ESTABLISHED, 4 FIN-WAIT-1)."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in list(f)[1:]:
                fields = line.split()
                local, remote, state, queues = fields[1], fields[2], fields[3], fields[4]
                if int(local.rsplit(":", 1)[1], 16) == local_port and int(remote.rsplit(":", 1)[1], 16) == remote_port:
                    found.append((int(state, 16), int(queues.split(":")[0], 16)))
    return found


async def small_buffer_socket(url: str, receive_buffer: int = 4096) -> socket.socket:
    """A TCP socket connected to `url` (ws://host:port) with a small kernel receive buffer, for
    `websockets.connect(url, sock=...)`: once its client stops reading, the relay's writes to it stall."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.setblocking(False)
    host, port = url.removeprefix("ws://").rsplit(":", 1)
    await asyncio.get_running_loop().sock_connect(sock, (host, int(port)))
    return sock


async def non_reader(url: str, receive_buffer: int = 4096, **kwargs):
    """A WebSocket client of `url` with a small receive buffer and a one-message queue: once it stops reading,
    the relay's writes to it stall. `kwargs` go to websockets.connect."""
    sock = await small_buffer_socket(url, receive_buffer)
    return await websockets.connect(url, sock=sock, max_size=None, max_queue=1, ping_interval=None, **kwargs)


def send_masked(writer: asyncio.StreamWriter, opcode: Opcode, payload: bytes) -> None:
    """Write one masked client frame (RFC 6455 section 5.3) on a `raw_websocket` connection."""
    writer.write(Frame(opcode, payload).serialize(mask=True, extensions=[]))
