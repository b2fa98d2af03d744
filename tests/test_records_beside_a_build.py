"""Record commands beside a projector being built (relay/commands/record_get.py, relay/node.py `open_store`,
relay/locks.py `is_served`), and a writer that waits out another process's write lock (relay/store/db.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import sqlite3
import time
from pathlib import Path

import orjson

from relay.config import load_config
from relay.locks import database_lock
from relay.node import open_store
from relay.protocol.event import EventLimits, parse_event
from relay.store.projectors.tables import build_progress
from tests.conftest import make_config
from tests.served import relay_cli_async

NOTES = 5


def _note(i: int) -> dict:
    # Stored straight through the store's writer, which checks ids but not signatures (ingest does).
    body = [0, "ab" * 32, 1_700_000_000 + i, 1, [], f"note {i}"]
    event_id = hashlib.sha256(orjson.dumps(body)).hexdigest()
    return {"id": event_id, "pubkey": body[1], "created_at": body[2], "kind": 1, "tags": [], "content": body[5],
            "sig": "00" * 64}


async def _building(tmp_path: Path) -> tuple[Path, Path]:
    """A database of NOTES kind-1 events whose `notes` projector (one event a step) is left mid-build, as a relay
    stopped while building leaves it; (config file, database)."""
    db = tmp_path / "relay.db"
    config_file = tmp_path / "relay.toml"
    config_file.write_text(f"""
[store]
path = "{db}"
projector_build_batch = 1
[[projectors]]
table = "notes"
kind = 1
primary_key = ["id"]
fields = [{{name = "id", type = "TEXT", source = "id"}}, {{name = "body", type = "TEXT", source = "content"}}]
""")
    config = load_config(config_file)
    store = await open_store(dataclasses.replace(config, projectors=()))
    for i in range(NOTES):
        await store.submit(parse_event(_note(i), EventLimits(), time.time()))
    await store.close()
    await (await open_store(config, background_builds=True)).close()  # the build started, no step run
    return config_file, db


def _progress(db: Path) -> dict | None:
    with sqlite3.connect(db) as conn:
        return build_progress(conn, "notes")


async def test_get_while_the_table_builds_exits_3_and_runs_no_build_step(tmp_path):
    """`relay record get` reads read-only: exit 3 "building", and the build is where it was."""
    config_file, db = await _building(tmp_path)
    code, _, err = await relay_cli_async("record", "get", "notes", "--pk", json.dumps({"id": _note(0)["id"]}),
                                         "--config", config_file)
    assert code == 3 and "building" in err
    assert _progress(db) == {"done": 0, "total": NOTES}


async def test_an_offline_write_beside_a_serving_relay_leaves_its_build_to_it(tmp_path):
    """`relay record put` while a relay holds the database lock (and, here, no channel answers: a relay starting,
    or its socket removed) refuses after waiting for the channel and steps no build; with no relay serving the
    database, the offline writer finishes the build itself."""
    config_file, db = await _building(tmp_path)
    lock = database_lock(db)
    lock.acquire({})
    try:
        code, out, err = await relay_cli_async("record", "put", "notes", "--row", '{"body": "beside"}',
                                               "--config", config_file)
        assert code == 2 and "a relay serves it" in err, (code, out, err)
        assert _progress(db) == {"done": 0, "total": NOTES}
    finally:
        lock.release()
    code, _, err = await relay_cli_async("record", "put", "notes", "--row", '{"body": "alone"}', "--config", config_file)
    assert code == 0, err
    assert _progress(db) is None


async def test_the_writer_waits_out_another_connection_holding_the_write_lock(tmp_path):
    """A write lock held past the busy timeout (5 s) by another connection delays the writer; the event is
    stored once the lock goes, and the store keeps working (it used to fail with "database is locked")."""
    store = await open_store(make_config(tmp_path))
    try:
        other = sqlite3.connect(tmp_path / "relay.db", isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        write = asyncio.ensure_future(store.submit(parse_event(_note(0), EventLimits(), time.time())))
        await asyncio.sleep(6)
        assert not write.done()
        other.execute("ROLLBACK")
        other.close()
        assert (await asyncio.wait_for(write, 30))[0] is True
        assert (await store.submit(parse_event(_note(1), EventLimits(), time.time())))[0] is True
    finally:
        await store.close()
