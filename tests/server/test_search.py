"""NIP-50 search through the real server: REQ and COUNT answers, refusals with NIP-01 prefixes, live events
after EOSE, NEG-OPEN, and NIP-11."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from tests.helpers import REAL_EVENTS, Client, read_jsonl
from tests.served import nip11


async def answer(client: Client, message: list) -> list:
    await client.send(message)
    return await client.recv()


async def test_req_and_count_answer_a_search(client, alice):
    """REQ gets the matching notes, best first, then EOSE; COUNT counts them (NIP-45)."""
    for content in ("green tea", "tea tea tea", "coffee"):
        assert (await client.publish(alice.sign(content=content)))[2] is True
    assert [e["content"] for e in await client.req("s", {"search": "tea"})] == ["tea tea tea", "green tea"]
    assert await answer(client, ["COUNT", "c", {"search": "tea"}]) == ["COUNT", "c", {"count": 2}]


@pytest.mark.parametrize("search, reason", [
    ("", "invalid: search is empty (no words)"),
    ("language:en", "invalid: search is empty (no words)"),
    ("x" * 33, "invalid: search is longer than 32 bytes"),
    (["tea"], "invalid: search must be a string"),
])
async def test_bad_search_is_closed_with_invalid(start, search, reason):
    """An empty search, one over limits.max_search_bytes or not a string: CLOSED "invalid:", for REQ and COUNT."""
    relay = await start(limits={"max_search_bytes": 32})
    client = await Client.connect(relay.url)
    try:
        assert await answer(client, ["REQ", "s", {"search": search}]) == ["CLOSED", "s", reason]
        assert await answer(client, ["COUNT", "c", {"search": search}]) == ["CLOSED", "c", reason]
    finally:
        await client.close()


async def test_hostile_query_text_is_searched_as_words(client, alice):
    """FTS5 syntax in the user's text is only words: no error, and the words must all match."""
    await client.publish(alice.sign(content="meet at 10:30 near the C++ OR bitcoin talk"))
    for text in ("10:30", "C++", "bitcoin OR", "NEAR(", '"near the', "https://x.example/?q=a:b"):
        await client.send(["REQ", "s", {"search": text}])
        reply = await client.recv()
        assert reply[0] in ("EVENT", "EOSE"), (text, reply)
        if reply[0] == "EVENT":
            assert (await client.recv())[0] == "EOSE"
    assert len(await client.req("ok", {"search": "10:30 near"})) == 1


async def test_live_events_after_eose_match_the_search(relay, client, alice):
    """After EOSE, a new note with the words arrives live; one without them, or of a kind not indexed, does not."""
    await client.req("live", {"search": "comet*", "kinds": [1, 7]})
    writer = await Client.connect(relay.url)
    try:
        for event in (alice.sign(content="no match here"), alice.sign(kind=7, content="comet"),
                      alice.sign(content="a COMÈTE tonight")):
            await writer.publish(event)
        reply = await client.recv()
        assert reply[:2] == ["EVENT", "live"] and reply[2]["content"] == "a COMÈTE tonight"
        with pytest.raises(asyncio.TimeoutError):
            await client.recv(timeout=0.5)
    finally:
        await writer.close()


REAL_CJK_NOTES = ("d049e559", "57e8b7b1", "28691679")
"""Real notes of ../shared/data: Chinese (人们如何能更好地治理自己？), Japanese with "YouTube" (YouTube で動画見る
ときは、片画面ミラーリングモードで...), Japanese with "Nostr" (...「で、Nostrって流行ってんの？」...ビットコイン...)."""


async def test_cjk_words_inside_real_sentences_are_found_stored_and_live(relay, client, alice):
    """A Chinese or Japanese word inside a sentence, and a Latin word glued to Japanese, find the same real notes
    live after EOSE as from the stored events afterwards; `cat` finds no `concatenate` either way."""
    chinese, japanese, mixed = sorted((e for e in read_jsonl(REAL_EVENTS) if e["id"][:8] in REAL_CJK_NOTES),
                                      key=lambda e: REAL_CJK_NOTES.index(e["id"][:8]))
    latin = alice.sign(content="concatenate the strings")
    expected = {"治理": [chinese], "自己": [chinese], "動画": [japanese], "ミラーリング": [japanese],
                "YouTube": [japanese], "画面": [japanese], "Nostr": [mixed], "流行": [mixed],
                "ビットコイン": [mixed], "cat": [], "concatenate": [latin]}
    subscriptions = {f"s{i}": word for i, word in enumerate(expected)}
    for sub_id, word in subscriptions.items():
        assert await client.req(sub_id, {"search": word}) == []
    writer = await Client.connect(relay.url)
    try:
        for event in (chinese, japanese, mixed, latin):
            assert (await writer.publish(event))[2] is True, event["id"]
    finally:
        await writer.close()
    live: dict[str, set[str]] = {sub_id: set() for sub_id in subscriptions}
    with contextlib.suppress(asyncio.TimeoutError):  # then no more: the last recv waits 0.5 s for nothing
        for timeout in [5.0] * sum(map(len, expected.values())) + [0.5]:
            reply = await client.recv(timeout=timeout)
            assert reply[0] == "EVENT", reply
            live[reply[1]].add(reply[2]["id"])
    for sub_id, word in subscriptions.items():
        assert live[sub_id] == {e["id"] for e in expected[word]}, word
        assert {e["id"] for e in await client.req("stored", {"search": word})} == live[sub_id], word


async def test_neg_open_with_a_search_gets_neg_err_blocked(client):
    """NIP-77 cannot reconcile a search: NEG-ERR "blocked:"."""
    reply = await answer(client, ["NEG-OPEN", "n", {"search": "tea"}, "6100000200"])
    assert reply[:2] == ["NEG-ERR", "n"] and reply[2].startswith("blocked: ")


async def test_supported_nips_lists_50_only_while_search_is_enabled(start):
    """NIP-11 lists 50 with [search] enabled; disabled, 50 is gone and a search filter is CLOSED "blocked:"."""
    assert 50 in (await nip11(await start("on")))["supported_nips"]
    off = await start("off", search={"enabled": False})
    assert 50 not in (await nip11(off))["supported_nips"]
    client = await Client.connect(off.url)
    try:
        reply = await answer(client, ["REQ", "s", {"search": "tea"}])
        assert reply[:2] == ["CLOSED", "s"] and reply[2].startswith("blocked: ")
        assert (await client.req("t", {"kinds": [1]})) == []
    finally:
        await client.close()
