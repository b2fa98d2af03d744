"""Shards across nodes (docs/peers.md, "Shards"): sync by shard, events published to a node outside its shards,
and retention that waits for copies other nodes confirm.  Real relays on loopback, synced every second."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
import websockets

from relay.protocol.claims import CLAIM_KIND
from relay.protocol.filters import parse_filter
from tests.conftest import make_config
from tests.helpers import Client, Keys, eventually
from tests.inprocess import running
from tests.served import relay_cli_async
from tests.sync.conftest import publish
from tests.sync.fleet import SHARDING, claim_statuses, fleet, ids, start

ALICE = Keys(0xA11CE)
ARCHIVE = '[[shards]]\nid = "all"\nfilter = {}\n'
NOTES = '[[shards]]\nid = "notes"\nfilter = {kinds = [1]}\n'
REACTIONS = '[[shards]]\nid = "reactions"\nfilter = {kinds = [7]}\n'


async def _publish(url: str, event: dict) -> None:
    client = await Client.connect(url)
    try:
        assert (await client.publish(event))[2] is True
    finally:
        await client.close()


async def _stop(nodes) -> None:
    for node in nodes.values():
        if node.relay is not None:
            await node.relay.stop()


async def test_events_go_to_their_shards_holders_and_leave_the_nodes_that_do_not_hold_them(tmp_path):
    """An archive node, a node of kind 1, a node of kind 7 (min_copies 2): each claims its shard complete; a
    note published to the kind-7 node and a reaction to the kind-1 node reach their holders and are then
    removed from the node that took them; an article (kind 30023) that only the archive holds stays where it was
    published (one copy elsewhere is fewer than min_copies)."""
    nodes = fleet(tmp_path, {"archive": ARCHIVE, "notes": NOTES, "reactions": REACTIONS}, copies=2)
    try:
        for node in nodes.values():
            await start(tmp_path, nodes, node)
        everyone = {(n.key.pubkey, shard): "complete" for n, shard in
                    ((nodes["archive"], "all"), (nodes["notes"], "notes"), (nodes["reactions"], "reactions"))}
        await _sharded(nodes, everyone)
        now = int(time.time())
        note = ALICE.sign(kind=1, content="to the wrong node", created_at=now - 60)
        reaction = ALICE.sign(kind=7, content="+", created_at=now - 60, tags=[["e", note["id"]]])
        article = ALICE.sign(kind=30023, content="long", created_at=now - 60, tags=[["d", "a"]])
        await _publish(nodes["reactions"].url, note)
        await _publish(nodes["notes"].url, reaction)
        await _publish(nodes["notes"].url, article)

        names = {note["id"]: "note", reaction["id"]: "reaction", article["id"]: "article"}

        async def placed() -> dict[str, set[str]]:
            return {name: {names[i] for i in await ids(n.url, {"ids": list(names)})} for name, n in nodes.items()}

        expected = {"archive": {"note", "reaction", "article"}, "notes": {"note", "article"}, "reactions": {"reaction"}}
        assert await eventually(lambda: _equal(placed(), expected), timeout=40), await placed()
    finally:
        await _stop(nodes)


async def test_a_direct_message_leaves_a_node_outside_its_shard_once_the_archive_returns_it_to_our_auth(tmp_path):
    """A kind-4 message (a private kind: a relay leaves it out of an unauthenticated answer) published to the
    kind-1 node reaches the archive and then leaves the kind-1 node: its confirmation waits for the archive to
    accept the node's AUTH before asking (else the archive answers nothing, and the message stayed forever)."""
    nodes = await _archive_and(tmp_path, "notes", NOTES, "notes")
    archive, notes = nodes["archive"], nodes["notes"]
    try:
        message = ALICE.sign(kind=4, content="?iv=x", created_at=int(time.time()) - 60,
                             tags=[["p", Keys(0xB0B).pubkey]])
        await _publish(notes.url, message)
        assert await eventually(lambda: _equal(_stored(archive, message["id"]), {message["id"]}), timeout=20)
        assert await eventually(lambda: _equal(_stored(notes, message["id"]), set()), timeout=40)
    finally:
        await _stop(nodes)


async def test_an_old_version_leaves_a_node_outside_its_shard_once_a_holder_has_a_newer_one(tmp_path):
    """A profile (kind 0) and an article (kind 30023, `d` "a") published to the kind-1 node in versions older
    than the archive's: the archive refuses them (it has newer ones) and never returns their ids, yet they
    leave the kind-1 node, the archive's newer versions standing for them (before: held back forever, and
    served).  The newer ones stay on the archive."""
    nodes = await _archive_and(tmp_path, "notes", NOTES, "notes")
    archive, notes = nodes["archive"], nodes["notes"]
    try:
        now = int(time.time())
        newer = [ALICE.sign(kind=0, content='{"name":"new"}', created_at=now - 10),
                 ALICE.sign(kind=30023, content="new", created_at=now - 10, tags=[["d", "a"]])]
        older = [ALICE.sign(kind=0, content='{"name":"old"}', created_at=now - 60),
                 ALICE.sign(kind=30023, content="old", created_at=now - 60, tags=[["d", "a"]])]
        for event in newer:
            await _publish(archive.url, event)
        for event in older:
            await _publish(notes.url, event)
        gone = {e["id"]: set() for e in older}
        assert await eventually(lambda: _equal(_stored_each(notes, gone), gone), timeout=40)
        kept = {e["id"]: {e["id"]} for e in newer}
        assert await _stored_each(archive, kept) == kept
    finally:
        await _stop(nodes)


async def _stored_each(node, ids_: dict) -> dict[str, set[str]]:
    return {i: await _stored(node, i) for i in ids_}


async def _stored(node, event_id: str) -> set[str]:
    """`event_id` if `node`'s store holds it (read from its store: a REQ would not show a private kind)."""
    return {bytes(i).hex() for _, i in await node.relay.store.items(parse_filter({"ids": [event_id]}))}


@pytest.mark.single_process  # reads the live subscriptions of each node's server
async def test_fleet_nodes_hold_no_live_req_on_each_other_and_push_what_they_commit(tmp_path):
    """An archive and two nodes of kind 1, reconciled only at start (interval 60 s): no node holds a live REQ on
    another (before: one per peer, each event streamed again beside its push), and 50 notes published to one
    kind-1 node reach the other and the archive by pushes alone."""
    nodes = fleet(tmp_path, {"archive": ARCHIVE, "first": NOTES, "second": NOTES}, copies=1)
    try:
        for node in nodes.values():
            await start(tmp_path, nodes, node, interval=60.0)
        await _sharded(nodes, {(nodes["archive"].key.pubkey, "all"): "complete",
                               (nodes["first"].key.pubkey, "notes"): "complete",
                               (nodes["second"].key.pubkey, "notes"): "complete"})
        # (a reconciliation's fetch or a confirmation holds a REQ for a moment; a live REQ stays)
        assert await eventually(lambda: all(node.relay.subscriptions.empty() for node in nodes.values()),
                                timeout=5)
        notes = [ALICE.sign(kind=1, content=f"pushed {i}") for i in range(50)]
        client = await Client.connect(nodes["first"].url)
        try:
            assert all([(await client.publish(note))[2] for note in notes])
        finally:
            await client.close()
        wanted = {note["id"] for note in notes}
        for name in ("archive", "second"):
            assert await eventually(lambda: _equal(ids(nodes[name].url, {"ids": list(wanted)}), wanted), timeout=20)
    finally:
        await _stop(nodes)


async def _archive_and(tmp_path, name: str, toml: str, shard_id: str) -> dict:
    """An archive node and node `name` (its `[[shards]]` in `toml`, claiming `shard_id`), min_copies 1, both
    started, each claiming complete and syncing with the other by shard; stopped again if that fails."""
    nodes = fleet(tmp_path, {"archive": ARCHIVE, name: toml}, copies=1)
    try:
        for node in nodes.values():
            await start(tmp_path, nodes, node)
        await _sharded(nodes, {(nodes["archive"].key.pubkey, "all"): "complete",
                               (nodes[name].key.pubkey, shard_id): "complete"})
    except BaseException:
        await _stop(nodes)
        raise
    return nodes


async def _sharded(nodes, claims: dict) -> None:
    """Wait until every node has every claim of `claims` and syncs with each peer by its shards."""
    for node in nodes.values():
        assert await eventually(lambda: _has(claim_statuses(node.url), claims), timeout=20), node.name
        assert await eventually(lambda: all(p.scope is not None for p in node.relay.sync.peers), timeout=20)


async def _equal(found, expected) -> bool:
    return await found == expected


async def _has(statuses, expected: dict) -> bool:
    found = await statuses
    return all(found.get(k) == v for k, v in expected.items())


RECENT = '[[shards]]\nid = "recent"\nfilter = {}\n[[retention.rules]]\nmax_age_days = 2.3e-5\n'  # 2 seconds


async def test_retention_removes_an_old_event_only_once_another_node_confirms_it(tmp_path):
    """A recent-data node (every event, kept 2 s) beside an archive node, min_copies 1: an old event goes from
    the recent node once its raised `since` has had its wait and the archive returned the event; while the
    archive is down, an old event published to the recent node stays (no confirmed copy), and goes once the
    archive is back and holds it."""
    nodes = await _archive_and(tmp_path, "recent", RECENT, "recent")
    archive, recent = nodes["archive"], nodes["recent"]
    try:
        first = ALICE.sign(kind=1, content="old", created_at=int(time.time()) - 100)
        await _publish(recent.url, first)
        assert await eventually(lambda: _equal(ids(archive.url, {"ids": [first["id"]]}), {first["id"]}), timeout=20)
        assert await eventually(lambda: _equal(ids(recent.url, {"ids": [first["id"]]}), set()), timeout=30)
        await archive.relay.stop()
        archive.relay = None
        second = ALICE.sign(kind=1, content="old too", created_at=int(time.time()) - 100)
        await _publish(recent.url, second)
        await asyncio.sleep(12)  # two waits of the raised since (claim_ttl_seconds + max_clock_skew_seconds)
        assert await ids(recent.url, {"ids": [second["id"]]}) == {second["id"]}
        await start(tmp_path, nodes, archive)
        assert await eventually(lambda: _equal(ids(recent.url, {"ids": [second["id"]]}), set()), timeout=40)
        assert await ids(archive.url, {"ids": [first["id"], second["id"]]}) == {first["id"], second["id"]}
    finally:
        await _stop(nodes)


async def test_two_nodes_never_remove_the_last_copies_on_each_others_word(tmp_path):
    """Two recent-data nodes and no archive, min_copies 1: each raised its `since` before it may remove, so
    neither claim covers the old event when the other looks: both keep it."""
    nodes = fleet(tmp_path, {"one": RECENT, "two": RECENT}, copies=1)
    try:
        for node in nodes.values():
            await start(tmp_path, nodes, node)
        await _sharded(nodes, {(n.key.pubkey, "recent"): "complete" for n in nodes.values()})
        event = ALICE.sign(kind=1, content="old", created_at=int(time.time()) - 100)
        await _publish(nodes["one"].url, event)
        await asyncio.sleep(15)  # three waits of the raised since
        for node in nodes.values():
            assert await ids(node.url, {"ids": [event["id"]]}) == {event["id"]}, node.name
    finally:
        await _stop(nodes)


async def test_a_handed_over_shard_goes_once_its_holders_have_it_and_comes_back_when_taken_again(tmp_path):
    """`hold = false` on one of two nodes of kind 1 (with an archive, min_copies 2): it claims `leaving` and
    removes its notes once both others returned them; `hold = true` again forgets the handover, and sync
    fetches them back."""
    nodes = fleet(tmp_path, {"archive": ARCHIVE, "notes": NOTES, "leaver": NOTES}, copies=2)
    leaver = nodes["leaver"]
    try:
        for node in nodes.values():
            await start(tmp_path, nodes, node)
        await _sharded(nodes, {(n.key.pubkey, s): "complete" for n, s in
                               ((nodes["archive"], "all"), (nodes["notes"], "notes"), (leaver, "notes"))})
        notes = [ALICE.sign(kind=1, content=f"n{i}", created_at=int(time.time()) - 10) for i in range(3)]
        for note in notes:
            await _publish(leaver.url, note)
        every = {n["id"] for n in notes}
        for node in nodes.values():
            assert await eventually(lambda: _equal(ids(node.url, {"ids": list(every)}), every), timeout=20)
        await leaver.relay.stop()
        leaver.toml = leaver.toml.replace('filter = {kinds = [1]}\n', 'filter = {kinds = [1]}\nhold = false\n')
        await start(tmp_path, nodes, leaver)
        assert await eventually(lambda: _has(claim_statuses(nodes["notes"].url),
                                             {(leaver.key.pubkey, "notes"): "leaving"}), timeout=20)
        assert await eventually(lambda: _equal(ids(leaver.url, {"ids": list(every)}), set()), timeout=40)
        for name in ("archive", "notes"):
            assert await ids(nodes[name].url, {"ids": list(every)}) == every, name
        await leaver.relay.stop()
        leaver.toml = leaver.toml.replace("hold = false\n", "")
        await start(tmp_path, nodes, leaver)
        assert await eventually(lambda: _equal(ids(leaver.url, {"ids": list(every)}), every), timeout=40)
    finally:
        await _stop(nodes)


async def test_a_relay_that_knows_nothing_of_shards_is_synced_as_a_full_replica(tmp_path, local_relay):
    """nostr-sdk's LocalRelay as the peer of a node holding kind 1: everything is synced both ways as before
    (its kind-7 event too, which no fleet node's shard holds, so it stays), the node's kind-30803 claim passes
    through the other relay unchanged, and that relay counts as no copy (under-replicated)."""
    peer_url = await local_relay()
    config = make_config(tmp_path, SHARDING.format(copies=1) + NOTES,
                         sync={"peers": [{"url": peer_url}], "interval_seconds": 1.0, "backoff_max_seconds": 1.0})
    theirs = [ALICE.sign(kind=kind, content="at the peer", created_at=int(time.time()) - 30) for kind in (1, 7)]
    await publish(peer_url, theirs)
    async with running(config) as relay:
        ours = ALICE.sign(kind=1, content="here")
        await _publish(relay.url, ours)
        every = {e["id"] for e in theirs} | {ours["id"]}
        for url in (relay.url, peer_url):
            assert await eventually(lambda: _equal(ids(url, {"authors": [ALICE.pubkey]}), every), timeout=20), url
        claim = (await Client.connect(relay.url))
        [stored] = await claim.req("claim", {"kinds": [CLAIM_KIND]})
        await claim.close()
        assert await eventually(lambda: _served_as(peer_url, stored), timeout=20)
        await asyncio.sleep(3)  # guard rounds: the kind-7 event is in no fleet node's shard
        assert await ids(relay.url, {"authors": [ALICE.pubkey]}) == every
        code, out, err = await relay_cli_async("status", "--json", "--config", tmp_path / "relay.toml", "--db",
                                               config.store.path)
        [shard] = json.loads(out)["shards"]
        assert code == 0 and shard["claimed_copies"] == 0 and shard["under_replicated"], err


async def _served_as(url: str, event: dict) -> bool:
    """Whether `url` serves `event` exactly: every field as it was signed."""
    async with websockets.connect(url) as ws:
        await ws.send(json.dumps(["REQ", "one", {"ids": [event["id"]]}]))
        while True:
            reply = json.loads(await asyncio.wait_for(ws.recv(), 10))
            if reply[0] == "EVENT":
                return reply[2] == event
            if reply[0] in ("EOSE", "CLOSED"):
                return False


async def test_a_shard_withdrawn_from_the_configuration_goes_only_after_its_claims_lapse(tmp_path):
    """A node that held reactions restarts without that shard: it claims `leaving` once, and its reactions
    (foreign now) stay until that withdrawal has waited out the claims' lifetime and the clock skew, then go
    once the archive and the reactions node returned them."""
    nodes = fleet(tmp_path, {"archive": ARCHIVE, "reactions": REACTIONS, "both": NOTES + REACTIONS}, copies=2)
    both = nodes["both"]
    try:
        for node in nodes.values():
            await start(tmp_path, nodes, node)
        await _sharded(nodes, {(both.key.pubkey, "reactions"): "complete"})
        reactions = [ALICE.sign(kind=7, content=f"r{i}", created_at=int(time.time()) - 10) for i in range(3)]
        for reaction in reactions:
            await _publish(both.url, reaction)
        every = {r["id"] for r in reactions}
        for node in nodes.values():
            assert await eventually(lambda: _equal(ids(node.url, {"ids": list(every)}), every), timeout=20)
        await both.relay.stop()
        both.toml = both.toml.replace(REACTIONS, "")
        await start(tmp_path, nodes, both)
        assert await eventually(lambda: _has(claim_statuses(nodes["archive"].url),
                                             {(both.key.pubkey, "reactions"): "leaving"}), timeout=20)
        await asyncio.sleep(2)  # within claim_ttl_seconds + max_clock_skew_seconds (5 s) of the withdrawal
        assert await ids(both.url, {"ids": list(every)}) == every
        assert await eventually(lambda: _equal(ids(both.url, {"ids": list(every)}), set()), timeout=30)
    finally:
        await _stop(nodes)


async def test_max_events_removes_a_shards_oldest_events_only_once_confirmed(tmp_path):
    """`[retention] max_events = 5` on a node holding kind 1 beside an archive (min_copies 1), with 5 notes and
    the 2 claims (never removed): its 2 oldest notes go once the archive returned them, through the guard."""
    nodes = fleet(tmp_path, {"archive": ARCHIVE, "notes": NOTES + "[retention]\nmax_events = 5\n"}, copies=1)
    notes_node = nodes["notes"]
    try:
        for node in nodes.values():
            await start(tmp_path, nodes, node)
        await _sharded(nodes, {(notes_node.key.pubkey, "notes"): "complete"})
        now = int(time.time())
        notes = [ALICE.sign(kind=1, content=f"n{i}", created_at=now - 100 + i) for i in range(5)]
        for note in notes:
            await _publish(notes_node.url, note)
        every = {n["id"] for n in notes}
        assert await eventually(lambda: _equal(ids(nodes["archive"].url, {"ids": list(every)}), every), timeout=20)
        newest = {n["id"] for n in notes[2:]}
        assert await eventually(lambda: _equal(ids(notes_node.url, {"ids": list(every)}), newest), timeout=40)
    finally:
        await _stop(nodes)
