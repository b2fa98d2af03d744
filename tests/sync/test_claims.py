"""Coverage claims (kind 30803, relay/sync/claims.py, relay/protocol/claims.py): what a node publishes for its
shards, the status it claims, a copied node key, and what `relay status` and `relay shards` show."""

from __future__ import annotations

import asyncio
import json
import re

import pytest
from structlog.testing import capture_logs

from relay.keys import NodeKey
from relay.config import fleet_pubkeys
from relay.protocol.claims import CLAIM_KIND, Claim, claim_tags, filter_covers, parse_claim
from relay.supervisor import Processes
from relay.sync.claims import copies, plan, publish_claims
from tests.conftest import make_config
from tests.helpers import Client, Keys, eventually
from tests.inprocess import running
from tests.served import http_get, relay_cli_async

SHARDS = """
[sharding]
claim_interval_seconds = 1
claim_ttl_seconds = 30
[[shards]]
id = "notes"
filter = {kinds = [1]}
[[shards]]
id = "reactions"
filter = {kinds = [7], "#t" = ["x"]}
hold = false
"""
OTHER = Keys(0xB0B)


async def _claims(url: str) -> dict[str, dict]:
    client = await Client.connect(url)
    try:
        return {e["tags"][0][1]: e for e in await client.req("claims", {"kinds": [CLAIM_KIND]})}
    finally:
        await client.close()


def _claim(event: dict) -> Claim:
    claim = parse_claim(event)
    assert claim is not None, event
    return claim


async def test_a_node_claims_each_of_its_shards_signed_with_its_node_key(tmp_path):
    """Alone in its fleet, a node claims its held shard `complete` up to the claim's own time, the shard it
    hands over `leaving`; each claim carries the shard's filter, the node's URL, the database's instance and a
    NIP-40 expiration `claim_ttl_seconds` after it.  A restart keeps the instance; claims are republished with
    a later created_at."""
    config = make_config(tmp_path, SHARDS)
    async with running(config) as relay:
        first = await eventually(lambda: _claims(relay.url))
        key, url = relay.node.records.node_key, relay.url
    notes, reactions = _claim(first["notes"]), _claim(first["reactions"])
    assert (notes.status, notes.filter, notes.since, notes.until) == ("complete", '{"kinds":[1]}', 0,
                                                                      notes.created_at)
    assert reactions.status == "leaving" and reactions.filter == '{"#t":["x"],"kinds":[7]}'
    assert notes.pubkey == key.pubkey and notes.url == url and len(notes.instance) == 32
    assert notes.expiration == notes.created_at + 30
    async with running(config) as relay:
        async def republished():
            claim = _claim((await _claims(relay.url))["notes"])
            return claim if claim.created_at > notes.created_at else None

        again = await eventually(republished, timeout=10)
    assert again and again.instance == notes.instance


def _other_claim(shard: str, filter_json: str, status: str, now: int, instance: str = "i" * 32,
                 url: str = "ws://127.0.0.1:9", key: Keys = OTHER) -> Claim:
    tags = claim_tags(shard, filter_json, url, instance, 0, now - 5, status, now + 60)
    return _claim(key.sign(kind=CLAIM_KIND, tags=tags, created_at=now - 1))


def test_a_node_joining_a_held_shard_builds_until_it_has_reconciled_with_every_holder(tmp_path):
    """Another fleet node holds the shard: `building` until a complete reconciliation with it (by the peer's
    URL), then `complete` up to that reconciliation's time; a claim of a key outside the fleet counts for
    nothing; a node already complete stays complete when a newcomer appears."""
    now = 1_800_000_000
    toml = SHARDS + f'[[sync.peers]]\nurl = "ws://127.0.0.1:9"\npubkey = "{OTHER.pubkey}"\n'
    config = make_config(tmp_path, toml)
    me = NodeKey(b"\x01" * 32)
    theirs = _other_claim("notes", '{"kinds":[1]}', "complete", now)
    building = plan(config, [theirs], me.pubkey, "m" * 32, {}, now).claims[0]
    assert (building.shard.id, building.status) == ("notes", "building")
    done = plan(config, [theirs], me.pubkey, "m" * 32, {"ws://127.0.0.1:9": now - 30}, now).claims[0]
    assert (done.status, done.until) == ("complete", now - 30)
    stranger = _other_claim("notes", '{"kinds":[1]}', "complete", now, key=Keys(0x5))  # not in the fleet
    alone = plan(config, [stranger], me.pubkey, "m" * 32, {}, now).claims[0]
    assert (alone.status, alone.until) == ("complete", now)
    mine = _claim(me.sign_event(CLAIM_KIND, claim_tags("notes", '{"kinds":[1]}', "ws://me", "m" * 32, 0, now - 9,
                                                       "complete", now + 60), "", now - 2))
    stays = plan(config, [mine, theirs], me.pubkey, "m" * 32, {}, now).claims[0]
    assert (stays.status, stays.until) == ("complete", now - 9)
    new_filter = plan(config, [theirs, _other_claim("notes", '{"kinds":[2]}', "complete", now)], me.pubkey,
                      "m" * 32, {}, now).claims[0]
    assert new_filter.status == "building"  # the other claim of another filter is another shard


@pytest.mark.parametrize(("outer", "inner", "covers"), [
    ("{}", '{"kinds":[1]}', True),
    ('{"kinds":[1,7]}', '{"kinds":[1]}', True),
    ('{"kinds":[1]}', '{"kinds":[1],"#t":["x"]}', True),
    ('{"kinds":[1],"#t":["x"]}', '{"kinds":[1]}', False),  # the outer one leaves out notes without the tag
    ('{"kinds":[1]}', '{"kinds":[1,7]}', False),
    ('{"authors":["aa"]}', '{"kinds":[1]}', False),
    ('{"kinds":[1]}', "{}", False),
    ("not json", "{}", False),
])
def test_a_filter_covers_another_when_it_matches_every_event_the_other_does(outer, inner, covers):
    """`filter_covers`: each field of the outer filter is in the inner one, with no value the outer lacks."""
    assert filter_covers(outer, inner) is covers


def test_an_archive_claim_counts_as_a_copy_of_every_shard_it_covers(tmp_path):
    """The copies of "notes" (kinds 1) are the other fleet nodes' claims on it and those of shards covering it
    (an archive's `{}`, kinds 1 and 7), complete first; a narrower filter, a building claim of another shard
    and a stranger's key count for nothing: the count the guard's removals rely on."""
    now = 1_800_000_000
    fleet_keys = [Keys(0xB0B), Keys(0xC0C), Keys(0xD0D), Keys(0xE0E)]
    toml = SHARDS + "".join(f'[[sync.peers]]\nurl = "ws://127.0.0.1:{9 + i}"\npubkey = "{k.pubkey}"\n'
                            for i, k in enumerate(fleet_keys))
    config = make_config(tmp_path, toml)
    notes = next(s for s in config.shards if s.id == "notes")
    claims = [_other_claim("all", "{}", "complete", now, key=fleet_keys[0]),
              _other_claim("notes", '{"kinds":[1]}', "building", now, key=fleet_keys[1]),
              _other_claim("social", '{"kinds":[1,7]}', "complete", now, key=fleet_keys[1]),
              _other_claim("tagged", '{"kinds":[1],"#t":["x"]}', "complete", now, key=fleet_keys[2]),
              _other_claim("later", "{}", "building", now, key=fleet_keys[3]),
              _other_claim("all", "{}", "complete", now, key=Keys(0x5))]
    found = copies(claims, notes, fleet_pubkeys(config), "", now)
    assert sorted((c.pubkey, c.shard_id, c.status) for c in found) == sorted(
        [(fleet_keys[0].pubkey, "all", "complete"), (fleet_keys[1].pubkey, "social", "complete")])


def test_a_claim_of_this_key_from_another_database_is_never_overwritten(tmp_path):
    """A stored claim of this node's key naming another instance (a copied key): that shard is left unclaimed
    (listed in `copied`), the others are claimed."""
    now = 1_800_000_000
    config = make_config(tmp_path, SHARDS)
    me = NodeKey(b"\x01" * 32)
    copy = _claim(me.sign_event(CLAIM_KIND, claim_tags("notes", '{"kinds":[1]}', "ws://copy", "c" * 32, 0, now,
                                                       "complete", now + 60), "", now - 1))
    found = plan(config, [copy], me.pubkey, "m" * 32, {}, now)
    assert found.copied == {"notes": "c" * 32} and [c.shard.id for c in found.claims] == ["reactions"]


@pytest.mark.single_process  # reads the writer's node key and publishes in the test's process
async def test_status_and_shards_show_the_fleet_claims_and_a_copied_key(tmp_path):
    """`relay status --json` lists each shard with this node's claim, the other nodes' and the copies they
    claim (under `min_copies`: under-replicated); `relay shards --json` lists every live claim, whether its
    key counts and whether it is this node's.  A claim of this key from another database shows as copied."""
    toml = SHARDS + f'[[sync.peers]]\nurl = "ws://127.0.0.1:9"\npubkey = "{OTHER.pubkey}"\n'
    config = make_config(tmp_path, toml)
    async with running(config) as relay:
        await eventually(lambda: _claims(relay.url))
        key = relay.node.records.node_key
        now = _claim((await _claims(relay.url))["notes"]).created_at
        client = await Client.connect(relay.url)
        theirs = OTHER.sign(kind=CLAIM_KIND, created_at=now, tags=claim_tags(
            "notes", '{"kinds":[1]}', "ws://127.0.0.1:9", "o" * 32, 0, now, "complete", now + 600))
        forged = key.sign_event(CLAIM_KIND, claim_tags("reactions", '{"#t":["x"],"kinds":[7]}', "ws://copy",
                                                       "c" * 32, 0, now, "leaving", now + 600), "", now + 5)
        assert [(await client.publish(e))[2] for e in (theirs, forged)] == [True, True]
        await client.close()
        plan_now = await publish_claims(config, relay.store, relay.node.ingest, key, relay.url)
        assert plan_now.copied == {"reactions": "c" * 32}
        code, out, err = await relay_cli_async("status", "--json", "--config", tmp_path / "relay.toml", "--db",
                                               config.store.path)
        assert code == 0, err
        shards = {s["id"]: s for s in json.loads(out)["shards"]}
        assert shards["notes"]["claim"]["status"] == "complete" and shards["notes"]["claimed_copies"] == 1
        assert [h["pubkey"] for h in shards["notes"]["holders"]] == [OTHER.pubkey]
        assert shards["notes"]["under_replicated"] and shards["reactions"]["copied_key"] == "c" * 32
        code, out, err = await relay_cli_async("shards", "--json", "--config", tmp_path / "relay.toml", "--db",
                                               config.store.path)
        assert code == 0, err
        rows = {(r["shard"], r["pubkey"], r["instance"]): r for r in json.loads(out)["claims"]}
        ours = rows[("notes", key.pubkey, shards["notes"]["claim"]["instance"])]
        assert ours["this_node"] and not ours["counted"]
        assert rows[("notes", OTHER.pubkey, "o" * 32)]["counted"]
        assert not rows[("reactions", key.pubkey, "c" * 32)]["this_node"]
        await relay.node.shards.publish()  # the figures of the metrics and the status page
        _, _, metrics = await asyncio.to_thread(http_get, relay.port, "/metrics")
        assert 'relay_shard_copies{shard="notes"} 1.0' in metrics.decode()
        assert 'relay_shard_held_back_events{shard="notes"} 0.0' in metrics.decode()
        _, _, page = await asyncio.to_thread(http_get, relay.port, "/", {"Accept": "text/html"})
        assert "<td>notes</td><td>complete</td>" in page.decode()
        assert "UNDER-REPLICATED: removals wait" in page.decode()


@pytest.mark.single_process  # reads the log of the relay in the test's process
async def test_a_peer_listed_without_pubkey_beside_shards_is_warned_of(tmp_path):
    """A `[[sync.peers]]` entry without `pubkey` on a node with `[[shards]]`: its claims can never count, said
    once at start, naming the peer; a peer with its pubkey is not named."""
    toml = SHARDS + f'[[sync.peers]]\nurl = "ws://127.0.0.1:9"\n[[sync.peers]]\nurl = "ws://127.0.0.1:8"\n' \
                    f'pubkey = "{OTHER.pubkey}"\n'
    with capture_logs() as logs:
        async with running(make_config(tmp_path, toml)):
            assert await eventually(lambda: _logged(logs, "shard_peer_without_pubkey"))
    assert [e["peer"] for e in logs if e["event"] == "shard_peer_without_pubkey"] == ["ws://127.0.0.1:9"]


async def _logged(logs: list[dict], event: str) -> bool:
    return any(e["event"] == event for e in logs)


async def test_the_writer_of_workers_claims_with_the_port_its_workers_share(tmp_path):
    """With worker processes on port 0 (no `public_url`), the claims name the port the kernel gave the workers,
    not port 0."""
    processes = Processes(make_config(tmp_path, SHARDS), 1)
    assert await processes.start() is None
    try:
        assert processes.port != 0
        assert await eventually(lambda: _claims(processes.url))
        assert _claim((await _claims(processes.url))["notes"]).url == processes.url
    finally:
        await processes.stop()


_CLAIM_AGE = r'relay_shard_claim_age_seconds\{shard="notes"\} (-?[0-9.]+)'


async def test_the_claim_age_metric_is_read_at_each_scrape(tmp_path):
    """`relay_shard_claim_age_seconds` grows between two scrapes while no claim is published (every 60 s here):
    a stalled publication shows."""
    config = make_config(tmp_path, '[sharding]\nclaim_interval_seconds = 60\n[[shards]]\nid = "notes"\n'
                                   'filter = {kinds = [1]}\n')
    async with running(config) as relay:
        async def scraped() -> str:
            return (await asyncio.to_thread(http_get, relay.port, "/metrics"))[2].decode()

        assert await eventually(lambda: _has_claim(scraped()))
        first = _claim_age(await scraped())
        await asyncio.sleep(1.5)
        assert _claim_age(await scraped()) - first >= 1.4


async def _has_claim(page) -> bool:
    age = re.search(_CLAIM_AGE, await page)
    return age is not None and float(age.group(1)) >= 0


def _claim_age(metrics: str) -> float:
    """`relay_shard_claim_age_seconds` of shard "notes" in a /metrics page."""
    age = re.search(_CLAIM_AGE, metrics)
    assert age is not None, metrics
    return float(age.group(1))


def test_a_shard_no_longer_declared_is_withdrawn_by_one_leaving_claim(tmp_path):
    """A live claim of this node on a shard the configuration no longer declares is answered by one `leaving`
    claim of the same filter and range (no kind 5: it would outlive a later claim); once that is stored, it is
    left to expire."""
    now = 1_800_000_000
    config = make_config(tmp_path, SHARDS)
    me = NodeKey(b"\x01" * 32)

    def ours(status: str) -> Claim:
        tags = claim_tags("old", '{"kinds":[9]}', "ws://me", "m" * 32, 5, now - 9, status, now + 60)
        return _claim(me.sign_event(CLAIM_KIND, tags, "", now - 2))

    found = plan(config, [ours("complete")], me.pubkey, "m" * 32, {}, now)
    [old] = [c for c in found.claims if c.shard.id == "old"]
    assert (old.status, old.shard.filter, old.since, old.until) == ("leaving", '{"kinds":[9]}', 5, now - 9)
    assert [c.shard.id for c in plan(config, [ours("leaving")], me.pubkey, "m" * 32, {}, now).claims] == \
        ["notes", "reactions"]
