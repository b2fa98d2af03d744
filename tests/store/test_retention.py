"""Retention (relay/retention.py, relay/store/retention.py) through a real relay: rules by kind and age, a
maximum event count, protected events, eviction records, and every derived table consistent afterwards."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from dataclasses import replace

import pytest

from relay.config import ConfigError, load_config
from relay.protocol.event import parse_event
from relay.retention import run_retention
from relay.store.projectors.spec import spec_hash
from relay.sync.session import SETTLED, classify
from tests.conftest import make_config
from tests.helpers import Keys
from tests.store.retention_common import assert_consistent, publish_all, running, stored_ids

NOW = int(time.time())
DAY = 86_400


def evictions(relay) -> set[str]:
    """Hex ids in the `evictions` table of `relay`."""
    conn = sqlite3.connect(relay.config.store.path)
    try:
        return {r[0].hex() for r in conn.execute("SELECT id FROM evictions")}
    finally:
        conn.close()


async def test_age_rule_removes_old_events_of_its_kinds_only(tmp_path, alice: Keys, bob: Keys):
    """kinds [1, 7] older than 30 days go (in steps of 2 rows), newer ones and other kinds stay; tables agree."""
    rules = [{"kinds": [1, 7], "max_age_days": 30}]
    async with running(tmp_path, retention={"rules": rules, "batch_size": 2}) as (relay, client):
        old = [alice.sign(1, f"old {i}", [["t", "x"]], created_at=NOW - 40 * DAY + i) for i in range(3)]
        old += [alice.sign(7, "+", [["e", old[0]["id"]]], created_at=NOW - 31 * DAY),
                bob.sign(1, "hi", [["p", alice.pubkey]], created_at=NOW - 35 * DAY)]
        kept = [alice.sign(1, "recent", created_at=NOW - DAY), alice.sign(0, '{"name":"a"}', created_at=NOW - 40 * DAY),
                bob.sign(3, "", [["p", alice.pubkey]], created_at=NOW - 50 * DAY)]
        await publish_all(client, old + kept)

        report = await run_retention(relay.store, relay.config)

        assert report.evicted == len(old)
        assert await stored_ids(client) == {e["id"] for e in kept}
        assert evictions(relay) == {e["id"] for e in old}
        assert_consistent(relay.config.store.path, relay.config)
        assert (await run_retention(relay.store, relay.config)).evicted == 0


async def test_max_events_evicts_the_oldest_first(tmp_path, alice: Keys):
    """With max_events 5, the 3 oldest of 8 events go, whatever their arrival order; tables agree."""
    async with running(tmp_path, retention={"max_events": 5, "batch_size": 2}) as (relay, client):
        events = [alice.sign(1, f"n{i}", [["t", "x"]], created_at=NOW - 1000 + i) for i in range(8)]
        await publish_all(client, events[4:] + events[:4])

        report = await run_retention(relay.store, relay.config)

        assert report.evicted == 3
        assert await stored_ids(client) == {e["id"] for e in events[3:]}
        assert evictions(relay) == {e["id"] for e in events[:3]}
        assert_consistent(relay.config.store.path, relay.config)


async def test_protected_projector_and_filter_events_survive(tmp_path, alice: Keys, bob: Keys):
    """Events of a protected projector's kind and those matching a protected filter stay; others go, rows too."""
    neg = {"protected_filters": [{"kinds": [1], "authors": [bob.pubkey]}]}
    retention = {"rules": [{"max_age_days": 1}], "max_events": 1, "batch_size": 1}
    async with running(tmp_path, ("profiles",), negentropy=neg, retention=retention) as (relay, client):
        old = NOW - 10 * DAY
        protected = [alice.sign(0, '{"name":"alice"}', created_at=old), bob.sign(0, '{"name":"bob"}', created_at=old)]
        protected += [bob.sign(1, f"b{i}", created_at=old + i) for i in range(3)]
        unprotected = [alice.sign(3, "", [["p", bob.pubkey]], created_at=old), alice.sign(1, "a", created_at=old + 1),
                       alice.sign(10002, "", [["r", "wss://r.example"]], created_at=old)]
        await publish_all(client, protected + unprotected)

        report = await run_retention(relay.store, relay.config)

        assert report.evicted == len(unprotected)
        assert await stored_ids(client) == {e["id"] for e in protected}
        conn = sqlite3.connect(relay.config.store.path)
        try:
            assert conn.execute("SELECT count(*) FROM profiles").fetchone()[0] == 2
            assert conn.execute("SELECT count(*) FROM follows").fetchone()[0] == 0
            assert conn.execute("SELECT count(*) FROM relay_lists").fetchone()[0] == 0
        finally:
            conn.close()
        assert_consistent(relay.config.store.path, relay.config)


async def test_retention_runs_every_interval_in_the_background(tmp_path, alice: Keys):
    """With interval_seconds set, the relay applies its rules by itself."""
    retention = {"rules": [{"kinds": [1], "max_age_days": 1}], "interval_seconds": 0.05}
    async with running(tmp_path, retention=retention) as (relay, client):
        event = alice.sign(1, "old", created_at=NOW - 2 * DAY)
        await publish_all(client, [event])
        for _ in range(400):  # waits for the task, bounded; asserts no duration
            if event["id"] in evictions(relay):
                break
            await asyncio.sleep(0.025)
        assert await stored_ids(client) == set()
        assert evictions(relay) == {event["id"]}


async def test_an_evicted_event_is_refused_from_a_peer_and_stored_again_from_a_client(tmp_path, alice: Keys):
    """From a peer: `blocked:` and settled for sync; published again by a client: stored."""
    async with running(tmp_path, retention={"rules": [{"max_age_days": 1}]}) as (relay, client):
        event = alice.sign(1, "old", created_at=NOW - 2 * DAY)
        await publish_all(client, [event])
        assert (await run_retention(relay.store, relay.config)).evicted == 1

        parsed = parse_event(event, relay.event_limits, time.time())
        accepted, message = await relay.store.submit(parsed, "ws://peer.example")
        assert not accepted and message.startswith("blocked:")
        assert classify(accepted, message)[0] == SETTLED
        assert await stored_ids(client) == set()

        assert await client.publish(event) == ["OK", event["id"], True, ""]
        assert await stored_ids(client) == {event["id"]}
        assert_consistent(relay.config.store.path, relay.config)


def test_protected_is_read_from_projector_tables_and_changes_no_spec_hash(tmp_path):
    """`protected = true` in [[projectors]] marks the spec without changing its hash (no rebuild)."""
    path = tmp_path / "relay.toml"
    path.write_text('[[projectors]]\ntable = "profiles"\nkind = 0\nprimary_key = ["pubkey"]\nprotected = true\n'
                    'fields = [{ name = "pubkey", type = "TEXT", source = "pubkey" }]\n')
    spec = load_config(path).projectors[0]
    assert spec.protected
    assert spec_hash(spec) == spec_hash(replace(spec, protected=False))


@pytest.mark.parametrize("rules, says", [
    ([{"kinds": [1]}], "retention.rules[0].max_age_days"),
    ([{"max_age_days": 0}], "retention.rules[0].max_age_days"),
    ([{"max_age_days": 1, "kinds": ["1"]}], "retention.rules[0].kinds"),
    ([{"max_age_days": 1, "kind": 1}], "retention.rules[0].kind: unknown key"),
])
def test_bad_retention_rules_are_refused_with_the_key(tmp_path, rules, says):
    """A bad [[retention.rules]] table stops the start, naming the key."""
    with pytest.raises(ConfigError, match=says.replace("[", r"\[").replace("]", r"\]")):
        make_config(tmp_path, retention={"rules": rules})


def test_bad_protected_filter_is_refused_with_the_key(tmp_path):
    """`[negentropy] protected_filters` is checked like `filters`, and the error names it."""
    with pytest.raises(ConfigError, match=r"negentropy\.protected_filters\[1\]\.since"):
        make_config(tmp_path, negentropy={"protected_filters": [{"kinds": [1]}, {"since": 5}]})
