"""Sync test helpers: nostr-sdk's LocalRelay in-process, event sets, and reading either side's ids."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from contextlib import asynccontextmanager
from pathlib import Path

import nostr_sdk as sdk
import pytest
import websockets

from relay.config import Config
from relay.hooks import hooks
from relay.protocol.event import parse_event
from relay.store.store import Store
from tests.conftest import make_config
from tests.helpers import Keys
from tests.inprocess import Relay
from tests.served import free_port


@pytest.fixture
async def local_relay():
    """Factory: `await local_relay(nip42=None, port=None)` starts nostr-sdk's LocalRelay on 127.0.0.1, returns its URL.

    `nip42` is a `LocalRelayBuilderNip42Mode` to require NIP-42 AUTH.  The
    builder's rate limits are lifted; every relay is shut down after the test.
    """
    started: list[sdk.LocalRelay] = []

    async def start(nip42=None, port: int | None = None) -> str:
        port = port or free_port()
        builder = (sdk.LocalRelayBuilder().addr("127.0.0.1").port(port).max_filter_limit(100_000)
                   .default_filter_limit(100_000)
                   .rate_limit(sdk.RateLimit(max_reqs=100_000, notes_per_minute=4_000_000_000)))
        if nip42 is not None:
            builder = builder.nip42(sdk.LocalRelayBuilderNip42(mode=nip42))
        relay = builder.build()
        await relay.run()
        started.append(relay)
        return f"ws://127.0.0.1:{port}"

    yield start
    for relay in started:
        relay.shutdown()


def notes(keys: Keys, count: int, start: int, kind: int = 1, tag: str = "n") -> list[dict]:
    """`count` signed events of `kind`, created_at start, start+1, ... (contents "<tag><i>")."""
    return [keys.sign(kind=kind, content=f"{tag}{i}", created_at=start + i) for i in range(count)]


async def publish(url: str, events: list[dict], auth_key: Keys | None = None) -> list[list]:
    """Send every event to `url` over one WebSocket and return the OK replies, in order of arrival."""
    async with websockets.connect(url, max_size=None) as ws:
        for e in events:
            await ws.send(json.dumps(["EVENT", e]))
        oks = []
        while len(oks) < len(events):
            reply = json.loads(await asyncio.wait_for(ws.recv(), 10))
            if reply[0] == "OK":
                oks.append(reply)
        return oks


async def remote_ids(url: str, filter_obj: dict | None = None) -> set[str]:
    """Ids of every event `url` serves for `filter_obj`, paging back with `until` (LocalRelay caps a REQ at 500)."""
    found: set[str] = set()
    until = None
    async with websockets.connect(url, max_size=None) as ws:
        for page in range(200):
            f = {**(filter_obj or {}), "limit": 500, **({"until": until} if until is not None else {})}
            await ws.send(json.dumps(["REQ", f"ids{page}", f]))
            before, oldest = len(found), None
            while True:
                reply = json.loads(await asyncio.wait_for(ws.recv(), 10))
                if reply[0] == "EVENT":
                    found.add(reply[2]["id"])
                    oldest = min(oldest or reply[2]["created_at"], reply[2]["created_at"])
                elif reply[0] in ("EOSE", "CLOSED"):
                    assert reply[0] == "EOSE", reply
                    break
            await ws.send(json.dumps(["CLOSE", f"ids{page}"]))
            if len(found) == before:
                return found
            until = oldest
    raise AssertionError("too many pages")


async def seed(config: Config, events: list[dict]) -> None:
    """Validate and store `events` in `config`'s database (origin local), with the configured hooks."""
    store = await Store.open(config.store.path, config.store.options(read_connections=1), hooks(config))
    try:
        for outcome in await asyncio.gather(*(store.submit(parse_event(e, config.limits.event_limits(), time.time()))
                                              for e in events)):
            assert outcome[0], outcome
    finally:
        await store.close()


def stored(config: Config) -> dict[str, str]:
    """Event id -> origin of every row in `config`'s database ('' for local events)."""
    conn = sqlite3.connect(config.store.path)
    try:
        return {id_.hex(): origin for id_, origin in conn.execute("SELECT id, origin FROM events")}
    finally:
        conn.close()


def local_config(tmp_path: Path, name: str = "local", **sections) -> Config:
    """A Config whose database is `tmp_path/name/relay.db` (the node key lands beside it)."""
    (tmp_path / name).mkdir(exist_ok=True)
    return make_config(tmp_path / name, **sections)


async def speaks_nip77(url: str) -> bool:
    """True when `url` answers an empty NEG-OPEN with NEG-MSG (relay-side NIP-77 is there)."""
    async with websockets.connect(url) as ws:
        await ws.send(json.dumps(["NEG-OPEN", "probe", {}, "6100000200"]))
        try:
            reply = json.loads(await asyncio.wait_for(ws.recv(), 5))
            if reply[0] == "AUTH":  # a NIP-42 challenge sent on connect comes first
                reply = json.loads(await asyncio.wait_for(ws.recv(), 5))
        except TimeoutError:
            return False
        return reply[0] == "NEG-MSG"


def peered_node(tmp_path, name: str, port: int, peer_port: int) -> Relay:
    """A relay in `tmp_path/name` on `port` (not started) whose one peer is 127.0.0.1:`peer_port`, synced every 0.5 s."""
    (tmp_path / name).mkdir(exist_ok=True)
    return Relay(make_config(tmp_path / name, server={"port": port},
                             sync={"peers": [{"url": f"ws://127.0.0.1:{peer_port}"}], "interval_seconds": 0.5,
                                   "backoff_initial_seconds": 0.1, "backoff_max_seconds": 0.5}))


@asynccontextmanager
async def peered_pair(tmp_path):
    """Nodes a and b, each with the other as its peer, started; every node in the list is stopped at the end."""
    pa, pb = free_port(), free_port()
    nodes = [peered_node(tmp_path, "a", pa, pb), peered_node(tmp_path, "b", pb, pa)]
    for node in nodes:
        await node.start()
    try:
        yield nodes
    finally:
        for node in nodes:
            await node.stop()
