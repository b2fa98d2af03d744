"""Frames of the local channel: a 4-byte big-endian length, then one JSON object (orjson) with a "type".

| type        | direction        | fields                                                               |
|-------------|------------------|----------------------------------------------------------------------|
| `hello`     | worker -> writer | `worker` (index): sent once the worker listens                       |
| `submit`    | worker -> writer | `items`: `encode_submit` of each event (verified)                    |
| `outcomes`  | writer -> worker | `items`: `encode_outcome` of each submit answered (after its COMMIT) |
| `commit`    | writer -> all    | `head`: the feed's largest position committed; read the change feed  |
| `ephemeral` | writer -> all    | `event` (canonical JSON), `d`, `expiration`: fan out, never stored   |
| `heartbeat` | writer -> all    | every `HEARTBEAT_SECONDS`: the writer is alive                       |
| `job`       | worker -> writer | `id`, `job`: a store job and its arguments (pickled, base64)         |
| `job_done`  | writer -> worker | `id`, `result` (pickled, base64) or `error` (text) and `fatal` (the writer failed) |
| `moderation`| writer -> all    | `id`: a job changed the moderation lists: read them again            |
| `moderation_loaded` | worker -> writer | `id`: read again; the job is answered once every worker has  |

Submits and outcomes of one event-loop iteration travel as one frame
(`ItemFrames`): a burst of events costs the other end one frame to read and
one JSON document to parse, not one per event.

A `job` is what `Store.run_job` runs (NIP-86 management in a worker: bans,
allow lists, roles); it is pickled, which only the relay's own processes
may send: the socket is its user's alone (mode 0600 in a 0700 directory),
and that user can write the database anyway.

A `source` is the `Source` fields the writer's stage reads (relay/ingest/source.py):
`name`, `origin`, `ip`, `pubkeys`, `fans_out_ephemeral`.
"""

from __future__ import annotations

import asyncio
import base64
import os
import pickle
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path

import orjson

from relay.ingest import Outcome, Source
from relay.protocol.event import Event, trusted_event_object
from relay.runtime import runtime_dir

HEARTBEAT_SECONDS = 0.25
MAX_FRAME_BYTES = 64 * 1024 * 1024  # far above one event (limits.max_message_bytes): a corrupt length, not data
SOCKET_NAME = "writer.sock"


class ChannelError(ConnectionError):
    """The other end sent something that is not a frame (a length past MAX_FRAME_BYTES, bad JSON)."""


def socket_path(db_path: str | Path) -> Path:
    """The writer's channel socket of the relay serving the database at `db_path` (relay/runtime.py)."""
    return runtime_dir(db_path) / SOCKET_NAME


def encode(frame: dict) -> bytes:
    """One frame: length prefix and JSON."""
    body = orjson.dumps(frame)
    return len(body).to_bytes(4, "big") + body


class FrameWriter:
    """Frames to one end of the channel, written together once per event-loop iteration.

    `send(frame)` costs no system call: frames sent in one iteration (a burst of submits, the outcomes
    of one commit) leave in one write, not one each.  `buffered()` is what waits here and in the
    transport, in bytes.
    """

    __slots__ = ("writer", "_pending", "_size")

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self._pending: list[bytes] = []
        self._size = 0

    def send(self, frame: dict) -> None:
        """Queue `frame`; dropped when the connection is closing."""
        self.send_encoded(encode(frame))

    def send_encoded(self, data: bytes) -> None:
        """Queue one frame already encoded (the same bytes to every worker)."""
        if self.writer.is_closing():
            return
        if not self._pending:
            asyncio.get_running_loop().call_soon(self._flush)
        self._pending.append(data)
        self._size += len(data)

    def buffered(self) -> int:
        """Bytes not yet taken by the other end's socket."""
        return self._size + self.writer.transport.get_write_buffer_size()

    def _flush(self) -> None:
        pending, self._pending, self._size = self._pending, [], 0
        if not self.writer.is_closing():
            self.writer.write(b"".join(pending))


async def read_frame(reader: asyncio.StreamReader) -> dict | None:
    """The next frame, or None at a clean end of stream.

    Raises:
        ChannelError: not a frame.
        asyncio.IncompleteReadError: the stream ended inside a frame.
    """
    try:
        header = await reader.readexactly(4)
    except asyncio.IncompleteReadError as exc:
        if exc.partial:
            raise
        return None
    size = int.from_bytes(header, "big")
    if size > MAX_FRAME_BYTES:
        raise ChannelError(f"frame of {size} bytes")
    try:
        frame = orjson.loads(await reader.readexactly(size))
    except orjson.JSONDecodeError as exc:
        raise ChannelError(f"bad frame: {exc}") from None
    if type(frame) is not dict:
        raise ChannelError("a frame is a JSON object")
    return frame


def encode_submit(request: int, event: Event, source: Source) -> list:
    """The item of a `submit` frame: [request, event (its canonical JSON), d tag, expiration, source], where the
    source is what the writer's stage needs of it (its callables ran in the worker): [name, origin, ip,
    pubkeys, fans_out_ephemeral]."""
    return [request, orjson.Fragment(event.raw), event.d_tag, event.expiration,
            [source.name, source.origin, source.ip, sorted(source.pubkeys), source.fans_out_ephemeral]]


def decode_submit(item: list) -> tuple[int, Event, Source]:
    """(request, event, source) of an item made by `encode_submit`.

    Raises:
        ValueError, TypeError, KeyError: not such an item.
    """
    request, obj, d_tag, expiration, (name, origin, ip, pubkeys, fans_out_ephemeral) = item
    return (request, trusted_event_object(obj, d_tag, expiration),
            _source(name, origin, ip, tuple(pubkeys), fans_out_ephemeral))


@lru_cache(maxsize=4096)
def _source(name: str, origin: str, ip: str, pubkeys: tuple[str, ...], fans_out_ephemeral: bool) -> Source:
    # One per client IP and identity, not one per event: a burst of submits shares a handful of them.
    return Source(name, origin=origin, fans_out_ephemeral=fans_out_ephemeral, ip=ip, pubkeys=frozenset(pubkeys))


def encode_outcome(request: int, outcome: Outcome) -> list:
    """The item of an `outcomes` frame answering submit `request`: [request, accepted, prefix, reason, settles]."""
    return [request, outcome.accepted, outcome.prefix, outcome.reason, outcome.settles]


def decode_outcome(item: list) -> tuple[int, Outcome]:
    """(request, `Outcome`) of an item made by `encode_outcome`."""
    request, accepted, prefix, reason, settles = item
    return request, Outcome(accepted, prefix, reason, settles)


class ItemFrames:
    """Items of one frame type gathered over an event-loop iteration and sent as one frame,
    `{"type": type, "items": [...]}`, through `send(encoded)`; `flush()` sends what is gathered now."""

    __slots__ = ("type", "_send", "_items")

    def __init__(self, frame_type: str, send: Callable[[bytes], None]) -> None:
        self.type = frame_type
        self._send = send
        self._items: list = []

    def add(self, item: object) -> None:
        """Gather `item` for this iteration's frame."""
        if not self._items:
            asyncio.get_running_loop().call_soon(self.flush)
        self._items.append(item)

    def flush(self) -> None:
        """Send the items gathered, if any, as one frame."""
        if self._items:
            items, self._items = self._items, []
            self._send(encode({"type": self.type, "items": items}))


def pack(value: object) -> str:
    """`value` pickled, as base64 text (a `job` frame's job, a `job_done` frame's result)."""
    return base64.b64encode(pickle.dumps(value)).decode()


def unpack(text: str) -> object:
    """The value `pack` made (only ever from this relay's own processes: see the module comment)."""
    return pickle.loads(base64.b64decode(text))


def remove_stale(path: Path) -> None:
    """Remove a socket file left by a relay that died (the database lock says none runs now)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
