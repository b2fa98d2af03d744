"""Bans in the store: refused by the write transaction itself, removed through the one removal path, purged
in resumable batches; a real SQLite file with the configured hooks, checked by `relay verify`."""

from __future__ import annotations

import time

from relay.commands.projectors import run_verify
from relay.ingest.outcome import BANNED
from relay.node import open_store
from relay.protocol.event import parse_event
from relay.store import bans
from relay.store.moderation import BANNED_EVENT, BANNED_PUBKEY, PURGE_PUBKEY, Entry
from tests.conftest import make_config
from tests.helpers import eventually
from tests.inprocess import Relay


def _event(config, event: dict):
    return parse_event(event, config.limits.event_limits(), time.time())


async def test_a_ban_committed_while_events_wait_refuses_them_in_the_write_transaction(tmp_path, alice, bob):
    """No ingest in between: events submitted after a ban of their id or author are refused "blocked:"."""
    config = make_config(tmp_path)
    store = await open_store(config)
    try:
        event = bob.sign(content="banned id")
        await store.run_job(bans.set_entries, [Entry(BANNED_PUBKEY, alice.pubkey), Entry(BANNED_EVENT, event["id"])])
        outcomes = [await store.submit(_event(config, e)) for e in (alice.sign(content="x"), event,
                                                                    bob.sign(content="fine"))]
        assert outcomes == [(BANNED.accepted, BANNED.message)] * 2 + [(True, "")]
    finally:
        await store.close()


async def test_a_banned_event_leaves_with_its_tags_projected_rows_and_index_entries(tmp_path, alice):
    """Banning a stored kind-0 (projected into profiles) and a tagged note removes rows, tag rows, profile and
    negentropy entries in one transaction: relay verify is clean and no tag row points at a gone event."""
    config = make_config(tmp_path)
    store = await open_store(config)
    profile = alice.sign(kind=0, content='{"name":"alice"}')
    note = alice.sign(content="tagged", tags=[["t", "spam"], ["p", alice.pubkey]])
    try:
        for e in (profile, note):
            assert (await store.submit(_event(config, e)))[0]
        for e in (profile, note):
            removed = await store.run_job(bans.ban_event, Entry(BANNED_EVENT, e["id"], "spam", int(time.time())))
            assert removed is True
        assert await store.run_job(bans.ban_event, Entry(BANNED_EVENT, note["id"])) is False  # gone already
        counts = await store.read_snapshot(lambda c: [c.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
                                                      for t in ("events", "tags", "profiles")])
        assert counts == [0, 0, 0]
    finally:
        await store.close()
    assert run_verify(config) == 0


async def test_a_purge_cut_short_is_resumed_by_the_next_start(tmp_path, alice, bob):
    """A ban with its purge row but no purge run (a crash right after the ban): the next `relay serve`
    removes the author's events in batches of purge_batch_size, then drops the row; others' stay."""
    config = make_config(tmp_path, admin={"purge_batch_size": 2})
    store = await open_store(config)
    keep = bob.sign(content="keep")
    for e in [alice.sign(content=str(i), created_at=1_700_000_000 + i) for i in range(7)] + [keep]:
        assert (await store.submit(_event(config, e)))[0]
    await store.run_job(bans.set_entries, [Entry(BANNED_PUBKEY, alice.pubkey), Entry(PURGE_PUBKEY, alice.pubkey)])
    await store.close()

    relay = Relay(config)
    await relay.start()
    try:
        def left():
            return relay.store.read_snapshot(lambda c: (
                [r[0].hex() for r in c.execute("SELECT id FROM events")],
                c.execute("SELECT count(*) FROM moderation WHERE list = ?", (PURGE_PUBKEY,)).fetchone()[0]))

        async def purged() -> bool:
            return await left() == ([keep["id"]], 0)

        assert await eventually(purged)
    finally:
        await relay.stop()
    assert run_verify(config) == 0
