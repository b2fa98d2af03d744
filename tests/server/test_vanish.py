"""NIP-62 requests to vanish through a real relay: what goes, what stays, what is refused afterwards."""

from __future__ import annotations

import sqlite3
import time

from tests.helpers import Keys
from tests.served import nip11
from tests.store import retention_common
from tests.store.retention_common import assert_consistent, publish_all, stored_ids

NOW = int(time.time())
URL = "wss://relay.example.com"


def running(tmp_path, relay_url: str = URL):
    """(relay, client) with `[server] public_url`; no private kinds, so the client's REQs see the gift wraps."""
    return retention_common.running(tmp_path, server={"public_url": relay_url}, auth={"private_kinds": []})


def history(alice: Keys, bob: Keys, carol: Keys, at: int) -> tuple[list[dict], list[dict]]:
    """(events a request to vanish of alice at `at` covers, events it leaves), all created before it or after."""
    note = alice.sign(1, "note", [["t", "x"]], created_at=at - 100)
    covered = [note, alice.sign(0, '{"name":"alice"}', created_at=at - 50),
               alice.sign(3, "", [["p", bob.pubkey]], created_at=at - 40),
               alice.sign(30023, "text", [["d", "post"], ["title", "T"]], created_at=at - 30),
               alice.sign(5, "", [["e", "ab" * 32]], created_at=at - 20),  # NIP-62: deletions go too
               alice.sign(1, "same second", created_at=at),
               bob.sign(1059, "wrapped", [["p", alice.pubkey]], created_at=at - 7200)]  # NIP-59 gift wrap to alice
    kept = [alice.sign(1, "after", created_at=at + 1),
            bob.sign(1059, "wrapped", [["p", carol.pubkey]], created_at=at - 7200),
            bob.sign(1, "reply", [["p", alice.pubkey], ["e", note["id"]]], created_at=at - 10),
            bob.sign(0, '{"name":"bob"}', created_at=at - 10)]
    return covered, kept


async def test_request_naming_this_relay_deletes_the_authors_events_and_gift_wraps(tmp_path, alice, bob):
    """Alice's events up to the request and gift wraps to her go; the request, later events and others stay."""
    carol = Keys(0xCA401)
    async with running(tmp_path) as (relay, client):
        covered, kept = history(alice, bob, carol, NOW - 60)
        await publish_all(client, covered + kept)
        request = alice.sign(62, "gone", [["relay", "wss://Relay.Example.com:443/"]], created_at=NOW - 60)

        assert await client.publish(request) == ["OK", request["id"], True, ""]

        assert await stored_ids(client) == {e["id"] for e in kept} | {request["id"]}
        assert_consistent(relay.config.store.path, relay.config)
        conn = sqlite3.connect(relay.config.store.path)
        try:
            assert conn.execute("SELECT pubkey FROM profiles").fetchall() == [(bob.pubkey,)]
            assert conn.execute("SELECT count(*) FROM articles").fetchone()[0] == 0
        finally:
            conn.close()


async def test_vanished_events_are_refused_with_blocked(tmp_path, alice, bob):
    """After the request: its covered events, older new ones and gift wraps to alice get `blocked:`;
    a deletion of the request has no effect; newer events are stored."""
    carol = Keys(0xCA401)
    async with running(tmp_path) as (relay, client):
        covered, kept = history(alice, bob, carol, NOW - 60)
        await publish_all(client, covered + kept)
        request = alice.sign(62, "", [["relay", URL]], created_at=NOW - 60)
        await publish_all(client, [request])

        late = [alice.sign(1, "older, never seen", created_at=NOW - 1000),
                bob.sign(1059, "late wrap", [["p", alice.pubkey]], created_at=NOW - 3600)]
        for event in covered + late:
            reply = await client.publish(event)
            assert reply[2] is False and reply[3].startswith("blocked:"), reply
        newer = [alice.sign(5, "", [["e", request["id"]]], created_at=NOW), alice.sign(1, "back", created_at=NOW)]
        await publish_all(client, newer)

        assert await stored_ids(client) == {e["id"] for e in kept + newer} | {request["id"]}
        assert_consistent(relay.config.store.path, relay.config)


async def test_events_in_the_same_batch_as_the_request_are_settled_in_arrival_order(tmp_path, alice, bob):
    """Sent without waiting (one writer batch): covered events before the request are accepted then removed,
    those after it are refused."""
    async with running(tmp_path) as (relay, client):
        before = [alice.sign(1, f"b{i}", created_at=NOW - 100 + i) for i in range(3)]
        request = alice.sign(62, "", [["relay", "ALL_RELAYS"]], created_at=NOW - 50)
        after = [alice.sign(1, f"a{i}", created_at=NOW - 90 + i) for i in range(3)]
        for event in before + [request] + after:
            await client.send(["EVENT", event])
        replies = {}
        while len(replies) < 7:
            reply = await client.recv()
            replies[reply[1]] = reply
        assert all(replies[e["id"]][2] for e in before + [request])
        assert not any(replies[e["id"]][2] for e in after)
        assert await stored_ids(client) == {request["id"]}
        assert_consistent(relay.config.store.path, relay.config)


async def test_request_for_another_relay_is_stored_and_deletes_nothing(tmp_path, alice, bob):
    """A `relay` tag naming another relay: the kind 62 is stored (it propagates), nothing else changes."""
    async with running(tmp_path) as (relay, client):
        covered, kept = history(alice, bob, Keys(0xCA401), NOW - 60)
        await publish_all(client, covered + kept)
        request = alice.sign(62, "", [["relay", "wss://other.example.com"]], created_at=NOW - 60)
        await publish_all(client, [request])
        assert await stored_ids(client) == {e["id"] for e in covered + kept} | {request["id"]}


async def test_all_relays_is_honoured_without_a_configured_url(tmp_path, alice, bob):
    """`ALL_RELAYS` needs no `relay_url`; NIP-11 lists 62."""
    async with running(tmp_path, relay_url="") as (relay, client):
        covered, kept = history(alice, bob, Keys(0xCA401), NOW - 60)
        await publish_all(client, covered + kept)
        request = alice.sign(62, "", [["relay", "ALL_RELAYS"]], created_at=NOW - 60)
        await publish_all(client, [request])
        assert await stored_ids(client) == {e["id"] for e in kept} | {request["id"]}
        assert 62 in (await nip11(relay))["supported_nips"]

