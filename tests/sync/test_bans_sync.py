"""A ban is settled for sync like a tombstone: a banned event is never fetched back from a peer, and a
banned author's events are refused as settled, not as errors."""

from __future__ import annotations

from relay.commands.sync import sync_once
from relay.ingest.moderation import Moderation
from relay.ingest.outcome import BANNED
from relay.node import open_store
from relay.sync.scheduler import sync_options
from tests.sync.conftest import local_config, publish, seed, stored


async def test_banned_events_are_not_fetched_back_and_banned_authors_are_settled(tmp_path, relay, alice, bob):
    """Both the peer and we hold the events; we ban one event (removed here) and bob: reconciliations fetch
    neither the banned event (settled without a REQ) nor store bob's (settled), twice, with no error."""
    fine = [alice.sign(content=f"a{i}", created_at=1_700_000_000 + i) for i in range(5)]
    spam, bobs = alice.sign(content="spam"), [bob.sign(content=f"b{i}") for i in range(3)]
    await publish(relay.url, fine + [spam] + bobs)
    config = local_config(tmp_path)
    await seed(config, fine + [spam])
    store = await open_store(config, read_connections=1)
    moderation = await Moderation.open(store, config)
    assert await moderation.ban_event(spam["id"], "spam") is True
    await moderation.ban_pubkey(bob.pubkey)
    await store.close()

    for _ in range(2):
        report = await sync_once(config, relay.url, {}, sync_options(config, "down"))
        assert (report.need, report.fetched, report.errors) == (1 + len(bobs), 0, {})
        assert report.settled == {BANNED.message: 1 + len(bobs)}
    assert set(stored(config)) == {e["id"] for e in fine}
