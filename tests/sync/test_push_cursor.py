"""Peer sync's live push resumes from the peer's cursor in the change feed (relay/sync/scheduler.py).

The peer is a ScriptedRelay that records every EVENT it receives, so an event
pushed twice shows; it is configured `up` with a long interval, so that a
reconciliation (a NEG-OPEN it receives) happens only where the cursor cannot
serve.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections import Counter

import structlog

from relay.config import load_config
from tests.helpers import eventually
from tests.inprocess import Relay
from tests.served import Served, free_port
from tests.sync.conftest import local_config, notes, publish, seed
from tests.sync.mesh import peer_toml
from tests.sync.scripted import ScriptedRelay

NOW = int(time.time())
SYNC = {"interval_seconds": 3600.0, "backoff_initial_seconds": 0.1, "backoff_max_seconds": 0.5,
        "lease_seconds": 3.0, "timeout_seconds": 5.0}


def _neg_opens(peer: ScriptedRelay) -> int:
    return sum(m[0] == "NEG-OPEN" for m in peer.messages)


def _peer_state(db, column: str):
    """`column` of the one row of `sync_peers` (None when there is none yet)."""
    conn = sqlite3.connect(db)
    try:
        row = conn.execute(f"SELECT {column} FROM sync_peers").fetchone()
        return row and row[0]
    finally:
        conn.close()


def _reconciled(peer: ScriptedRelay, db, times: int = 1) -> bool:
    """The peer was sent `times` NEG-OPENs, and our side recorded a finished reconciliation."""
    return _neg_opens(peer) == times and _peer_state(db, "last_success") is not None


async def test_events_committed_while_stopped_are_pushed_at_restart_without_a_reconciliation(tmp_path, alice):
    """A relay stopped, written to offline, restarted: the peer gets every missing event, each once, from the
    stored cursor; only the very first session (no cursor yet) reconciled."""
    async with ScriptedRelay(keep=True) as peer:
        config = local_config(tmp_path, sync={**SYNC, "peers": [{"url": peer.url, "direction": "up"}]})
        live, offline = notes(alice, 5, NOW - 100, tag="live"), notes(alice, 30, NOW - 50, tag="offline")
        relay = Relay(config)
        await relay.start()
        try:
            assert await eventually(lambda: _reconciled(peer, config.store.path))
            await publish(relay.url, live)
            # Answered and recorded: stopped before that, the batch would be sent again (at least once).
            assert await eventually(lambda: _peer_state(config.store.path, "push_cursor") == 5)
        finally:
            await relay.stop()
        await seed(config, offline)
        relay = Relay(config)
        await relay.start()
        try:
            assert await eventually(lambda: len(peer.received) == 35)
            await asyncio.sleep(0.5)  # room for a second push, if there were one
        finally:
            await relay.stop()
    assert Counter(e["id"] for e in peer.received) == Counter(e["id"] for e in live + offline)
    assert _neg_opens(peer) == 1
    assert _peer_state(config.store.path, "push_cursor") == 35


async def test_after_a_lost_connection_and_a_crash_every_event_arrives_with_at_most_one_batch_resent_each(tmp_path,
                                                                                                        alice):
    """`relay serve` pushing in batches of 10 from its cursor: the peer drops the connection mid-batch, later the
    relay is SIGKILLed mid-push and restarted; the peer ends with every event, and each incident resent at most
    one batch.  The events are written by another process on the database (the push polls the feed)."""
    batch = 10
    events = notes(alice, 300, NOW - 1000)
    async with ScriptedRelay(keep=True, drop_after=75) as peer:
        (tmp_path / "a").mkdir()
        db, port = tmp_path / "a" / "relay.db", free_port()
        config_path = tmp_path / "a" / "relay.toml"
        config_path.write_text(peer_toml(db, [], settings={"sync": {**SYNC, "push_in_flight": batch}})
                               + f'[[sync.peers]]\nurl = "{peer.url}"\ndirection = "up"\n')
        served = Served(tmp_path, "--config", config_path, "--port", port).__enter__()
        try:
            served.wait_health(port)
            assert await eventually(lambda: _reconciled(peer, db))
            await seed(load_config(config_path), events)
            assert await eventually(lambda: len({e["id"] for e in peer.received}) >= 150)
            served.kill()
            served.__exit__(None, None, None)
            served = Served(tmp_path, "--config", config_path, "--port", port).__enter__()
            assert await eventually(lambda: len({e["id"] for e in peer.received}) == 300, timeout=30)
            await asyncio.sleep(0.5)
        finally:
            served.__exit__(None, None, None)
    resent = sum(n - 1 for n in Counter(e["id"] for e in peer.received).values())
    assert resent <= 2 * batch, resent
    assert _neg_opens(peer) == 1


async def test_a_cursor_older_than_the_feed_keeps_falls_back_to_a_reconciliation(tmp_path, alice):
    """A peer cursor behind a trimmed removal log: the relay says so in its log and reconciles instead."""
    async with ScriptedRelay(keep=True) as peer:
        config = local_config(tmp_path, store={"change_log_max_entries": 1},
                              sync={**SYNC, "peers": [{"url": peer.url, "direction": "up"}]})
        relay = Relay(config)
        await relay.start()
        try:
            assert await eventually(lambda: _reconciled(peer, config.store.path))
        finally:
            await relay.stop()
        profiles = [alice.sign(0, f"v{i}", [], NOW - 10 + i) for i in range(3)]  # two supersessions: one dropped
        await seed(config, profiles[:1])
        await seed(config, profiles[1:2])
        await seed(config, profiles[2:])
        assert _peer_state(config.store.path, "push_cursor") == 0  # the feed was empty: positions 1 to 5 came after
        with structlog.testing.capture_logs() as logs:
            relay = Relay(config)
            await relay.start()
            try:
                assert await eventually(lambda: _neg_opens(peer) == 2)
                assert await eventually(lambda: any(e["id"] == profiles[2]["id"] for e in peer.received))
            finally:
                await relay.stop()
    [stale] = [e for e in logs if e["event"] == "sync_push_cursor_stale"]
    assert (stale["cursor"], stale["oldest"], stale["fallback"]) == (0, 3, "reconciliation")
    assert [e["id"] for e in peer.received] == [profiles[2]["id"]]  # only the live version is offered
