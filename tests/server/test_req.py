"""REQ, CLOSE, COUNT and live delivery through the real server (NIP-01, NIP-45)."""

from __future__ import annotations

from tests.helpers import Client


async def test_req_returns_newest_first_with_ties_by_lowest_id(client, alice):
    """Stored events come newest first; events with equal created_at come lowest id first."""
    events = [alice.sign(content=str(i), created_at=1000 + i // 3) for i in range(9)]
    for e in events:
        assert (await client.publish(e))[2] is True
    got = [e["id"] for e in await client.req("s", {"authors": [alice.pubkey]})]
    expected = [e["id"] for e in sorted(events, key=lambda e: (-e["created_at"], e["id"]))]
    assert got == expected


async def test_limit_zero_sends_only_eose(client, alice):
    """limit 0 answers EOSE and no stored event."""
    await client.publish(alice.sign(content="x"))
    assert await client.req("s", {"limit": 0}) == []


async def test_each_filter_keeps_its_own_limit(client, alice, bob):
    """Filters are OR-ed, each with its own limit, and an event matched twice is sent once."""
    for i in range(5):
        await client.publish(alice.sign(content=f"a{i}", created_at=2000 + i))
        await client.publish(bob.sign(content=f"b{i}", created_at=2000 + i))
    got = await client.req("s", {"authors": [alice.pubkey], "limit": 2}, {"authors": [bob.pubkey], "limit": 3},
                           {"authors": [alice.pubkey, bob.pubkey], "limit": 1})
    assert sorted(e["content"] for e in got) == ["a3", "a4", "b2", "b3", "b4"]


async def test_since_until_inclusive_and_empty_lists_match_nothing(client, alice):
    """since/until are inclusive; an empty ids list matches nothing."""
    for t in (10, 20, 30):
        await client.publish(alice.sign(content=str(t), created_at=t))
    got = await client.req("s", {"since": 10, "until": 20})
    assert sorted(e["created_at"] for e in got) == [10, 20]
    assert await client.req("t", {"ids": []}) == []
    assert await client.req("u", {"kinds": [1], "#e": []}) == []


async def test_tag_filters_and_across_keys_or_within(client, alice):
    """Several tag keys are AND-ed; values within one key are OR-ed."""
    x, y = "a" * 64, "b" * 64
    e1 = alice.sign(tags=[["e", x], ["t", "nostr"]], content="1")
    e2 = alice.sign(tags=[["e", y]], content="2")
    e3 = alice.sign(tags=[["e", x]], content="3")
    for e in (e1, e2, e3):
        await client.publish(e)
    assert {e["id"] for e in await client.req("s", {"#e": [x, y]})} == {e1["id"], e2["id"], e3["id"]}
    assert [e["id"] for e in await client.req("t", {"#e": [x], "#t": ["nostr"]})] == [e1["id"]]


async def test_live_events_follow_eose_and_close_stops_them(client, relay, alice):
    """After EOSE, new matching events arrive live; after CLOSE they stop."""
    await client.req("live", {"kinds": [1]})
    other = await Client.connect(relay.url)
    try:
        e = alice.sign(content="live")
        assert (await other.publish(e))[2] is True
        assert await client.recv() == ["EVENT", "live", e]
        await client.send(["CLOSE", "live"])
        await other.publish(alice.sign(content="after close"))
        await client.send(["REQ", "probe", {"limit": 0}])
        assert await client.recv() == ["EOSE", "probe"]
    finally:
        await other.close()


async def test_req_reusing_an_id_replaces_the_subscription(client, relay, alice):
    """A REQ with an open subscription id replaces its filters."""
    await client.req("s", {"kinds": [7]})
    await client.req("s", {"kinds": [1]})
    other = await Client.connect(relay.url)
    try:
        await other.publish(alice.sign(kind=7, content="+"))
        note = alice.sign(kind=1, content="note")
        await other.publish(note)
        assert await client.recv() == ["EVENT", "s", note]
    finally:
        await other.close()


async def test_an_invalid_req_reusing_an_id_ends_that_subscription(client, relay, alice):
    """A REQ with an open subscription's id but an invalid filter gets CLOSED, and the old one is gone with it:
    nothing more arrives on that id."""
    await client.req("s", {"kinds": [1]})
    await client.send(["REQ", "s", {"#e": "x"}])
    assert await client.recv() == ["CLOSED", "s", "invalid: #e must be an array"]
    other = await Client.connect(relay.url)
    try:
        note = alice.sign(kind=1, content="after CLOSED")
        await other.publish(note)
        await client.send(["REQ", "probe", {"ids": [note["id"]]}])  # stored: the note was committed
        replies = []
        while (reply := await client.recv())[:2] != ["EOSE", "probe"]:
            replies.append(reply)
        assert replies == [["EVENT", "probe", note]]  # and none for "s"
    finally:
        await other.close()


async def test_count_counts_distinct_matches(client, alice, bob):
    """COUNT (NIP-45) counts distinct events over OR-ed filters, ignoring limit."""
    for i in range(4):
        await client.publish(alice.sign(content=f"a{i}"))
    await client.publish(bob.sign(content="b"))
    await client.send(["COUNT", "c", {"authors": [alice.pubkey], "limit": 1}, {"kinds": [1]}])
    assert await client.recv() == ["COUNT", "c", {"count": 5}]


async def test_event_written_during_req_is_delivered_exactly_once(relay, alice):
    """An event committed while a REQ is still sending its stored results reaches that REQ exactly once."""
    loader = await Client.connect(relay.url)
    reader = await Client.connect(relay.url)
    padding = "x" * 16_000  # 800 of these exceed the socket buffers: the REQ blocks mid-send
    try:
        for i in range(800):
            await loader.send(["EVENT", alice.sign(content=f"{i} {padding}", created_at=5000 + i)])
        for _ in range(800):
            assert (await loader.recv())[2] is True
        await reader.send(["REQ", "s", {"authors": [alice.pubkey], "limit": 5000}])
        first = await reader.recv()
        late = [alice.sign(content=f"late {i}", created_at=4000 + i) for i in range(20)]
        for e in late:
            await loader.send(["EVENT", e])
        for _ in late:
            assert (await loader.recv())[2] is True
        seen = [first[2]["id"]]
        while (msg := await reader.recv())[0] != "EOSE":
            seen.append(msg[2]["id"])
        assert len(seen) == 800
        for _ in late:
            msg = await reader.recv()
            assert msg[0] == "EVENT"
            seen.append(msg[2]["id"])
        await reader.send(["REQ", "probe", {"limit": 0}])
        assert await reader.recv() == ["EOSE", "probe"]
        assert len(seen) == len(set(seen)) == 820
    finally:
        await loader.close()
        await reader.close()


async def test_ephemeral_events_are_relayed_but_not_stored(client, relay, alice):
    """Ephemeral kinds reach live subscribers and are never stored."""
    await client.req("eph", {"kinds": [20001]})
    other = await Client.connect(relay.url)
    try:
        e = alice.sign(kind=20001, content="ping")
        assert (await other.publish(e))[2] is True
        assert await client.recv() == ["EVENT", "eph", e]
        assert await other.req("again", {"kinds": [20001]}) == []
    finally:
        await other.close()


async def test_pipelined_events_are_settled_in_arrival_order(client, alice):
    """Versions of a replaceable event pipelined on one connection are each accepted, in order, then superseded."""
    versions = [alice.sign(kind=0, content=f"v{i}", created_at=10_000 + i) for i in range(400)]
    for event in versions:
        await client.send(["EVENT", event])
    replies = {}
    while len(replies) < len(versions):
        reply = await client.recv()
        replies[reply[1]] = reply
    refused = [replies[e["id"]] for e in versions if replies[e["id"]][2] is not True]
    assert refused == []
    assert [e["content"] for e in await client.req("s", {"kinds": [0], "authors": [alice.pubkey]})] == ["v399"]


async def test_stored_events_of_every_frame_length_form_arrive_whole(client, alice):
    """Served frames use each RFC 6455 length form and a strict client parses them: the events' messages take
    the 16-bit and 64-bit forms, the EOSE the 7-bit one."""
    sizes = [10, 60_000, 200_000]  # framed messages of ~360 bytes, ~60 kB (< 65,536) and ~200 kB
    events = [alice.sign(content="x" * n, created_at=1000 + i) for i, n in enumerate(sizes)]
    for e in events:
        assert (await client.publish(e))[2] is True
    got = await client.req("s", {"authors": [alice.pubkey]})
    assert [len(e["content"]) for e in got] == sizes[::-1]
    assert [e["id"] for e in got] == [e["id"] for e in events[::-1]]
