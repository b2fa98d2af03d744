"""strfry's write-policy plugin protocol: an external program judging events over JSON lines.

How this works (strfry's docs/plugins.md): the relay runs the plugin's
command once and writes one request per line to its stdin,
`{"type": "new", "event": {...}, "receivedAt": <unix seconds>, "sourceType":
"IP4" | "IP6" | "Import" | "Sync", "sourceInfo": <IP address or peer URL>}`;
the plugin prints one answer per line, `{"id": <event id>, "action": "accept"
| "reject" | "shadowReject", "msg": <OK message of a reject>}`.  Answers are
matched to requests by id, so they may come in any order.  A line that is not
such an answer refuses the event it names, or, naming none, the oldest one
waiting ("error:"); so does a line longer than `MAX_LINE_BYTES`, which is
skipped to its end without being kept.  A plugin that exits is started
again at the next event after a pause (1 s, doubling per exit up to 30 s; counted and logged), and
meanwhile its events are refused with "error:", never accepted unchecked; one
that overruns its time budget (`overran`, called by relay/ingest/policies.py)
is killed and started again at the next event.  One process per relay,
run by the relay process (with worker processes, it would run in the writer).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import deque

import orjson
import structlog

from relay.policies import ACTIONS, Verdict, reject
from relay.protocol.event import Event

log = structlog.get_logger(__name__)

NOT_RUNNING = "error: the write policy plugin is not running"
BAD_ANSWER = "error: the write policy plugin answered badly"
STOPPED = "error: the write policy plugin stopped"
FIRST_PAUSE_SECONDS, MAX_PAUSE_SECONDS = 1.0, 30.0
_STEADY_SECONDS = 60.0  # a plugin that ran this long before exiting starts again after the first pause
MAX_LINE_BYTES = 65_536
"""An answer line longer than this is a bad line (answers are an id, an action and a message)."""
_NAMED_ID = re.compile(rb'"id"\s*:\s*"([0-9a-f]{64})"')  # the id an overlong line names, if its head shows one


def request_line(event: Event, source: object, received_at: int) -> bytes:
    """One request of strfry's protocol for `event` from `source` (relay.ingest.Source), newline included."""
    name, ip = getattr(source, "name", ""), getattr(source, "ip", "")
    if name == "client":
        kind, info = ("IP6" if ":" in ip else "IP4"), ip
    elif name == "peer":
        kind, info = "Sync", getattr(source, "origin", "")
    else:
        kind, info = "Import", ""
    return b"".join((b'{"type":"new","event":', event.raw, b',"receivedAt":', str(received_at).encode(),
                     b',"sourceType":', orjson.dumps(kind), b',"sourceInfo":', orjson.dumps(info), b"}\n"))


def parse_answer(line: bytes) -> tuple[str | None, Verdict | None]:
    """(event id, verdict) of one answer line; (id or None, None) when it is not a valid answer."""
    try:
        answer = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None, None
    if type(answer) is not dict or type(answer.get("id")) is not str:
        return None, None
    action, msg = answer.get("action"), answer.get("msg", "")
    if action not in ACTIONS or type(msg) is not str:
        return answer["id"], None
    return answer["id"], reject(msg) if action == "reject" else Verdict(action)


class Plugin:
    """One plugin process, `command` (argv list), started at the first event; `await plugin(event, source)`
    answers its verdict.  `restarts` and `bad_lines` count what went wrong; `close()` kills it (then
    `await wait_closed()`)."""

    def __init__(self, name: str, command: list[str]) -> None:
        self.name = name
        self.command = command
        self.restarts = 0
        self.bad_lines = 0
        self._process: asyncio.subprocess.Process | None = None
        self._starting: asyncio.Task | None = None
        self._readers: set[asyncio.Task] = set()  # one per process not yet reaped
        self._waiting: dict[str, deque[asyncio.Future]] = {}
        self._order: deque[tuple[str, asyncio.Future]] = deque()  # requests in the order sent
        self._paused_until = 0.0  # monotonic seconds: not started again before
        self._pause = FIRST_PAUSE_SECONDS
        self._started_at = 0.0
        self._closed = False

    async def __call__(self, event: Event, source: object) -> Verdict:
        process = self._process or await self._start()
        if process is None or process is not self._process:  # not started, or let go while starting
            return reject(NOT_RUNNING)
        answer = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(event.id, deque()).append(answer)
        self._order.append((event.id, answer))
        try:
            process.stdin.write(request_line(event, source, int(time.time())))
            await process.stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            pass  # it exited: the reader's end of file answers every waiting request
        return await answer

    def overran(self) -> None:
        """Its answer came too late: kill it (every waiting request is refused); it starts again at once."""
        if self._process is not None:
            self.restarts += 1
            log.warning("policy_plugin_killed", policy=self.name, reason="time budget", restarts=self.restarts)
            self._let_go()

    def close(self) -> None:
        """Kill the process; the events waiting for it are refused."""
        self._closed = True
        self._let_go()

    async def wait_closed(self) -> None:
        """After `close()`: wait until the processes killed have exited and been reaped."""
        await asyncio.gather(*self._readers, return_exceptions=True)

    def _let_go(self) -> None:
        """Kill the process and forget it (its reader only reaps it); refuse what waits for it."""
        if self._process is not None and self._process.returncode is None:
            self._process.kill()
        self._process = None
        self._refuse_waiting()

    async def _start(self) -> asyncio.subprocess.Process | None:
        if self._closed or time.monotonic() < self._paused_until:
            return None
        if self._starting is None or self._starting.done():
            self._starting = asyncio.ensure_future(self._spawn())
        return await asyncio.shield(self._starting)

    async def _spawn(self) -> asyncio.subprocess.Process | None:
        self._started_at = time.monotonic()
        try:
            process = await asyncio.create_subprocess_exec(*self.command, stdin=asyncio.subprocess.PIPE,
                                                           stdout=asyncio.subprocess.PIPE, limit=MAX_LINE_BYTES)
        except OSError as exc:
            log.error("policy_plugin_not_started", policy=self.name, error=str(exc))
            self._pause_restart()
            return None
        log.info("policy_plugin_started", policy=self.name, pid=process.pid)
        self._process = process
        reader = asyncio.ensure_future(self._read(process))
        self._readers.add(reader)
        reader.add_done_callback(self._readers.discard)
        return process

    async def _read(self, process: asyncio.subprocess.Process) -> None:
        while line := await _read_line(process.stdout):
            if self._process is process:  # not one let go: its late answers are for requests refused
                self._answer(*line)
        await process.wait()
        self._exited(process)

    def _answer(self, line: bytes, whole: bool) -> None:
        """Settle the request `line` answers; `whole` False: `line` is only the head of an overlong line."""
        if whole:
            event_id, verdict = parse_answer(line)
        else:
            named = _NAMED_ID.search(line)
            event_id, verdict = (named[1].decode() if named else None), None
        if verdict is None or event_id not in self._waiting:
            self.bad_lines += 1
            log.warning("policy_plugin_bad_line", policy=self.name, line=line[:200].decode(errors="replace"),
                        overlong=not whole)
            if event_id not in self._waiting:  # it names no waiting event: the oldest one is refused
                event_id = self._oldest_waiting()
                if event_id is None:
                    return
            verdict = reject(BAD_ANSWER)
        futures = self._waiting[event_id]
        future = futures.popleft()
        if not futures:
            del self._waiting[event_id]
        if not future.done():
            future.set_result(verdict)
        self._oldest_waiting()  # drops the answered requests from the front of the order

    def _oldest_waiting(self) -> str | None:
        order = self._order
        while order and order[0][1].done():
            order.popleft()
        return order[0][0] if order else None

    def _exited(self, process: asyncio.subprocess.Process) -> None:
        if self._process is not process:  # let go already (`overran`, `close`)
            return
        self._process = None
        self._refuse_waiting()
        self.restarts += 1
        log.error("policy_plugin_exited", policy=self.name, code=process.returncode, restarts=self.restarts)
        self._pause_restart()

    def _pause_restart(self) -> None:
        if time.monotonic() - self._started_at >= _STEADY_SECONDS:
            self._pause = FIRST_PAUSE_SECONDS
        self._paused_until = time.monotonic() + self._pause
        self._pause = min(self._pause * 2, MAX_PAUSE_SECONDS)

    def _refuse_waiting(self) -> None:
        waiting, self._waiting, self._order = self._waiting, {}, deque()
        for futures in waiting.values():
            for future in futures:
                if not future.done():
                    future.set_result(reject(STOPPED))


async def _read_line(stream: asyncio.StreamReader) -> tuple[bytes, bool] | None:
    """The next line of `stream` (its limit is MAX_LINE_BYTES) as (line, True), or (its first bytes, False) for a
    longer line, whose rest is read and dropped; None at the end of the stream."""
    try:
        return await stream.readuntil(b"\n"), True
    except asyncio.IncompleteReadError as end:  # a last line without its newline, or nothing
        return (end.partial, True) if end.partial else None
    except asyncio.LimitOverrunError as overrun:
        head = await stream.readexactly(overrun.consumed)  # what the buffer holds, at most about the limit
    while True:  # drop the rest, a buffer at a time, up to and with its newline
        try:
            await stream.readuntil(b"\n")
        except asyncio.LimitOverrunError as overrun:
            await stream.readexactly(overrun.consumed)
            continue
        except asyncio.IncompleteReadError:
            pass  # the output ended inside it
        return head, False
