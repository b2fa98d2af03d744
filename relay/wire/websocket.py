"""The socket of one WebSocket connection: frames out, progress of the peer's reading, pings, resets.

How this works: `Wire` is the only code that touches the socket of a client
of ours, and `send_texts` the only one that writes to a peer relay we are a
client of (relay/sync/peer.py).  Both write a batch of messages per
flow-control wait, inside websockets' `send_context` (which keeps the close
handshake and flow control right): the server's text frames are built here
and handed to the transport in one write.  Whether the peer reads is measured by the
bytes its TCP acknowledged (`TCP_INFO`), which both the stored-results pacing
(`send_watched`) and the keepalive (relay/server/keepalive.py) look at every 0.5 s.  A
connection dropped for not reading closes with SO_LINGER 0: what the peer has
not taken is discarded, not kept in the kernel.
"""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import Awaitable, Callable, Iterable
from functools import partial

from websockets.asyncio.client import ClientConnection
from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed
from websockets.protocol import State

# RFC 6455 section 5.2: FIN + text opcode, then the payload length in 7, 7+16 or 7+64 bits;
# a server's frames are not masked, and no extension is negotiated (compression=None).
_TEXT_FRAME = 0x81
_LENGTH_16 = struct.Struct("!BBH")
_LENGTH_64 = struct.Struct("!BBQ")
PROGRESS_CHECK_SECONDS = 0.5  # how often a write waiting on the socket, or a ping, looks for progress
TCP_INFO = getattr(socket, "TCP_INFO", None)
"""Linux's `TCP_INFO` socket option, None where the platform has none (then `taken_bytes` counts the bytes
handed to the kernel instead; tests set it to None to take that path)."""
# Linux's struct tcp_info (netinet/tcp.h): tcpi_bytes_acked, the bytes the peer has acknowledged, is a u64 at 120
_TCP_INFO_BYTES = 256  # room for the whole struct, of whichever kernel version
_BYTES_ACKED = struct.Struct("=Q")
_BYTES_ACKED_OFFSET = 120
_LINGER_RESET = struct.pack("ii", 1, 0)  # struct linger {l_onoff, l_linger}


def text_frame_header(size: int) -> bytes:
    """The header of an unmasked, final text frame carrying `size` bytes (RFC 6455 section 5.2)."""
    if size < 126:
        return bytes((_TEXT_FRAME, size))
    if size < 65536:
        return _LENGTH_16.pack(_TEXT_FRAME, 126, size)
    return _LENGTH_64.pack(_TEXT_FRAME, 127, size)


def reset(ws: ServerConnection) -> None:
    """End `ws`'s TCP connection now (RST), discarding whatever it has not sent, whatever its WebSocket state
    (a peer leaving, or shutdown's deadline passed); nothing when it has ended already."""
    _discard_unsent_on_close(ws)
    ws.transport.abort()


def _discard_unsent_on_close(ws: ServerConnection) -> None:
    # SO_LINGER on, 0 s: closing the socket resets the connection and frees its send queue at once.
    sock = ws.transport.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
        except (OSError, ValueError):
            pass  # closed already (uvloop's socket object raises ValueError: negative file descriptor)


class Progress:
    """How long a peer has taken nothing of what was written to it, from looks every `PROGRESS_CHECK_SECONDS`
    at its `Wire.taken_bytes()`; no baseline before the first look."""

    __slots__ = ("taken", "still")

    def __init__(self) -> None:
        self.taken: int | None = None
        self.still = 0.0

    def look(self, taken: int) -> float:
        """Seconds without progress, given the bytes taken now (0.0 after progress, or at the first look)."""
        self.still = 0.0 if self.taken is None or taken > self.taken else self.still + PROGRESS_CHECK_SECONDS
        self.taken = taken
        return self.still


class RateWindow:
    """Whether a peer takes one stored answer at `min_rate` bytes per second at least, over windows of
    `seconds`: when the current window began (loop seconds; None before the first look) and the
    taken-bytes count then (`Wire.taken_bytes`)."""

    __slots__ = ("seconds", "min_rate", "start", "taken")

    def __init__(self, seconds: float, min_rate: float) -> None:
        self.seconds = seconds
        self.min_rate = min_rate
        self.start: float | None = None
        self.taken = 0

    def too_slow(self, now: float, taken: int) -> bool:
        """True when the window has lasted `seconds` and less than `min_rate` bytes per second were taken in it;
        a window that has lasted that long and was fast enough is begun again at `now`."""
        if self.start is not None and now - self.start < self.seconds:
            return False
        if self.start is not None and taken - self.taken < self.min_rate * (now - self.start):
            return True
        self.start, self.taken = now, taken
        return False


class Wire:
    """One client's WebSocket `ws` (websockets' connection, open): `recv()` a message, `send_many` frames.

    `recv()` returns each message as bytes, undecoded (orjson checks UTF-8
    itself); it raises `ConnectionClosed` once the socket has closed.
    """

    def __init__(self, ws: ServerConnection) -> None:
        self.ws = ws
        self.recv: Callable[[], Awaitable[bytes]] = partial(ws.recv, decode=False)  # no wrapper per message
        self._written = 0  # bytes of frames given to the transport (`taken_bytes` where TCP_INFO is missing)

    def unsent_bytes(self) -> int:
        """Bytes written to this socket that the kernel has not taken yet (the transport's buffer)."""
        return self.ws.transport.get_write_buffer_size()

    async def send(self, message: bytes) -> None:
        """Send one UTF-8 JSON message as a text frame (waits while the send buffer is full)."""
        await self.send_many([message])

    async def send_many(self, messages: list[bytes]) -> None:
        """Write UTF-8 JSON messages as text frames, then wait while the send buffer is full; `messages` is
        emptied once written, so while the socket is slow they are held once (in the transport), not twice.

        websockets' `send_context` is the primitive its own `send` uses; one
        context per batch pays the flow-control wait once, not per message,
        and the frames go to the socket in one write.  The frame headers are
        built here: websockets' `protocol.send_text` builds a frame object and
        copies each payload twice, several times the cost per frame.

        Raises:
            ConnectionClosed: the socket is closed.
        """
        async with self.ws.send_context():  # enters only while the connection is open
            data = b"".join([piece for message in messages
                             for piece in (text_frame_header(len(message)), message)])
            messages.clear()
            self._written += len(data)
            self.ws.transport.write(data)
            del data  # while the socket is slow, what it has not taken stays in the transport only

    async def send_watched(self, messages: list[bytes], seconds: float, window: RateWindow | None) -> bool:
        """`send_many`, given up (False) once the peer has taken nothing of what was written for `seconds`,
        or too little for `window` (None: no minimum rate); True once sent.

        Raises:
            ConnectionClosed: the socket is closed.
        """
        return await self._while_taking(self.send_many(messages), self.ws.drain, seconds, window)

    def drop(self, code: int, reason: str) -> bool:
        """Close for not reading or not answering in time: True when the close handshake begins (with `code`
        and `reason`); False when the WebSocket is no longer open (its peer is leaving, or the relay is
        closing it), and the connection is reset at once: what its peer did not read is of no use to it.

        The close frame waits behind what the socket holds; when the close handshake has not ended within
        websockets' close timeout (10 s), the TCP connection is reset and its unsent bytes discarded. Left to
        websockets, a dropped non-reader stayed connected until it read (the close waits for the socket to
        drain), and then its socket held 3 MB in the kernel (FIN-WAIT-1) for minutes.
        """
        if self.ws.state is not State.OPEN:
            reset(self.ws)
            return False
        _discard_unsent_on_close(self.ws)
        asyncio.create_task(self._close_or_reset(code, reason))
        return True

    async def close(self, code: int, reason: str) -> None:
        """Begin the close handshake (RFC 6455 section 7) and wait for its end."""
        await self.ws.close(code, reason)

    async def _close_or_reset(self, code: int, reason: str) -> None:
        try:
            async with asyncio.timeout(self.ws.close_timeout):
                await self.ws.close(code, reason)
        except TimeoutError:
            reset(self.ws)

    async def ping(self) -> None:
        """Ping the peer (RFC 6455 section 5.5.2) and return once it answers, or once the socket closes."""
        try:
            await (await self.ws.ping())
        except ConnectionClosed:
            pass  # the read loop ends too, and the keepalive forgets this wire

    async def _while_taking(self, waiting: Awaitable, then: Callable[[], Awaitable], seconds: float,
                            window: RateWindow | None = None) -> bool:
        """Await `waiting`, looking every 0.5 s whether the peer takes what was written to it: False,
        `waiting` cancelled, once it has taken nothing for `seconds`, or too little for `window` (which
        begins at its first look and may span several calls); True when `waiting` is done.
        After each look `then()` is awaited in its place (`waiting` is cancelled by the look).

        Progress is the bytes the peer's TCP acknowledges. Waiting for the socket to become writable
        is no measure: the kernel reports that only once a third of its send buffer (grown up to 4 MiB)
        is free, and a client reading a steady 64 kB/s was dropped after about 70 s when each 256 KiB
        chunk had 15 s to be written. Nor are the unsent bytes going down: other writes (live events, the
        answer beside a ping) add to them.

        Raises:
            ConnectionClosed: the socket is closed.
        """
        progress = Progress()  # no baseline before the first look: most writes never wait that long
        loop = asyncio.get_running_loop()
        while True:
            try:
                async with asyncio.timeout(PROGRESS_CHECK_SECONDS):
                    await waiting
                return True
            except TimeoutError:  # what was written stays with the transport
                pass
            taken = self.taken_bytes()
            if progress.look(taken) >= seconds or (window is not None and window.too_slow(loop.time(), taken)):
                return False
            waiting = then()

    def taken_bytes(self) -> int:
        """A count of bytes that grows as the peer takes what was written to it: its TCP acknowledged
        bytes (`tcp_info.tcpi_bytes_acked`, Linux 4.1+); elsewhere, the bytes the transport has handed to
        the kernel (written by `send_many`, less those still unsent): it never falls when more is written."""
        transport = self.ws.transport
        sock = transport.get_extra_info("socket")
        if TCP_INFO is not None and sock is not None:
            try:
                info = sock.getsockopt(socket.IPPROTO_TCP, TCP_INFO, _TCP_INFO_BYTES)
            except OSError:
                info = b""
            if len(info) >= _BYTES_ACKED.size + _BYTES_ACKED_OFFSET:
                return _BYTES_ACKED.unpack_from(info, _BYTES_ACKED_OFFSET)[0]
        return self._written - transport.get_write_buffer_size()


async def send_texts(ws: ClientConnection, messages: Iterable[bytes]) -> None:
    """Send UTF-8 JSON `messages` to the relay at the other end of `ws` as text frames, then wait while the send
    buffer is full: websockets' flow-control wait paid once for the batch, not per message.

    `protocol.send_text` is what websockets' own `send` calls inside `send_context`: it masks each frame, as a
    client's must be (RFC 6455 section 5.3).

    Raises:
        ConnectionClosed: the socket is closed.
    """
    async with ws.send_context():
        for message in messages:
            ws.protocol.send_text(message)
