"""The change feed (relay/store/feed.py): every committed insertion and removal, once, in commit order."""

from __future__ import annotations

import asyncio
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings

from relay.store import feed
from relay.store.retention import Protection, Scan, evict_step
from relay.store.store import Store
from tests.store.test_properties import OPTIONS, SETTINGS, live_ids, parsed, scenarios

NOW = int(time.time())


async def _everything(store: Store, since: int = 0, limit: int = 3) -> list[feed.Change]:
    """The whole feed after `since`, read in pages of `limit` as a consumer would."""
    changes = []
    while page := await store.changes(since, limit):
        changes += page
        since = page[-1].cursor
    return changes


def _ops(changes: list[feed.Change]) -> list[tuple[str, str, str | None]]:
    return [(c.op, c.id, c.reason) for c in changes]


async def test_each_insertion_and_removal_has_one_position_in_commit_order(tmp_path, alice, bob):
    """Written, superseded, deleted, expired, evicted and vanished: a consumer polling the feed sees each change
    once, in commit order, as one read at the end does (which no longer has the events removed since)."""
    note = alice.sign(1, "note", [], NOW - 50)
    v1, v2 = alice.sign(0, "v1", [], NOW - 40), alice.sign(0, "v2", [], NOW - 30)
    deletion = alice.sign(5, "", [["e", note["id"]]], NOW - 20)
    expiring = bob.sign(1, "soon gone", [["expiration", str(NOW - 1)]], NOW - 60)
    old = bob.sign(7, "+", [], NOW - 100_000)
    vanish = alice.sign(62, "", [["relay", "ALL_RELAYS"]], NOW - 10)
    store = await Store.open(tmp_path / "f.db", OPTIONS)
    seen: list[feed.Change] = []
    try:
        steps = [
            lambda: store.submit(parsed(note)), lambda: store.submit(parsed(v1)), lambda: store.submit(parsed(v2)),
            lambda: store.submit(parsed(deletion)), lambda: store.submit(parsed(expiring)),
            lambda: store.submit(parsed(old)), store.purge_expired,
            lambda: store.run_job(evict_step, Scan(7, NOW - 1000), 100, 100, Protection(), NOW),
            lambda: store.submit(parsed(vanish)),
        ]
        for step in steps:
            await step()
            seen += await _everything(store, seen[-1].cursor if seen else 0)
        everything = await _everything(store)
    finally:
        await store.close()
    assert [replace(c, raw=None, origin=None) for c in seen] == [replace(c, raw=None, origin=None) for c in everything]
    assert [c.cursor for c in seen] == sorted({c.cursor for c in seen})
    # Removed since: their insertions keep their place, without the event.
    assert _ops(seen)[:11] == [
        ("insert", note["id"], None), ("insert", v1["id"], None), ("insert", v2["id"], None),
        ("remove", v1["id"], "superseded"), ("insert", deletion["id"], None), ("remove", note["id"], "deleted"),
        ("insert", expiring["id"], None), ("insert", old["id"], None), ("remove", expiring["id"], "expired"),
        ("remove", old["id"], "retention"), ("insert", vanish["id"], None)]
    # One transaction's removals come after its insertions, in no particular order among themselves.
    assert sorted(_ops(seen)[11:]) == sorted([("remove", v2["id"], "vanished"), ("remove", deletion["id"], "vanished")])
    inserted = [c for c in seen if c.op == "insert"]
    assert [c.raw for c in inserted] == [parsed(e).raw for e in (note, v1, v2, deletion, expiring, old, vanish)]
    assert [c.raw for c in everything if c.op == "insert"] == [None] * 6 + [parsed(vanish).raw]
    assert everything[10].origin == ""


async def test_an_event_inserted_and_removed_in_one_transaction_shows_both(tmp_path, alice):
    """v1 and v2 of one coordinate in one batch: v1's insertion and its supersession, then v2's insertion."""
    v1, v2 = alice.sign(0, "v1", [], NOW - 40), alice.sign(0, "v2", [], NOW - 30)
    store = await Store.open(tmp_path / "f.db", OPTIONS)
    try:
        await asyncio.gather(store.submit(parsed(v1)), store.submit(parsed(v2)))
        changes = await _everything(store)
    finally:
        await store.close()
    assert _ops(changes) == [("insert", v1["id"], None), ("insert", v2["id"], None),
                             ("remove", v1["id"], "superseded")]
    assert changes[0].raw is None and changes[1].raw == parsed(v2).raw


async def test_a_position_is_never_given_twice(tmp_path, alice):
    """The newest event expires and is purged: the next insertion still gets a new position."""
    gone = alice.sign(1, "x", [["expiration", str(NOW - 1)]], NOW - 60)
    store = await Store.open(tmp_path / "f.db", OPTIONS)
    try:
        await store.submit(parsed(gone))
        await store.purge_expired()
        await store.submit(parsed(alice.sign(1, "y", [], NOW)))
        changes = await _everything(store)
    finally:
        await store.close()
    assert [(c.cursor, c.op) for c in changes] == [(1, "insert"), (2, "remove"), (3, "insert")]


async def test_a_cursor_older_than_the_log_keeps_is_refused(tmp_path, alice):
    """With room for two removals, the third drops the first: cursors before it are stale, later ones read."""
    store = await Store.open(tmp_path / "f.db", replace(OPTIONS, change_log_max_entries=2))
    try:
        for i in range(4):  # four versions of one profile: three supersessions
            await store.submit(parsed(alice.sign(0, f"v{i}", [], NOW - 40 + i)))
        # Positions: v0 1, v1 2, v0 gone 3, v2 4, v1 gone 5, v3 6, v2 gone 7; the removal at 3 was dropped.
        removals = [c for c in await store.read_snapshot(feed.read, 3, 10) if c.op == "remove"]
        assert [c.cursor for c in removals] == [5, 7]
        with pytest.raises(feed.StaleCursor, match="cursor 2 is older than the oldest kept, 3") as stale:
            await store.changes(2, 10)
        assert stale.value.oldest == 3
        assert [(c.cursor, c.op) for c in await store.changes(3, 10)] == [
            (4, "insert"), (5, "remove"), (6, "insert"), (7, "remove")]
    finally:
        await store.close()


async def test_kinds_select_changes_of_those_kinds(tmp_path, alice):
    """feed.read with kinds: insertions and removals of other kinds are left out."""
    store = await Store.open(tmp_path / "f.db", OPTIONS)
    try:
        await store.submit(parsed(alice.sign(1, "note", [], NOW)))
        await store.submit(parsed(alice.sign(0, "v1", [], NOW - 2)))
        await store.submit(parsed(alice.sign(0, "v2", [], NOW - 1)))
        changes = await store.read_snapshot(feed.read, 0, 10, frozenset({0}))
    finally:
        await store.close()
    assert [(c.cursor, c.op, c.kind) for c in changes] == [(2, "insert", 0), (3, "insert", 0), (4, "remove", 0)]


@settings(SETTINGS, max_examples=60)
@given(scenario=scenarios())
def test_replaying_the_feed_gives_the_live_set(scenario):
    """Replacements and deletions in gathered batches (with repeats): each stored event is inserted once, each
    removal follows its insertion, positions are unique and rising, and insertions minus removals are the live
    set."""
    events = scenario.events()

    async def run(path: Path) -> tuple[list[feed.Change], set[str], set[str]]:
        store = await Store.open(path, OPTIONS)
        try:
            stored = set()
            for batch in scenario.batches(events):
                outcomes = await asyncio.gather(*[store.submit(parsed(e)) for e in batch])
                stored |= {e["id"] for e, outcome in zip(batch, outcomes) if outcome == (True, "")}
            return await _everything(store, limit=4), await live_ids(store), stored
        finally:
            await store.close()

    with tempfile.TemporaryDirectory() as tmp:
        changes, live, stored = asyncio.run(run(Path(tmp) / "f.db"))
    assert [c.cursor for c in changes] == sorted({c.cursor for c in changes})
    inserted = [c.id for c in changes if c.op == "insert"]
    assert sorted(inserted) == sorted(stored)  # once each
    removed = [c.id for c in changes if c.op == "remove"]
    assert len(removed) == len(set(removed))
    first = {c.id: c.cursor for c in reversed(changes)}
    assert all(first[c.id] < c.cursor for c in changes if c.op == "remove")
    assert set(inserted) - set(removed) == live
