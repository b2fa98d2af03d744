"""The WAL checkpoint policy (relay/store/checkpoint.py) on real SQLite files, and the store running it."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from contextlib import closing

import pytest

from relay.config import ConfigError
from relay.protocol.filters import parse_filter
from relay.store.checkpoint import checkpoint, wal_bytes
from relay.store.store import Store, StoreOptions
from tests.conftest import make_config
from tests.helpers import Keys, store_events


@pytest.fixture
def wal_db(tmp_path):
    """(path, writer) of a WAL database whose WAL holds ~1 MiB not yet checkpointed."""
    path = tmp_path / "wal.db"
    writer = sqlite3.connect(path, isolation_level=None)
    writer.execute("PRAGMA journal_mode = WAL")
    writer.execute("PRAGMA wal_autocheckpoint = 0")  # only our checkpoints run
    writer.execute("CREATE TABLE t (x BLOB)")
    _insert(writer, 1000)
    yield path, writer
    writer.close()


def _insert(writer: sqlite3.Connection, rows: int) -> None:
    writer.execute("BEGIN")
    writer.executemany("INSERT INTO t VALUES (?)", [(bytes(1000),)] * rows)
    writer.execute("COMMIT")


def _checkpointer(path) -> sqlite3.Connection:
    return sqlite3.connect(path, isolation_level=None)


def test_passive_copies_everything_and_leaves_the_wal_file(wal_db):
    """PASSIVE backfills the whole WAL when nobody reads; the file keeps its size."""
    path, _ = wal_db
    size = wal_bytes(path)
    assert size > 1_000_000
    with closing(_checkpointer(path)) as conn:
        result = checkpoint(conn, path, "passive", 0)
    assert (result.mode, result.busy) == ("passive", False)
    assert result.wal_frames == result.checkpointed_frames > 0
    assert wal_bytes(path) == size


@pytest.mark.parametrize("mode, limit", [("truncate", 0), ("passive", 100_000)], ids=["mode", "size"])
def test_truncate_by_mode_or_by_wal_size_empties_the_wal_file(wal_db, mode, limit):
    """checkpoint_mode = truncate, or a WAL past checkpoint_truncate_wal_bytes: the WAL file ends at 0 bytes."""
    path, writer = wal_db
    with closing(_checkpointer(path)) as conn:
        result = checkpoint(conn, path, mode, limit)
    assert (result.mode, result.busy) == ("truncate", False)
    assert wal_bytes(path) == 0
    assert writer.execute("SELECT count(*) FROM t").fetchone() == (1000,)


def test_a_wal_under_the_size_limit_is_not_truncated(wal_db):
    """Below checkpoint_truncate_wal_bytes, passive mode stays passive."""
    path, _ = wal_db
    with closing(_checkpointer(path)) as conn:
        assert checkpoint(conn, path, "passive", 100_000_000).mode == "passive"
    assert wal_bytes(path) > 1_000_000


def test_a_reader_on_an_old_snapshot_stops_the_stronger_mode_without_waiting(wal_db):
    """A reader holding frames: PASSIVE cannot copy them all, so TRUNCATE is not even tried (no waiting, no lock)."""
    path, writer = wal_db
    reader = sqlite3.connect(path, isolation_level=None)
    try:
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM t").fetchone()  # a snapshot of the WAL as it is now
        _insert(writer, 100)  # frames past that snapshot
        with closing(_checkpointer(path)) as conn:
            result = checkpoint(conn, path, "truncate", 0)
        assert result.mode == "passive"
        assert result.checkpointed_frames < result.wal_frames
        writer.execute("INSERT INTO t VALUES (x'00')")  # the writer was never locked out
    finally:
        reader.close()
    assert wal_bytes(path) > 0


async def test_store_runs_the_configured_policy_in_the_background(tmp_path):
    """A store with checkpoint_mode = truncate empties its WAL after writes, by itself."""
    options = StoreOptions(checkpoint_interval_seconds=0.05, checkpoint_mode="truncate")
    store = await Store.open(tmp_path / "relay.db", options)
    try:
        keys = Keys(0xC0FFEE)
        await store_events(store, [keys.sign(content=str(i)) for i in range(300)])
        deadline = time.monotonic() + 30
        while wal_bytes(store.path) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert wal_bytes(store.path) == 0
        assert len(await store.query([parse_filter({})], 500, 500)) == 300  # every event is still served
    finally:
        await store.close()


def test_checkpoint_mode_must_be_a_known_mode(tmp_path):
    """A bad checkpoint_mode stops the start, naming the key."""
    with pytest.raises(ConfigError, match="store.checkpoint_mode"):
        make_config(tmp_path, store={"checkpoint_mode": "sometimes"})
    assert make_config(tmp_path, store={"checkpoint_mode": "restart"}).store.options().checkpoint_mode == "restart"
