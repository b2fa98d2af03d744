"""NIP-70 protected events (`["-"]` tag): only their authenticated author may publish them; reposts of them are
refused; peers follow the rule unless their entry says `nip70_events = true`; `relay import` takes them."""

from __future__ import annotations

import json
import time

from relay.commands.sync import sync_once
from relay.sync.scheduler import sync_options
from tests.helpers import Client, Keys, import_into
from tests.served import nip11
from tests.server.test_auth import authenticate, connect
from tests.sync.conftest import local_config, stored

NOW = int(time.time())


def protected(keys: Keys, content: str = "only from me") -> dict:
    return keys.sign(content=content, tags=[["-"], ["t", "nip70"]])


async def test_a_protected_event_needs_its_authors_auth(relay, alice: Keys, bob: Keys):
    """Not authenticated: auth-required: (and the challenge); as bob: restricted:; as alice: stored and broadcast,
    and the refused ones reached neither the store nor a live subscriber."""
    watcher = await Client.connect(relay.url)
    assert await watcher.req("live", {"#t": ["nip70"]}) == []
    client = await connect(relay)
    first, second, third = protected(alice, "1"), protected(alice, "2"), protected(alice, "3")
    reply = await client.publish(first)
    assert reply[2] is False and reply[3].startswith("auth-required: ")
    assert (await authenticate(client, bob, relay.url))[2] is True
    reply = await client.publish(second)
    assert reply[2] is False and reply[3].startswith("restricted: ")
    assert (await authenticate(client, alice, relay.url))[2] is True
    assert (await client.publish(third))[2:] == [True, ""]
    live = await watcher.recv()
    assert live[0] == "EVENT" and live[2]["id"] == third["id"]
    assert [e["id"] for e in await watcher.req("stored", {"#t": ["nip70"]})] == [third["id"]]


async def test_an_unprotected_event_needs_no_auth(relay, alice: Keys):
    """The rule is the `["-"]` tag alone: a `["-", "x"]` tag or none at all changes nothing."""
    client = await Client.connect(relay.url)
    assert (await client.publish(alice.sign(content="open")))[2] is True
    assert (await client.publish(alice.sign(content="two", tags=[["-", "x"]])))[2] is True


async def test_reposts_embedding_a_protected_event_are_refused(relay, alice: Keys):
    """Kinds 6 and 16 whose content is a protected event: blocked:, even from its authenticated author; a repost
    of an unprotected event is stored."""
    client = await connect(relay)
    assert (await authenticate(client, alice, relay.url))[2] is True
    inner = protected(alice)
    for kind in (6, 16):
        repost = alice.sign(kind=kind, content=json.dumps(inner), tags=[["e", inner["id"]], ["k", "1"]])
        reply = await client.publish(repost)
        assert reply[2] is False and reply[3] == "blocked: a repost of a protected event (NIP-70)"
    plain = alice.sign(content="anyone may repost me")
    assert (await client.publish(alice.sign(kind=6, content=json.dumps(plain), tags=[["e", plain["id"]]])))[2]


async def test_nip11_lists_70(relay):
    assert 70 in (await nip11(relay))["supported_nips"]


async def test_import_takes_protected_events(relay, alice: Keys):
    """A file is the operator's own data: `relay import` stores a protected event without any AUTH."""
    report = await import_into(relay.store, [json.dumps(protected(alice)).encode()])
    assert report.stored == 1


async def test_peers_follow_the_rule_unless_their_entry_says_nip70_events(tmp_path, relay, alice: Keys):
    """Fetched from a peer: refused (settled, not an error); with `nip70_events = true` on its entry: stored."""
    client = await connect(relay)
    await authenticate(client, alice, relay.url)
    event = protected(alice)
    assert (await client.publish(event))[2] is True

    strict = local_config(tmp_path, "strict")
    report = await sync_once(strict, relay.url, {}, sync_options(strict, "down"))
    assert (report.fetched, sum(report.settled.values()), dict(report.errors)) == (0, 1, {})
    assert stored(strict) == {}

    trusting = local_config(tmp_path, "trusting", sync={"peers": [{"url": relay.url, "nip70_events": True}]})
    report = await sync_once(trusting, relay.url, {}, sync_options(trusting, "down"))
    assert report.fetched == 1 and stored(trusting) == {event["id"]: relay.url}
