"""Peer sync and write policies: a policy's refusal of a peer's event is settled, never fetched again."""

from __future__ import annotations

import time

from relay.commands.sync import sync_once
from relay.sync.scheduler import sync_options
from relay.sync.session import REFUSED_HERE
from tests.helpers import Keys
from tests.policies.sample import policies_config
from tests.sync.conftest import notes, publish, stored

NOW = int(time.time())
REFUSE_PEERS = '[[policies]]\ncall = "tests.policies.sample:refuse_all"\nsources = ["peer"]'


async def test_a_second_reconciliation_fetches_none_of_the_events_a_policy_refused(tmp_path, relay, alice: Keys):
    """First run: 4 fetched, all refused by the policy (settled, not errors); second run: 0 fetched, 4 settled
    as refused here, and the policy is not asked again."""
    events = notes(alice, 4, NOW - 100)
    await publish(relay.url, events)
    config = policies_config(tmp_path / "local", REFUSE_PEERS)
    options = sync_options(config, "down")

    first = await sync_once(config, relay.url, {}, options)
    assert (first.need, first.fetched, dict(first.settled), dict(first.errors)) == (
        4, 0, {"blocked: not from here": 4}, {})

    second = await sync_once(config, relay.url, {}, options)
    assert (second.need, second.fetched, dict(second.settled), dict(second.errors)) == (4, 0, {REFUSED_HERE: 4}, {})
    assert stored(config) == {}


async def test_a_client_source_policy_leaves_peer_events_alone(tmp_path, relay, alice: Keys):
    """The same policy listed for clients only: sync stores the peer's events."""
    events = notes(alice, 3, NOW - 100)
    await publish(relay.url, events)
    config = policies_config(tmp_path / "local", '[[policies]]\ncall = "tests.policies.sample:refuse_all"')
    report = await sync_once(config, relay.url, {}, sync_options(config, "down"))
    assert report.fetched == 3 and set(stored(config)) == {e["id"] for e in events}


async def test_the_record_of_refusals_is_bounded_oldest_first(tmp_path):
    """Past `max_rows`, the oldest refusals are dropped (they would be fetched, and refused, once more)."""
    from relay.store import refused
    from relay.store.store import Store

    store = await Store.open(tmp_path / "r.db")
    try:
        ids = [bytes([i]) * 32 for i in range(5)]
        for i, id_ in enumerate(ids):
            await store.run_job(refused.record, [(id_, "ws://peer")], 1000 + i, 3)
        assert await store.read_snapshot(refused.refused_among, ids) == set(ids[2:])
    finally:
        await store.close()
