"""Peer sync against a second instance of our relay: evicted events and vanished authors are not brought back."""

from __future__ import annotations

import time

from relay.hooks import hooks
from relay.retention import run_retention
from relay.store.store import Store
from relay.commands.sync import sync_once
from relay.sync.scheduler import sync_options
from relay.sync.session import EVICTED_HERE
from tests.helpers import Keys
from tests.sync.conftest import local_config, notes, publish, remote_ids, seed, stored

NOW = int(time.time())
DAY = 86_400


async def test_evicted_events_are_not_fetched_back_from_a_peer_that_has_them(tmp_path, relay, alice: Keys):
    """Retention removed 5 old notes here; the peer still has them: reconciliation needs them, fetches none."""
    old, recent = notes(alice, 5, NOW - 10 * DAY), notes(alice, 3, NOW - 100, tag="r")
    await publish(relay.url, old + recent)
    config = local_config(tmp_path, retention={"rules": [{"max_age_days": 1}]})
    await seed(config, old + recent)
    store = await Store.open(config.store.path, config.store.options(read_connections=1), hooks(config))
    try:
        assert (await run_retention(store, config)).evicted == len(old)
    finally:
        await store.close()

    report = await sync_once(config, relay.url, {}, sync_options(config, "down"))

    assert (report.need, report.fetched) == (len(old), 0)
    assert report.settled == {EVICTED_HERE: len(old)} and not report.errors
    assert set(stored(config)) == {e["id"] for e in recent}
    assert await remote_ids(relay.url) == {e["id"] for e in old + recent}


async def test_a_vanished_authors_events_are_not_reimported_and_the_request_propagates(tmp_path, relay, alice, bob):
    """Here alice asked to vanish (ALL_RELAYS); the peer still has her events: none is stored by the fetch
    (settled, `blocked:`), and the request pushed to the peer makes it delete them too."""
    # (no gift wrap here: the peer hides private kinds from a sync client it does not list as its peer)
    hers = notes(alice, 4, NOW - 1000)
    others = notes(bob, 2, NOW - 500)
    await publish(relay.url, hers + others)
    request = alice.sign(62, "", [["relay", "ALL_RELAYS"]], created_at=NOW - 10)
    config = local_config(tmp_path)
    await seed(config, others + [request])

    report = await sync_once(config, relay.url, {}, sync_options(config, "both"))

    assert (report.need, report.fetched, report.pushed) == (len(hers), 0, 1)
    assert sum(report.settled.values()) == len(hers) and not report.errors
    assert all(message.startswith("blocked:") for message in report.settled)
    assert set(stored(config)) == {e["id"] for e in others} | {request["id"]}
    assert await remote_ids(relay.url) == {e["id"] for e in others} | {request["id"]}
