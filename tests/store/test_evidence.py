"""The evidence of a deleted newest version (relay/store/evidence.py) and expired high-water marks.

A coordinate whose newest version was deleted by an `e` tag keeps that
version's JSON on its mark, whatever came first (the deletion or the version,
one transaction or several), until a newer version replaces the mark; an
expired mark is purged with its version, so an older version is taken again.
"""

from __future__ import annotations

import asyncio
import time
from contextlib import asynccontextmanager

import pytest

from relay.store import evidence
from relay.store.store import Store
from tests.store.test_properties import OPTIONS, live_ids, parsed

NOW = int(time.time())


def _coordinate(event: dict) -> tuple[int, bytes, str]:
    d = next((t[1] for t in event["tags"] if t[0] == "d"), "")
    return (event["kind"], bytes.fromhex(event["pubkey"]), d if event["kind"] >= 30000 else "")


async def _submit(store: Store, events: list[dict], together: bool) -> list[tuple[bool, str]]:
    if together:
        return list(await asyncio.gather(*[store.submit(parsed(e)) for e in events]))
    return [await store.submit(parsed(e)) for e in events]


@pytest.mark.parametrize("kind", [0, 30023])
@pytest.mark.parametrize("together", [False, True], ids=["one-by-one", "one-batch"])
@pytest.mark.parametrize("order", ["deletion-last", "deletion-first"])
async def test_a_deleted_newest_version_is_kept_as_evidence(tmp_path, alice, kind, together, order):
    """v1, v2 and D(e: v2) in either order: nothing is served, v1 is refused, and the mark holds v2 with D."""
    tags = [["d", "x"]] if kind >= 30000 else []
    v1 = alice.sign(kind, "v1", tags, NOW - 20)
    v2 = alice.sign(kind, "v2", tags, NOW - 10)
    deletion = alice.sign(5, "", [["e", v2["id"]]], NOW - 5)
    events = [v1, v2, deletion] if order == "deletion-last" else [deletion, v2, v1]
    store = await Store.open(tmp_path / "e.db", OPTIONS)
    try:
        await _submit(store, events, together)
        assert await live_ids(store) == {deletion["id"]}
        assert await store.submit(parsed(v1)) == (False, "duplicate: have a newer version")
        pairs = await store.read_snapshot(evidence.select, [_coordinate(v1)])
        assert [(d.decode(), v.decode()) for d, v in pairs] == [(parsed(deletion).raw.decode(),
                                                                   parsed(v2).raw.decode())]
    finally:
        await store.close()


@asynccontextmanager
async def _deleted_profile(tmp_path, alice):
    """A store holding alice's kind-0 v2 deleted by `e` (its evidence kept); yields (store, v2); closed after."""
    v2 = alice.sign(0, "v2", [], NOW - 10)
    store = await Store.open(tmp_path / "e.db", OPTIONS)
    try:
        for event in (v2, alice.sign(5, "", [["e", v2["id"]]], NOW - 5)):
            assert (await store.submit(parsed(event)))[0]
        assert len(await store.read_snapshot(evidence.select, [_coordinate(v2)])) == 1
        yield store, v2
    finally:
        await store.close()


async def test_a_newer_version_replaces_the_evidence(tmp_path, alice):
    """Once a newer version is live, the mark names it and no deleted version is offered as evidence."""
    async with _deleted_profile(tmp_path, alice) as (store, v2):
        v3 = alice.sign(0, "v3", [], NOW - 1)
        assert await store.submit(parsed(v3)) == (True, "")
        assert await store.read_snapshot(evidence.select, [_coordinate(v2)]) == []


async def test_an_expired_version_leaves_no_mark(tmp_path, alice):
    """v1 then v2 expiring soon: after the purge nothing is served and v1 is taken again (as by a node that never
    saw v2); before it, v1 is still refused."""
    v1 = alice.sign(0, "v1", [], NOW - 20)
    v2 = alice.sign(0, "v2", [["expiration", str(NOW + 2)]], NOW - 10)
    store = await Store.open(tmp_path / "e.db", OPTIONS)
    try:
        assert [await store.submit(parsed(e)) for e in (v1, v2)] == [(True, "")] * 2
        assert await store.submit(parsed(v1)) == (False, "duplicate: have a newer version")
        await asyncio.sleep(max(0.0, NOW + 3 - time.time()))
        await store.purge_expired()
        assert await live_ids(store) == set()
        assert await store.submit(parsed(v1)) == (True, "")
        assert await live_ids(store) == {v1["id"]}
    finally:
        await store.close()


async def test_a_request_to_vanish_drops_the_kept_versions(tmp_path, alice):
    """NIP-62: once the author asks to vanish, the deleted version kept as evidence is dropped with the rest."""
    async with _deleted_profile(tmp_path, alice) as (store, _):
        assert (await store.submit(parsed(alice.sign(62, "", [["relay", "ALL_RELAYS"]], NOW - 1))))[0]
        kept = await store.read_snapshot(lambda conn: conn.execute(
            "SELECT count(*) FROM coordinates WHERE deleted_raw IS NOT NULL").fetchone()[0])
        assert kept == 0
