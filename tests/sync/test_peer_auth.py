"""Peers recognized by pubkey (NIP-42 AUTH as a `[[sync.peers]] pubkey`): origin, privileges, no echo.

Two in-process relays of ours, each configured with the other's URL and node
key, both direction "up" so that an event reaches the other only by being
pushed into its server: what the receiving relay records as the event's
origin is then decided by the AUTH alone.
"""

from __future__ import annotations

import os
import sqlite3
import time

from relay.keys import NodeKey
from tests.conftest import make_config
from tests.helpers import Client, Keys, eventually
from tests.inprocess import Relay
from tests.served import free_port
from tests.server.test_auth import auth_event, closed_or_events, neg_need
from tests.sync.conftest import stored

NOW = int(time.time())
SYNC_TIMEOUT = 20.0  # seconds for an event to reach the other relay


def reconciled(db_path: str, url: str) -> bool:
    """True once the database's sync state shows a finished reconciliation with `url`."""
    with sqlite3.connect(db_path) as conn:
        row = conn.execute("SELECT last_success FROM sync_peers WHERE url = ?", (url,)).fetchone()
    return bool(row and row[0])


def node_key_file(path, secret: int) -> NodeKey:
    """Write a node key file (64 hex, mode 0600) and return the key."""
    raw = secret.to_bytes(32, "big")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(raw.hex() + "\n")
    return NodeKey(raw)


async def test_a_peer_authenticated_by_pubkey_is_that_peer(tmp_path, alice, bob):
    """Events a peer pushes are stored with its origin (so never pushed back), pass kind rules and rate limits
    meant for clients, and private kinds travel between peers."""
    ports = {"a": free_port(), "b": free_port()}
    keys = {}
    for i, name in enumerate(ports):
        (tmp_path / name).mkdir()
        keys[name] = node_key_file(tmp_path / name / "node.key", 0x5EED + i)
    urls = {name: f"ws://127.0.0.1:{port}" for name, port in ports.items()}
    timings = {"interval_seconds": 60.0, "timeout_seconds": 5.0, "backoff_initial_seconds": 0.1,
               "backoff_max_seconds": 0.5}

    def config(name: str, other: str, **sections):
        return make_config(tmp_path / name, server={"port": ports[name]}, sync={
            **timings, "secret_key_file": str(tmp_path / name / "node.key"),
            "peers": [{"url": urls[other], "direction": "up", "pubkey": keys[other].pubkey}]}, **sections)

    # b takes only kind 1 from clients and one EVENT per connection; its peer a is held to neither.
    a = Relay(config("a", "b"))
    b = Relay(config("b", "a", auth={"allow_kinds": [1]},
                     rate_limits={"exempt": [], "exempt_loopback": False, "events_per_second": 0.01,
                                  "events_burst": 1}))
    await a.start()
    await b.start()
    try:
        # Once a has reconciled with b, its AUTH (answered as soon as b's challenge came) has been handled.
        assert await eventually(lambda: reconciled(a.config.store.path, urls["b"]), SYNC_TIMEOUT)
        note = alice.sign(content="published to a", created_at=NOW - 20)
        dm = alice.sign(kind=4, content="to bob", tags=[["p", bob.pubkey]], created_at=NOW - 19)
        client = await Client.connect(a.url)
        for e in (note, dm):
            assert (await client.publish(e))[2] is True
        await client.close()

        assert await eventually(lambda: {note["id"], dm["id"]} <= set(stored(b.config)), SYNC_TIMEOUT)
        origins = stored(b.config)
        assert (origins.get(note["id"]), origins.get(dm["id"])) == (urls["a"], urls["a"])  # not "": no echo
        assert stored(a.config) == {note["id"]: "", dm["id"]: ""}

        # As a client of b, a's node key reads the private kinds, including from the full-set index.
        reader = await Client.connect(b.url)
        await reader.send(["COUNT", "wait", {"limit": 0}])  # any reply: the challenge has arrived before it
        await reader.recv()
        event = auth_event(Keys(0x5EED), b.url, reader.challenge)
        await reader.send(["AUTH", event])
        assert await reader.recv() == ["OK", event["id"], True, ""]
        assert await closed_or_events(reader, "REQ", "dm", {"kinds": [4]}) == ("EVENTS", [dm])
        assert await neg_need(reader, "neg", {}) == {note["id"], dm["id"]}
        await reader.close()
    finally:
        await b.stop()
        await a.stop()
