"""Builds of projectors that resume: bounded steps, each one transaction holding its checkpoint.

How this works.  `Build.start` (from the hook's `setup`, on the writer
connection) prepares the target's tables (`PlainTarget` here, `causal_build.CausalTarget` for a causal
projector).  A plain table is created; altered when the new spec only adds
fields to the one built (the rows are kept and refilled); else emptied.  It
writes the projector's `meta` record in state "building" with
`build` = {"through": the largest `events.seq` then, "after": the last seq
built (the checkpoint), "done", "total": events of the kind up to `through`,
"fill": rows kept}.  Each `step` projects the next `batch` events of the kind
with seq in (after, through], in seq order, with INSERT OR REPLACE, and moves
the checkpoint in the same transaction; the last step marks the record
"current".  A crash loses at most the step in flight: the next start finds the
record (same spec, same revision) and resumes after the checkpoint.

Live writes are projected normally meanwhile (the hook's `apply` ignores
builds).  An event above `through` is only ever projected live.  One at or
below it that is removed before the build reaches it is no longer in `events`
when the step reads, and `apply` deletes whatever rows it had.  Two live
events never share a row key (the key follows the kind's storage class), so
the build's INSERT OR REPLACE only ever rewrites a row of the same event: the
finished table is the projection of the live events whatever the interleaving.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterator
from typing import Protocol

import structlog

from relay.protocol.event import Event
from relay.store.db import transaction
from relay.store.projectors import rowfeed
from relay.store.projectors.rows import stored_event
from relay.store.projectors.spec import ProjectorSpec
from relay.store.projectors.tables import quote, record_refusals, sync_schema, write_meta

log = structlog.get_logger(__name__)

_STEP_STATEMENT = 900  # seqs bound in one statement (SQLite's default variable limit is 999 on old builds)


class Writes(Protocol):
    """What a build needs of a compiled projector (`engine.PlainProjector`)."""

    spec: ProjectorSpec
    encoder: rowfeed.RowEncoder

    def write(self, cur: sqlite3.Cursor, events: list[Event], refusals: list, replace: bool = False,
              written: list[tuple] | None = None) -> int: ...


def events_by_seq(cur: sqlite3.Cursor, seqs: list[int]) -> list[Event]:
    """The stored events whose `events.seq` is in `seqs` (at most 900), in seq order; removed ones are skipped."""
    sql = f"SELECT raw FROM events WHERE seq IN ({','.join('?' * len(seqs))}) ORDER BY seq"
    return [stored_event(raw) for (raw,) in cur.execute(sql, seqs)]


def progress_of(record: dict | None, current: dict) -> dict | None:
    """The `build` progress of `record` when it is a build of the spec whose "current" record is `current`
    (same hash and revision), so that it can resume; else None."""
    if record is None or record.get("state") != "building" or "build" not in record:
        return None
    if record.get("hash") != current["hash"] or record.get("revision") != current["revision"]:
        return None
    return record["build"]


def adds_fields_only(record: dict | None, current: dict) -> bool:
    """Whether `current` (a "current" record of a new spec) differs from the finished build `record` only by
    fields added (and indexes): then the rows are kept, the columns added and filled."""
    if record is None or record.get("state") != "current" or record.get("revision") != current["revision"]:
        return False
    old, new = record.get("fields"), current.get("fields")
    if old is None or record.get("shape") != current.get("shape"):
        return False
    return len(new) > len(old) and all(field in new for field in old)


class Target(Protocol):
    """What a build writes: one projector's tables (`PlainTarget`, `causal_build.CausalTarget`)."""

    name: str  # the projector's name (its `meta` record)
    kind: int  # the event kind it reads

    def prepare(self, cur: sqlite3.Cursor, fill: bool) -> str:
        """Make the tables fit the spec, emptied unless `fill`; returns what was done to the schema."""
        ...

    def project(self, cur: sqlite3.Cursor, seqs: list[int], refusals: list, fill: bool) -> None:
        """Project the stored events whose `events.seq` is in `seqs` (ascending) inside the step's transaction."""
        ...


def chunks_by_seq(cur: sqlite3.Cursor, seqs: list[int]) -> Iterator[list[Event]]:
    """The stored events of `seqs` in seq order, a statement's worth (`events_by_seq`) at a time."""
    for start in range(0, len(seqs), _STEP_STATEMENT):
        yield events_by_seq(cur, seqs[start:start + _STEP_STATEMENT])


class PlainTarget:
    """A plain projector as a build's target: rows written with INSERT OR REPLACE, logged in its row feed."""

    def __init__(self, projector: Writes) -> None:
        self.projector = projector
        self.name, self.kind = projector.spec.name, projector.spec.kind
        self._delete_event_sql = (f"DELETE FROM {quote(projector.spec.table)} WHERE _event_id = ? RETURNING "
                                  + ", ".join(quote(c) for c in projector.spec.key_columns()))

    def prepare(self, cur: sqlite3.Cursor, fill: bool) -> str:
        """`sync_schema`, then (unless a fill) the table, its refusals and its row feed emptied."""
        spec = self.projector.spec
        schema = sync_schema(cur, spec)
        if not fill:
            cur.execute(f"DELETE FROM {quote(spec.table)}")
            cur.execute("DELETE FROM projector_refusals WHERE projector = ?", (spec.name,))
            if rowfeed.is_logged(cur, spec.table):
                rowfeed.reset(cur, spec.table)
        return schema

    def project(self, cur: sqlite3.Cursor, seqs: list[int], refusals: list, fill: bool) -> None:
        """The events' rows written over any row of the same key; in a fill, rows of events now refused removed."""
        logged = rowfeed.is_logged(cur, self.projector.spec.table)
        written: list[tuple] | None = [] if logged else None
        for events in chunks_by_seq(cur, seqs):
            self.projector.write(cur, events, refusals, replace=True, written=written)
        # a fill keeps the rows: those of an event a new field now refuses go (a build from empty has none)
        removed = [key for _, event_id, _ in refusals for key in cur.execute(
            self._delete_event_sql, (event_id,))] if fill else []
        if logged:  # a fill puts rows back over the same keys
            rowfeed.log(cur, self.projector.encoder, removed, written, rowfeed.REPLACE if fill else rowfeed.INSERT)


class Build:
    """One projector's build: `start` it, then `step` until it returns True (module docstring).

    `read` counts the events this process read (a resumed build starts at 0).
    """

    def __init__(self, target: Target, current: dict, progress: dict, seqs: list[int], batch: int,
                 max_refusals: int, clock: Callable[[], float]) -> None:
        self.target = target
        self.current = current
        self.progress = progress
        self.seqs = seqs
        self.batch = max(1, batch)
        self.max_refusals = max_refusals
        self.clock = clock
        self.read = 0
        self.started = self._reported = time.perf_counter()

    @classmethod
    def start(cls, conn: sqlite3.Connection, target: Target, current: dict, record: dict | None, reason: str,
              batch: int, max_refusals: int, clock: Callable[[], float] = time.time) -> Build:
        """Prepare or resume the build of `target`, whose "current" `meta` record will be `current`, given its
        stored `record`; on an autocommit connection outside any transaction."""
        progress = progress_of(record, current)
        if progress is not None:
            log.info("projector_build_resumed", projector=target.name, events_done=progress["done"],
                     events_total=progress["total"])
        else:
            fill = adds_fields_only(record, current)
            with transaction(conn) as cur:
                schema = target.prepare(cur, fill)
                through = cur.execute("SELECT coalesce(max(seq), 0) FROM events").fetchone()[0]
                total = cur.execute("SELECT count(*) FROM events WHERE kind = ?", (target.kind,)).fetchone()[0]
                progress = {"after": 0, "through": through, "done": 0, "total": total, "fill": fill}
                write_meta(cur, target.name, {**current, "state": "building", "build": progress})
            log.info("projector_build_started", projector=target.name, reason=reason, schema=schema, fill=fill,
                     events_total=total)
        # events_by_kind covers (kind, ..., seq): no table rows are read.
        seqs = sorted(seq for (seq,) in conn.execute("SELECT seq FROM events WHERE kind = ? AND seq > ? AND seq <= ?",
                                                     (target.kind, progress["after"], progress["through"])))
        return cls(target, current, progress, seqs, batch, max_refusals, clock)

    @property
    def remaining(self) -> int:
        """Events (seqs) still to build in this process."""
        return len(self.seqs) - self.read

    def step(self, conn: sqlite3.Connection) -> bool:
        """Build the next `batch` events in one transaction with the checkpoint; True once the build is done."""
        chunk = self.seqs[self.read:self.read + self.batch]
        name = self.target.name
        refusals: list = []
        progress = {**self.progress, "done": self.progress["done"] + len(chunk)}
        if chunk:
            progress["after"] = chunk[-1]
        finished = self.read + len(chunk) >= len(self.seqs)
        with transaction(conn) as cur:
            self.target.project(cur, chunk, refusals, self.progress["fill"])
            record_refusals(cur, refusals, int(self.clock()), self.max_refusals)
            write_meta(cur, name, {**self.current, "state": "current"} if finished
                       else {**self.current, "state": "building", "build": progress})
        self.read += len(chunk)
        self.progress = progress
        if not finished and time.perf_counter() - self._reported >= 1.0:
            self._reported = time.perf_counter()
            log.info("projector_build_progress", projector=name, events_done=progress["done"],
                     events_total=progress["total"])
        if finished:
            log.info("projector_build_finished", projector=name, events_read=self.read,
                     events_total=progress["total"], seconds=round(time.perf_counter() - self.started, 3))
        return finished

    def finish(self, conn: sqlite3.Connection) -> None:
        """Run every remaining step now (a build in the foreground)."""
        while not self.step(conn):
            pass

