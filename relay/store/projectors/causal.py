"""Causal projectors: ordered operation logs per (log id, author), applied by a Python callable.

How this works.  An operation is an event of the spec's (regular) kind with
three tags: the log id (`log_tag`), its sequence number (`seq_tag`, decimal,
0 for the first operation) and, from 1 on, the id of the previous operation's
event (`prev_tag`).  For one (log id, author) the applied chain is a pure
function of the operations stored:

    chain[0] = the lowest id among operations at seq 0
    chain[n] = the lowest id among operations at seq n whose back-link is chain[n-1]
               and whose created_at is not earlier than chain[n-1]'s
    (the chain stops at the first n with no such operation)

Every other operation has a state, kept in `causal_ops`:
    lost     a fork loser: its back-link is right, a lower id took its place
    held     its back-link names an operation that is not applied (a losing branch),
             or it is backdated: its created_at is earlier than its predecessor's
             (the fleetmesh seed refuses backdated operations)
    waiting  a gap: the operation before it has not arrived (or is not applied) yet

Each write transaction re-settles the logs it touched: when the applied
chain is a prefix of the new one, only the new operations are applied, in
order; otherwise (a lower id arrived at an applied position, or an applied
operation was deleted or expired) the log's rows are deleted from the
projector's tables and the whole chain is applied again.  So the tables are
the fold of `apply` over the chain, whatever the arrival order, provided
`apply` is deterministic and touches only rows of its own (log, author).

`apply(conn, op)` runs inside the write transaction; it must write rows that
carry `_log` and `_author` (op.log_id, op.author) so that a rebuild can
delete them.  An exception in it rolls back that operation only (a
SAVEPOINT); the operation keeps its place in the chain and the failure is
recorded in the refusal log.
"""

from __future__ import annotations

import hashlib
import re
import sqlite3
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import orjson

from relay.protocol.event import MAX_KIND, Event, is_decimal, is_hex64, kind_class
from relay.store.projectors.rows import Refusal, stored_event
from relay.store.projectors.spec import ENGINE_VERSION, STORE_TABLES, SpecError
from relay.store.projectors.tables import quote, table_exists

_IDENTIFIER = re.compile(r"[a-z][a-z0-9_]{0,62}")
APPLIED, LOST, HELD, WAITING, NEW = "applied", "lost", "held", "waiting", "new"


@dataclass(frozen=True, slots=True)
class Operation:
    """One operation of a log: `author` is 64-char hex, `prev` the previous operation's id (None at seq 0)."""

    log_id: str
    author: str
    seq: int
    prev: str | None
    event: Event


@dataclass(frozen=True, eq=False)
class CausalSpec:
    """A causal projector: events of `kind` are operations of logs, folded by `apply` into `tables`.

    `tables` is a sequence of (table name, column definitions SQL); each
    table gets the leading columns `_log TEXT NOT NULL, _author TEXT NOT
    NULL` and an index on them.  `apply(conn, op)` is called once per
    operation of the applied chain, in order, inside the write transaction.
    Bump `revision` when `apply` changes: the projector is rebuilt at start-up.

    Raises:
        SpecError: an invalid name, kind (must be regular), table or tag name.
    """

    # Field metadata: each key of a `[[causal_projectors]]` table (docs/configuration.md).
    name: str = field(metadata={"doc": "the projector's name (lowercase SQL identifier)", "type": "string"})
    kind: int = field(metadata={"doc": "a regular kind: its events are the operations", "type": "integer"})
    tables: tuple[tuple[str, str], ...] = field(metadata={
        "doc": "[[causal_projectors.tables]]: name, columns = [{ name, type }], primary_key (optional); each "
               "table also gets the columns _log and _author first", "type": "array of tables"})
    apply: Callable[[sqlite3.Connection, Operation], None] = field(metadata={
        "doc": "module:function, called as function(conn, op) in the write transaction for each operation of the "
               "applied chain, in order; imported when the configuration loads", "type": "string"})
    log_tag: str = field(default="log", metadata={"doc": "the tag naming the log", "type": "string"})
    seq_tag: str = field(default="seq", metadata={
        "doc": "the tag holding the position (decimal, 0 first)", "type": "string"})
    prev_tag: str = field(default="prev", metadata={
        "doc": "the tag holding the previous operation's id", "type": "string"})
    revision: int = field(default=1, metadata={
        "doc": "bump when apply changes: the tables are rebuilt at the next start", "type": "integer"})
    protected: bool = field(default=False, metadata={  # relay/store/retention.py
        "doc": "retention never removes an operation (an event of kind)", "type": "boolean"})
    shard_id: str | None = field(default=None, metadata={
        "doc": "the shard of kind, held by this node (docs/peers.md, \"Shards\")", "type": "string",
        "default": "none"})

    def __post_init__(self) -> None:
        object.__setattr__(self, "tables", tuple((t, sql) for t, sql in self.tables))
        label = f"causal projector {self.name!r}"
        if type(self.name) is not str or not _IDENTIFIER.fullmatch(self.name):
            raise SpecError(f"{label}: name must be a lowercase SQL identifier")
        if type(self.kind) is not int or not 0 <= self.kind <= MAX_KIND or kind_class(self.kind) != "regular":
            raise SpecError(f"{label}: kind must be a regular kind (operations are never replaced), got {self.kind!r}")
        if not self.tables:
            raise SpecError(f"{label}: tables must not be empty")
        for table, columns in self.tables:
            if type(table) is not str or not _IDENTIFIER.fullmatch(table) or table in STORE_TABLES:
                raise SpecError(f"{label}, table {table!r}: must be a lowercase SQL identifier not used by the store")
            if type(columns) is not str or not columns.strip():
                raise SpecError(f"{label}, table {table!r}: column definitions must be non-empty SQL")
        tags = (self.log_tag, self.seq_tag, self.prev_tag)
        if len(set(tags)) != 3 or not all(type(t) is str and t for t in tags):
            raise SpecError(f"{label}: log_tag, seq_tag and prev_tag must be three different tag names")
        if not callable(self.apply):
            raise SpecError(f"{label}: apply must be callable")
        if type(self.revision) is not int or self.revision < 0:
            raise SpecError(f"{label}: revision must be an integer >= 0")

    @property
    def table_names(self) -> tuple[str, ...]:
        """The names of the projector's tables."""
        return tuple(t for t, _ in self.tables)


def causal_hash(spec: CausalSpec) -> str:
    """Hex SHA-256 of the spec without its revision (the callable by its qualified name)."""
    body = {"kind": spec.kind, "tables": [list(t) for t in spec.tables], "tags": [spec.log_tag, spec.seq_tag,
            spec.prev_tag], "apply": f"{spec.apply.__module__}.{getattr(spec.apply, '__qualname__', '?')}",
            "engine_version": ENGINE_VERSION}
    return hashlib.sha256(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest()


def parse_operation(spec: CausalSpec, event: Event) -> Operation:
    """The operation an event carries.

    Raises:
        Refusal: no log tag, a sequence number that is not decimal, a back-link
        at seq 0, or a missing / non-hex back-link after it.
    """
    values: dict[str, str] = {}
    for tag in event.tags:
        if len(tag) > 1 and tag[0] in (spec.log_tag, spec.seq_tag, spec.prev_tag) and tag[0] not in values:
            values[tag[0]] = tag[1]
    log_id, seq_text, prev = values.get(spec.log_tag), values.get(spec.seq_tag), values.get(spec.prev_tag)
    if log_id is None:
        raise Refusal(f"operation without a {spec.log_tag!r} tag")
    if seq_text is None or not is_decimal(seq_text) or len(seq_text) > 18:
        raise Refusal(f"operation without a decimal {spec.seq_tag!r} tag")
    seq = int(seq_text)
    if seq == 0 and prev is not None:
        raise Refusal(f"operation 0 has a {spec.prev_tag!r} back-link")
    if seq > 0 and not is_hex64(prev):
        raise Refusal(f"operation {seq} needs a {spec.prev_tag!r} back-link (64-char hex id)")
    return Operation(log_id, event.pubkey, seq, prev, event)


def create_tables(conn: sqlite3.Connection | sqlite3.Cursor, spec: CausalSpec, drop: bool = False) -> None:
    """Create the projector's tables (dropping them first with `drop`), each with `_log`, `_author` and their index."""
    for table, columns in spec.tables:
        if drop:
            conn.execute(f"DROP TABLE IF EXISTS {quote(table)}")
        if not table_exists(conn, table):
            conn.execute(f"CREATE TABLE {quote(table)} (_log TEXT NOT NULL, _author TEXT NOT NULL, {columns})")
            conn.execute(f"CREATE INDEX {quote(table + '__log_author')} ON {quote(table)} (_log, _author)")


def chain_of(ops: Iterable[tuple[int, str, str | None]], created_at: Mapping[str, int] | None = None) -> list[str]:
    """The applied chain (event ids by seq) of one log's operations given as (seq, event_id, prev);
    with `created_at` (event id -> unix seconds), a backdated operation never extends it."""
    by_seq: dict[int, list[tuple[str, str | None]]] = defaultdict(list)
    for seq, event_id, prev in ops:
        by_seq[seq].append((event_id, prev))
    chain: list[str] = []
    previous = None
    while True:
        # A fork: the lowest event id among operations whose back-link is the applied one wins.
        candidates = [event_id for event_id, prev in by_seq.get(len(chain), ())
                      if prev == previous and not backdated(event_id, previous, created_at)]
        if not candidates:
            return chain
        previous = min(candidates)
        chain.append(previous)


def backdated(event_id: str, previous: str | None, created_at: Mapping[str, int] | None) -> bool:
    """Whether operation `event_id` was signed earlier than its predecessor `previous` (None at seq 0: never)."""
    return created_at is not None and previous is not None and created_at[event_id] < created_at[previous]


def state_of(seq: int, event_id: str, prev: str | None, chain: list[str],
             created_at: Mapping[str, int] | None = None) -> str:
    """An operation's state against its log's applied `chain` (module docstring; `created_at` as for `chain_of`)."""
    if seq < len(chain) and chain[seq] == event_id:
        return APPLIED
    if seq > len(chain):
        return WAITING
    expected_prev = chain[seq - 1] if seq > 0 else None
    return LOST if prev == expected_prev and not backdated(event_id, prev, created_at) else HELD


class CausalEngine:
    """Maintains one causal projector's tables and `causal_ops` rows inside write transactions.

    `load_event(conn, event_id_hex)` returns the stored Event of an operation
    and `load_created_at(conn, event_ids_hex)` their created_at by id (by
    default read from `events`; verification replays from memory).
    """

    def __init__(self, spec: CausalSpec, load_event: Callable[[sqlite3.Connection, str], Event] | None = None,
                 load_created_at: Callable[[sqlite3.Connection, list[str]], dict[str, int]] | None = None) -> None:
        self.spec = spec
        self.load_event = load_event or _load_stored_event
        self.load_created_at = load_created_at or _stored_created_at

    def remove(self, conn: sqlite3.Connection, event_ids: list[str]) -> tuple[set[tuple[str, str]], set[tuple[str, str]]]:
        """Forget operations whose events left the store.

        Returns the (log_id, author) pairs touched, and those of them that lost
        an applied operation (their tables must be rebuilt).
        """
        touched: set[tuple[str, str]] = set()
        lost_applied: set[tuple[str, str]] = set()
        for event_id in event_ids:
            rows = conn.execute("DELETE FROM causal_ops WHERE event_id = ? AND projector = ?"
                                " RETURNING log_id, author, state", (event_id, self.spec.name)).fetchall()
            for log_id, author, state in rows:
                touched.add((log_id, author))
                if state == APPLIED:
                    lost_applied.add((log_id, author))
        return touched, lost_applied

    def add(self, conn: sqlite3.Connection, events: list[Event], refusals: list[tuple[str, str, str]]
            ) -> set[tuple[str, str]]:
        """Record new operations (state "new" until settled); returns the logs touched. Bad ones go to `refusals`."""
        rows = []
        for event in events:
            try:
                op = parse_operation(self.spec, event)
            except Refusal as refusal:
                refusals.append((self.spec.name, event.id, refusal.reason))
                continue
            rows.append((self.spec.name, op.log_id, op.author, op.seq, event.id, op.prev, NEW))
        conn.executemany("INSERT OR IGNORE INTO causal_ops (projector, log_id, author, seq, event_id, prev, state)"
                         " VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
        return {(r[1], r[2]) for r in rows}

    def settle(self, conn: sqlite3.Connection, log_id: str, author: str, refusals: list[tuple[str, str, str]],
               reset: bool = False) -> None:
        """Bring one log's tables and states in line with its operations (module docstring).

        `reset`: rebuild the log's tables whatever the chain (an applied operation was removed).
        """
        name = self.spec.name
        ops = conn.execute("SELECT seq, event_id, prev, state FROM causal_ops WHERE projector = ? AND log_id = ?"
                           " AND author = ? ORDER BY seq, event_id", (name, log_id, author)).fetchall()
        applied = [event_id for _, event_id, _, state in ops if state == APPLIED]
        created_at = self.load_created_at(conn, [event_id for _, event_id, _, _ in ops])
        chain = chain_of(((seq, event_id, prev) for seq, event_id, prev, _ in ops), created_at)
        if not reset and chain[:len(applied)] == applied:
            todo = chain[len(applied):]
        else:
            for table in self.spec.table_names:
                conn.execute(f"DELETE FROM {quote(table)} WHERE _log = ? AND _author = ?", (log_id, author))
            todo = chain
        seqs = {event_id: seq for seq, event_id, _, _ in ops}
        for event_id in todo:
            self._apply(conn, log_id, author, seqs[event_id], event_id, refusals)
        changed = []
        for seq, event_id, prev, old in ops:
            new = state_of(seq, event_id, prev, chain, created_at)
            if new != old:
                changed.append((new, name, log_id, author, seq, event_id))
                if new in (LOST, HELD):
                    refusals.append((name, event_id, _why(new, seq, event_id, prev, chain, created_at)))
        conn.executemany("UPDATE causal_ops SET state = ? WHERE projector = ? AND log_id = ? AND author = ?"
                         " AND seq = ? AND event_id = ?", changed)

    def _apply(self, conn: sqlite3.Connection, log_id: str, author: str, seq: int, event_id: str,
               refusals: list[tuple[str, str, str]]) -> None:
        event = self.load_event(conn, event_id)
        prev = None if seq == 0 else parse_operation(self.spec, event).prev
        conn.execute("SAVEPOINT causal_apply")
        try:
            self.spec.apply(conn, Operation(log_id, author, seq, prev, event))
        except Exception as exc:  # the user's callable: contain its failure to this one operation
            conn.execute("ROLLBACK TO causal_apply")
            refusals.append((self.spec.name, event_id, f"apply failed: {exc!r}"[:300]))
        conn.execute("RELEASE causal_apply")


def _why(state: str, seq: int, event_id: str, prev: str | None, chain: list[str], created_at: Mapping[str, int]) -> str:
    if state == LOST:
        return f"lost the fork at seq {seq} to {chain[seq]}"
    if seq > 0 and prev == chain[seq - 1] and backdated(event_id, prev, created_at):
        return (f"held: backdated, created_at {created_at[event_id]} at seq {seq} is earlier than its "
                f"predecessor's ({created_at[prev]})")
    return f"held: back-link {prev} at seq {seq} is not the applied operation"


def _stored_created_at(conn: sqlite3.Connection, event_ids: list[str]) -> dict[str, int]:
    found: dict[str, int] = {}
    for start in range(0, len(event_ids), 500):  # (SQLite bounds the parameters of one statement)
        chunk = [bytes.fromhex(i) for i in event_ids[start:start + 500]]
        rows = conn.execute(f"SELECT id, created_at FROM events WHERE id IN ({', '.join('?' * len(chunk))})", chunk)
        found.update((bytes(raw).hex(), created_at) for raw, created_at in rows)
    return found


def _load_stored_event(conn: sqlite3.Connection, event_id: str) -> Event:
    row = conn.execute("SELECT raw FROM events WHERE id = ?", (bytes.fromhex(event_id),)).fetchone()
    return stored_event(row[0])
