"""Helpers for projector tests: events from signed dicts, stores on real SQLite files, table dumps."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path

from relay.protocol.event import Event, EventLimits, parse_event
from relay.store.projectors import BUILTIN_PROJECTORS, ProjectorHook
from relay.store.projectors.causal import CausalSpec
from relay.store.projectors.spec import ProjectorSpec
from relay.store.projectors.tables import dump_table
from relay.store.projectors.verify import verify
from relay.store.store import Store, StoreOptions
from tests.helpers import Keys

OPTIONS = StoreOptions(read_connections=1, checkpoint_interval_seconds=0)
LIMITS = EventLimits(max_created_at_future_seconds=10**10)


def event(keys: Keys, kind: int, content: str | dict = "", tags: list | None = None,
          created_at: int = 1_000) -> Event:
    """A signed, validated Event (content dicts are JSON-encoded)."""
    if not isinstance(content, str):
        content = json.dumps(content)
    return parse_event(keys.sign(kind=kind, content=content, tags=tags or [], created_at=created_at), LIMITS,
                       time.time())


async def open_store(path: Path, specs: Sequence = BUILTIN_PROJECTORS, **hook_options) -> tuple[Store, ProjectorHook | None]:
    """A Store on `path` with a ProjectorHook for `specs` (none when `specs` is empty)."""
    hook = ProjectorHook(specs, **hook_options) if specs else None
    store = await Store.open(path, OPTIONS, [hook] if hook else [])
    return store, hook


async def submit_batches(store: Store, events: Sequence[Event], sizes: Sequence[int] = ()) -> list[tuple[bool, str]]:
    """Submit `events` in consecutive batches of `sizes` (then one batch of the rest); each batch is one transaction."""
    outcomes, start = [], 0
    for size in list(sizes) + [len(events)]:
        chunk = events[start:start + max(1, size)]
        if not chunk:
            break
        outcomes += await asyncio.gather(*[store.submit(e) for e in chunk])
        start += len(chunk)
    return outcomes


def connect(path: Path) -> sqlite3.Connection:
    """A plain autocommit sqlite3 connection to `path`."""
    return sqlite3.connect(path, isolation_level=None)


def table_names(spec) -> tuple[str, ...]:
    """The tables a spec writes."""
    return spec.table_names if isinstance(spec, CausalSpec) else (spec.table,)


def dumps(path: Path, specs: Sequence) -> dict[str, bytes]:
    """Every projected table of `specs` in `path` as sorted JSON lines (causal tables by all columns)."""
    conn = connect(path)
    try:
        out = {}
        for spec in specs:
            if isinstance(spec, ProjectorSpec):
                out[spec.table] = dump_table(conn, spec.table, spec.columns, spec.key_columns())
            else:
                for table in spec.table_names:
                    columns = [r[1] for r in conn.execute(f"PRAGMA table_info({table})")]
                    out[table] = dump_table(conn, table, columns, columns)
                out["causal_ops"] = dump_table(conn, "causal_ops", ["log_id", "author", "seq", "event_id", "prev",
                                                                    "state"], ["log_id", "author", "seq", "event_id"])
        return out
    finally:
        conn.close()


def problems(path: Path, specs: Sequence) -> list:
    """The TableChecks of `verify` that are not ok (empty when every table agrees with the events)."""
    conn = connect(path)
    try:
        return [c for c in verify(conn, list(specs)) if not c.ok]
    finally:
        conn.close()


def rows(path: Path, sql: str, params: tuple = ()) -> list[tuple]:
    """Result rows of one query on `path`."""
    conn = connect(path)
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()
