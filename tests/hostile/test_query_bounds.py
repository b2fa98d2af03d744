"""Expensive queries are bounded: database time per REQ/COUNT, rows per REQ; the writer never waits on readers."""

from __future__ import annotations

import asyncio
import threading
import time

import orjson
import pytest

from relay.config import ConfigError
from relay.protocol.auth import PrivateKinds
from relay.protocol.event import parse_event
from relay.protocol.filters import Filter
from tests.conftest import make_config
from tests.helpers import Client
from tests.hostile.fuzzing import real_events
from tests.inprocess import Relay

async def _relay_with_events(tmp_path, stored: int = 1000, store: dict | None = None, **limits) -> Relay:
    """A started relay holding the first `stored` real events (written through the store, signatures aside)."""
    relay = Relay(make_config(tmp_path, limits=limits, store=store or {}))
    await relay.start()
    events = [parse_event(e, relay.config.limits.event_limits(), time.time()) for e in real_events(stored)]
    await asyncio.gather(*(relay.store.submit(e) for e in events))
    return relay


async def test_query_past_its_time_bound_gets_closed_error_and_the_connection_goes_on(tmp_path):
    """A REQ or COUNT scanning 3,000 events past a 1 ns bound gets CLOSED "error:"; an id lookup still answers."""
    # About ten SQLite instructions per event scanned: past PROGRESS_STEPS, so the deadline is checked.
    relay = await _relay_with_events(tmp_path, 3000, query_timeout_seconds=1e-9)
    client = await Client.connect(relay.url)
    try:
        await client.send(["REQ", "scan", {"since": 0, "limit": 5000}])
        assert await client.recv() == ["CLOSED", "scan", "error: query took too long (max 1e-09 s)"]
        await client.send(["COUNT", "count", {"since": 0}])
        assert await client.recv() == ["CLOSED", "count", "error: query took too long (max 1e-09 s)"]
        # Far fewer than PROGRESS_STEPS SQLite instructions: never checked, never aborted.
        wanted = next(e for e in real_events(3000) if e["kind"] == 1 and not e["tags"])
        assert [e["id"] for e in await client.req("lookup", {"ids": [wanted["id"]]})] == [wanted["id"]]
    finally:
        await client.close()
        await relay.stop()


async def test_req_with_1000_filters_returns_at_most_max_query_rows_and_count_takes_600(tmp_path):
    """1,000 filters of limit 5,000 over 1,000 events: only the newest `max_query_rows` (50) come back, in order.

    And a COUNT of 600 filters counts what one filter with the 600 kinds counts.
    """
    relay = await _relay_with_events(tmp_path, max_filters=1000, max_query_rows=50)
    client = await Client.connect(relay.url)
    try:
        newest = [e["id"] for e in await client.req("one", {"limit": 50})]
        filters = [{"since": k, "limit": 5000} for k in range(1000)]
        got = [e["id"] for e in await client.req("many", *filters)]
        assert len(newest) == 50 and got == newest
        # COUNT with more filters than SQLite allows terms in one UNION (500): once "error: internal".
        kinds = range(5, 605)  # not kind 4: served only to its authenticated author or recipient (NIP-42)
        await client.send(["COUNT", "by_kind", *[{"kinds": [k]} for k in kinds]])
        by_kind = await client.recv()
        await client.send(["COUNT", "at_once", {"kinds": list(kinds)}])
        at_once = await client.recv()
        assert by_kind[:2] == ["COUNT", "by_kind"] and at_once[:2] == ["COUNT", "at_once"]
        assert by_kind[2]["count"] == at_once[2]["count"] > 0
    finally:
        await client.close()
        await relay.stop()


@pytest.mark.parametrize("filters", [
    [{"limit": 5000}],  # one statement: SQLite concatenates the answer, and stops at the byte bound
    [{"limit": 5000}, {"since": 0, "limit": 5000}],  # several: merged row by row
], ids=["one filter", "two filters"])
async def test_req_returns_the_newest_events_that_fit_in_max_query_bytes(tmp_path, filters):
    """An answer over `max_query_bytes` (its least, `max_message_bytes`: 1 MiB; the 1,000 events hold ~1.2 MB)
    is cut to its newest events that fit, then EOSE, as `limit` would cut it; the connection goes on."""
    relay = await _relay_with_events(tmp_path, max_query_bytes=1_048_576)
    client = await Client.connect(relay.url)
    try:
        # What an unauthenticated reader sees, with no byte bound: newest first
        private = PrivateKinds(frozenset(relay.config.auth.private_kinds))
        everything = await relay.store.query([Filter()], 5000, 5000, private)
        fits, held = [], 0
        for raw in everything:
            held += len(raw)
            if held > 1_048_576:
                break
            fits.append(orjson.loads(raw)["id"])
        assert 100 < len(fits) < len(everything)
        assert [e["id"] for e in await client.req("big", *filters)] == fits
        wanted = orjson.loads(everything[-1])["id"]
        assert [e["id"] for e in await client.req("small", {"ids": [wanted]})] == [wanted]
    finally:
        await client.close()
        await relay.stop()


async def test_disjoint_filters_over_twice_max_query_bytes_keep_the_newest_that_fit(tmp_path):
    """Two filters splitting 3,000 events (~3 MB visible) by time: the merge passes twice `max_query_bytes` (1 MiB),
    trims to the newest as it goes, and answers the same newest events that fit as one filter does."""
    relay = await _relay_with_events(tmp_path, 3000, max_query_bytes=1_048_576)
    client = await Client.connect(relay.url)
    try:
        private = PrivateKinds(frozenset(relay.config.auth.private_kinds))  # as an unauthenticated reader
        everything = [orjson.loads(raw) for raw in await relay.store.query([Filter()], 5000, 5000, private)]
        middle = everything[len(everything) // 2]["created_at"]
        assert sum(map(len, (orjson.dumps(e) for e in everything))) > 2 * 1_048_576 + 500_000
        one = [e["id"] for e in await client.req("one", {"limit": 5000})]
        two = [e["id"] for e in await client.req("two", {"since": middle, "limit": 5000},
                                                 {"until": middle - 1, "limit": 5000})]
        assert 100 < len(one) < len(everything) and two == one
    finally:
        await client.close()
        await relay.stop()


async def test_an_event_larger_than_max_query_bytes_is_left_out_of_answers(tmp_path, alice):
    """One stored event over `max_query_bytes` (stored before the bound was lowered, or imported) is left
    out: the REQs that reach it answer the other events and EOSE, not `error:`."""
    relay = await _relay_with_events(tmp_path, 20, max_query_bytes=1_048_576, max_content_bytes=2_000_000)
    client = await Client.connect(relay.url)
    try:
        huge = parse_event(alice.sign(content="h" * 1_100_000), relay.config.limits.event_limits(), time.time())
        await relay.store.submit(huge)
        private = PrivateKinds(frozenset(relay.config.auth.private_kinds))  # as an unauthenticated reader
        everything = [orjson.loads(raw)["id"] for raw in await relay.store.query([Filter()], 5000, 5000, private)]
        others = [event_id for event_id in everything if event_id != huge.id]
        assert huge.id in everything and len(others) > 10
        assert [e["id"] for e in await client.req("one", {"limit": 100})] == others
        assert [e["id"] for e in await client.req("two", {"limit": 100}, {"authors": [alice.pubkey]})] == others
        assert await client.req("by_id", {"ids": [huge.id]}) == []
    finally:
        await client.close()
        await relay.stop()


def test_max_query_bytes_below_max_message_bytes_is_refused(tmp_path):
    """One event must fit in an answer: a smaller `max_query_bytes` is a configuration error."""
    with pytest.raises(ConfigError, match=r"limits.max_query_bytes: must be from limits.max_message_bytes \(2048\)"):
        make_config(tmp_path, limits={"max_query_bytes": 1000, "max_message_bytes": 2048})


def test_an_ip_share_smaller_than_one_answer_is_refused(tmp_path):
    """A client IP's share of the stored-results budget below `max_query_bytes` would refuse its large answers
    every time: a configuration error; 0 (no per-IP bound) is allowed."""
    with pytest.raises(ConfigError, match=r"rate_limits.ip_stored_results_bytes: must be 0 \(no bound\) or at least"):
        make_config(tmp_path, rate_limits={"ip_stored_results_bytes": 1_000_000})
    assert make_config(tmp_path, rate_limits={"ip_stored_results_bytes": 0}).rate_limits.ip_stored_results_bytes == 0


async def test_writes_are_acknowledged_while_every_read_connection_is_stuck_mid_query(tmp_path, alice):
    """The only read connection held inside a query (an open snapshot) never stops EVENTs from getting OK true (WAL)."""
    relay = await _relay_with_events(tmp_path, store={"read_connections": 1})
    before = await relay.store.count([Filter()])
    reading, release = threading.Event(), threading.Event()

    def stuck_scan(conn):
        cursor = conn.execute("SELECT raw FROM events ORDER BY created_at")
        cursor.fetchone()  # the statement is running: its snapshot is pinned
        reading.set()
        release.wait(30)
        return conn.execute("SELECT COUNT(*) FROM events").fetchone()[0]

    stuck = asyncio.create_task(relay.store.read_snapshot(stuck_scan))
    client = await Client.connect(relay.url)
    try:
        assert await asyncio.to_thread(reading.wait, 30)
        published = [alice.sign(content=f"during the read {k}") for k in range(5)]
        for event in published:
            assert await client.publish(event) == ["OK", event["id"], True, ""]
        assert not stuck.done()
        release.set()
        assert await stuck == before  # the stuck reader kept its snapshot: it saw none of the writes
        assert {e["id"] for e in await client.req("back", {"authors": [alice.pubkey]})} == {e["id"] for e in published}
    finally:
        release.set()
        await client.close()
        await relay.stop()
