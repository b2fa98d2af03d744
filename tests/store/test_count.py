"""NIP-45 COUNT statements: a filter of tags and times alone is counted from the tag index, without reading
the events table, and still leaves out expired events the purge has not removed yet (NIP-40)."""

from __future__ import annotations

import sqlite3
import time

import pytest

from relay.node import open_store
from relay.protocol.filters import parse_filter
from relay.store.queries import compile_count, compile_filter, run_count
from tests.conftest import make_config
from tests.helpers import Keys, store_events

P = Keys(0xC0).pubkey
SHAPES = [{"#p": [P]}, {"#p": [P], "#t": ["x"]}, {"#p": [P, "f" * 64], "since": 900}, {"#p": [P], "kinds": [1]}]


@pytest.fixture
async def stored(tmp_path, alice, bob):
    """A store holding four `p`-tagged events, one of them expiring 60 s from now; (its path, now)."""
    now = int(time.time())
    events = [alice.sign(tags=[["p", P], ["t", "x"]], created_at=now - 10),
              bob.sign(tags=[["p", P]], created_at=now - 9),
              bob.sign(kind=7, tags=[["p", P], ["t", "x"]], created_at=now - 8),
              alice.sign(tags=[["p", P], ["t", "x"], ["expiration", str(now + 60)]], created_at=now - 7)]
    config = make_config(tmp_path)
    store = await open_store(config)
    try:
        await store_events(store, events)
    finally:
        await store.close()
    return config.store.path, now


def test_a_count_of_tags_and_times_reads_no_event(stored):
    """The plan of `{"#p": [...]}` (and with `since`, or a second tag) names no events table access but the
    expiration index; with `kinds` it reads each event."""
    path, now = stored
    with sqlite3.connect(path) as conn:
        for obj in SHAPES:
            c = compile_count(parse_filter(obj), now)
            plan = [row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + c.sql, c.params)]
            reads_events = any(line.startswith("SEARCH e ") for line in plan)
            assert reads_events == ("kinds" in obj), (obj, plan)


def test_a_count_leaves_out_expired_events_not_yet_purged(stored):
    """At `now` every event counts; 61 s later (before any purge) the expired one does not, for each shape,
    and each count equals the number of events the same filter selects."""
    path, now = stored
    with sqlite3.connect(path) as conn:
        for at, expected in ((now, {0: 4, 1: 3, 2: 4, 3: 3}), (now + 61, {0: 3, 1: 2, 2: 3, 3: 2})):
            for i, obj in enumerate(SHAPES):
                f = parse_filter(obj)
                counted = run_count(conn, [compile_count(f, at)])
                selected = compile_filter(f, 100, at)
                assert counted == expected[i] == len(conn.execute(selected.sql, selected.params).fetchall()), obj
