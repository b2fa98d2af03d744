"""Retention and NIP-62 tests: a running relay, publishing, and one check that every table derived from
`events` agrees with it (tag index, projected tables, negentropy index)."""

from __future__ import annotations

import sqlite3
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path

import orjson

from relay.config import Config
from relay.store.negentropy import check_nodes, indexed_items, recompute
from tests.conftest import make_config
from tests.helpers import Client
from tests.inprocess import Relay
from tests.store.projectors.common import problems
from tests.store.test_properties import expected_tag_rows, table_rows


def assert_consistent(path: Path, config: Config) -> None:
    """Fail unless the tag index, every projector of `config` (`verify`) and every negentropy filter's items
    and nodes equal what the stored events give."""
    conn = sqlite3.connect(path)
    try:
        events = [orjson.loads(raw) for (raw,) in conn.execute("SELECT raw FROM events")]
        filters = conn.execute("SELECT filter_no, spec FROM neg_filters").fetchall()
        assert filters, "no negentropy index"
        for number, spec in filters:
            assert indexed_items(conn, number) == recompute(conn, spec), spec
            assert check_nodes(conn, number) == [], spec
    finally:
        conn.close()
    ids, tags, orphans = table_rows(path)
    assert ids == {e["id"] for e in events}
    assert tags == expected_tag_rows(events) and orphans == 0
    assert problems(path, config.projectors) == []


@asynccontextmanager
async def running(tmp_path: Path, protected: tuple[str, ...] = (), **sections):
    """(relay, client): a started relay on `tmp_path` with `sections`, projectors named in `protected` marked
    protected, and a client connected to it; both closed on exit."""
    config = make_config(tmp_path, **sections)
    config = replace(config, projectors=tuple(replace(s, protected=s.table in protected) for s in config.projectors))
    relay = Relay(config)
    await relay.start()
    client = await Client.connect(relay.url)
    try:
        yield relay, client
    finally:
        await client.close()
        await relay.stop()


async def publish_all(client: Client, events: list[dict]) -> None:
    """Publish `events` one by one; each must be accepted."""
    for event in events:
        reply = await client.publish(event)
        assert reply[2] is True, reply


async def stored_ids(client: Client) -> set[str]:
    """Ids of every event the relay serves."""
    return {e["id"] for e in await client.req("all", {"limit": 5000})}
