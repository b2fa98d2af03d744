"""Configured peers (`[[sync.peers]]`): `relay serve` processes that reconcile and stream, leases, migrations.

Relays run as real subprocesses (`python -m relay serve --config <toml>`) on
free loopback ports; the peer is nostr-sdk's LocalRelay (in this process) or
another of our relay processes.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import structlog

from relay.config import load_config
from relay.protocol.event import parse_event
from relay.store import db
from relay.store.store import Store
from relay.sync.state import (
    LeaseBusy,
    LeaseLost,
    PeerStates,
    acquire_lease,
    add_counts,
    new_owner,
    read_states,
    record_error,
    release_lease,
    renew_lease,
)
from tests.conftest import make_config
from tests.helpers import Client, eventually
from tests.inprocess import Relay
from tests.served import free_port
from tests.sync.conftest import notes, publish, remote_ids, seed, speaks_nip77, stored
from tests.sync.mesh import RelayProcess
from tests.sync.scripted import ScriptedRelay

NOW = int(time.time())
SYNC_TIMEOUT = 15.0  # seconds for an event to reach the other side


# --- helpers -------------------------------------------------------------------------------------------


@pytest.fixture
def processes():
    """Collects RelayProcesses so that every one is stopped after the test, whatever happens."""
    started: list[RelayProcess] = []
    yield started
    for p in started:
        p.stop()


async def served_ids(url: str) -> set[str]:
    """Ids our relay at `url` serves (one REQ, limit 5000)."""
    client = await Client.connect(url, open_timeout=5)
    try:
        return {e["id"] for e in await client.req("all", {"limit": 5000})}
    finally:
        await client.close()


# --- a relay process and LocalRelay --------------------------------------------------------------------


async def test_serve_reconciles_then_streams_both_ways_with_localrelay(tmp_path, local_relay, processes, alice, bob):
    """The relay retries a peer that is down (backoff), reconciles once it is up, then a new event on either side
    reaches the other within seconds; nothing is echoed; `relay status` shows counts, last success, the lease."""
    peer_port = free_port()
    peer_url = f"ws://127.0.0.1:{peer_port}"
    remote_before, local_before = notes(alice, 40, NOW - 1000), notes(bob, 30, NOW - 900)
    ours = RelayProcess(tmp_path, "a", free_port(), [peer_url])
    await seed(ours.config, local_before)
    processes.append(ours.start())

    async def failed_to_connect():
        peers = ours.status()["peers"]
        return peers and "cannot connect" in (peers[0].get("last_error") or "")

    assert await eventually(failed_to_connect, timeout=10)
    assert await local_relay(port=peer_port) == peer_url
    await publish(peer_url, remote_before)
    before = {e["id"] for e in remote_before + local_before}
    assert await eventually(lambda: _holds(served_ids(ours.url), before), SYNC_TIMEOUT)
    assert await eventually(lambda: _holds(remote_ids(peer_url), before), SYNC_TIMEOUT)

    to_peer, from_peer = alice.sign(content="published to us", created_at=NOW - 5), bob.sign(content="to the peer")
    assert (await publish(ours.url, [to_peer]))[0][2] is True
    assert await eventually(lambda: _holds(remote_ids(peer_url), {to_peer["id"]}), SYNC_TIMEOUT)
    assert (await publish(peer_url, [from_peer]))[0][2] is True
    assert await eventually(lambda: _holds(served_ids(ours.url), {from_peer["id"]}), SYNC_TIMEOUT)

    everything = before | {to_peer["id"], from_peer["id"]}
    await asyncio.sleep(1.0)  # room for an echo, if there were one
    assert await served_ids(ours.url) == everything == await remote_ids(peer_url)
    origins = stored(ours.config)
    assert {i for i, o in origins.items() if o == peer_url} == {e["id"] for e in remote_before} | {from_peer["id"]}

    async def counted():
        [peer] = ours.status()["peers"]
        return peer if (peer["events_in"], peer["events_out"]) == (41, 31) else None

    peer = await eventually(counted, timeout=10)
    assert peer, ours.status()
    assert peer["configured"] and peer["direction"] == "both" and peer["last_success"] is not None
    assert peer["lease_owner"] is not None  # held while serving
    assert (ours.dir / "relay.db.key").stat().st_mode & 0o777 == 0o600
    busy = subprocess.run([sys.executable, "-m", "relay", "sync", peer_url, "--config", str(ours.config_path)],
                          capture_output=True, text=True, timeout=60)
    assert busy.returncode == 1
    assert f"relay sync: another process is syncing {peer_url} (lease held by" in busy.stderr
    assert ours.stop() == 0
    [peer] = ours.status()["peers"]
    assert peer["lease_owner"] is None  # released at shutdown
    assert any(e.get("event") == "sync_reconciled" for e in ours.log_events())
    text = subprocess.run([sys.executable, "-m", "relay", "status", "--config", str(ours.config_path)],
                          capture_output=True, text=True, timeout=30, check=True).stdout
    assert f"events: {len(everything)}\n  kind     1: {len(everything)}\nsync peers: 1\n  {peer_url} (both, filter {{}})" in text
    assert "    events in 41, out 31" in text and "cannot connect" in text


async def _holds(ids_coro, wanted: set[str]) -> bool:
    return wanted <= await ids_coro


# --- two relay processes ---------------------------------------------------------------------------------


async def test_two_relay_processes_converge_and_stream(tmp_path, processes, alice, bob):
    """Two relays, each the other's peer: a new event reaches the other in seconds; after one is stopped, both are
    written to, and it restarts, they converge; counts stay exact (no echo)."""
    port_a, port_b = free_port(), free_port()
    a = RelayProcess(tmp_path, "a", port_a, [f"ws://127.0.0.1:{port_b}"])
    b = RelayProcess(tmp_path, "b", port_b, [f"ws://127.0.0.1:{port_a}"])
    await seed(a.config, notes(alice, 20, NOW - 2000))
    await seed(b.config, notes(bob, 25, NOW - 1900))
    processes.extend([a.start(), b.start()])
    assert await speaks_nip77(a.url)
    first = set(stored(a.config)) | set(stored(b.config))
    assert len(first) == 45
    assert await eventually(lambda: _equal(served_ids(a.url), first), SYNC_TIMEOUT)
    assert await eventually(lambda: _equal(served_ids(b.url), first), SYNC_TIMEOUT)

    live = alice.sign(content="live to a", created_at=NOW - 3)
    await publish(a.url, [live])
    assert await eventually(lambda: _holds(served_ids(b.url), {live["id"]}), SYNC_TIMEOUT)

    assert b.stop() == 0
    while_down = alice.sign(content="written to a while b is down", created_at=NOW - 2)
    await publish(a.url, [while_down])
    offline = notes(bob, 5, NOW - 1000, tag="offline")  # written into b's database while it is stopped
    await seed(b.config, offline)
    processes.append(b.start())

    everything = first | {live["id"], while_down["id"]} | {e["id"] for e in offline}
    assert await eventually(lambda: _equal(served_ids(a.url), everything), SYNC_TIMEOUT)
    assert await eventually(lambda: _equal(served_ids(b.url), everything), SYNC_TIMEOUT)
    counts = (a.status()["peers"][0], b.status()["peers"][0])
    await asyncio.sleep(2.5)  # longer than the count flush period: an echo loop would show here
    assert await served_ids(a.url) == everything == await served_ids(b.url)
    later = (a.status()["peers"][0], b.status()["peers"][0])
    assert [(p["events_in"], p["events_out"]) for p in later] == [(p["events_in"], p["events_out"]) for p in counts]
    assert len(stored(a.config)) == len(stored(b.config)) == len(everything)


async def _equal(ids_coro, wanted: set[str]) -> bool:
    return await ids_coro == wanted


async def test_events_from_a_peer_are_not_pushed_back_to_it(tmp_path, alice, bob):
    """In-process relay with one scripted peer: an event streamed from the peer is stored with the peer as origin
    and never sent back to it, while an event published here is pushed to it once."""
    async with ScriptedRelay() as peer:
        config = make_config(tmp_path, sync={"peers": [{"url": peer.url}], "backoff_initial_seconds": 0.1,
                                             "backoff_max_seconds": 0.5})
        server = Relay(config)
        await server.start()
        try:
            assert await eventually(lambda: peer.live and any(m[0] == "NEG-CLOSE" for m in peer.messages), SYNC_TIMEOUT)
            from_peer = alice.sign(content="streamed from the peer", created_at=NOW - 9)
            await peer.broadcast(from_peer)
            assert await eventually(lambda: stored(config).get(from_peer["id"]) == peer.url, SYNC_TIMEOUT)
            local = bob.sign(content="published here", created_at=NOW - 8)
            assert (await publish(server.url, [local]))[0][2] is True
            assert await eventually(lambda: any(e["id"] == local["id"] for e in peer.received), SYNC_TIMEOUT)
            await asyncio.sleep(0.5)
            assert [e["id"] for e in peer.received] == [local["id"]]
        finally:
            await server.stop()




async def test_interrupted_reconciliation_counts_what_the_peer_acknowledged(tmp_path, alice):
    """A configured peer that drops the connection mid-push (right after answering its 75th EVENT of 120): the
    interrupted reconciliation is logged with its count and elapsed seconds, and once the next one pushed the
    rest, sync_peers.events_out is exactly what the peer holds from us."""
    events = notes(alice, 120, NOW - 300)

    def events_out() -> int:
        conn = sqlite3.connect(config.store.path)
        try:
            return sum(state.events_out for state in read_states(conn))
        finally:
            conn.close()

    async with ScriptedRelay(keep=True, drop_after=75) as peer:
        config = make_config(tmp_path, sync={"peers": [{"url": peer.url}], "backoff_initial_seconds": 0.1,
                                             "backoff_max_seconds": 0.5})
        await seed(config, events)
        server = Relay(config)
        with structlog.testing.capture_logs() as logs:
            await server.start()
            try:
                assert await eventually(lambda: events_out() == 120, SYNC_TIMEOUT), events_out()
            finally:
                await server.stop()
    assert sorted(e["id"] for e in peer.received) == sorted(e["id"] for e in events)  # each sent once
    [interrupted] = [entry for entry in logs if entry["event"] == "sync_reconcile_interrupted"]
    assert (interrupted["have"], interrupted["pushed"]) == (120, 75)
    assert interrupted["seconds"] > 0


async def test_changes_name_the_origin_of_events_that_came_by_sync(tmp_path, alice):
    """The commit listener sees, for each inserted event, the peer it came from ('' or absent: local)."""
    store = await Store.open(tmp_path / "o.db")
    seen: list[dict] = []
    store.add_listener(lambda changes: seen.append({e.id: changes.origins.get(e.id, "") for e in changes.inserted}))
    try:
        mine, theirs = alice.sign(content="mine"), alice.sign(content="theirs")
        limits = load_config(None).limits.event_limits()
        await asyncio.gather(store.submit(parse_event(mine, limits, time.time())),
                             store.submit(parse_event(theirs, limits, time.time()), "ws://peer.example"))
    finally:
        await store.close()
    merged = {k: v for batch in seen for k, v in batch.items()}
    assert merged == {mine["id"]: "", theirs["id"]: "ws://peer.example"}


# --- the lease -----------------------------------------------------------------------------------------


def _migrated(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    db.migrate(conn)
    return conn


def test_lease_is_held_by_one_process_at_a_time(tmp_path):
    """acquire/renew/release on one database from two connections (two processes): at most one owner at once."""
    path = tmp_path / "lease.db"
    one, two = _migrated(path), sqlite3.connect(path, isolation_level=None, timeout=5)
    url = "ws://peer.example"
    assert acquire_lease(one, url, "p1", now=1000.0, seconds=60)
    assert not acquire_lease(two, url, "p2", now=1001.0, seconds=60)  # held
    assert acquire_lease(one, url, "p1", now=1002.0, seconds=60)  # re-entrant for its owner
    assert renew_lease(one, url, "p1", now=1030.0, seconds=60)  # now expires at 1090
    assert not acquire_lease(two, url, "p2", now=1089.0, seconds=60)
    assert not renew_lease(two, url, "p2", now=1089.0, seconds=60)
    assert acquire_lease(two, url, "p2", now=1090.0, seconds=60)  # expired: taken over
    assert not renew_lease(one, url, "p1", now=1091.0, seconds=60)  # the old owner learns it lost it
    release_lease(one, url, "p1")  # not the owner: no effect
    assert not acquire_lease(one, url, "p1", now=1092.0, seconds=60)
    release_lease(two, url, "p2")
    assert acquire_lease(one, url, "p1", now=1093.0, seconds=60)
    assert not acquire_lease(two, "ws://peer.example", "p2", now=1094.0, seconds=60)
    assert acquire_lease(two, "ws://other.example", "p2", now=1094.0, seconds=60)  # leases are per peer


def test_a_lease_whose_holder_died_on_this_host_is_taken_at_once(tmp_path):
    """A holder named "host:pid:random" with our host and a pid that no longer runs (a SIGKILLed relay, reaped or
    not yet: a zombie held the lease 29-41 s in a walkthrough) or our own
    pid from another process (a restarted container's pid 1) is taken over before its lease expires; a holder
    that runs, of another host, or made by this process is not."""
    conn = _migrated(tmp_path / "lease.db")
    host = socket.gethostname()
    dead = subprocess.Popen([sys.executable, "-c", ""])
    dead.wait()
    zombie = subprocess.Popen([sys.executable, "-c", ""])  # ended, not reaped (yet): still answers kill(0)
    for _ in range(500):  # up to 5 s for it to end
        if Path(f"/proc/{zombie.pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z":
            break
        time.sleep(0.01)
    ours = new_owner()
    cases = [(f"{host}:{dead.pid}:0001", True), (f"{host}:{zombie.pid}:0005", True),
             (f"{host}:{os.getpid()}:0002", True),
             (f"{host}:{os.getppid()}:0003", False), (f"other-host:{dead.pid}:0004", False), (new_owner(), False)]
    for n, (holder, taken) in enumerate(cases):
        url = f"ws://peer{n}.example"
        assert acquire_lease(conn, url, holder, now=1000.0, seconds=60)
        assert acquire_lease(conn, url, ours, now=1001.0, seconds=60) is taken, holder
    zombie.wait()


def test_counts_and_errors_accumulate_per_peer(tmp_path):
    """add_counts adds, sets last_success only on success; record_error keeps the last error."""
    conn = _migrated(tmp_path / "state.db")
    add_counts(conn, "ws://p", 3, 4, success_at=100)
    add_counts(conn, "ws://p", 2, 0)
    record_error(conn, "ws://p", 150, "timed out")
    [state] = read_states(conn)
    assert (state.events_in, state.events_out, state.last_success, state.last_error, state.last_error_at) == (
        5, 4, 100, "timed out", 150)


async def test_hold_refuses_a_second_holder_and_cancels_a_holder_that_lost_the_lease(tmp_path):
    """PeerStates.hold: a second process gets LeaseBusy; a holder whose lease was taken over gets LeaseLost."""
    path = tmp_path / "hold.db"
    _migrated(path).close()
    one, two = await PeerStates.open(path), await PeerStates.open(path)
    try:
        async with one.hold("ws://p", "owner-1", seconds=1.5):
            with pytest.raises(LeaseBusy, match="another process is syncing ws://p"):
                async with two.hold("ws://p", "owner-2", seconds=1.5):
                    pass
        async with two.hold("ws://p", "owner-2", seconds=1.5):  # released on exit: free again
            pass
        with pytest.raises(LeaseLost):
            async with one.hold("ws://p", "owner-1", seconds=1.5):
                # Another process takes the lease over as if ours had expired (we were stalled).
                conn = sqlite3.connect(path, isolation_level=None, timeout=5)
                acquire_lease(conn, "ws://p", "owner-2", now=time.time() + 10, seconds=60)
                conn.close()
                await asyncio.sleep(5)  # the renewal (every 0.5 s) notices and cancels this body
        assert [s.lease_owner for s in await two.read()] == ["owner-2"]
    finally:
        await one.close()
        await two.close()


def test_migrations_are_numbered_uniquely_and_applied_in_order_with_gaps(tmp_path):
    """Migration numbers are unique and increasing; a database at an older version gets the rest in order."""
    numbers = [n for n, _ in db.migrations()]
    assert numbers == sorted(set(numbers)) and 4 in numbers
    conn = sqlite3.connect(tmp_path / "m.db", isolation_level=None)
    first, sql = db.migrations()[0]
    conn.executescript(f"BEGIN;\n{sql}\nPRAGMA user_version = {first};\nCOMMIT;")
    assert db.migrate(conn) == numbers[-1]
    assert conn.execute("PRAGMA user_version").fetchone()[0] == numbers[-1]
    assert read_states(conn) == []  # the sync_peers table exists
