"""A bulk load into an empty store (relay/store/bulk.py): the events' secondary indexes are dropped for the load
and built at its end; a load that died half-way leaves them to the next writer that opens the store."""

from __future__ import annotations

import json
import sqlite3

from relay.node import open_store
from relay.protocol.filters import parse_filter
from relay.store.bulk import DEFERRED, META_KEY, defer_indexes
from tests.conftest import make_config
from tests.helpers import REAL_EVENTS, store_events
from tests.served import relay_cli, relay_cli_async


def _indexes(path) -> set[str]:
    with sqlite3.connect(path) as conn:
        return {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}


def _saved(path) -> bool:
    with sqlite3.connect(path) as conn:
        return conn.execute("SELECT 1 FROM meta WHERE key = ?", (META_KEY,)).fetchone() is not None


def _plan(path, sql: str) -> str:
    with sqlite3.connect(path) as conn:
        return " ".join(row[-1] for row in conn.execute("EXPLAIN QUERY PLAN " + sql))


def test_an_import_into_a_new_store_ends_with_every_index(tmp_path):
    """`relay import --create`: the deferred indexes are back, nothing is left in meta, queries use them, and
    `relay verify` agrees."""
    db = tmp_path / "relay.db"
    done = relay_cli("import", "--create", REAL_EVENTS, "--db", db)
    assert done.returncode == 0, done.stderr
    assert set(DEFERRED) <= _indexes(db) and not _saved(db)
    assert "events_by_pubkey" in _plan(db, "SELECT id FROM events WHERE pubkey = x'00' ORDER BY created_at DESC")
    assert relay_cli("verify", "--db", db).returncode == 0


async def test_a_sync_into_a_new_store_ends_with_every_index(tmp_path, relay):
    """`relay sync URL --create --dir down` from a real relay holding the real kind-1 events: a bulk load too, so
    the same end (every index, nothing in meta, `relay verify` clean), and every event the peer holds is here."""
    events = [e for e in map(json.loads, REAL_EVENTS.read_bytes().splitlines()) if e["kind"] == 1]
    await store_events(relay.store, events)
    held = await relay.store.items(parse_filter({}))
    db = tmp_path / "synced.db"
    code, out, err = await relay_cli_async("sync", relay.url, "--create", "--dir", "down", "--db", db)
    assert code == 0, err
    assert f"fetched {len(held)}," in out, out
    assert set(DEFERRED) <= _indexes(db) and not _saved(db)
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM events").fetchone()[0] == len(held)
    assert relay_cli("verify", "--db", db).returncode == 0


async def test_a_load_that_died_leaves_the_indexes_to_the_next_writer(tmp_path, alice):
    """Deferred, then no end (a killed import): the next store opened for writing builds them first."""
    config = make_config(tmp_path)
    store = await open_store(config)
    assert await store.run_job(defer_indexes) is True
    await store_events(store, [alice.sign(content=f"n{i}") for i in range(20)])
    await store.close()
    path = config.store.path
    assert not set(DEFERRED) & _indexes(path) and _saved(path)
    store = await open_store(config)
    await store.close()
    assert set(DEFERRED) <= _indexes(path) and not _saved(path)


async def test_a_store_holding_events_is_not_deferred(tmp_path, alice):
    """Only an empty store is loaded without its indexes: one with events keeps them."""
    store = await open_store(make_config(tmp_path))
    try:
        await store_events(store, [alice.sign(content="held")])
        assert await store.run_job(defer_indexes) is False
    finally:
        await store.close()
    assert set(DEFERRED) <= _indexes(make_config(tmp_path).store.path)
