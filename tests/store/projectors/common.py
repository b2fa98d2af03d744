"""Helpers for projector tests: events from signed dicts, stores on real SQLite files, table dumps."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from hypothesis import strategies as st

from relay.protocol.event import Event, EventLimits, parse_event
from relay.store.projectors import BUILTIN_PROJECTORS, ProjectorHook
from relay.store.projectors.causal import CausalSpec
from relay.store.projectors.spec import ProjectorSpec
from relay.store.projectors.tables import dump_table
from relay.store.projectors.verify import verify
from relay.store.store import Store, StoreOptions
from relay.store.writes import Changes
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


async def build_step(store: Store, build) -> bool:
    """One step of a `build.Build` as the relay runs it: a job of the store's writer, between batches of events."""
    return await store.run_job(lambda conn, hooks, b: (Changes(), b.step(conn)), build)


async def build_while_writing(store: Store, hook: ProjectorHook, during: Sequence[Event], sizes: Sequence[int],
                              rest_sizes: Sequence[int]) -> int:
    """Run `hook.builds` step by step, committing a batch of `during` (sizes from `sizes`, else 1) before each
    step, then the rest in batches of `rest_sizes`. Returns the steps run."""
    steps, queue = 0, list(during)
    for build in hook.builds:
        while True:
            size = sizes[steps % len(sizes)] if sizes else 1
            await submit_batches(store, queue[:size], [size])
            del queue[:size]
            steps += 1
            if await build_step(store, build):
                break
    await submit_batches(store, queue, rest_sizes)
    return steps


def built_and_live(data, events: Sequence[Event], specs: Sequence, built_while_writing, live) -> tuple:
    """Draw with hypothesis' `data` an order of `events`, how many are stored before the build, the events per
    build step and the batches written between steps; run `built_while_writing(path, before, during, batch,
    sizes)` and `live(path, events in that order)` on two new databases. Returns (the built database's `dumps`,
    the live one's, the built one's `problems`)."""
    order = data.draw(st.permutations(events), label="order")
    cut = data.draw(st.integers(0, len(events)), label="events before the build")
    batch = data.draw(st.integers(1, 4), label="events per step")
    sizes = data.draw(st.lists(st.integers(0, 5), max_size=6), label="writes between steps")
    with tempfile.TemporaryDirectory() as tmp:
        built, other = Path(tmp) / "built.db", Path(tmp) / "live.db"
        asyncio.run(built_while_writing(built, list(order[:cut]), list(order[cut:]), batch, sizes))
        asyncio.run(live(other, list(order)))
        return dumps(built, specs), dumps(other, specs), problems(built, specs)
