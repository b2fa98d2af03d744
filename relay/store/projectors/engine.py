"""The projector hook: projected tables kept in step with events inside the write transaction.

How this works.  `ProjectorHook` is a `writes.TransactionHook`.  At open
(`setup`), each projector's spec hash and revision are compared with the
record in `meta`: an unchanged projector costs one lookup, a new or changed
one (plain or causal: `causal_build.py`) is built from `events` in steps that
resume after a crash (`build.py`): with `background`, a build longer than one
step is left in `builds` for `background.build_in_background` to run through
the writer while the relay serves; else (offline commands) it finishes here.  A
projector in `meta` that is no longer configured is reported and its table
left alone.

In every write transaction (`apply`), with `Changes.net()`:
  1. rows of removed events (superseded, deleted, expired) are deleted, by
     the class key prefix of the primary key and `_event_id`;
  2. rows of inserted events are computed in Python (`RowMaker`) and written
     with one `executemany` per table; only if that fails are the rows it
     wrote deleted and each event retried in a SAVEPOINT of its own, and the
     failing ones are refused;
  3. refusals (Python or SQL) are appended to the bounded `projector_refusals`
     log; the events themselves stay stored.
Causal projectors (`causal.py`) are settled per log after the plain ones.
"""

from __future__ import annotations

import sqlite3
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from operator import itemgetter

import structlog

from relay.protocol.event import Event
from relay.store.projectors import rowfeed
from relay.store.projectors.build import Build, PlainTarget, progress_of
from relay.store.projectors.causal import CausalEngine, CausalSpec, causal_hash
from relay.store.projectors.causal_build import CausalTarget
from relay.store.projectors.rows import Refusal, RowMaker
from relay.store.projectors.rowfeed import RowEncoder
from relay.store.projectors.spec import ProjectorSpec, column_identity, shape_hash, spec_hash
from relay.store.projectors.tables import (
    ensure_store_tables,
    quote,
    read_meta,
    record_refusals,
    table_exists,
    write_meta,
)
from relay.store.db import transaction
from relay.store.writes import Changes, Removed

log = structlog.get_logger(__name__)

AnySpec = ProjectorSpec | CausalSpec
Refusals = list[tuple[str, str, str]]  # (projector, event id hex, reason)
_SQL_ERRORS = (sqlite3.Error, ValueError, OverflowError)  # ValueError: e.g. a string SQLite cannot encode
MAX_REFUSALS = 10_000
"""Rows kept in `projector_refusals` by default (the `[store] max_projector_refusals` default)."""
REBUILD_BATCH = 10_000
"""Events per rebuild transaction by default (the `[store] projector_rebuild_batch` default)."""
BUILD_BATCH = 2_000
"""Events per step of a background build by default (the `[store] projector_build_batch` default)."""


class PlainProjector:
    """One `ProjectorSpec` compiled: its SQL statements and row maker."""

    def __init__(self, spec: ProjectorSpec) -> None:
        self.spec = spec
        self.maker = RowMaker(spec)
        table = quote(spec.table)
        columns = ", ".join(quote(c) for c in spec.stored_columns)
        marks = ", ".join("?" * len(spec.stored_columns))
        self.insert_sql = f"INSERT INTO {table} ({columns}) VALUES ({marks})"
        self.replace_sql = f"INSERT OR REPLACE INTO {table} ({columns}) VALUES ({marks})"
        class_key = spec.class_key_columns()
        self.delete_sql = (f"DELETE FROM {table} WHERE " + " AND ".join(f"{quote(c)} = ?" for c in class_key)
                           + " AND _event_id = ?")
        self._key_getters = [_removed_getter(column_identity(spec, c)) for c in class_key]
        key = spec.key_columns()
        self._key_positions = [spec.stored_columns.index(c) for c in key]
        self._event_id_position = spec.stored_columns.index(spec.aliases.get("_event_id", "_event_id"))
        self.undo_sql = (f"DELETE FROM {table} WHERE " + " AND ".join(f"{quote(c)} = ?" for c in key)
                         + " AND _event_id = ?")
        self.encoder = RowEncoder(spec)
        self.logged = False  # whether its row changes are logged (rowfeed.py); set by the hook's setup
        self._delete_returning_sql = self.delete_sql + " RETURNING " + ", ".join(quote(c) for c in key)

    def remove(self, cur: sqlite3.Cursor, removed: list[Removed]) -> list[tuple]:
        """Delete the rows of removed events; returns the keys deleted when `logged` (else [])."""
        if not self.logged:
            cur.executemany(self.delete_sql, [self.delete_params(r) for r in removed])
            return []
        return [key for r in removed for key in cur.execute(self._delete_returning_sql, self.delete_params(r))]

    def delete_params(self, removed: Removed) -> tuple:
        """Parameters of `delete_sql` for one removed event row."""
        return (*(get(removed) for get in self._key_getters), removed.id.hex())

    def write(self, cur: sqlite3.Cursor, events: list[Event], refusals: Refusals, replace: bool = False,
              written: list[tuple] | None = None) -> int:
        """Insert the rows of `events`; refused events go to `refusals`; the rows written are added to `written`
        if given. Returns the rows written."""
        name = self.spec.table
        groups: list[tuple[str, list[tuple]]] = []
        for event in events:
            try:
                rows = self.maker.rows(event)
            except Refusal as refusal:
                refusals.append((name, event.id, refusal.reason))
                continue
            if rows:
                groups.append((event.id, rows))
        if not groups:
            return 0
        all_rows = [row for _, rows in groups for row in rows]
        sql = self.replace_sql if replace else self.insert_sql
        if replace:
            # A rebuild writes many rows: in key order, B-tree pages are filled one after the other.
            all_rows.sort(key=itemgetter(*self._key_positions))
        # No SAVEPOINT on the common path: it would copy every page the batch touches.  executemany stops at
        # the failing row, and each row before it is ours (same key and event id): delete them, then retry.
        # (A rebuild's INSERT OR REPLACE can only have replaced a row of the same event, written meanwhile
        # by a writer with the same spec, so deleting it too is what the retry puts back.)
        try:
            cur.executemany(sql, all_rows)
        except _SQL_ERRORS:
            cur.executemany(self.undo_sql, [tuple(row[i] for i in self._key_positions) + (row[self._event_id_position],)
                                            for row in all_rows])
            return self._write_one_by_one(cur, sql, groups, refusals, [] if written is None else written)
        if written is not None:
            written.extend(all_rows)
        return len(all_rows)

    def _write_one_by_one(self, cur: sqlite3.Cursor, sql: str, groups: list[tuple[str, list[tuple]]],
                          refusals: Refusals, written: list[tuple]) -> int:
        count = 0
        for event_id, rows in groups:
            cur.execute("SAVEPOINT projector_event")
            try:
                cur.executemany(sql, rows)
                count += len(rows)
                written.extend(rows)
            except _SQL_ERRORS as exc:
                cur.execute("ROLLBACK TO projector_event")
                refusals.append((self.spec.table, event_id, f"sqlite: {exc}"[:300]))
            cur.execute("RELEASE projector_event")
        return count


def _removed_getter(identity: str) -> Callable[[Removed], object]:
    if identity == "id":
        return lambda r: r.id.hex()
    if identity == "pubkey":
        return lambda r: r.pubkey.hex()
    return lambda r: r.d_tag  # "tag:d": the coordinate's d value


def record_for(spec: AnySpec, state: str) -> dict:
    """The `meta` record of `spec` in `state` ("current", "building")."""
    if isinstance(spec, CausalSpec):
        return {"type": "causal", "hash": causal_hash(spec), "revision": spec.revision, "state": state,
                "kind": spec.kind, "tables": list(spec.table_names)}
    # fields and shape: a later spec that only adds fields is filled, not rebuilt (build.adds_fields_only)
    return {"type": "plain", "hash": spec_hash(spec), "revision": spec.revision, "state": state,
            "kind": spec.kind, "tables": [spec.table], "fields": spec.to_dict()["fields"], "shape": shape_hash(spec)}


def pending_reason(spec: AnySpec, record: dict | None, conn: sqlite3.Connection) -> str | None:
    """Why `spec` needs a rebuild given its `meta` record ("new", "spec changed", ...), or None when current."""
    if record is None:
        return "new"
    if (progress := progress_of(record, record_for(spec, "current"))) is not None:
        return f"building ({progress['done']} of {progress['total']})"
    if record.get("state") != "current":
        return f"state {record.get('state')}"
    expected = record_for(spec, "current")
    if record.get("hash") != expected["hash"]:
        return "spec changed"
    if record.get("revision") != spec.revision:
        return f"revision {record.get('revision')} -> {spec.revision}"
    names = spec.table_names
    if not all(table_exists(conn, t) for t in names):
        return "table missing"
    return None


class ProjectorHook:
    """Keeps every configured projector's tables equal to the projection of the stored events.

    `specs`: plain and causal specs (unique names).  `row_tables`: the plain
    projectors' tables whose row changes are logged (`rowfeed.py`; a table
    logged before and not named is no longer).  `max_refusals`: rows kept
    in `projector_refusals`.  `rebuild_batch`: events per rebuild transaction
    (per build step with `background`, where `build_batch` is used instead).
    `served`: a relay serves the database and owns the builds in progress, which `setup` leaves to it.
    After `setup`, `rebuilt` lists (name, reason) of the projectors rebuilt or
    being built, `builds` the builds left for the background (`background`
    only), and `removed` the names found in `meta` but no longer configured.
    """

    def __init__(self, specs: Sequence[AnySpec], max_refusals: int = MAX_REFUSALS, rebuild_batch: int = REBUILD_BATCH,
                 clock: Callable[[], float] = time.time, background: bool = False,
                 build_batch: int = BUILD_BATCH, row_tables: Iterable[str] = (), served: bool = False) -> None:
        names = [s.name for s in specs]
        duplicate = next((n for n in names if names.count(n) > 1), None)
        if duplicate is not None:
            raise ValueError(f"projector {duplicate!r} declared twice")
        tables = [t for s in specs for t in s.table_names]
        clash = next((t for t in tables if tables.count(t) > 1), None)
        if clash is not None:
            raise ValueError(f"table {clash!r} is written by two projectors")
        self.specs = tuple(specs)
        self.plain = [PlainProjector(s) for s in specs if isinstance(s, ProjectorSpec)]
        self.row_tables = frozenset(row_tables)
        unknown = self.row_tables - {p.spec.table for p in self.plain}
        if unknown:
            raise ValueError(f"row changes of {sorted(unknown)!r}: not tables of plain projectors")
        self.causal = [CausalEngine(s) for s in specs if isinstance(s, CausalSpec)]
        self.max_refusals = max_refusals
        self.rebuild_batch = rebuild_batch
        self.clock = clock
        self._plain_by_kind: dict[int, list[PlainProjector]] = {}
        for p in self.plain:
            self._plain_by_kind.setdefault(p.spec.kind, []).append(p)
        self._causal_kinds = {c.spec.kind for c in self.causal}
        self.background = background
        self.build_batch = build_batch
        self.served = served
        self.builds: list[Build] = []
        self.rebuilt: list[tuple[str, str]] = []
        self.removed: list[str] = []
        # projector name -> events refused since start (metrics); every name from the start, at 0
        self.refused: Counter[str] = Counter({name: 0 for name in names})

    def stats(self) -> dict[str, int]:
        """Events refused since start, by projector name (a copy: the writer thread adds to `refused`)."""
        return dict(self.refused)

    # ---------------------------------------------------------------- start-up

    def setup(self, conn: sqlite3.Connection) -> None:
        """Rebuild the projectors that are new or changed; report those no longer configured."""
        ensure_store_tables(conn)
        records = read_meta(conn)
        for spec in self.specs:
            record = records.get(spec.name)
            reason = pending_reason(spec, record, conn)
            if reason is None:
                continue
            if self.served and progress_of(record, record_for(spec, "current")) is not None:
                log.info("projector_build_left", projector=spec.name, reason="the relay serving the database builds it")
                continue
            self.rebuilt.append((spec.name, reason))
            batch = self.build_batch if self.background else self.rebuild_batch
            build = start_build(conn, spec, record, reason, batch, self.max_refusals, self.clock)
            if self.background and build.remaining > batch:
                self.builds.append(build)
            else:
                build.finish(conn)
        self._log_rows(conn)
        configured = {s.name for s in self.specs}
        for name, record in sorted(records.items()):
            if name in configured:
                continue
            self.removed.append(name)
            log.warning("projector_removed", projector=name, tables=record.get("tables"),
                        note="no longer configured: its tables are kept but not maintained")
            if record.get("state") != "removed":
                with transaction(conn) as cur:
                    write_meta(cur, name, {**record, "state": "removed"})

    def _log_rows(self, conn: sqlite3.Connection) -> None:
        """Start or stop logging row changes as `row_tables` says (a table's log starts with its rows)."""
        with transaction(conn) as cur:
            for table in rowfeed.logged_tables(cur) - self.row_tables:
                rowfeed.disable(cur, table)
            for projector in self.plain:
                if projector.spec.table in self.row_tables:
                    rowfeed.enable(cur, projector.spec)
                    projector.logged = True

    # ---------------------------------------------------------------- the write transaction

    def apply(self, cur: sqlite3.Cursor, changes: Changes) -> None:
        """Update projected rows for one transaction's changes (module docstring)."""
        inserted, removed = changes.net()
        by_kind = self._plain_by_kind
        causal_kinds = self._causal_kinds
        ins: dict[int, list[Event]] = {}
        rem: dict[int, list[Removed]] = {}
        for event in inserted:
            if event.kind in by_kind or event.kind in causal_kinds:
                ins.setdefault(event.kind, []).append(event)
        for row in removed:
            if row.kind in by_kind or row.kind in causal_kinds:
                rem.setdefault(row.kind, []).append(row)
        if not ins and not rem:
            return
        refusals: Refusals = []
        for kind in rem.keys() | ins.keys():
            for projector in by_kind.get(kind, ()):
                keys = projector.remove(cur, rem[kind]) if kind in rem else []
                written: list[tuple] | None = [] if projector.logged else None
                if kind in ins:
                    projector.write(cur, ins[kind], refusals, written=written)
                if projector.logged:
                    rowfeed.log(cur, projector.encoder, keys, written, rowfeed.INSERT)
        for engine in self.causal:
            kind = engine.spec.kind
            if kind in rem or kind in ins:
                conn = cur.connection
                touched, reset = engine.remove(conn, [r.id.hex() for r in rem.get(kind, ())])
                touched |= engine.add(conn, ins.get(kind, []), refusals)
                for log_id, author in sorted(touched):
                    engine.settle(conn, log_id, author, refusals, reset=(log_id, author) in reset)
        record_refusals(cur, refusals, int(self.clock()), self.max_refusals)
        self.refused.update(name for name, _, _ in refusals)


# -------------------------------------------------------------------- rebuild

class TableTaken(RuntimeError):
    """A projector names a table that exists and belongs to no projector (it is never dropped or changed)."""


def _check_ownership(cur: sqlite3.Cursor, spec: AnySpec) -> None:
    owned = {t for record in read_meta(cur).values() for t in record.get("tables", ())}
    for table in spec.table_names:
        if table_exists(cur, table) and table not in owned:
            raise TableTaken(f"projector {spec.name!r}: table {table!r} exists and is not a projector's; "
                             "choose another table name")


def start_build(conn: sqlite3.Connection, spec: AnySpec, record: dict | None, reason: str, batch: int,
                max_refusals: int, clock: Callable[[], float] = time.time) -> Build:
    """Prepare (or resume, see `build.py`) the build of `spec` given its stored `meta` record.

    Raises:
        TableTaken: a table of the spec exists and no projector made it.
    """
    current = record_for(spec, "current")
    if progress_of(record, current) is None:
        _check_ownership(conn.cursor(), spec)
    target = CausalTarget(CausalEngine(spec)) if isinstance(spec, CausalSpec) else PlainTarget(PlainProjector(spec))
    return Build.start(conn, target, current, record, reason, batch, max_refusals, clock)


def rebuild(conn: sqlite3.Connection, spec: AnySpec, reason: str, batch: int, max_refusals: int,
            clock: Callable[[], float] = time.time) -> int:
    """Recompute `spec`'s tables from the `events` table now, from empty, in transactions of `batch` events (at
    most 900 per statement; `build.py`). Returns the events read.

    Safe to run while another process writes with the same spec (plain rows
    are written with INSERT OR REPLACE; causal logs are settled from all
    their recorded operations).  Runs on an autocommit connection, outside
    any transaction.

    Raises:
        TableTaken: a table of the spec exists and no projector made it.
    """
    build = start_build(conn, spec, None, reason, batch, max_refusals, clock)
    build.finish(conn)
    return build.read


def force_rebuild(conn: sqlite3.Connection, specs: Sequence[AnySpec], name: str, batch: int,
                  max_refusals: int) -> int:
    """Rebuild the projector called `name` now, whatever its record. Returns the events read.

    Raises:
        KeyError: no configured projector has that name.
    """
    ensure_store_tables(conn)
    for spec in specs:
        if spec.name == name:
            return rebuild(conn, spec, "requested", batch, max_refusals)
    raise KeyError(name)
