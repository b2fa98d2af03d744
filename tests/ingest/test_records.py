"""Records, the writing side (relay/ingest/records.py, relay/store/clock.py): put_record and delete_record on a
node in this process, through ingest, with created_at reserved per coordinate."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time

import pytest
import structlog.testing
import websockets

from relay.ingest import RECORD
from relay.ingest.outcome import ACCEPTED, NEWER_VERSION
from relay.keys import NodeKey
from relay.protocol.event import EventLimits, parse_event
from relay.protocol.filters import parse_filter
from relay.protocol.rejection import Rejection
from relay.store import clock
from relay.store.projectors import BUILTIN_PROJECTORS
from relay.store.projectors.encode import RowRefused
from relay.store.projectors.spec import FieldSpec, ProjectorSpec
from relay.store.records import RecordQueryError
from tests.conftest import make_config
from tests.inprocess import Relay
from tests.store.projectors.common import dumps, open_store

LIMITS = EventLimits(max_created_at_future_seconds=10**10)


async def test_put_get_query_and_delete_a_row(relay):
    """A put row is read back by key and by query; the event is signed by the node key; a delete removes it."""
    records = relay.node.records
    written = await records.put_record("profiles", {"name": "alice", "about": "hi"})
    assert written.outcome == ACCEPTED and written.event["pubkey"] == records.node_key.pubkey
    pk = {"pubkey": records.node_key.pubkey}
    row = await records.get_record("profiles", pk)
    assert (row["name"], row["about"], row["_event_id"]) == ("alice", "hi", written.event["id"])
    assert [r["name"] for r in (await records.query_records("profiles", {"pubkey": pk["pubkey"]})).rows] == ["alice"]
    deleted = await records.delete_record("profiles", pk=pk, reason="gone")
    assert deleted.outcome == ACCEPTED and deleted.event["kind"] == 5 and deleted.event["content"] == "gone"
    assert deleted.event["tags"] == [["a", f"0:{pk['pubkey']}:"], ["k", "0"]]
    assert await records.get_record("profiles", pk) is None


async def test_a_put_reaches_live_subscribers_like_any_event(relay):
    """The event goes through ingest and the writer, so a REQ open on the relay receives it live."""
    async with websockets.connect(relay.url) as ws:
        await ws.send(json.dumps(["REQ", "s", {"kinds": [0]}]))
        while json.loads(await asyncio.wait_for(ws.recv(), 10))[0] != "EOSE":  # (a NIP-42 AUTH challenge first)
            pass
        written = await relay.node.records.put_record("profiles", {"name": "live"})
        message = json.loads(await asyncio.wait_for(ws.recv(), 10))
    assert message == ["EVENT", "s", written.event]


async def test_a_given_key_signs_and_a_regular_kind_only_inserts(tmp_path):
    """A key given to put_record signs; a regular kind's rows key on the event id, so each put adds a row."""
    spec = ProjectorSpec("notes", 1, (FieldSpec("id", "TEXT", "id"), FieldSpec("text", "TEXT", "content")), ("id",))
    config = make_config(tmp_path)
    relay = Relay(dataclasses.replace(config, projectors=(*config.projectors, spec)))
    await relay.start()
    try:
        records, key = relay.node.records, NodeKey(bytes(range(1, 33)))
        first = await records.put_record("notes", {"text": "one"}, key=key)
        second = await records.put_record("notes", {"text": "two"}, key=key)
        assert first.event["pubkey"] == second.event["pubkey"] == key.pubkey
        rows = (await records.query_records("notes")).rows
        assert sorted(r["text"] for r in rows) == ["one", "two"]
        gone = await records.delete_record("notes", key=key, event_id=first.event["id"])
        assert gone.event["tags"] == [["e", first.event["id"]], ["k", "1"]]
        assert [r["text"] for r in (await records.query_records("notes")).rows] == ["two"]
    finally:
        await relay.stop()


async def test_two_puts_within_one_second_are_ordered_and_the_second_wins_everywhere(relay, tmp_path):
    """Two puts of one coordinate in the same second get created_at t and t+1; a store fed them in the opposite
    order ends with the same row (the second's)."""
    records = relay.node.records
    first = await records.put_record("profiles", {"name": "one"})
    second = await records.put_record("profiles", {"name": "two"})
    assert second.event["created_at"] > first.event["created_at"]  # t+1 in one second, later on a slow machine
    assert (await records.get_record("profiles", {"pubkey": records.node_key.pubkey}))["name"] == "two"
    peer, _ = await open_store(tmp_path / "peer.db")
    try:
        answers = [await peer.submit(parse_event(e, LIMITS, time.time())) for e in (second.event, first.event)]
        assert answers[1] == (False, NEWER_VERSION.message)
    finally:
        await peer.close()
    here = dumps(relay.config.store.path, BUILTIN_PROJECTORS)
    assert dumps(tmp_path / "peer.db", BUILTIN_PROJECTORS)["profiles"] == here["profiles"]


@pytest.mark.parametrize("table, row, pk", [
    ("profiles", {"name": "back"}, {}),
    ("articles", {"d": "post", "title": "back"}, {"d": "post"}),
    ("follows", [{"followed": "aa" * 32}], {}),
])
async def test_a_put_after_a_delete_re_creates_the_row(relay, table, row, pk):
    """Put, delete (an `a` tag), put again in the same second: the deletion is newer than the first version and
    the second put newer than the deletion, so the row is back."""
    records = relay.node.records
    pk = {"pubkey": records.node_key.pubkey, **pk}
    put = await records.put_record(table, row)
    deletion = await records.delete_record(table, pk=pk)
    again = await records.put_record(table, row)
    assert put.event["created_at"] < deletion.event["created_at"] < again.event["created_at"]
    assert again.outcome == ACCEPTED
    assert (await records.query_records(table, pk)).rows[0]["_event_id"] == again.event["id"]


async def test_a_put_is_newer_than_a_deletion_signed_elsewhere(relay):
    """A kind-5 `a` deletion of the coordinate with a later created_at (another client of the same key): the
    next put is newer still, so it is stored and not deleted."""
    records = relay.node.records
    key = records.node_key
    ahead = int(time.time()) + 100
    deletion = key.sign_event(5, [["a", f"30023:{key.pubkey}:post"]], "", ahead)
    [(outcome, _)] = await relay.ingest.accept_many([deletion], RECORD)
    assert outcome == ACCEPTED
    written = await records.put_record("articles", {"d": "post", "title": "t"})
    assert written.event["created_at"] == ahead + 1 and written.outcome == ACCEPTED
    assert await records.get_record("articles", {"pubkey": key.pubkey, "d": "post"}) is not None


async def test_writes_faster_than_the_future_window_wait_or_are_rate_limited(tmp_path):
    """With 62 s of future allowed, a coordinate's created_at may run 2 s ahead: past it, wait=False raises
    "rate-limited:", and wait=True waits until the value fits."""
    relay = Relay(make_config(tmp_path, limits={"max_created_at_future_seconds": 62}))
    await relay.start()
    try:
        records = relay.node.records
        with pytest.raises(Rejection) as refused:
            for _ in range(20):  # each put moves the coordinate one second ahead; the clock does not keep up
                await records.put_record("profiles", {"name": "fast"}, wait=False)
        assert str(refused.value).startswith("rate-limited: ")
        written = await records.put_record("profiles", {"name": "patient"})
        assert written.outcome == ACCEPTED and written.event["created_at"] <= time.time() + 2
    finally:
        await relay.stop()


async def test_the_reservation_holds_across_restarts(tmp_path):
    """A created_at reserved (even for an event never stored) is never handed out again after a restart."""
    config = make_config(tmp_path)
    relay = Relay(config)
    await relay.start()
    key = relay.node.records.node_key
    coordinate = (0, bytes.fromhex(key.pubkey), "")
    now = int(time.time())
    reserved = [await relay.store.run_job(clock.reserve, coordinate, now, now + 10) for _ in range(3)]
    assert reserved == [now, now + 1, now + 2]
    await relay.stop()
    relay = Relay(config)
    await relay.start()
    try:
        written = await relay.node.records.put_record("profiles", {"name": "after"})
        assert written.event["created_at"] == now + 3
    finally:
        await relay.stop()


async def test_bad_tables_rows_and_keys_are_refused_by_name(relay):
    """An unknown table, a row outside the projection's image and a delete of another signer's row."""
    records = relay.node.records
    with pytest.raises(RecordQueryError) as unknown:
        await records.put_record("nope", {})
    assert unknown.value.parameter == "table"
    with pytest.raises(RowRefused) as bad:
        await records.put_record("follows", [{"followed": "aa" * 32, "petname": "x"}])
    assert bad.value.parameter == "relay"
    with pytest.raises(RowRefused) as other:
        await records.delete_record("profiles", pk={"pubkey": "cd" * 32})
    assert other.value.parameter == "pubkey"
    with pytest.raises(RowRefused) as neither:
        await records.delete_record("profiles")
    assert neither.value.parameter == "pk"


async def test_a_created_at_too_far_ahead_is_refused_before_the_clock_moves(relay):
    """An explicit created_at past the future limit is refused "invalid:" and reserves nothing: the next put
    to that coordinate is signed now, with no wait and no rate limit."""
    records = relay.node.records
    with pytest.raises(Rejection) as refused:
        await records.put_record("profiles", {"name": "fut"}, created_at=4_000_000_000)
    assert str(refused.value).startswith("invalid: created_at 4000000000 is too far in the future")
    written = await records.put_record("profiles", {"name": "now"}, wait=False)
    assert written.outcome == ACCEPTED and written.event["created_at"] <= time.time() + 1


async def test_a_wait_for_the_clock_is_logged_once(tmp_path):
    """A put that waits for its coordinate's clock says so once in the log (a silent wait looks like a hang)."""
    relay = Relay(make_config(tmp_path, limits={"max_created_at_future_seconds": 62}))
    await relay.start()
    try:
        records = relay.node.records
        # 2 s of margin; a version 4 s ahead makes the next put wait 2-3 s, whenever the clock ticks (a run of
        # quick puts would not wait if a second passed between them)
        ahead = int(time.time()) + 4
        assert (await records.put_record("profiles", {"name": "x"}, created_at=ahead)).outcome == ACCEPTED
        with structlog.testing.capture_logs() as logs:
            started = time.monotonic()
            written = await records.put_record("profiles", {"name": "y"})
        assert written.outcome == ACCEPTED and written.event["created_at"] == ahead + 1
        assert time.monotonic() - started >= 1
        assert [e["event"] for e in logs].count("record_clock_wait") == 1
    finally:
        await relay.stop()


async def test_a_record_whose_event_a_client_could_not_send_is_refused(tmp_path):
    """A row signed into an event whose EVENT message exceeds limits.max_message_bytes is refused "invalid:"
    and not stored; ingest's event limits (tags) apply to records as to clients."""
    relay = Relay(make_config(tmp_path, limits={"max_message_bytes": 9000, "max_event_tags": 100},
                              negentropy={"frame_size_limit": 4096}))
    await relay.start()
    try:
        records = relay.node.records
        written = await records.put_record("profiles", {"name": "big", "about": "x" * 9000})
        assert (written.outcome.accepted, written.outcome.prefix) == (False, "invalid")
        assert "limits.max_message_bytes" in written.outcome.reason
        assert await records.get_record("profiles", {"pubkey": records.node_key.pubkey}) is None
        many = await records.put_record("follows", [{"followed": f"{i:064x}"} for i in range(101)])
        assert (many.outcome.accepted, many.outcome.prefix) == (False, "invalid")
    finally:
        await relay.stop()


async def test_a_lone_surrogate_in_a_row_is_refused_naming_the_field(relay):
    """A string that no UTF-8 JSON holds is refused with RowRefused naming its column, not a crash."""
    with pytest.raises(RowRefused) as refused:
        await relay.node.records.put_record("profiles", {"name": "\ud800"})
    assert refused.value.parameter == "name" and "surrogate" in str(refused.value)


async def test_deleting_a_row_that_does_not_exist_is_refused_and_stores_nothing(relay):
    """A delete matching no row is refused "invalid: no such row" instead of storing a kind-5 that deletes
    nothing, by key and by event id."""
    records = relay.node.records
    by_key = await records.delete_record("articles", pk={"pubkey": records.node_key.pubkey, "d": "never"})
    by_id = await records.delete_record("profiles", event_id="ef" * 32)
    for written in (by_key, by_id):
        assert (written.outcome.accepted, written.outcome.prefix) == (False, "invalid")
        assert written.outcome.reason.startswith("no such row of ")
    assert await relay.store.query([parse_filter({"kinds": [5]})], 100, 100) == []
