"""The one ingest path (relay/ingest/): which rules each source gets, the typed outcome, one signature pool."""

from __future__ import annotations

import sqlite3
import threading
import time

import orjson
import pytest
from structlog.testing import capture_logs

from relay.ingest import IMPORT, Ingest, Outcome, Source
from relay.ingest.outcome import (
    ACCEPTED,
    BAD_SIGNATURE,
    EPHEMERAL,
    EVICTED,
    EXPIRED,
    INTERNAL,
    NEWER_VERSION,
    RATE_LIMITED,
    from_store,
)
from relay.protocol.event import EventLimits
from relay.protocol.rejection import Rejection
from relay.protocol.rules import KindRules
from relay.store import batch
from relay.store.store import Store
from tests.conftest import make_config
from tests.helpers import Client, Keys, eventually
from tests.inprocess import Relay

NOW = int(time.time())
PEER = "ws://peer.example"
DENIED = 7  # the kind the ingest under test refuses ([auth] deny_kinds)
ALICE, BOB = Keys(0xA11CE), Keys(0xB0B)


@pytest.fixture
async def ingest(tmp_path):
    """An Ingest on a fresh store that denies kind 7; `ingest.live` appends to `ingest.fanned_out`."""
    store = await Store.open(tmp_path / "relay.db")
    fanned_out: list = []
    ingest = Ingest(store, EventLimits(), KindRules.of(deny=[DENIED]), 2, fanned_out.append)
    ingest.fanned_out = fanned_out
    yield ingest
    ingest.close()
    await store.close()


async def take(ingest: Ingest, source: Source, *objects, screen=None) -> list[Outcome]:
    """The outcome of each of `objects` taken from `source`."""
    return [outcome for outcome, _ in await ingest.accept_many(objects, source, screen)]


def evict(ingest: Ingest, event: dict) -> None:
    """Record `event`'s id in `evictions`, as retention does once it removed it (relay/store/retention.py)."""
    with sqlite3.connect(ingest.store.path) as conn:
        conn.execute("INSERT INTO evictions (id, created_at, evicted_at) VALUES (?, ?, ?)",
                     (bytes.fromhex(event["id"]), event["created_at"], NOW))


def origins(ingest: Ingest) -> dict[str, str]:
    """Stored event id -> origin."""
    with sqlite3.connect(ingest.store.path) as conn:
        return {i.hex(): origin for i, origin in conn.execute("SELECT id, origin FROM events")}


def only_alice(event) -> None:
    if event.pubkey != ALICE.pubkey:
        raise Rejection("restricted", "this pubkey may not publish here")


def test_an_outcome_renders_the_nip01_message():
    """`message` is "<prefix>: <reason>", or the bare reason; the writer's answers convert exactly."""
    assert Outcome(False, "blocked", "kind 7 is not accepted here").message == "blocked: kind 7 is not accepted here"
    assert (ACCEPTED.accepted, ACCEPTED.prefix, ACCEPTED.message) == (True, "", "")
    assert (NEWER_VERSION.accepted, NEWER_VERSION.prefix, NEWER_VERSION.reason) == (False, "duplicate",
                                                                                   "have a newer version")
    for answer in (batch.STORED, batch.DUPLICATE, batch.NEWER_VERSION, batch.DELETED, batch.VANISHED,
                   batch.EVICTED, (False, "error: the relay cannot store events now")):
        outcome = from_store(*answer)
        assert (outcome.accepted, outcome.message) == answer
    assert from_store(*batch.EVICTED) is EVICTED
    assert Outcome.parse(False, "nope: not a prefix") == Outcome(False, "", "nope: not a prefix")
    assert Outcome.refused(Rejection("invalid", "bad signature")) == BAD_SIGNATURE


async def test_a_client_gets_rate_kind_and_publish_rules(ingest):
    """A client: rate limit first, then event rules, the [auth] kinds, who may publish; ephemeral events are
    fanned out; an id retention evicted is stored again."""
    client = Source.client(only_alice, rate=lambda: True)
    old = ALICE.sign(content="evicted here", created_at=NOW - 100)
    evict(ingest, old)
    expired = BOB.sign(kind=DENIED, tags=[["expiration", str(NOW - 1)]])
    ephemeral = ALICE.sign(kind=20001)
    outcomes = await take(ingest, client, ALICE.sign(kind=DENIED), BOB.sign(kind=DENIED), BOB.sign(), expired,
                          ephemeral, old)
    assert [o.message for o in outcomes] == ["blocked: kind 7 is not accepted here"] * 2 + [
        "restricted: this pubkey may not publish here", "invalid: event has expired", "", ""]
    assert [e.id for e in ingest.fanned_out] == [ephemeral["id"]]
    assert origins(ingest) == {old["id"]: ""}
    assert await take(ingest, Source.client(rate=lambda: False), {"not": "parsed"}) == [RATE_LIMITED]


async def test_a_client_authenticated_as_a_peer_is_that_peer(ingest):
    """NIP-42 as a configured peer: no kind, publish or rate rule; its origin is the peer's URL."""
    note = ALICE.sign(kind=DENIED)
    assert await take(ingest, Source.client(peer=PEER), note, ALICE.sign(kind=20001)) == [ACCEPTED, ACCEPTED]
    assert origins(ingest) == {note["id"]: PEER}
    assert len(ingest.fanned_out) == 1


async def test_a_peer_gets_no_kind_rules_and_never_brings_back_an_evicted_id(ingest):
    """Sync: a denied kind is stored with the peer's origin, an evicted id refused (settled), an ephemeral event
    neither stored nor fanned out; the screen (what was asked for) comes before the event rules."""
    old = ALICE.sign(content="evicted here", created_at=NOW - 100)
    evict(ingest, old)
    note = ALICE.sign(kind=DENIED)
    forged = {**ALICE.sign(content="x"), "sig": ALICE.sign(content="y")["sig"]}
    assert await take(ingest, Source.peer(PEER), note, old, ALICE.sign(kind=20001), forged) == [
        ACCEPTED, EVICTED, EPHEMERAL, BAD_SIGNATURE]
    assert origins(ingest) == {note["id"]: PEER}
    assert ingest.fanned_out == []

    def asked_for_none(event) -> None:
        raise Rejection("invalid", "the peer sent an event that was not asked for")

    expired = ALICE.sign(tags=[["expiration", str(NOW - 1)]])
    assert await take(ingest, Source.peer(PEER), expired) == [EXPIRED]
    assert (await take(ingest, Source.peer(PEER), expired, screen=asked_for_none))[0].reason == (
        "the peer sent an event that was not asked for")


async def test_an_import_line_gets_the_kind_rules_and_no_publish_rule(ingest):
    """Import: JSON text in, [auth] kinds apply, anyone may publish, ephemeral lines are not stored, an evicted
    id is stored again (origin "")."""
    old = ALICE.sign(content="evicted here", created_at=NOW - 100)
    evict(ingest, old)
    lines = [orjson.dumps(e) for e in (BOB.sign(), BOB.sign(kind=DENIED), BOB.sign(kind=20001), old)] + [b"{oops"]
    outcomes = await take(ingest, IMPORT, *lines)
    assert outcomes[:4] == [ACCEPTED, Outcome(False, "blocked", "kind 7 is not accepted here"), EPHEMERAL, ACCEPTED]
    assert outcomes[4].prefix == "invalid"
    assert set(origins(ingest).values()) == {""}
    assert ingest.fanned_out == []


async def test_submit_answers_a_refusal_at_once_and_a_stored_event_after_its_commit(ingest):
    """`done` runs before `submit` returns for a refusal; for a valid event, once the writer committed it."""
    answers: list[Outcome] = []
    assert ingest.submit(ALICE.sign(kind=22242), IMPORT, answers.append) is None
    assert [o.prefix for o in answers] == ["invalid"]
    note = ALICE.sign()
    assert ingest.submit(note, IMPORT, answers.append).id == note["id"]
    assert len(answers) == 1
    assert await eventually(lambda: len(answers) == 2, 5.0)
    assert answers[1] == ACCEPTED and note["id"] in origins(ingest)


async def test_a_bug_while_taking_an_event_answers_error_internal_and_is_logged(ingest):
    """An unexpected exception is "error: internal" to the sender; the log has it with the event id."""
    def broken(event) -> None:
        raise RuntimeError("bug")

    note = ALICE.sign()
    with capture_logs() as logs:
        assert await take(ingest, Source.client(broken), note) == [INTERNAL]
    assert INTERNAL.message == "error: internal"
    assert [(e["event"], e["event_id"]) for e in logs if e["log_level"] == "error"] == [("event_failed", note["id"])]


def verify_threads() -> set[threading.Thread]:
    """The threads of this process that check signatures (named after their pool)."""
    return {t for t in threading.enumerate() if "verify" in t.name}


async def test_one_signature_pool_serves_clients_and_peers(tmp_path):
    """`relay serve` checks the signatures of a client's EVENTs and of events fetched by sync on one pool of
    `store.verify_threads` threads: the relay's ingest is the one its sync scheduler uses."""
    (tmp_path / "peer").mkdir()
    peer = Relay(make_config(tmp_path / "peer"))
    await peer.start()
    fetched = ALICE.sign(content="on the peer", created_at=NOW - 10)
    to_peer = await Client.connect(peer.url)
    assert (await to_peer.publish(fetched))[2] is True
    await to_peer.close()
    before = verify_threads()
    relay = Relay(make_config(tmp_path, store={"verify_threads": 2}, sync={
        "peers": [{"url": peer.url, "direction": "down"}], "secret_key_file": str(tmp_path / "node.key")}))
    await relay.start()
    try:
        assert [p.intake.ingest for p in relay.sync.peers] == [relay.ingest]
        client = await Client.connect(relay.url)
        assert (await client.publish(BOB.sign(content="from a client")))[2] is True
        await client.close()
        assert await eventually(lambda: fetched["id"] in origins(relay.ingest), 20.0)
        started = sorted(t.name for t in verify_threads() - before)
        assert 1 <= len(started) <= 2 and all(name.startswith("verify_") for name in started), started
    finally:
        await relay.stop()
        await peer.stop()
