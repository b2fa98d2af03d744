"""`relay import` and `relay export`: JSONL into and out of the store.

Each imported line goes through ingest as `IMPORT` (relay/ingest/source.py): shape,
id, BIP-340 signature, the event rules and the `[auth]` kind rules, not who
may publish (the operator imports), then the same writer, so the outcome
counts are those a client would have been told in its OK replies.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
import sys
from collections import Counter, deque
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import orjson

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

from relay.commands import SERVED_DATABASE_HINT, check_database_path, path_error, refuse_store_file
from relay.commands.interrupt import EXIT_INTERRUPTED, interruptible
from relay.commands.linereader import PAUSED, LineReader
from relay.commands.through import open_write_path
from relay.config import Config
from relay.ingest import IMPORT, Ingest, Outcome
from relay.ingest.checking import CheckingPool, default_processes
from relay.ingest.outcome import EPHEMERAL, NEWER_VERSION
from relay.protocol.envelopes import loads
from relay.protocol.event import Event, event_ref
from relay.protocol.filters import parse_filter
from relay.protocol.rejection import Rejection
from relay.store.db import require_relay_database
from relay.store.store import Store

CHUNK_LINES = 2_000
IDLE_FLUSH_SECONDS = 0.2  # a chunk not yet full is imported once no line came for this long (a pipe that pauses)
NOT_JSONL_HINT = "the input is not JSONL: one event object per line"
_NOT_AN_OBJECT = ("invalid: malformed JSON", "invalid: event must be a JSON object")  # what lines of no JSONL get
SHOWN_LINES = 5  # line numbers listed per rejection reason in the summary


@dataclass
class ImportReport:
    """Counts of one import, in lines: stored, duplicates, older versions, ephemeral, refusals by message.

    `stored` also counts a line stored, then superseded or deleted by a later
    line; `duplicate` an id already held; `older_version` a replaceable or
    addressable version that loses to the one held (NIP-01: older, or as old
    with a higher id), which a client is told with OK false "duplicate: have
    a newer version": not stored, like `ephemeral`, but not a refusal.
    """

    stored: int = 0
    duplicate: int = 0
    older_version: int = 0
    ephemeral: int = 0
    rejected: Counter = field(default_factory=Counter)
    rejected_lines: dict[str, list[int]] = field(default_factory=dict)  # the first SHOWN_LINES per message

    @property
    def total(self) -> int:
        """Lines read."""
        return self.stored + self.duplicate + self.older_version + self.ephemeral + sum(self.rejected.values())

    def add(self, outcome: Outcome, line: int = 0) -> None:
        """Count one line's outcome; `line` is its number in the file (1-based; 0: unknown)."""
        if outcome == NEWER_VERSION:
            self.older_version += 1
        elif outcome == EPHEMERAL:
            self.ephemeral += 1
        elif not outcome.accepted:
            self.rejected[outcome.message] += 1
            shown = self.rejected_lines.setdefault(outcome.message, [])
            if line and len(shown) < SHOWN_LINES:
                shown.append(line)
        elif outcome.prefix == "duplicate":
            self.duplicate += 1
        else:
            self.stored += 1


Rejected = Callable[[int, bytes, Event | None, Outcome], None]
"""Told of each rejected line: (line number, the line, its event if it parsed, the outcome)."""


async def import_lines(ingest: Ingest, lines: Iterable[bytes] | AsyncIterable[bytes | Outcome | object], progress=None,
                       report: ImportReport | None = None, rejected: Rejected | None = None,
                       pool: CheckingPool | None = None) -> ImportReport:
    """Take each non-blank JSONL line (one event object per line) through `ingest` as `IMPORT`.

    `lines` may hold, in place of a line, the `Outcome` refusing it unread
    (`LineReader.too_long`), or `PAUSED` (no line came for a while).  Lines go
    in chunks of `CHUNK_LINES`, whose signatures are checked together on the
    ingest's threads, or in `pool`'s processes (then a few chunks are checked
    ahead while the writer stores the one before), and at each `PAUSED` (a
    pipe's lines are stored as they come, not when it closes); chunks reach
    the writer in order; `progress()` is called after each chunk.  Counts go to `report` (a new one if None),
    which holds the chunks done so far if the import is cancelled; cancelled
    while waiting for `lines` (SIGINT on a stalled pipe), the lines already
    read are imported first.
    """
    report = ImportReport() if report is None else report
    chunks = _Chunks(ingest, pool, report, progress, rejected)
    source = aiter(lines) if isinstance(lines, AsyncIterable) else _async(lines)
    chunk: list[tuple[int, bytes]] = []  # lines read and not yet handed to `chunks`
    number = 0
    try:
        while True:
            try:
                line = await anext(source)
            except StopAsyncIteration:
                break
            if line is PAUSED:  # the input paused: store what came so far
                full, chunk = chunk, []
                await chunks.add(full)
                await chunks.drain()
                continue
            number += 1
            if isinstance(line, Outcome):
                _refuse(number, line, report, rejected)
            elif line.strip():
                chunk.append((number, line))
            if len(chunk) >= CHUNK_LINES:
                full, chunk = chunk, []
                await chunks.add(full)
        await chunks.add(chunk)
        await chunks.drain()
    except asyncio.CancelledError:  # (SIGINT): what was read is stored, and every chunk on its way is counted
        await chunks.add(chunk)
        await chunks.drain()
        raise
    finally:
        chunks.abandon()
    return report


class _Chunks:
    """An import's chunks of lines on their way to the writer, counted in order.  With a `CheckingPool`, several
    (two per process, or a writer's transaction of them) are checked while the writer stores the ones before;
    each is handed to ingest only after the one before it, so the writer takes lines in the file's order."""

    def __init__(self, ingest: Ingest, pool: CheckingPool | None, report: ImportReport, progress,
                 rejected: Rejected | None) -> None:
        self.ingest, self.pool, self.report, self.progress, self.rejected = ingest, pool, report, progress, rejected
        self._pending: deque[tuple[list[tuple[int, bytes]], asyncio.Future]] = deque()
        self._handed: asyncio.Future | None = None  # set once the newest chunk was handed to ingest
        # Two per checking process, and enough to fill one transaction of the writer (a bulk load's is large);
        # none ahead without a pool (the ingest's threads check one chunk at a time).
        self._ahead = 0 if pool is None else max(2 * pool.processes,
                                                 -(-ingest.store.options.max_batch // CHUNK_LINES) + 1)

    async def add(self, chunk: list[tuple[int, bytes]]) -> None:
        """Start `chunk` on its way; wait while as many as the pool holds are on theirs."""
        if not chunk:
            return
        if self.pool is None:
            task = asyncio.ensure_future(self.ingest.accept_many([line for _, line in chunk], IMPORT))
        else:
            before, self._handed = self._handed, asyncio.get_running_loop().create_future()
            task = asyncio.ensure_future(self._checked(chunk, before, self._handed))
        self._pending.append((chunk, task))
        while len(self._pending) > self._ahead:
            await self._settle_oldest()

    async def drain(self) -> None:
        """Wait until every chunk started is stored and counted."""
        while self._pending:
            await self._settle_oldest()

    def abandon(self) -> None:
        """Stop waiting for the chunks on their way (an import cancelled by something else than its input)."""
        for _, task in self._pending:
            task.cancel()
        self._pending.clear()

    async def _checked(self, chunk: list[tuple[int, bytes]], before: asyncio.Future | None,
                       handed: asyncio.Future) -> list[tuple[Outcome, Event | None]]:
        try:
            checked = await self.pool.check([line for _, line in chunk], self.ingest.limits)
            if before is not None:
                await before
            return await self.ingest.accept_checked_many(checked, IMPORT, handed)
        finally:
            handed.done() or handed.set_result(None)  # the next chunk never waits for one that failed

    async def _settle_oldest(self) -> None:
        chunk, task = self._pending[0]
        # shielded: a SIGINT while waiting leaves the chunk on its way (its events may commit), to be counted
        answers = await asyncio.shield(task)
        self._pending.popleft()
        self._count(chunk, answers)

    def _count(self, chunk: list[tuple[int, bytes]], answers: list[tuple[Outcome, Event | None]]) -> None:
        for (number, line), (outcome, event) in zip(chunk, answers):
            self.report.add(outcome, number)
            if self.rejected is not None and not outcome.accepted and outcome not in (NEWER_VERSION, EPHEMERAL):
                self.rejected(number, line, event, outcome)
        self.progress and self.progress()


async def _async(lines: Iterable[bytes]) -> AsyncIterator[bytes]:
    for line in lines:
        yield line


def _refuse(number: int, outcome: Outcome, report: ImportReport, rejected: Rejected | None) -> None:
    """Count line `number`, refused unread (too long), and tell `rejected` with an empty text."""
    report.add(outcome, number)
    if rejected is not None:
        rejected(number, b"", None, outcome)


def rejects_writer(out: BinaryIO) -> Rejected:
    """`--rejects FILE`: one JSON object per rejected line, `{"line": n, "id": "<hex>" | null, "reason":
    "<NIP-01 prefix>: ...", "text": "<the line as read>"}`; `text` is "" for a line longer than
    `limits.max_message_bytes`, which is not kept."""

    def write(number: int, line: bytes, event: Event | None, outcome: Outcome) -> None:
        out.write(orjson.dumps({"line": number, "id": event.id if event is not None else _id_of(line),
                                "reason": outcome.message,
                                "text": line.decode("utf-8", "replace").rstrip("\r\n")}) + b"\n")

    return write


def _id_of(line: bytes) -> str | None:
    """The `id` field of a line that did not parse as an event, if it is a JSON object with a string id."""
    try:
        ref = event_ref(orjson.loads(line))
    except orjson.JSONDecodeError:
        return None
    return ref if type(ref) is str else None


def print_import_report(report: ImportReport) -> None:
    """The summary on stdout: one line of counts, then per rejection message its count and first line numbers."""
    print(f"read {report.total}: stored {report.stored}, duplicate {report.duplicate}, "
          f"older version (not stored) {report.older_version}, ephemeral (not stored) {report.ephemeral}, "
          f"rejected {sum(report.rejected.values())}")
    for message, count in report.rejected.most_common():
        print(f"  rejected {count}: {message}")
        shown = report.rejected_lines.get(message, [])
        more = ", ..." if count > len(shown) else ""
        print(f"    at line{'s' if len(shown) > 1 else ''} {', '.join(map(str, shown))}{more}")


async def run_import(config: Config, path: Path, rejects: Path | None = None, create: bool = False,
                     processes: int | None = None) -> int:
    """`relay import FILE [--rejects OUT] [--create] [--processes N]`: prints the counts (see `ImportReport`,
    `print_import_report`); `rejects` gets each rejected line (`rejects_writer`), replacing what OUT held.
    Lines are checked (JSON, id, signature) in `processes` processes (None: one per CPU; 0: this process's
    signature threads), so the writer, here or in the relay serving the database, is the bound.

    FILE ('-': stdin) may be a regular file, a pipe or a FIFO; it is read
    once, and a pipe's lines are stored as they come.  A line longer than
    `limits.max_message_bytes` is rejected without being read into memory.
    Exit 0; 1 when lines were read and every one was rejected (with a hint
    when the input is not JSONL); 2 (one line on stderr) if the database does
    not exist and `create` is not given (`check_database_path`), or FILE or OUT
    cannot be opened or OUT is FILE, the database or a file beside it (`refuse_store_file`); 130 when interrupted (SIGINT), after the
    summary of the lines done, including those read before a stalled pipe.
    """
    console = Console(stderr=True)
    check_database_path(config, create)
    try:
        source = sys.stdin.buffer if str(path) == "-" else path.open("rb")
        info = os.fstat(source.fileno())
        regular = stat.S_ISREG(info.st_mode)
        # A character device such as /dev/null may be both.  A pipe may not: opening it (`--rejects /dev/stdin`
        # for `cat x | relay import -`) would hold its write end, and the input would never end.
        if not stat.S_ISCHR(info.st_mode) and rejects is not None and rejects.exists() \
                and os.path.samestat(info, rejects.stat()):
            raise OSError(f"--rejects {rejects} is the input: writing it would empty it first, or (a pipe) "
                          "never let it end")
        if rejects is not None:
            refuse_store_file(config, rejects, "--rejects")
        out = rejects.open("wb") if rejects is not None else None
    except OSError as exc:
        return path_error("import", exc)
    processes = default_processes() if processes is None else processes
    pool = CheckingPool(processes) if processes > 0 else None  # forked before any thread starts
    try:
        path = await open_write_path(config, read_connections=1, bulk=True)  # through the running relay if one serves it
    except BaseException:
        if pool is not None:
            pool.close()
        raise
    ingest = await path.ingest(config)  # bans
    report = ImportReport()
    reader = LineReader(source.fileno(), config.limits.max_message_bytes, IDLE_FLUSH_SECONDS)
    try:
        with Progress(TextColumn("importing"), BarColumn(), DownloadColumn(), TimeRemainingColumn(),
                      console=console, disable=not console.is_terminal) as bar:
            # Bytes, not lines: only a regular file's size is known before reading it.
            task = bar.add_task("import", total=info.st_size if regular else None)
            interrupted = await interruptible(path.unless_writer_lost(import_lines(
                ingest, reader.lines(), lambda: bar.update(task, completed=reader.consumed), report,
                rejects_writer(out) if out is not None else None, pool)))
    finally:
        if pool is not None:
            pool.close()
        await ingest.aclose()
        await path.close()
        if source is not sys.stdin.buffer:
            source.close()
        if out is not None:
            out.close()
    print_import_report(report)
    if interrupted:
        print(f"relay import: interrupted; the summary counts the {report.total} lines done", file=sys.stderr)
        return EXIT_INTERRUPTED
    if path.writer_lost:
        print("relay import: the relay serving the database stopped during the import; the lines rejected "
              "\"error: the relay cannot store events now\" may or may not be stored: import the file again",
              file=sys.stderr)
        return 1
    if report.total and sum(report.rejected.values()) == report.total:
        not_jsonl = reader.first_byte == b"[" or set(report.rejected) <= set(_NOT_AN_OBJECT)
        print("relay import: every line was rejected" + (f"; {NOT_JSONL_HINT}" if not_jsonl else ""),
              file=sys.stderr)
        return 1
    return 0


async def run_export(config: Config, filter_json: str, output: Path | None) -> int:
    """`relay export [--filter JSON] [--output OUT]`: every matching live event as one JSON line, newest first (a
    NIP-50 `search`: best scored first).  Exit 0; 2 (one line on stderr) for a bad filter, a missing database, or
    an OUT that cannot be opened or is the database or a file beside it (`refuse_store_file`).

    Raises:
        DatabaseUnusable: no relay database at `store.path` (exit 2, as every command that reads one).
    """
    try:
        f = parse_filter(loads(filter_json))
        if f.search is not None and not config.search.enabled:
            raise Rejection("invalid", "search is disabled ([search] enabled = false): there is no index to search")
    except Rejection as exc:
        print(f"relay export: bad --filter: {exc}", file=sys.stderr)
        return 2
    require_relay_database(config.store.path, SERVED_DATABASE_HINT)
    try:
        if output:
            refuse_store_file(config, output, "--output")
        out = output.open("wb") if output else sys.stdout.buffer
    except OSError as exc:
        return path_error("export", exc)
    store = await Store.open(config.store.path, config.store.options(read_connections=1))
    try:
        # aclosing: a failed write (a full disk) ends the scan here, its read connection back in the pool for
        # close(); left to asyncio.run's shutdown, its thread answered a closed loop (a traceback).
        with out:
            async with contextlib.aclosing(store.scan(f)) as events:
                async for raw in events:
                    out.write(raw + b"\n")
    finally:
        await store.close()
    return 0
