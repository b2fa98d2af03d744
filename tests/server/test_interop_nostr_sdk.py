"""Interoperability: the independent rust-nostr client (`nostr-sdk` Python bindings) against the real relay.

Everything goes over a real WebSocket to the in-process relay of the `relay`
fixture; nostr-sdk builds, signs and verifies events itself (its own NIP-01
serialisation), so a disagreement on ids, signatures, JSON escaping or
message framing shows up here.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from datetime import timedelta

import nostr_sdk as sdk
import pytest

from relay.config import AuthConfig
from tests.helpers import REAL_EVENTS, Client, Keys

TIMEOUT = timedelta(seconds=5)
NOW = int(time.time())


# --- helpers -------------------------------------------------------------------------------------------


@pytest.fixture
async def connect(relay):
    """A factory of nostr-sdk clients connected to `relay` (verifying events against filters); shut down after."""
    clients: list[sdk.Client] = []

    async def make() -> sdk.Client:
        client = sdk.ClientBuilder().verify_subscriptions(True).build()
        clients.append(client)
        url = sdk.RelayUrl.parse(relay.url)
        assert await client.add_relay(url)
        await client.connect(TIMEOUT)
        assert (await client.relay(url)).status() == sdk.RelayStatus.CONNECTED
        return client

    yield make
    for client in clients:
        await client.shutdown()


def sdk_keys(secret: int) -> sdk.Keys:
    """nostr-sdk keys for the same secret as `tests.helpers.Keys(secret)`."""
    return sdk.Keys.parse(f"{secret:064x}")


def note(keys: sdk.Keys, content: str, kind: int = 1, created_at: int | None = None,
         tags: list[list[str]] | None = None) -> sdk.Event:
    """An event built and signed by nostr-sdk."""
    builder = sdk.EventBuilder(sdk.Kind(kind), content)
    if tags:
        builder = builder.tags([sdk.Tag.parse(t) for t in tags])
    if created_at is not None:
        builder = builder.custom_created_at(sdk.Timestamp.from_secs(created_at))
    return builder.finalize(keys)


async def fetch(client: sdk.Client, *filters: sdk.Filter) -> list[sdk.Event]:
    """Stored events matching `filters`, as nostr-sdk returns them after EOSE."""
    return await client.fetch_events(sdk.ReqTarget.auto(list(filters)), TIMEOUT)


def ids(events) -> set[str]:
    return {e.id().to_hex() for e in events}


def accepted(output: sdk.SendEventOutput, relay) -> bool:
    """True when nostr-sdk reports the relay's OK as success (and no failure)."""
    urls = [str(u).rstrip("/") for u in output.success]
    assert len(urls) + len(output.failed) == 1, output
    assert urls in ([], [relay.url]), output
    return bool(urls)


def failure(output: sdk.SendEventOutput) -> str:
    """The relay's OK false message, as nostr-sdk reports it (the only failed relay)."""
    assert output.success == [], output
    assert len(output.failed) == 1, output
    return next(iter(output.failed.values()))


# --- publishing: OK true / OK false as nostr-sdk reports them -------------------------------------------


async def test_text_note_is_accepted_and_read_back_verbatim(relay, connect):
    """A nostr-sdk text note gets success, and another nostr-sdk client reads back the identical, verified event."""
    writer, reader = await connect(), await connect()
    keys = sdk.Keys.generate()
    event = note(keys, "hello from rust-nostr", tags=[["t", "interop"]])
    output = await writer.send_event(event)
    assert accepted(output, relay)
    assert output.id.to_hex() == event.id().to_hex()
    got = await fetch(reader, sdk.Filter().id(event.id()))
    assert len(got) == 1
    assert got[0].verify()
    assert json.loads(got[0].as_json()) == json.loads(event.as_json())


async def test_resending_an_event_is_reported_as_success(relay, connect):
    """Sending the same event twice succeeds both times (NIP-01 "duplicate:" is OK true) and it is stored once."""
    client = await connect()
    keys = sdk.Keys.generate()
    event = note(keys, "twice")
    assert accepted(await client.send_event(event), relay)
    assert accepted(await client.send_event(event), relay)
    got = await fetch(client, sdk.Filter().author(keys.public_key()))
    assert [e.id().to_hex() for e in got] == [event.id().to_hex()]


async def test_metadata_is_replaced_by_a_newer_version(relay, connect):
    """Kind 0: a newer version replaces the older one, and re-sending the older one fails with "duplicate:"."""
    writer, reader = await connect(), await connect()
    keys = sdk.Keys.generate()
    old = (sdk.Metadata.from_json(json.dumps({"name": "old"})).into_event_builder()
           .custom_created_at(sdk.Timestamp.from_secs(NOW - 100)).finalize(keys))
    new = (sdk.Metadata.from_json(json.dumps({"name": "new"})).into_event_builder()
           .custom_created_at(sdk.Timestamp.from_secs(NOW - 50)).finalize(keys))
    assert old.kind().as_u16() == 0
    assert accepted(await writer.send_event(old), relay)
    assert ids(await fetch(reader, sdk.Filter().author(keys.public_key()).kind(sdk.Kind(0)))) == ids([old])
    assert accepted(await writer.send_event(new), relay)
    got = await fetch(reader, sdk.Filter().author(keys.public_key()).kind(sdk.Kind(0)))
    assert ids(got) == ids([new])
    assert sdk.Metadata.from_json(got[0].content()).as_record().name == "new"
    assert failure(await writer.send_event(old)).startswith("duplicate:")
    assert ids(await fetch(reader, sdk.Filter().author(keys.public_key()))) == ids([new])


async def test_older_metadata_sent_after_newer_is_refused(relay, connect):
    """Kind 0 sent newest first: the older version fails with "duplicate:" and is never stored."""
    client = await connect()
    keys = sdk.Keys.generate()
    newer = note(keys, json.dumps({"name": "newer"}), kind=0, created_at=NOW - 10)
    older = note(keys, json.dumps({"name": "older"}), kind=0, created_at=NOW - 20)
    assert accepted(await client.send_event(newer), relay)
    assert failure(await client.send_event(older)).startswith("duplicate:")
    assert ids(await fetch(client, sdk.Filter().ids([older.id(), newer.id()]))) == ids([newer])


@pytest.mark.parametrize("lower_first", [True, False])
async def test_replaceable_tie_keeps_the_lowest_id(relay, connect, lower_first):
    """Two kind 0 versions with the same created_at: the one with the lowest id survives, whichever arrives first."""
    client = await connect()
    keys = sdk.Keys.generate()
    pair = [note(keys, json.dumps({"name": f"v{i}"}), kind=0, created_at=NOW - 5) for i in range(2)]
    low, high = sorted(pair, key=lambda e: e.id().to_hex())
    first, second = (low, high) if lower_first else (high, low)
    assert accepted(await client.send_event(first), relay)
    second_output = await client.send_event(second)
    if lower_first:
        assert failure(second_output).startswith("duplicate:")
    else:
        assert accepted(second_output, relay)
    assert ids(await fetch(client, sdk.Filter().author(keys.public_key()))) == ids([low])


async def test_addressable_events_are_replaced_per_d_tag_and_deleted_by_coordinate(relay, connect):
    """Kind 30023: versions replace each other per `d` tag only; a kind 5 `a` tag (nostr-sdk Coordinate) deletes one address."""
    writer, reader = await connect(), await connect()
    keys = sdk.Keys.generate()
    a1 = note(keys, "a v1", kind=30023, created_at=NOW - 40, tags=[["d", "a"]])
    b1 = note(keys, "b v1", kind=30023, created_at=NOW - 39, tags=[["d", "b"]])
    a2 = note(keys, "a v2", kind=30023, created_at=NOW - 30, tags=[["d", "a"]])
    for event in (a1, b1, a2):
        assert accepted(await writer.send_event(event), relay)
    mine = sdk.Filter().author(keys.public_key()).kind(sdk.Kind(30023))
    assert ids(await fetch(reader, mine)) == ids([a2, b1])
    coordinate = sdk.Coordinate(sdk.Kind(30023), keys.public_key(), "a")
    assert ids(await fetch(reader, sdk.Filter().coordinate(coordinate))) == set()  # nothing *references* it yet
    assert ids(await fetch(reader, mine.identifier("a"))) == ids([a2])
    deletion = (sdk.EventBuilder(sdk.Kind(5), "").tags([sdk.Tag.coordinate(coordinate)])
                .custom_created_at(sdk.Timestamp.from_secs(NOW - 20)).finalize(keys))
    assert accepted(await writer.send_event(deletion), relay)
    assert ids(await fetch(reader, mine)) == ids([b1])
    assert ids(await fetch(reader, sdk.Filter().coordinate(coordinate))) == ids([deletion])
    # A version no newer than the deletion stays deleted; a newer one is a new version of the address.
    assert failure(await writer.send_event(a2)).startswith(("blocked:", "duplicate:"))
    a3 = note(keys, "a v3", kind=30023, created_at=NOW - 10, tags=[["d", "a"]])
    assert accepted(await writer.send_event(a3), relay)
    assert ids(await fetch(reader, mine)) == ids([a3, b1])


async def test_deletion_request_removes_the_event_and_blocks_it(relay, connect):
    """Kind 5 by the author removes the named event (not others); re-sending it fails "blocked:"; the kind 5 is stored."""
    writer, reader = await connect(), await connect()
    keys = sdk.Keys.generate()
    doomed, kept = note(keys, "doomed", created_at=NOW - 30), note(keys, "kept", created_at=NOW - 20)
    for event in (doomed, kept):
        assert accepted(await writer.send_event(event), relay)
    deletion = (sdk.EventBuilder(sdk.Kind(5), "mistake").tags([sdk.Tag.event(doomed.id())])
                .custom_created_at(sdk.Timestamp.from_secs(NOW - 10)).finalize(keys))
    assert accepted(await writer.send_event(deletion), relay)
    assert ids(await fetch(reader, sdk.Filter().author(keys.public_key()).kind(sdk.Kind(1)))) == ids([kept])
    assert ids(await fetch(reader, sdk.Filter().kind(sdk.Kind(5)).event(doomed.id()))) == ids([deletion])
    assert failure(await writer.send_event(doomed)).startswith("blocked:")
    assert ids(await fetch(reader, sdk.Filter().ids([doomed.id()]))) == set()


async def test_deletion_request_by_another_key_has_no_effect(relay, connect):
    """A kind 5 naming someone else's event is accepted but leaves that event in place."""
    client = await connect()
    author, stranger = sdk.Keys.generate(), sdk.Keys.generate()
    target = note(author, "mine")
    assert accepted(await client.send_event(target), relay)
    deletion = sdk.EventBuilder(sdk.Kind(5), "").tags([sdk.Tag.event(target.id())]).finalize(stranger)
    assert accepted(await client.send_event(deletion), relay)
    assert ids(await fetch(client, sdk.Filter().id(target.id()))) == ids([target])
    assert accepted(await client.send_event(target), relay)


@pytest.mark.parametrize("make, prefix", [
    (lambda k: note(k, "from the future", created_at=NOW + 3600), "invalid:"),
    (lambda k: sdk.EventBuilder(sdk.Kind(1), "expired")
     .tags([sdk.Tag.expiration(sdk.Timestamp.from_secs(NOW - 60))]).finalize(k), "invalid:"),
], ids=["created_at-too-far-ahead", "nip40-expired"])
async def test_refused_events_are_reported_as_failed(relay, connect, make, prefix):
    """Events the relay refuses come back in nostr-sdk's `failed` map with the relay's machine-readable prefix."""
    client = await connect()
    keys = sdk.Keys.generate()
    event = make(keys)
    assert failure(await client.send_event(event)).startswith(prefix)
    assert ids(await fetch(client, sdk.Filter().author(keys.public_key()))) == set()


async def test_special_characters_survive_the_round_trip(relay, connect):
    """Control characters, U+2028/9, quotes, backslashes and astral emoji: nostr-sdk's id is accepted and content round-trips."""
    writer, reader = await connect(), await connect()
    keys = sdk.Keys.generate()
    content = ("".join(chr(i) for i in range(0x20)) + "\x7f\u2028\u2029 \"q\" \\ / </script> é 日本 🎉 \U0001F600")
    tags = [["t", "ü🎉"], ["x", "a\nb\x00c\\"], ["empty"]]
    event = note(keys, content, tags=tags)
    assert accepted(await writer.send_event(event), relay)
    got = await fetch(reader, sdk.Filter().id(event.id()))
    assert len(got) == 1 and got[0].verify()
    assert got[0].content() == content
    assert [t.to_vec() for t in got[0].tags()] == tags
    raw = await Client.connect(relay.url)
    try:
        [stored] = await raw.req("raw", {"ids": [event.id().to_hex()]})
    finally:
        await raw.close()
    assert stored["content"] == content and stored["tags"] == tags


# --- queries with nostr-sdk filters ---------------------------------------------------------------------


class Corpus:
    """A fixed, hand-built set of events from two authors with known timestamps and tags."""

    def __init__(self) -> None:
        self.alice, self.bob = sdk_keys(0xA11CE), sdk_keys(0xB0B)
        a, b = self.alice, self.bob
        t0 = NOW - 1000
        self.root = note(a, "root", created_at=t0)
        self.reply = note(b, "reply", created_at=t0 + 10,
                          tags=[["e", self.root.id().to_hex()], ["p", a.public_key().to_hex()]])
        self.reaction = note(b, "+", kind=7, created_at=t0 + 20,
                             tags=[["e", self.root.id().to_hex()], ["p", a.public_key().to_hex()]])
        self.mention = note(a, "hi bob", created_at=t0 + 30, tags=[["p", b.public_key().to_hex()], ["t", "nostr"]])
        self.later = note(a, "later", created_at=t0 + 40, tags=[["t", "nostr"], ["t", "python"]])
        self.article = note(b, "# long", kind=30023, created_at=t0 + 50, tags=[["d", "post-1"], ["t", "python"]])
        self.all = [self.root, self.reply, self.reaction, self.mention, self.later, self.article]


def _filters(c: Corpus):
    """(name, nostr-sdk filter, expected events) cases over the corpus."""
    a_pk, b_pk = c.alice.public_key(), c.bob.public_key()
    t0 = c.root.created_at().as_secs()
    return [
        ("author", sdk.Filter().author(a_pk), [c.root, c.mention, c.later]),
        ("authors", sdk.Filter().authors([a_pk, b_pk]), c.all),
        ("kind", sdk.Filter().kind(sdk.Kind(7)), [c.reaction]),
        ("kinds+author", sdk.Filter().kinds([sdk.Kind(1), sdk.Kind(30023)]).author(b_pk), [c.reply, c.article]),
        ("id", sdk.Filter().id(c.mention.id()), [c.mention]),
        ("ids", sdk.Filter().ids([c.root.id(), c.article.id()]), [c.root, c.article]),
        ("#e", sdk.Filter().event(c.root.id()), [c.reply, c.reaction]),
        ("#e+kind", sdk.Filter().event(c.root.id()).kind(sdk.Kind(1)), [c.reply]),
        ("#p alice", sdk.Filter().pubkey(a_pk), [c.reply, c.reaction]),
        ("#p bob", sdk.Filter().pubkey(b_pk), [c.mention]),
        ("#t", sdk.Filter().hashtag("python"), [c.later, c.article]),
        ("#t any", sdk.Filter().hashtags(["nostr", "python"]), [c.mention, c.later, c.article]),
        ("#d", sdk.Filter().identifier("post-1"), [c.article]),
        ("since", sdk.Filter().authors([a_pk, b_pk]).since(sdk.Timestamp.from_secs(t0 + 30)),
         [c.mention, c.later, c.article]),
        ("until", sdk.Filter().authors([a_pk, b_pk]).until(sdk.Timestamp.from_secs(t0 + 10)), [c.root, c.reply]),
        ("since+until", sdk.Filter().authors([a_pk, b_pk]).since(sdk.Timestamp.from_secs(t0 + 10))
         .until(sdk.Timestamp.from_secs(t0 + 30)), [c.reply, c.reaction, c.mention]),
        ("limit newest", sdk.Filter().authors([a_pk, b_pk]).limit(2), [c.later, c.article]),
        ("limit+author", sdk.Filter().author(a_pk).limit(1), [c.later]),
        ("limit 0", sdk.Filter().authors([a_pk, b_pk]).limit(0), []),
        ("no match", sdk.Filter().author(a_pk).kind(sdk.Kind(7)), []),
    ]


FILTER_NAMES = [name for name, _, _ in _filters(Corpus())]


@pytest.fixture
async def corpus(relay, connect) -> Corpus:
    """The corpus, published through nostr-sdk (every event accepted)."""
    c = Corpus()
    writer = await connect()
    for event in c.all:
        assert accepted(await writer.send_event(event), relay), event.as_json()
    return c


@pytest.mark.parametrize("name", FILTER_NAMES)
async def test_filter_returns_exactly_the_expected_events(corpus, connect, name):
    """Each nostr-sdk filter (author, kind, id, #e, #p, #t, #d, since/until, limit) returns exactly the expected events."""
    reader = await connect()
    [(f, expected)] = [(f, e) for n, f, e in _filters(corpus) if n == name]
    got = await fetch(reader, f)
    assert ids(got) == ids(expected), f.as_json()
    assert len(got) == len(expected)  # no duplicates
    assert all(e.verify() for e in got)
    # Cross-check the hand-written expectation with nostr-sdk's own matcher (limit aside).
    if "limit" not in name:
        assert ids(e for e in corpus.all if f.match_event(e)) == ids(expected)


async def test_several_filters_in_one_request_are_a_union(corpus, connect):
    """Two filters in one REQ return the union of their matches, each event once."""
    reader = await connect()
    got = await fetch(reader, sdk.Filter().kind(sdk.Kind(7)), sdk.Filter().event(corpus.root.id()))
    assert ids(got) == ids([corpus.reaction, corpus.reply])
    assert len(got) == 2


async def test_count_through_nostr_sdk(corpus, relay, connect):
    """NIP-45 COUNT through nostr-sdk's `Relay.count_events` equals the number of matching events."""
    client = await connect()
    relay_handle = await client.relay(sdk.RelayUrl.parse(relay.url))
    assert await relay_handle.count_events(sdk.Filter().author(corpus.alice.public_key()), TIMEOUT) == 3
    assert await relay_handle.count_events(sdk.Filter().event(corpus.root.id()), TIMEOUT) == 2
    assert await relay_handle.count_events(sdk.Filter().kind(sdk.Kind(9999)), TIMEOUT) == 0


# --- live subscriptions ---------------------------------------------------------------------------------


async def _subscribe_until_eose(client: sdk.Client, f: sdk.Filter):
    """Open a long-lived subscription; return (notification stream, sub id) once its EOSE has arrived."""
    stream = client.notifications()
    output = await client.subscribe(sdk.ReqTarget.auto([f]))
    assert len(output.success) == 1 and not output.failed, output
    while True:
        item = await asyncio.wait_for(stream.next(), 5)
        assert item is not None
        if item.is_message():
            message = item.message.as_enum()
            if message.is_end_of_stored_events() and message.subscription_id == output.id:
                return stream, output.id
            assert not message.is_closed(), message


async def _next_new_event(stream) -> sdk.ClientNotification:
    while True:
        item = await asyncio.wait_for(stream.next(), 5)
        assert item is not None, "notification stream ended"
        if item.is_new_event():
            return item


async def test_live_subscription_gets_event_from_another_sdk_client(relay, connect):
    """A nostr-sdk subscription receives, after EOSE, a matching event another nostr-sdk client publishes; not a non-matching one."""
    listener, publisher = await connect(), await connect()
    keys = sdk.Keys.generate()
    stream, sub_id = await _subscribe_until_eose(listener, sdk.Filter().author(keys.public_key()).kind(sdk.Kind(1)))
    unrelated = note(keys, "a reaction", kind=7)
    wanted = note(keys, "live!")
    assert accepted(await publisher.send_event(unrelated), relay)
    assert accepted(await publisher.send_event(wanted), relay)
    item = await _next_new_event(stream)
    assert item.subscription_id == sub_id
    assert item.event.id().to_hex() == wanted.id().to_hex()
    assert item.event.verify()


async def test_live_subscription_gets_event_from_raw_client(relay, connect):
    """A nostr-sdk subscription on `#t` receives an event signed by the test helpers and published over a raw WebSocket."""
    listener = await connect()
    stream, sub_id = await _subscribe_until_eose(listener, sdk.Filter().hashtag("live-raw"))
    event = Keys(0xC0FFEE).sign(content="raw publisher", tags=[["t", "live-raw"]])
    raw = await Client.connect(relay.url)
    try:
        assert (await raw.publish(event))[2] is True
    finally:
        await raw.close()
    item = await _next_new_event(stream)
    assert item.subscription_id == sub_id
    assert json.loads(item.event.as_json()) == event
    assert item.event.verify()


# --- real events ------------------------------------------------------------------------------------------


def _regular_real_events(count: int) -> list[dict]:
    """The first `count` real events of regular kinds, neither deletions, nor private kinds (served only after
    NIP-42 AUTH), nor carrying an expiration tag."""
    chosen = []
    with REAL_EVENTS.open(encoding="utf-8") as f:
        for line in f:
            e = json.loads(line)
            k = e["kind"]
            regular = k in (1, 2) or 4 <= k < 45 or 1000 <= k < 10000
            if regular and k != 5 and k not in AuthConfig().private_kinds and not any(t and t[0] == "expiration" for t in e["tags"]):
                chosen.append(e)
                if len(chosen) == count:
                    break
    return chosen


async def test_real_events_imported_raw_are_fetched_and_verified_by_nostr_sdk(relay, connect):
    """300 real events published over a raw WebSocket come back through nostr-sdk (by ids and by authors) identical and verified."""
    events = _regular_real_events(300)
    assert len(events) == 300
    assert all(sdk.Event.from_json(json.dumps(e)).verify() for e in events)
    raw = await Client.connect(relay.url)
    try:
        for e in events:  # pipelined: all EVENTs, then all OKs
            await raw.send(["EVENT", e])
        oks = {}
        while len(oks) < len(events):
            reply = await raw.recv()
            assert reply[0] == "OK", reply
            oks[reply[1]] = (reply[2], reply[3])
    finally:
        await raw.close()
    assert {i: ok for i, ok in oks.items() if not ok[0]} == {}
    by_id = {e["id"]: e for e in events}
    assert set(oks) == set(by_id)

    reader = await connect()
    got = await fetch(reader, sdk.Filter().ids([sdk.EventId.parse(i) for i in by_id]))
    assert len(got) == len(events)
    assert ids(got) == set(by_id)
    for event in got:
        assert event.verify()
        assert json.loads(event.as_json()) == by_id[event.id().to_hex()]

    authors = sorted({e["pubkey"] for e in events})[:5]
    got = await fetch(reader, sdk.Filter().authors([sdk.PublicKey.parse(a) for a in authors]))
    assert ids(got) == {e["id"] for e in events if e["pubkey"] in authors}


async def test_real_events_published_through_nostr_sdk_are_accepted(relay, connect):
    """Real events parsed by nostr-sdk and sent with `send_event` are all accepted and then counted by COUNT."""
    events = _regular_real_events(120)[-60:]
    client = await connect()
    for e in events:
        output = await client.send_event(sdk.Event.from_json(json.dumps(e)))
        assert accepted(output, relay), (e["id"], output)
    relay_handle = await client.relay(sdk.RelayUrl.parse(relay.url))
    f = sdk.Filter().ids([sdk.EventId.parse(e["id"]) for e in events])
    assert await relay_handle.count_events(f, TIMEOUT) == len(events)


# --- NIP-11 -----------------------------------------------------------------------------------------------


async def test_nip11_document_parses_with_nostr_sdk(relay):
    """The NIP-11 document parses as nostr-sdk's RelayInformationDocument with the configured limits."""
    http_url = "http" + relay.url[len("ws"):] + "/"
    request = urllib.request.Request(http_url, headers={"Accept": "application/nostr+json"})
    body = await asyncio.to_thread(lambda: urllib.request.urlopen(request, timeout=5).read())
    doc = sdk.RelayInformationDocument.from_json(body.decode())
    assert {1, 11}.issubset(set(doc.supported_nips()))
    assert doc.name() == relay.config.info.name
    limits = doc.limitation()
    assert limits.max_limit == relay.config.limits.max_limit
    assert limits.default_limit == relay.config.limits.default_limit
    assert limits.max_message_length == relay.config.limits.max_message_bytes
    assert limits.max_subscriptions == relay.config.limits.max_subscriptions
    assert limits.auth_required is False
