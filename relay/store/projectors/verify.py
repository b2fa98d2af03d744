"""`relay verify` for projectors: recompute every projected table from `events` and compare.

A plain projector's expected rows come from `RowMaker` over the stored
events of its kind (refused events project to nothing), keyed by the
table's primary key: a key only expected is *missing*, a key only stored is
an *orphan*, a key in both with different values is *mismatched*.  A causal
projector is replayed into an in-memory database with the same engine and
callable; its tables are compared as multisets of rows, and `causal_ops`
states by (log, author, seq, event).  Reads only: run it on a read-only
connection (one read transaction, so the comparison is of one snapshot).
"""

from __future__ import annotations

import sqlite3
from collections import Counter
from dataclasses import dataclass, field
from importlib import resources

from relay.store.db import read_transaction
from relay.store.projectors.causal import CausalEngine, CausalSpec, create_tables
from relay.store.projectors.engine import AnySpec, pending_reason
from relay.store.projectors.rows import Refusal, RowMaker, stored_event
from relay.store.projectors.spec import ProjectorSpec
from relay.store.projectors.tables import quote, read_meta, table_exists


@dataclass
class TableCheck:
    """The comparison of one projected table with its recomputation.

    `missing`, `orphan` and `mismatched` hold primary keys (tuples; whole
    rows for causal tables); `problem` says why the table could not be
    compared (not built for this spec, missing table); `rows` is the number
    of rows stored.
    """

    projector: str
    table: str
    rows: int = 0
    missing: list[tuple] = field(default_factory=list)
    orphan: list[tuple] = field(default_factory=list)
    mismatched: list[tuple] = field(default_factory=list)
    problem: str | None = None

    @property
    def ok(self) -> bool:
        """True when the table equals its recomputation."""
        return self.problem is None and not (self.missing or self.orphan or self.mismatched)


def expected_rows(conn: sqlite3.Connection, spec: ProjectorSpec) -> dict[tuple, tuple]:
    """Primary key -> row of `spec`'s table as computed from the stored events (refused events left out)."""
    maker = RowMaker(spec)
    positions = [spec.stored_columns.index(c) for c in spec.key_columns()]
    expected: dict[tuple, tuple] = {}
    for (raw,) in conn.execute("SELECT raw FROM events WHERE kind = ? ORDER BY seq", (spec.kind,)):
        try:
            rows = maker.rows(stored_event(raw))
        except Refusal:
            continue
        for row in rows:
            expected.setdefault(tuple(row[i] for i in positions), row)
    return expected


def verify_plain(conn: sqlite3.Connection, spec: ProjectorSpec) -> TableCheck:
    """Compare `spec`'s table with `expected_rows` (module docstring)."""
    check = TableCheck(spec.table, spec.table)
    positions = [spec.stored_columns.index(c) for c in spec.key_columns()]
    columns = ", ".join(quote(c) for c in spec.stored_columns)  # aliases are computed from these
    actual = {}
    for row in conn.execute(f"SELECT {columns} FROM {quote(spec.table)}"):
        actual[tuple(row[i] for i in positions)] = tuple(row)
    check.rows = len(actual)
    expected = expected_rows(conn, spec)
    for key, row in expected.items():
        stored = actual.get(key)
        if stored is None:
            check.missing.append(key)
        elif stored != row:
            check.mismatched.append(key)
    check.orphan = [key for key in actual if key not in expected]
    return check


def replay_causal(conn: sqlite3.Connection, spec: CausalSpec) -> sqlite3.Connection:
    """An in-memory database holding `spec`'s tables and `causal_ops` recomputed from `conn`'s events."""
    events = {}
    for (raw,) in conn.execute("SELECT raw FROM events WHERE kind = ?", (spec.kind,)):
        event = stored_event(raw)
        events[event.id] = event
    memory = sqlite3.connect(":memory:", isolation_level=None)
    memory.executescript(resources.files("relay.store.migrations").joinpath("0003_projectors.sql")
                         .read_text(encoding="utf-8"))
    create_tables(memory, spec)
    engine = CausalEngine(spec, load_event=lambda _conn, event_id: events[event_id],
                          load_created_at=lambda _conn, ids: {i: events[i].created_at for i in ids})
    memory.execute("BEGIN")
    touched = engine.add(memory, list(events.values()), [])
    for log_id, author in sorted(touched):
        engine.settle(memory, log_id, author, [])
    memory.execute("COMMIT")
    return memory


def verify_causal(conn: sqlite3.Connection, spec: CausalSpec) -> list[TableCheck]:
    """Compare a causal projector's tables and `causal_ops` rows with a replay (module docstring)."""
    memory = replay_causal(conn, spec)
    checks = []
    try:
        for table in spec.table_names:
            check = TableCheck(spec.name, table)
            actual = Counter(tuple(r) for r in conn.execute(f"SELECT * FROM {quote(table)}"))
            expected = Counter(tuple(r) for r in memory.execute(f"SELECT * FROM {quote(table)}"))
            check.rows = sum(actual.values())
            check.missing = sorted((expected - actual).elements(), key=repr)
            check.orphan = sorted((actual - expected).elements(), key=repr)
            checks.append(check)
        check = TableCheck(spec.name, "causal_ops")
        query = "SELECT log_id, author, seq, event_id, prev, state FROM causal_ops WHERE projector = ?"
        actual_ops = {r[:4]: r for r in conn.execute(query, (spec.name,))}
        expected_ops = {r[:4]: r for r in memory.execute(query, (spec.name,))}
        check.rows = len(actual_ops)
        check.missing = [k for k in expected_ops if k not in actual_ops]
        check.orphan = [k for k in actual_ops if k not in expected_ops]
        check.mismatched = [k for k, r in expected_ops.items() if k in actual_ops and actual_ops[k] != r]
        checks.append(check)
    finally:
        memory.close()
    return checks


def verify(conn: sqlite3.Connection, specs: list[AnySpec] | tuple[AnySpec, ...]) -> list[TableCheck]:
    """Check every projector of `specs` against the events in `conn`; one TableCheck per table.

    A projector whose `meta` record does not match its spec (never built,
    changed since, table missing) gets a `problem` instead of a comparison.
    """
    checks: list[TableCheck] = []
    with read_transaction(conn):  # one snapshot for the whole comparison
        records = read_meta(conn)
        for spec in specs:
            reason = pending_reason(spec, records.get(spec.name), conn)
            tables = spec.table_names
            if reason is not None:
                note = f"not built for this configuration ({reason}): restart the relay or run " \
                       f"`relay projectors rebuild {spec.name}`"
                checks.extend(TableCheck(spec.name, t, problem=note) for t in tables)
            elif not all(table_exists(conn, t) for t in tables):
                checks.extend(TableCheck(spec.name, t, problem="table missing") for t in tables)
            elif isinstance(spec, CausalSpec):
                checks.extend(verify_causal(conn, spec))
            else:
                checks.append(verify_plain(conn, spec))
    return checks
