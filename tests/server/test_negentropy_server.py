"""NIP-77 against the running relay: exact reconciliation, errors, session life, and nostr-sdk interop.

The client side is our own engine (`Negentropy` over a `SortedVector`, the
initiator) talking over a real WebSocket to the in-process relay, which
answers from the persisted index (the full set and `[negentropy] filters`)
or from a query (any other filter).  Expected have/need sets are computed
independently from the published events with `Filter.matches` and the
NIP-01 limit order (created_at descending, lowest id first).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import sqlite3
import time
from datetime import timedelta

import nostr_sdk as sdk
import pytest

from relay.config import ConfigError, load_config
from relay.protocol.event import EventLimits, parse_event
from relay.protocol.filters import parse_filter
from relay.protocol.negentropy import Negentropy, SortedVector
from tests.helpers import Client, Keys, store_events
from tests.inprocess import Relay
from tests.served import nip11

T0 = 1_700_000_000
KEYS = [Keys(0xA11CE), Keys(0xB0B), Keys(0xCA401)]
_events: dict[int, list[dict]] = {}


def events(n: int = 120) -> list[dict]:
    """`n` signed events of 3 authors, kinds 1 and 7, some with a `t` tag, over 40 seconds (many ties)."""
    if n not in _events:
        rng = random.Random(n)
        _events[n] = [
            KEYS[k % 3].sign(kind=1 if k % 4 else 7, content=f"note {k}",
                             tags=[["t", "x"]] if k % 5 == 0 else [], created_at=T0 + rng.randrange(40))
            for k in range(n)
        ]
    return _events[n]


def expected(evs: list[dict], filter_obj: dict) -> set[tuple[int, bytes]]:
    """The (created_at, id) a NEG-OPEN with `filter_obj` covers: matching events, the newest `limit` if any."""
    f = parse_filter(filter_obj)
    matching = [e for e in evs if f.matches(parse_event(e, EventLimits(), time.time()))]
    if f.limit is not None:
        matching = sorted(matching, key=lambda e: (-e["created_at"], e["id"]))[:f.limit]
    return {(e["created_at"], bytes.fromhex(e["id"])) for e in matching}


async def reconcile(client: Client, sub_id: str, filter_obj: dict, items, frame_size_limit: int = 0):
    """Run a whole reconciliation as initiator; returns (have, need, reply sizes in bytes). Closes the session."""
    neg = Negentropy(SortedVector.from_items(items), frame_size_limit)
    await client.send(["NEG-OPEN", sub_id, filter_obj, neg.initiate().hex()])
    have, need, sizes = set(), set(), []
    while True:
        reply = await client.recv()
        assert reply[:2] == ["NEG-MSG", sub_id], reply
        sizes.append(len(reply[2]) // 2)
        message, h, n = neg.reconcile_with_ids(bytes.fromhex(reply[2]))
        have.update(h)
        need.update(n)
        if message is None:
            break
        await client.send(["NEG-MSG", sub_id, message.hex()])
    await client.send(["NEG-CLOSE", sub_id])
    return have, need, sizes


async def check_exact(client: Client, evs: list[dict], filter_obj: dict, rng: random.Random) -> None:
    """Reconcile a client holding part of the expected set plus items of its own: have/need are exact."""
    theirs = expected(evs, filter_obj)
    ours = set(rng.sample(sorted(theirs), len(theirs) // 2))
    ours |= {(T0 + rng.randrange(40), rng.randbytes(32)) for _ in range(7)}
    have, need, _ = await reconcile(client, "sync", filter_obj, ours)
    assert need == {i for _, i in theirs - ours}, filter_obj
    assert have == {i for _, i in ours - theirs}, filter_obj


WINDOWS = [{}, {"since": T0 + 10}, {"until": T0 + 20}, {"since": T0 + 5, "until": T0 + 25},
           {"limit": 17}, {"since": T0 + 5, "limit": 9}, {"until": T0 + 30, "limit": 1}, {"limit": 0}]


async def test_full_set_reconciles_exactly_with_windows_and_limits(start):
    """The full set ({}) is served from the index: exact have/need for since/until windows and limits."""
    relay = await start()
    evs = events()
    await store_events(relay.store, evs)
    client = await Client.connect(relay.url)
    rng = random.Random(1)
    for window in WINDOWS:
        await check_exact(client, evs, window, rng)
    await client.close()


@pytest.mark.single_process  # reads the server's negentropy sessions (items_held)
async def test_indexed_filter_reconciles_exactly_from_the_index(start):
    """A configured filter is answered from its index: beyond max_sync_events, windows and limits exact."""
    relay = await start(negentropy={"filters": [{"kinds": [1]}], "max_sync_events": 5})
    evs = events()
    await store_events(relay.store, evs)
    client = await Client.connect(relay.url)
    rng = random.Random(2)
    assert len(expected(evs, {"kinds": [1]})) > 5  # a query would be refused: this is the index
    for window in WINDOWS:
        await check_exact(client, evs, {"kinds": [1], **window}, rng)
    assert relay.negentropy.items_held == 0  # indexed sessions hold nothing in memory
    await client.close()


async def test_unindexed_filter_reconciles_exactly_from_a_query(start):
    """Other filters are answered from a query: exact have/need for tag and author filters, windows and limits."""
    relay = await start()
    evs = events()
    await store_events(relay.store, evs)
    client = await Client.connect(relay.url)
    rng = random.Random(3)
    for base in ({"#t": ["x"]}, {"authors": [KEYS[0].pubkey], "kinds": [1]}, {"kinds": [7]}):
        for window in WINDOWS:
            await check_exact(client, evs, {**base, **window}, rng)
    await client.close()


async def test_large_sets_reconcile_within_a_small_frame_size_limit(start):
    """With frame_size_limit 4096, 1,500 events reconcile over many rounds, no reply above the limit."""
    relay = await start(negentropy={"frame_size_limit": 4096})
    evs = events(1500)
    await store_events(relay.store, evs)
    client = await Client.connect(relay.url)
    for filter_obj in ({}, {"kinds": [1]}):  # index, then query
        theirs = expected(evs, filter_obj)
        ours = set(sorted(theirs)[::3]) | {(T0 + 99, bytes([7]) * 32)}
        have, need, sizes = await reconcile(client, "big", filter_obj, ours, frame_size_limit=4096)
        assert need == {i for _, i in theirs - ours}
        assert have == {bytes([7]) * 32}
        assert len(sizes) > 3 and max(sizes) <= 4096, sizes
    await client.close()


async def test_each_message_reads_a_fresh_snapshot_and_none_is_held_between(start):
    """Between two messages no read transaction stays open (a TRUNCATE checkpoint succeeds) and new events show."""
    relay = await start(auth={"private_kinds": []})  # else {} is answered from a query, not the full-set index
    evs = events()
    await store_events(relay.store, evs[:60])
    client = await Client.connect(relay.url)
    ours = expected(evs[:60], {})
    neg = Negentropy(SortedVector.from_items(ours))
    initial = neg.initiate().hex()
    await client.send(["NEG-OPEN", "s", {}, initial])
    first = await client.recv()
    assert first[0] == "NEG-MSG"
    await store_events(relay.store, evs[60:61])
    conn = sqlite3.connect(relay.config.store.path)
    assert conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0] == 0  # 0: not blocked by a reader
    conn.close()
    await client.send(["NEG-MSG", "s", initial])  # the same question, answered from the newer state
    second = await client.recv()
    assert second[0] == "NEG-MSG" and second[2] != first[2]
    have, need, _ = await reconcile(client, "t", {}, ours)
    assert need == {bytes.fromhex(evs[60]["id"])} and not have
    await client.close()


# ---------------------------------------------------------------- errors and session life


async def expect_neg_err(client: Client, sub_id: str, prefix: str) -> str:
    reply = await client.recv()
    assert reply[0] == "NEG-ERR" and reply[1] == sub_id and reply[2].startswith(prefix), reply
    return reply[2]


async def open_session(client: Client, sub_id: str, filter_obj: dict, items=()) -> list:
    neg = Negentropy(SortedVector.from_items(items))
    await client.send(["NEG-OPEN", sub_id, filter_obj, neg.initiate().hex()])
    return await client.recv()


async def test_malformed_messages_get_neg_err(start):
    """Bad hex, an undecodable message, a bad filter or an unknown session: NEG-ERR, and the socket stays usable."""
    relay = await start()
    await store_events(relay.store, events()[:10])
    client = await Client.connect(relay.url)
    for bad in ("zz", "abc", 7, None):
        await client.send(["NEG-OPEN", "h", {}, bad])
        await expect_neg_err(client, "h", "invalid:")
    for undecodable in ("", "00", "6101", "61" + "01" * 3):
        await client.send(["NEG-OPEN", "u", {}, undecodable])
        await expect_neg_err(client, "u", "invalid:")
    await client.send(["NEG-OPEN", "f", {"kinds": "x"}, "61"])
    await expect_neg_err(client, "f", "invalid:")
    await client.send(["NEG-OPEN", "f"])
    await expect_neg_err(client, "f", "invalid:")
    await client.send(["NEG-MSG", "nope", "61"])
    await expect_neg_err(client, "nope", "closed:")
    # A bad NEG-MSG ends its session (NIP-77: after NEG-ERR the subscription is closed).
    assert (await open_session(client, "s", {}))[0] == "NEG-MSG"
    await client.send(["NEG-MSG", "s", "6101"])
    await expect_neg_err(client, "s", "invalid:")
    await client.send(["NEG-MSG", "s", "61"])
    await expect_neg_err(client, "s", "closed:")
    assert (await open_session(client, "s", {}))[0] == "NEG-MSG"
    await client.send(["NEG-MSG", "s", "xyz"])
    await expect_neg_err(client, "s", "invalid:")
    await client.send(["NEG-MSG", "s", "61"])
    await expect_neg_err(client, "s", "closed:")
    assert (await client.req("r", {"limit": 1}))  # REQ still works on this socket
    await client.close()


async def test_unsupported_version_is_answered_with_version_61(start):
    """A NEG-OPEN in protocol version 2 (0x62) gets NEG-MSG "61", the versions the relay speaks."""
    relay = await start()
    client = await Client.connect(relay.url)
    for message in ("62", "6f0102"):
        await client.send(["NEG-OPEN", "v", {}, message])
        assert await client.recv() == ["NEG-MSG", "v", "61"]
    await client.close()


@pytest.mark.single_process  # reads the server's negentropy sessions (items_held)
async def test_too_many_query_results_is_blocked(start):
    """A filter answered by a query with more than max_sync_events results: NEG-ERR blocked; a limit makes it fit."""
    relay = await start(negentropy={"max_sync_events": 5})
    evs = events()
    await store_events(relay.store, evs)
    client = await Client.connect(relay.url)
    reply = await open_session(client, "q", {"kinds": [7]})
    assert reply[:2] == ["NEG-ERR", "q"] and reply[2].startswith("blocked: too many query results"), reply
    assert relay.negentropy.items_held == 0
    await check_exact(client, evs, {"kinds": [7], "limit": 5}, random.Random(4))
    await client.close()


@pytest.mark.single_process  # reads the server's negentropy sessions (items_held)
async def test_relay_wide_item_budget_is_enforced_and_released(start):
    """Sessions built from queries share max_session_items: past it NEG-ERR blocked; closing gives items back."""
    relay = await start(negentropy={"max_sync_events": 30, "max_session_items": 40})
    evs = events()
    await store_events(relay.store, evs)
    kind7 = len(expected(evs, {"kinds": [7]}))
    assert 10 < kind7 <= 30
    first, second = await Client.connect(relay.url), await Client.connect(relay.url)
    assert (await open_session(first, "a", {"kinds": [7]}))[0] == "NEG-MSG"
    assert relay.negentropy.items_held == kind7
    reply = await open_session(second, "b", {"kinds": [7]})  # another connection: the budget is relay-wide
    assert reply[:2] == ["NEG-ERR", "b"] and reply[2].startswith("blocked:"), reply
    assert relay.negentropy.items_held == kind7
    await first.send(["NEG-CLOSE", "a"])
    await first.send(["NEG-MSG", "a", "61"])
    await expect_neg_err(first, "a", "closed:")
    assert relay.negentropy.items_held == 0
    assert (await open_session(second, "b", {"kinds": [7]}))[0] == "NEG-MSG"
    await second.close()
    for _ in range(50):  # the server notices the disconnect and releases the session
        if relay.negentropy.items_held == 0:
            break
        await asyncio.sleep(0.02)
    assert relay.negentropy.items_held == 0
    await first.close()


async def test_sessions_per_connection_are_capped(start):
    """The (max_sessions_per_connection + 1)-th session is refused with NEG-ERR blocked; another socket is not."""
    relay = await start(negentropy={"max_sessions_per_connection": 2})
    client, other = await Client.connect(relay.url), await Client.connect(relay.url)
    assert (await open_session(client, "1", {}))[0] == "NEG-MSG"
    assert (await open_session(client, "2", {"kinds": [1]}))[0] == "NEG-MSG"
    reply = await open_session(client, "3", {})
    assert reply[:2] == ["NEG-ERR", "3"] and reply[2].startswith("blocked: too many negentropy sessions"), reply
    assert (await open_session(other, "3", {}))[0] == "NEG-MSG"
    assert (await open_session(client, "2", {}))[0] == "NEG-MSG"  # re-opening an open id is no new session
    await client.close()
    await other.close()


@pytest.mark.single_process  # reads the server's negentropy sessions (items_held)
async def test_reopening_an_id_replaces_its_session(start):
    """NEG-OPEN on an open id replaces the session (its budget given back); negentropy ids are apart from REQ ids."""
    relay = await start(negentropy={"max_sessions_per_connection": 1})
    evs = events()
    await store_events(relay.store, evs)
    client = await Client.connect(relay.url)
    assert len(await client.req("s", {"limit": 1})) == 1  # a REQ with the same id stays open meanwhile
    assert (await open_session(client, "s", {"kinds": [7]}))[0] == "NEG-MSG"
    assert relay.negentropy.items_held == len(expected(evs, {"kinds": [7]}))
    rng = random.Random(5)
    theirs = expected(evs, {"kinds": [1]})
    ours = set(rng.sample(sorted(theirs), 20))
    neg = Negentropy(SortedVector.from_items(ours))
    await client.send(["NEG-OPEN", "s", {"kinds": [1]}, neg.initiate().hex()])
    reply = await client.recv()
    assert reply[:2] == ["NEG-MSG", "s"], reply
    assert relay.negentropy.items_held == len(theirs)
    need = set()
    while True:
        message, _, n = neg.reconcile_with_ids(bytes.fromhex(reply[2]))
        need.update(n)
        if message is None:
            break
        await client.send(["NEG-MSG", "s", message.hex()])
        reply = await client.recv()
    assert need == {i for _, i in theirs - ours}
    await client.close()


@pytest.mark.single_process  # reads the server's negentropy sessions (items_held)
async def test_idle_session_is_closed_with_neg_err(start):
    """A session without messages for idle_timeout_seconds ends with NEG-ERR "closed:"; its items are released."""
    relay = await start(negentropy={"idle_timeout_seconds": 0.3})
    await store_events(relay.store, events())
    client = await Client.connect(relay.url)
    assert (await open_session(client, "idle", {"kinds": [7]}))[0] == "NEG-MSG"
    assert relay.negentropy.items_held > 0
    started = time.monotonic()
    await expect_neg_err(client, "idle", "closed:")
    assert 0.25 <= time.monotonic() - started < 3
    assert relay.negentropy.items_held == 0
    await client.send(["NEG-MSG", "idle", "61"])
    await expect_neg_err(client, "idle", "closed:")
    await client.close()


@pytest.mark.single_process  # reads the server's negentropy sessions (items_held)
async def test_neg_close_ends_the_session_without_reply(start):
    """NEG-CLOSE ends a session silently; a NEG-CLOSE of an unknown id is ignored."""
    relay = await start()
    await store_events(relay.store, events())
    client = await Client.connect(relay.url)
    assert (await open_session(client, "c", {"kinds": [7]}))[0] == "NEG-MSG"
    await client.send(["NEG-CLOSE", "c"])
    await client.send(["NEG-CLOSE", "never-opened"])
    await client.send(["NEG-MSG", "c", "61"])
    await expect_neg_err(client, "c", "closed:")
    assert relay.negentropy.items_held == 0
    await client.close()


async def test_nip11_lists_77_only_while_enabled(start):
    """NIP-11 lists 77 when [negentropy] enabled (default); disabled, it does not and NEG-OPEN is refused."""
    enabled = await start("on")
    assert 77 in (await nip11(enabled))["supported_nips"]
    disabled = await start("off", negentropy={"enabled": False})
    assert 77 not in (await nip11(disabled))["supported_nips"]
    client = await Client.connect(disabled.url)
    assert (await open_session(client, "d", {}))[:2] == ["NEG-ERR", "d"]
    await client.close()
    conn = sqlite3.connect(disabled.config.store.path)
    assert conn.execute("SELECT count(*) FROM neg_nodes").fetchone() == (0,)  # no index kept
    conn.close()


def test_config_checks_frame_size_against_message_size_and_filters():
    """max_message_bytes must exceed twice the frame size limit; filters have no since/until/limit; lists not in env."""
    with pytest.raises(ConfigError, match="limits.max_message_bytes"):
        load_config(None, {}, {"limits": {"max_message_bytes": 999_999}})
    load_config(None, {}, {"limits": {"max_message_bytes": 999_999}, "negentropy": {"enabled": False}})
    assert load_config(None, {}, {"negentropy": {"frame_size_limit": 4096}}).negentropy.frame_size_limit == 4096
    with pytest.raises(ConfigError, match="negentropy.frame_size_limit"):
        load_config(None, {}, {"negentropy": {"frame_size_limit": 4095}})
    with pytest.raises(ConfigError, match="negentropy.filters\\[1\\].since"):
        load_config(None, {}, {"negentropy": {"filters": [{"kinds": [1]}, {"since": 5}]}})
    with pytest.raises(ConfigError, match="negentropy.filters\\[0\\]"):
        load_config(None, {}, {"negentropy": {"filters": [{"kinds": "x"}]}})
    with pytest.raises(ConfigError, match="negentropy.filters"):
        load_config(None, {"RELAY_NEGENTROPY__FILTERS": "[]"})
    assert load_config(None, {"RELAY_NEGENTROPY__MAX_SYNC_EVENTS": "7", "RELAY_NEGENTROPY__MAX_SESSION_ITEMS": "7"}
                       ).negentropy.max_sync_events == 7
    with pytest.raises(ConfigError, match="max_session_items"):
        load_config(None, {}, {"negentropy": {"max_session_items": 10, "max_sync_events": 11}})


# ---------------------------------------------------------------- nostr-sdk (rust-nostr) as the client


TIMEOUT = timedelta(seconds=5)


@contextlib.asynccontextmanager
async def sdk_relay(url: str):
    """(nostr-sdk client, its handle of the relay at `url`), connected; shut down on exit."""
    client = sdk.ClientBuilder().build()
    relay_url = sdk.RelayUrl.parse(url)
    try:
        assert await client.add_relay(relay_url)
        await client.connect(TIMEOUT)
        yield client, await client.relay(relay_url)
    finally:
        await client.shutdown()


async def sdk_sync(relay: Relay, filt: sdk.Filter, items: set[tuple[int, bytes]]) -> sdk.RelaySyncSummary:
    """nostr-sdk's negentropy sync (dry run: reconcile only) of `items` against the relay."""
    async with sdk_relay(relay.url) as (_, handle):
        negentropy_items = [sdk.NegentropyItem(id=sdk.EventId.parse(i.hex()), timestamp=sdk.Timestamp.from_secs(t))
                            for t, i in items]
        return await handle.sync(filt, negentropy_items, sdk.SyncOptions().dry_run())


def hexes(event_ids) -> set[str]:
    return {e.to_hex() for e in event_ids}


async def test_nostr_sdk_sync_reports_the_exact_difference(start):
    """nostr-sdk's Relay.sync against the relay finds exactly what each side lacks (index and query paths)."""
    relay = await start(negentropy={"filters": [{"kinds": [1]}]})
    evs = events(600)
    await store_events(relay.store, evs)
    rng = random.Random(6)
    cases = [({}, sdk.Filter()),
             ({"kinds": [1]}, sdk.Filter().kind(sdk.Kind(1))),
             ({"kinds": [7], "since": T0 + 10}, sdk.Filter().kind(sdk.Kind(7)).since(sdk.Timestamp.from_secs(T0 + 10))),
             ({"authors": [KEYS[1].pubkey]}, sdk.Filter().author(sdk.PublicKey.parse(KEYS[1].pubkey)))]
    for filter_obj, filt in cases:
        theirs = expected(evs, filter_obj)
        ours = set(rng.sample(sorted(theirs), len(theirs) * 2 // 3))
        ours |= {(T0 + rng.randrange(40), rng.randbytes(32)) for _ in range(5)}
        summary = await sdk_sync(relay, filt, ours)
        assert hexes(summary.remote) == {i.hex() for _, i in theirs - ours}, filter_obj
        assert hexes(summary.local) == {i.hex() for _, i in ours - theirs}, filter_obj
