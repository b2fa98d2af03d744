"""A fleet of sharded nodes on loopback for the shard tests: each node a relay in `tmp_path/<name>` with its own
node key, every other node as a `[[sync.peers]]` entry (URL and pubkey), and its `[[shards]]`."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path

import websockets

from relay.protocol.claims import CLAIM_KIND
from tests.conftest import make_config
from tests.helpers import Keys
from tests.inprocess import Relay
from tests.served import free_port

SHARDING = "[sharding]\nclaim_interval_seconds = 1\nclaim_ttl_seconds = 4\nmax_clock_skew_seconds = 1\nmin_copies = {copies}\n"


@dataclass
class Node:
    """One node of a fleet: its name, port, node key and configuration text ([[shards]], [retention])."""

    name: str
    port: int
    key: Keys
    secret: str
    toml: str
    relay: Relay | None = None

    @property
    def url(self) -> str:
        """ws://127.0.0.1:<port>."""
        return f"ws://127.0.0.1:{self.port}"


def fleet(tmp_path: Path, tomls: dict[str, str], copies: int) -> dict[str, Node]:
    """Nodes named as `tomls` (name -> configuration text), each with a fresh key and a free port (not started)."""
    nodes = {}
    for i, (name, toml) in enumerate(tomls.items()):
        secret = f"{0xF1EE7 + i:064x}"
        nodes[name] = Node(name, free_port(), Keys(bytes.fromhex(secret)), secret,
                           SHARDING.format(copies=copies) + toml)
    return nodes


async def start(tmp_path: Path, nodes: dict[str, Node], node: Node, interval: float = 1.0) -> Relay:
    """Start `node` with every other node of `nodes` as its peer (reconciled every `interval` seconds)."""
    home = tmp_path / node.name
    home.mkdir(exist_ok=True)
    (home / "node.key").write_text(node.secret + "\n")
    (home / "node.key").chmod(0o600)
    peers = [{"url": other.url, "pubkey": other.key.pubkey} for other in nodes.values() if other is not node]
    config = make_config(home, node.toml, server={"port": node.port},
                         sync={"peers": peers, "interval_seconds": interval, "secret_key_file": str(home / "node.key"),
                               "backoff_initial_seconds": 0.2, "backoff_max_seconds": 1.0})
    node.relay = Relay(config)
    await node.relay.start()
    return node.relay


async def ids(url: str, filter_obj: dict) -> set[str]:
    """The ids `url` serves for `filter_obj` (one REQ, up to 5,000)."""
    async with websockets.connect(url, max_size=None) as ws:
        await ws.send(json.dumps(["REQ", "ids", {**filter_obj, "limit": 5000}]))
        found = set()
        while True:
            reply = json.loads(await asyncio.wait_for(ws.recv(), 10))
            if reply[0] == "EVENT":
                found.add(reply[2]["id"])
            elif reply[0] == "EOSE":
                return found
            elif reply[0] == "CLOSED":
                raise AssertionError(reply)


async def claim_statuses(url: str) -> dict[tuple[str, str], str]:
    """(node pubkey, shard id) -> status of every live claim `url` serves."""
    async with websockets.connect(url, max_size=None) as ws:
        await ws.send(json.dumps(["REQ", "claims", {"kinds": [CLAIM_KIND]}]))
        found = {}
        while True:
            reply = json.loads(await asyncio.wait_for(ws.recv(), 10))
            if reply[0] == "EVENT":
                tags = dict(t[:2] for t in reply[2]["tags"])
                found[(reply[2]["pubkey"], tags["d"])] = tags["status"]
            elif reply[0] in ("EOSE", "CLOSED"):
                return found
