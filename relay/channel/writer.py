"""The writer process's side of the local channel: workers' events in, outcomes, commits and heartbeats out.

How this works: `ChannelServer` listens on the relay's Unix socket (mode
0600, in its runtime directory).  Each worker connection gets a task that
reads one frame at a time; before it reads the next, it waits while the
store's writer queue is full (`Store.wait_for_room`), so a full writer stops
this worker's connections from reading, not a buffer growing here.  A
`submit` becomes an `Event` again without a second signature check (the
worker verified it: `frames.decode_submit`) and goes through ingest's writer stage
(`Ingest.take_verified`: the `[[policies]]`, then the writer queue, or
live when ephemeral); its outcome goes back after the COMMIT (an `outcomes` frame).
After each write transaction one `commit` frame goes to every worker
(coalesced: one per loop iteration); ephemeral events go to every worker as
`ephemeral`; a `heartbeat` every `HEARTBEAT_SECONDS` lets workers tell a
live writer from a stuck or dead one.  A `job` (a worker's NIP-86 change) runs
on the store's writer; then every worker is told to read the moderation
lists again (`moderation`), and the job is answered once each has said so
(`moderation_loaded`, waited for at most `MODERATION_WAIT_SECONDS`): a NIP-86
change answered is in force in every worker.  A worker that stops reading its
frames (more than `MAX_UNREAD_BYTES` waiting) is disconnected: it exits and
is restarted, as a slow reader is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
from functools import partial
from pathlib import Path

import orjson
import structlog

from relay.channel import frames
from relay.ingest import Ingest, Outcome
from relay.ingest.outcome import INTERNAL
from relay.protocol.event import Event
from relay.store.store import JobFailed, StoreFailed
from relay.store.writes import Changes

log = structlog.get_logger(__name__)

MAX_UNREAD_BYTES = 256 * 1024 * 1024  # frames written to one worker and not yet read by it
MODERATION_WAIT_SECONDS = 5.0  # for every worker to read the moderation lists again after a job (then logged)


class ChannelServer:
    """The writer's end: `await start()`, `await close()`; `workers` counts the connected workers (hello)."""

    def __init__(self, path: Path, ingest: Ingest) -> None:
        self.path = path
        self.ingest = ingest
        self.workers: dict[frames.FrameWriter, int] = {}  # connected workers -> index, once they said hello
        self.ready = asyncio.Event()  # set at each hello (the supervisor counts them)
        self._server: asyncio.Server | None = None
        self._heartbeat: asyncio.Task | None = None
        self._commit_pending = False
        self._head = 0  # the largest change feed position committed with an insertion
        self._tasks: set[asyncio.Task] = set()
        self._reload_ids = itertools.count(1)
        self._reloading: dict[int, tuple[set[asyncio.StreamWriter], asyncio.Event]] = {}  # id -> workers to hear

    async def start(self) -> None:
        """Listen on `path` (a stale socket file removed first), only this user may connect, and start beating.

        Raises:
            OSError: the socket cannot be made.
        """
        frames.remove_stale(self.path)
        self._server = await asyncio.start_unix_server(self._serve, self.path, limit=frames.MAX_FRAME_BYTES)
        os.chmod(self.path, 0o600)
        self._heartbeat = asyncio.create_task(self._beat_forever(), name="channel-heartbeat")

    async def close(self) -> None:
        """Stop listening and drop every worker connection; the socket file is removed."""
        if self._heartbeat is not None:
            self._heartbeat.cancel()
        if self._server is not None:
            self._server.close()
        for out in list(self.workers):
            out.writer.close()
        for task in list(self._tasks):
            task.cancel()
        frames.remove_stale(self.path)

    def on_commit(self, changes: Changes) -> None:
        """Store listener: after a write transaction, wake every worker (one frame per loop iteration)."""
        if not changes.inserted:
            return
        self._head = max(self._head, *changes.seqs)
        if not self._commit_pending:
            self._commit_pending = True
            asyncio.get_running_loop().call_soon(self._send_commit)

    def broadcast_ephemeral(self, event: Event) -> None:
        """Ingest's `live`: an ephemeral event taken here goes to every worker's live subscriptions."""
        self._broadcast({"type": "ephemeral", "event": orjson.Fragment(event.raw), "d": event.d_tag,
                         "expiration": event.expiration})

    def _send_commit(self) -> None:
        self._commit_pending = False
        self._broadcast({"type": "commit", "head": self._head})  # the largest position committed with an insertion

    def _broadcast(self, frame: dict) -> None:
        data = frames.encode(frame)
        for out in list(self.workers):
            self._write(out, data)

    def _write(self, out: frames.FrameWriter, data: bytes) -> None:
        if out.buffered() > MAX_UNREAD_BYTES:
            log.error("worker_not_reading", worker=self.workers.get(out))
            out.writer.close()
            return
        out.send_encoded(data)

    async def _beat_forever(self) -> None:
        while True:
            await asyncio.sleep(frames.HEARTBEAT_SECONDS)
            self._broadcast({"type": "heartbeat"})

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._tasks.add(task)
        out = frames.FrameWriter(writer)
        outcomes = frames.ItemFrames("outcomes", partial(self._write, out))
        try:
            while True:
                await self.ingest.wait_for_room()  # back-pressure: a full writer stops this worker's submits
                frame = await frames.read_frame(reader)
                if frame is None:
                    break
                self._handle(out, outcomes, frame)
        except (ConnectionError, asyncio.IncompleteReadError) as exc:
            log.warning("channel_closed", worker=self.workers.get(out), error=repr(exc))
        except asyncio.CancelledError:  # close(), the relay stopping: its command-line writers see the channel
            pass  # close.  (Ended, not cancelled: asyncio's streams log a cancelled handler with a traceback.)
        finally:
            self._tasks.discard(task)
            self.workers.pop(out, None)
            for request in list(self._reloading):  # a worker gone reads no lists: not waited for
                self._reloaded(out, request)
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    def _handle(self, out: frames.FrameWriter, outcomes: frames.ItemFrames, frame: dict) -> None:
        kind = frame.get("type")
        if kind == "submit":
            for item in frame["items"]:
                try:
                    request, event, source = frames.decode_submit(item)
                except (KeyError, TypeError, ValueError) as exc:  # a worker's bug, not a client's input
                    log.error("channel_bad_submit", error=repr(exc))
                    _answer(outcomes, item[0], INTERNAL)
                    continue
                self.ingest.take_verified(event, source, partial(_answer, outcomes, request))
        elif kind == "job":
            self._spawn(self._run_job(out, frame["id"], frame["job"]))
        elif kind == "moderation_loaded":
            self._reloaded(out, frame["id"])
        elif kind == "hello":
            self.workers[out] = frame.get("worker", -1)
            self.ready.set()
        else:
            log.warning("channel_unknown_frame", type=kind)

    def _spawn(self, coroutine) -> None:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run_job(self, out: frames.FrameWriter, request: int, packed: str) -> None:
        """Run a worker's store job on the writer (NIP-86 management), answer it, then tell every worker to
        read the moderation lists again (the writer's own copy first)."""
        answer: dict = {"type": "job_done", "id": request}
        try:
            job, args = frames.unpack(packed)
            refused = self.ingest.moderation and self.ingest.moderation.refusal(job, args)  # this relay's config
            answer["result"] = frames.pack(refused or await self.ingest.store.run_job(job, *args))
        except Exception as exc:  # the job's failure is the caller's answer (JobFailed there, or StoreFailed)
            answer["error"] = str(exc) if isinstance(exc, (JobFailed, StoreFailed)) else repr(exc)
            answer["fatal"] = isinstance(exc, StoreFailed)
        if self.ingest.moderation is not None:
            await self.ingest.moderation.load()
        await self._reload_everywhere()
        self._write(out, frames.encode(answer))

    async def _reload_everywhere(self) -> None:
        """Tell every worker to read the moderation lists again; return once each has (a `moderation_loaded`
        frame) or is gone, or after MODERATION_WAIT_SECONDS (logged)."""
        request = next(self._reload_ids)
        waiting, heard = set(self.workers), asyncio.Event()
        self._reloading[request] = (waiting, heard)
        self._broadcast({"type": "moderation", "id": request})
        try:
            if waiting:
                await asyncio.wait_for(heard.wait(), MODERATION_WAIT_SECONDS)
        except TimeoutError:
            log.warning("moderation_reload_late", workers=sorted(self.workers.get(w, -1) for w in waiting))
        finally:
            del self._reloading[request]

    def _reloaded(self, out: frames.FrameWriter, request: int) -> None:
        if (entry := self._reloading.get(request)) is not None:
            waiting, heard = entry
            waiting.discard(out)
            if not waiting:
                heard.set()


def _answer(outcomes: frames.ItemFrames, request: int, outcome: Outcome) -> None:
    outcomes.add(frames.encode_outcome(request, outcome))
