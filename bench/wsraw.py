"""A minimal, fast WebSocket client (RFC 6455) on asyncio Protocols, for the load generators.

Why not the websockets library: at tens of thousands of small messages per second its
per-message Python overhead (futures, frames objects, assembler) costs more CPU than the
relays we measure on a 2-core box.  Here a send is one header build + C masking
(websockets.speedups.apply_mask, random 4-byte key per frame) + transport.write, and
received frames are cut out of one buffer and handed to a callback as bytes.

Only what a Nostr client needs: text frames out; text/binary/continuation, ping (answered
with pong) and close in; no extensions (no permessage-deflate is offered, so the server
never compresses).  Loopback only.
"""
from __future__ import annotations

import asyncio
import base64
import os
import socket
import struct
import time
from typing import Callable
from urllib.parse import urlsplit

try:
    from websockets.speedups import apply_mask  # C implementation
except Exception:  # pragma: no cover - fallback
    def apply_mask(data: bytes, mask: bytes) -> bytes:
        n = len(data)
        m = (mask * (n // 4 + 1))[:n]
        return (int.from_bytes(data, "big") ^ int.from_bytes(m, "big")).to_bytes(n, "big")

LOOPBACK = ("127.0.0.1", "localhost", "::1")
TCP_QUICKACK = getattr(socket, "TCP_QUICKACK", 12)


class WSClosed(Exception):
    pass


def encode_frame(payload: bytes, opcode: int = 1) -> bytes:
    n = len(payload)
    if n < 126:
        head = struct.pack("!BB", 0x80 | opcode, 0x80 | n)
    elif n < 65536:
        head = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, n)
    else:
        head = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, n)
    mask = os.urandom(4)
    return head + mask + apply_mask(payload, mask)


class _Proto(asyncio.Protocol):
    def __init__(self, on_message: Callable[[bytes], None] | None, quickack: bool,
                 count_prefix: bytes | None = None):
        self.on_message = on_message
        self.count_prefix = count_prefix  # text frames starting with this are only counted
        self.prefix_count = 0
        self.last_count_t = 0.0
        self.quickack = quickack
        self.transport: asyncio.Transport | None = None
        self.sock = None
        self.buf = bytearray()
        self.handshake_done = asyncio.get_running_loop().create_future()
        self.closed = asyncio.get_running_loop().create_future()
        self._frag: list[bytes] = []
        self._can_write = asyncio.Event()
        self._can_write.set()
        self.bytes_in = 0

    # transport callbacks
    def connection_made(self, transport):
        self.transport = transport
        self.sock = transport.get_extra_info("socket")

    def pause_writing(self):
        self._can_write.clear()

    def resume_writing(self):
        self._can_write.set()

    def connection_lost(self, exc):
        self._can_write.set()
        if not self.handshake_done.done():
            self.handshake_done.set_exception(WSClosed(f"connection lost in handshake: {exc}"))
        if not self.closed.done():
            self.closed.set_result(exc)

    def data_received(self, data: bytes):
        self.bytes_in += len(data)
        if self.quickack and self.sock is not None:
            try:  # Linux clears QUICKACK after some ACKs; re-arm on every receive
                self.sock.setsockopt(socket.IPPROTO_TCP, TCP_QUICKACK, 1)
            except OSError:
                pass
        buf = self.buf
        buf += data
        if not self.handshake_done.done():
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(buf[:end]).decode("latin-1")
            del buf[:end + 4]
            status = head.split("\r\n", 1)[0]
            if " 101 " not in status + " ":
                self.handshake_done.set_exception(WSClosed(f"handshake refused: {status}"))
                self.transport.close()
                return
            self.handshake_done.set_result(head)
        self._parse()

    def _parse(self):
        buf = self.buf
        pos = 0
        n = len(buf)
        cb = self.on_message
        cp = self.count_prefix
        counted = 0
        while n - pos >= 2:
            b0 = buf[pos]
            b1 = buf[pos + 1]
            ln = b1 & 0x7F
            hl = 2
            if ln == 126:
                if n - pos < 4:
                    break
                ln = (buf[pos + 2] << 8) | buf[pos + 3]
                hl = 4
            elif ln == 127:
                if n - pos < 10:
                    break
                ln = int.from_bytes(buf[pos + 2:pos + 10], "big")
                hl = 10
            masked = b1 & 0x80
            if masked:
                hl += 4
            if n - pos < hl + ln:
                break
            if cp is not None and b0 == 0x81 and not masked and buf.startswith(cp, pos + hl):
                counted += 1  # fast path: a complete text frame we only count
                pos += hl + ln
                continue
            payload = bytes(buf[pos + hl:pos + hl + ln])
            if masked:
                payload = apply_mask(payload, bytes(buf[pos + hl - 4:pos + hl]))
            pos += hl + ln
            op = b0 & 0x0F
            fin = b0 & 0x80
            if op == 0:  # continuation
                self._frag.append(payload)
                if fin:
                    payload = b"".join(self._frag)
                    self._frag = []
                    if cb:
                        cb(payload)
            elif op in (1, 2):
                if fin:
                    if cb:
                        cb(payload)
                else:
                    self._frag = [payload]
            elif op == 9:  # ping
                self.transport.write(encode_frame(payload, 10))
            elif op == 8:  # close
                try:
                    self.transport.write(encode_frame(payload[:2], 8))
                except Exception:
                    pass
                self.transport.close()
                break
        if counted:
            self.prefix_count += counted
            self.last_count_t = time.perf_counter()
        if pos:
            del buf[:pos]


class WSClient:
    """client = await WSClient.connect(url, on_message); client.send(bytes); await client.drain()"""

    def __init__(self, proto: _Proto):
        self._p = proto

    @classmethod
    async def connect(cls, url: str, on_message: Callable[[bytes], None] | None = None,
                      quickack: bool = True, timeout: float = 10.0,
                      count_prefix: bytes | None = None) -> "WSClient":
        u = urlsplit(url)
        host = u.hostname or "127.0.0.1"
        if host not in LOOPBACK:
            raise ValueError("benchmarks only talk to loopback")
        port = u.port or 80
        loop = asyncio.get_running_loop()
        transport, proto = await asyncio.wait_for(
            loop.create_connection(lambda: _Proto(on_message, quickack, count_prefix), host, port),
            timeout)
        sock = transport.get_extra_info("socket")
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if quickack:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, TCP_QUICKACK, 1)
            except OSError:
                pass
        key = base64.b64encode(os.urandom(16)).decode()
        path = u.path or "/"
        req = (f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
               f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
               f"Sec-WebSocket-Version: 13\r\nUser-Agent: relay-bench\r\n\r\n")
        transport.write(req.encode())
        await asyncio.wait_for(proto.handshake_done, timeout)
        return cls(proto)

    def set_handler(self, cb: Callable[[bytes], None]) -> None:
        self._p.on_message = cb

    def send(self, payload: bytes) -> None:
        """Queue one text frame (no await); call drain() now and then."""
        if self._p.transport.is_closing():
            raise WSClosed("connection closed")
        self._p.transport.write(encode_frame(payload))

    def send_many(self, payloads) -> None:
        if self._p.transport.is_closing():
            raise WSClosed("connection closed")
        self._p.transport.write(b"".join([encode_frame(p) for p in payloads]))

    async def drain(self) -> None:
        if self._p.transport.is_closing():
            raise WSClosed("connection closed")
        await self._p._can_write.wait()

    @property
    def prefix_count(self) -> int:
        """Frames that matched count_prefix (counted, never handed to the callback)."""
        return self._p.prefix_count

    @property
    def last_count_t(self) -> float:
        return self._p.last_count_t

    @property
    def closed(self) -> asyncio.Future:
        return self._p.closed

    @property
    def is_closed(self) -> bool:
        return self._p.closed.done() or self._p.transport.is_closing()

    async def close(self, timeout: float = 2.0) -> None:
        t = self._p.transport
        if t is None or t.is_closing():
            return
        try:
            t.write(encode_frame(struct.pack("!H", 1000), 8))
            await asyncio.wait_for(asyncio.shield(self._p.closed), timeout)
        except (asyncio.TimeoutError, Exception):
            pass
        finally:
            t.close()
