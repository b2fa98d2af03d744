"""Read connections map the database (`store.read_mmap_bytes`, SQLite's `mmap_size`): in the writer's process
and in a worker's (`ReadPool.open`) alike; 0 reads with pread, as before."""

from __future__ import annotations

import pytest

from relay.node import open_store
from relay.store.reads import ReadPool
from tests.conftest import make_config


def _mmap_size(conn) -> int:
    return conn.execute("PRAGMA mmap_size").fetchone()[0]


@pytest.mark.parametrize("configured", [1 << 20, 0])
async def test_each_read_connection_maps_what_is_configured(tmp_path, configured):
    """Every read connection of the store and of a reader-only store reports `mmap_size` = the key."""
    config = make_config(tmp_path, store={"read_mmap_bytes": configured, "read_connections": 2})
    store = await open_store(config)
    try:
        reader = await ReadPool.open(config.store.path, config.store.options())
        try:
            for s in (store, reader):
                sizes = [await s.read_snapshot(_mmap_size) for _ in range(4)]  # the pool hands each connection in turn
                assert sizes == [configured] * 4
        finally:
            await reader.close()
    finally:
        await store.close()

