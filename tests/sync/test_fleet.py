"""A fleet of five sharded relays (`relay serve` processes, `workers = 0`) through crashes, a restart and a
handover: no acknowledged event is lost, every node ends holding its shards' events, and no removal was made
without `min_copies` confirmed copies (docs/peers.md, "Shards").

The fleet: an archive node (`{}`), a node of kind 1 ("notes"), a node of kind 7 ("reactions"), and two
recent-data nodes (every event, kept 3 s); `min_copies = 2`.  A publisher writes notes and reactions to random
nodes (seeded); meanwhile one recent node is SIGKILLed (and started again later), and the notes node is stopped
and started again taking the reactions shard, which the reactions node then hands over (`hold = false`).
Every wait is a condition with a bound.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from pathlib import Path

import pytest
import websockets

from relay.protocol.claims import CLAIM_KIND
from tests.helpers import Keys, eventually
from tests.served import Served, clean_env, free_port

pytestmark = pytest.mark.fleet

MIN_COPIES = 2
KINDS = (1, 7)
ARCHIVE = '[[shards]]\nid = "all"\nfilter = {}\n'
NOTES = '[[shards]]\nid = "notes"\nfilter = {kinds = [1]}\n'
REACTIONS = '[[shards]]\nid = "reactions"\nfilter = {kinds = [7]}\n'
RECENT = '[[shards]]\nid = "recent"\nfilter = {}\n[[retention.rules]]\nmax_age_days = 3.5e-5\n'  # 3 seconds


class FleetNode:
    """One `relay serve` of the fleet: its configuration file, database and log in `tmp_path/<name>`."""

    def __init__(self, tmp_path: Path, name: str, index: int, shards: str) -> None:
        self.home = tmp_path / name
        self.home.mkdir()
        self.name, self.shards, self.port = name, shards, free_port()
        self.key = Keys(0xF1EE70 + index)
        (self.home / "node.key").write_text(f"{0xF1EE70 + index:064x}\n")
        (self.home / "node.key").chmod(0o600)
        self.served: Served | None = None
        self.logs: list[dict] = []  # the log lines of its earlier runs

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def write_config(self, others: list[FleetNode]) -> Path:
        peers = "".join(f'[[sync.peers]]\nurl = "{o.url}"\npubkey = "{o.key.pubkey}"\n' for o in others)
        path = self.home / "relay.toml"
        path.write_text(f'[sync]\nsecret_key_file = "{self.home / "node.key"}"\ninterval_seconds = 1.0\n'
                        'backoff_initial_seconds = 0.2\nbackoff_max_seconds = 1.0\n'
                        '[retention]\ninterval_seconds = 1.0\n'
                        f'[sharding]\nmin_copies = {MIN_COPIES}\nclaim_interval_seconds = 1\nclaim_ttl_seconds = 4\n'
                        f'max_clock_skew_seconds = 1\n{self.shards}{peers}')
        return path

    def start(self, fleet: dict[str, FleetNode]) -> None:
        config = self.write_config([o for o in fleet.values() if o is not self])
        self.served = Served(self.home, "--config", config, "--db", self.home / "relay.db", "--port", self.port,
                             "--workers", 0, env=clean_env(RELAY_SERVER__WORKERS="0")).__enter__()
        self.served.wait_health(self.port)

    def stop(self, kill: bool = False) -> None:
        self.served.kill() if kill else self.served.stop()
        self.logs += self.served.log_events()
        self.served.__exit__(None, None, None)
        self.served = None

    def log_events(self) -> list[dict]:
        return self.logs + (self.served.log_events() if self.served is not None else [])


async def _ask(url: str, filter_obj: dict) -> list[dict]:
    """The events `url` serves for `filter_obj` (one REQ, up to 10,000)."""
    async with websockets.connect(url, max_size=None) as ws:
        await ws.send(json.dumps(["REQ", "q", {**filter_obj, "limit": 10_000}]))
        found = []
        while True:
            reply = json.loads(await asyncio.wait_for(ws.recv(), 10))
            if reply[0] == "EVENT":
                found.append(reply[2])
            elif reply[0] in ("EOSE", "CLOSED"):
                assert reply[0] == "EOSE", reply
                return found


async def _publish(url: str, event: dict) -> bool:
    try:
        async with websockets.connect(url) as ws:
            await ws.send(json.dumps(["EVENT", event]))
            while True:
                reply = json.loads(await asyncio.wait_for(ws.recv(), 10))
                if reply[0] == "OK":
                    return reply[2] is True
    except (OSError, websockets.ConnectionClosed, TimeoutError):
        return False  # a node going down: not acknowledged


async def _holders(fleet: dict[str, FleetNode], ids: list[str]) -> dict[str, set[str]]:
    """Event id -> names of the running nodes that serve it."""
    found: dict[str, set[str]] = {i: set() for i in ids}
    for node in fleet.values():
        if node.served is not None:
            for event in await _ask(node.url, {"ids": ids}):
                found[event["id"]].add(node.name)
    return found


async def test_a_fleet_keeps_every_acknowledged_event_through_crashes_restarts_and_a_handover(tmp_path):
    rng = random.Random(30803)
    author = Keys(0xA17)
    fleet = {name: FleetNode(tmp_path, name, i, shards) for i, (name, shards) in enumerate(
        (("archive", ARCHIVE), ("notes", NOTES), ("reactions", REACTIONS), ("recent1", RECENT), ("recent2", RECENT)))}
    holds = {"archive": {1, 7}, "notes": {1}, "reactions": {7}, "recent1": set(), "recent2": set()}  # for good
    claims: dict[str, dict] = {}  # every kind-30803 event seen, by id
    acked: dict[str, tuple[int, str]] = {}  # id -> (kind, the node that acknowledged it)
    watcher = None
    try:
        for node in fleet.values():
            node.start(fleet)
        watcher = asyncio.create_task(_watch_claims(fleet["archive"].url, claims))  # every claim reaches it

        async def all_claimed() -> bool:
            for node in fleet.values():
                seen = await _ask(node.url, {"kinds": [CLAIM_KIND]})
                claims.update((c["id"], c) for c in seen)
                if {(c["pubkey"], dict(t[:2] for t in c["tags"])["status"]) for c in seen} < \
                        {(o.key.pubkey, "complete") for o in fleet.values()}:
                    return False
            return True

        assert await eventually(all_claimed, timeout=60)
        await asyncio.sleep(3)  # every node's sessions have their peers' shards (a new claim restarts them)

        async def publish(count: int) -> None:
            for _ in range(count):
                kind = rng.choice(KINDS)
                event = author.sign(kind=kind, content=f"{kind}-{len(acked)}",
                                    created_at=int(time.time()) - rng.randrange(0, 20))
                running = [n for n in fleet.values() if n.served is not None]
                node = rng.choice(running)
                if await _publish(node.url, event):
                    acked[event["id"]] = (kind, node.name)

        async def sample() -> None:
            """No acknowledged event is lost: each is served by a running node, or was acknowledged by one that
            is down (its database holds it)."""
            where = await _holders(fleet, list(acked))
            lost = [i for i, names in where.items() if not names and fleet[acked[i][1]].served is not None]
            assert not lost, f"acknowledged events served by no node: {lost}"

        await publish(60)
        fleet["recent2"].stop(kill=True)  # a crash
        await publish(40)
        await sample()
        fleet["notes"].stop()  # stopped, and started again taking the reactions shard
        fleet["notes"].shards = NOTES + REACTIONS
        fleet["notes"].start(fleet)
        await publish(40)
        await sample()
        fleet["reactions"].stop()  # the handover: the notes node now holds the reactions shard
        fleet["reactions"].shards = REACTIONS + "hold = false\n"
        fleet["reactions"].start(fleet)
        fleet["recent2"].start(fleet)
        holds.update(notes={1, 7}, reactions=set())
        await publish(40)
        await sample()

        async def unconverged() -> list[str]:
            """What is not there yet: events short of their holders, nodes holding what is not theirs."""
            where, missing = await _holders(fleet, list(acked)), []
            for event_id, (kind, _) in acked.items():
                holders = {n for n, kinds in holds.items() if kind in kinds}
                if not holders <= where[event_id] or len(where[event_id] - {"recent1", "recent2"}) < MIN_COPIES:
                    missing.append(f"kind {kind} {event_id[:8]} on {sorted(where[event_id])}")
            for name in ("notes", "reactions"):  # each holds only its shards' events (and the fleet-wide kinds)
                kinds = {e["kind"] for e in await _ask(fleet[name].url, {"authors": [author.pubkey]})}
                if not kinds <= holds[name]:
                    missing.append(f"{name} holds kinds {sorted(kinds)}")
            return missing

        assert await eventually(lambda: _none(unconverged()), timeout=120, every=1.0), await unconverged()
        for node in fleet.values():
            claims.update((c["id"], c) for c in await _ask(node.url, {"kinds": [CLAIM_KIND]}))
    finally:
        if watcher is not None:
            watcher.cancel()
        for node in fleet.values():
            if node.served is not None:
                node.stop()

    removals = [(node.name, e) for node in fleet.values() for e in node.log_events()
                if e.get("event") == "shard_events_removed"]
    assert removals, "no node removed anything: the recent nodes' retention and the handover never ran"
    pubkeys = {node.key.pubkey: node.name for node in fleet.values()}
    relied_seen = 0
    for name, removal in removals:
        assert removal["claims"], (name, removal)
        for claim_id in removal["claims"]:  # the claims it relied on, as the fleet published them
            if claim_id in claims:
                relied_seen += 1
                tags = dict(t[:2] for t in claims[claim_id]["tags"])
                assert tags["status"] == "complete" and claims[claim_id]["pubkey"] != fleet[name].key.pubkey
        for event_id, confirmers in removal["confirmed_by"].items():
            assert len(set(confirmers) - {fleet[name].key.pubkey}) >= MIN_COPIES, (name, event_id, confirmers)
            assert set(confirmers) <= set(pubkeys), (name, confirmers)
    handed = [e for name, e in removals if name == "reactions" and e["why"] == "handover"]
    assert handed, "the reactions node removed nothing in its handover"
    assert relied_seen, "none of the claims the removals relied on was seen"


async def _none(found) -> bool:
    return not await found


async def _watch_claims(url: str, claims: dict[str, dict]) -> None:
    """Keep every kind-30803 event `url` serves, stored and live, in `claims` (until cancelled)."""
    async with websockets.connect(url, max_size=None) as ws:
        await ws.send(json.dumps(["REQ", "claims", {"kinds": [CLAIM_KIND]}]))
        async for message in ws:
            reply = json.loads(message)
            if reply[0] == "EVENT":
                claims[reply[2]["id"]] = reply[2]
