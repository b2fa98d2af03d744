"""A worker process's side of the local channel: submits to the writer, outcomes back, commits and heartbeats.

How this works: `WriterChannel.submit` is a worker's ingest sink (after the
signature check and NIP-70): it adds the event to this iteration's `submit` frame and keeps
`done` under a request id until its outcome comes back (an `outcomes` frame).  At most
`max_in_flight` submits wait for outcomes; past that `wait_for_room` blocks,
which is where a connection waits before it reads its next EVENT, so a
writer that is behind stops this worker's clients, as its full queue does in
one process.  `run()` reads the writer's frames until the channel closes:
each `commit` calls `on_commit(head)` with the largest position committed
and each `heartbeat` `on_commit(None)` (the feed follower reads the change feed), each `ephemeral` calls `on_ephemeral`.  `run_job` is a worker's
write path for store jobs (`Moderation`'s and `Ingest`'s `writer`): NIP-86 changes run on the writer (a `job` frame).  When the channel
closes, every submit still waiting is answered "error:" (a job raises
`StoreFailed`) and `run` returns:
the worker must then stop, since nothing it takes could be acknowledged.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import structlog

from relay.channel import frames
from relay.ingest import Outcome, Source
from relay.protocol.event import Event, trusted_event_object
from relay.store.store import JobFailed, StoreFailed

log = structlog.get_logger(__name__)

WRITER_GONE = Outcome(False, "error", "the relay cannot store events now")


class WriterChannel:
    """A worker's connection to the writer at `path`; `connect()`, then `run()` until the writer is gone.

    `on_commit(head)` runs on each commit wake-up (`head`: the largest change feed position committed) and
    heartbeat (None); `on_ephemeral(event)` for each ephemeral event;
    `await on_moderation()` when the moderation lists changed (read them again: the writer waits for it).
    """

    def __init__(self, path: Path, max_in_flight: int, on_commit: Callable[[int | None], None],
                 on_ephemeral: Callable[[Event], None], on_moderation: Callable[[], Awaitable[None]]) -> None:
        self.path = path
        self.max_in_flight = max_in_flight
        self.on_commit = on_commit
        self.on_ephemeral = on_ephemeral
        self.on_moderation = on_moderation
        self._jobs: dict[int, asyncio.Future] = {}
        self.last_frame = 0.0  # time.monotonic() of the last frame from the writer
        self._reader: asyncio.StreamReader | None = None
        self._out: frames.FrameWriter | None = None
        self._submits: frames.ItemFrames | None = None
        self._ids = itertools.count(1)
        self._waiting: dict[int, Callable[[Outcome], None]] = {}
        self._room = asyncio.Event()
        self._room.set()
        self._closed = False
        self._reloads: set[asyncio.Task] = set()

    async def connect(self) -> None:
        """Connect to the writer's socket.

        Raises:
            OSError: no writer listens there.
        """
        self._reader, writer = await asyncio.open_unix_connection(self.path, limit=frames.MAX_FRAME_BYTES)
        self._out = frames.FrameWriter(writer)
        self._submits = frames.ItemFrames("submit", self._out.send_encoded)
        self.last_frame = time.monotonic()

    def hello(self, index: int) -> None:
        """Tell the writer that worker `index` listens (from now on it is sent commits and ephemeral events)."""
        self._send({"type": "hello", "worker": index})

    @property
    def closed(self) -> bool:
        """Whether the channel has closed (the writer is gone, or `close()` was called)."""
        return self._closed

    def reached_within(self, seconds: float) -> bool:
        """Whether a frame came from the writer within the last `seconds` (the /health answer)."""
        return not self._closed and time.monotonic() - self.last_frame < seconds

    def submit(self, event: Event, source: Source, done: Callable[[Outcome], None]) -> None:
        """Ingest's sink here: hand `event` (verified) to the writer; `done(outcome)` once it has answered."""
        if self._closed:
            done(WRITER_GONE)
            return
        request = next(self._ids)
        self._waiting[request] = done
        if len(self._waiting) >= self.max_in_flight:
            self._room.clear()
        self._submits.add(frames.encode_submit(request, event, source))

    async def wait_for_room(self) -> None:
        """Wait while `max_in_flight` submits wait for their outcomes (back-pressure, as `Store.wait_for_room`)."""
        if not self._room.is_set():
            await self._room.wait()

    async def run_job(self, job: Callable, *args) -> object:
        """`Store.run_job` in a worker: the writer process runs `job(conn, hooks, *args)`; its result.

        Raises:
            JobFailed: the job raised there (the writer goes on).
            StoreFailed: the writer failed, or is gone.
        """
        if self._closed:
            raise StoreFailed(WRITER_GONE.reason)
        request = next(self._ids)
        future = self._jobs[request] = asyncio.get_running_loop().create_future()
        self._send({"type": "job", "id": request, "job": frames.pack((job, args))})
        return await future

    async def run(self) -> None:
        """Read the writer's frames until the channel closes (then every waiting submit gets "error:")."""
        try:
            while (frame := await frames.read_frame(self._reader)) is not None:
                self.last_frame = time.monotonic()
                self._handle(frame)
        except (ConnectionError, asyncio.IncompleteReadError) as exc:
            log.error("channel_failed", error=repr(exc))
        finally:
            self._closed = True
            waiting, self._waiting = self._waiting, {}
            self._room.set()
            for done in waiting.values():
                done(WRITER_GONE)
            jobs, self._jobs = self._jobs, {}
            for future in jobs.values():
                future.done() or future.set_exception(StoreFailed(WRITER_GONE.reason))

    def close(self) -> None:
        """Close the connection (`run` then returns)."""
        if self._out is not None:
            self._out.writer.close()

    def _handle(self, frame: dict) -> None:
        kind = frame.get("type")
        if kind == "outcomes":
            for item in frame["items"]:
                request, outcome = frames.decode_outcome(item)
                if (done := self._waiting.pop(request, None)) is not None:
                    done(outcome)
            if len(self._waiting) < self.max_in_flight:
                self._room.set()
        elif kind == "commit":
            self.on_commit(frame.get("head"))
        elif kind == "heartbeat":
            self.on_commit(None)
        elif kind == "job_done":
            future = self._jobs.pop(frame["id"], None)
            if future is None or future.done():
                return
            if "error" in frame:  # the writer failed, or only this job did
                future.set_exception((StoreFailed if frame.get("fatal") else JobFailed)(frame["error"]))
            else:
                future.set_result(frames.unpack(frame["result"]))
        elif kind == "moderation":
            self._spawn_reload(frame["id"])
        elif kind == "ephemeral":
            self.on_ephemeral(trusted_event_object(frame["event"], frame["d"], frame["expiration"]))

    def _spawn_reload(self, request: int) -> None:
        task = asyncio.ensure_future(self._reload(request))
        self._reloads.add(task)
        task.add_done_callback(self._reloads.discard)

    async def _reload(self, request: int) -> None:
        """Read the moderation lists again, then tell the writer (which answers the NIP-86 change only then)."""
        await self.on_moderation()
        self._send({"type": "moderation_loaded", "id": request})

    def _send(self, frame: dict) -> None:
        self._submits.flush()  # frames leave in the order they were made
        self._out.send(frame)
