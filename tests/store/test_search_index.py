"""The NIP-50 search index in a real store: kept in the write transaction, queried with the other filter
keys, rebuilt when `[search]` changes, checked by `relay verify`."""

from __future__ import annotations

import json
import sqlite3
import time

import pytest

from relay.commands.projectors import run_verify
from relay.hooks import hooks
from relay.node import open_store
from relay.protocol.filters import parse_filter
from relay.protocol.search import parse_search
from relay.store.queries import compile_filter
from relay.store.search import TABLE, SearchIndex
from relay.store.search.index import DELETE_SQL, read_record
from relay.store.store import Store
from tests.conftest import make_config
from tests.helpers import Keys, store_events

NOW = int(time.time())
ALICE, BOB = Keys(0xA11CE), Keys(0xB0B)


async def search(store, *filters: dict, max_rows: int | None = None) -> list[str]:
    """Contents of the events a REQ with `filters` returns, in order."""
    raws = await store.query([parse_filter(f) for f in filters], 500, 5000, max_rows=max_rows)
    return [json.loads(raw)["content"] for raw in raws]


def profile(keys: Keys, created_at: int, **fields) -> dict:
    return keys.sign(0, json.dumps(fields), created_at=created_at)


@pytest.fixture
async def store(tmp_path):
    s = await open_store(make_config(tmp_path), read_connections=1)
    yield s
    await s.close()


async def test_words_phrases_prefixes_and_diacritics(store):
    """All words must match, a phrase matches in order, a prefix matches longer words, diacritics fold."""
    await store_events(store, [ALICE.sign(content=c, created_at=NOW - i) for i, c in enumerate(
        ["the café opens at 10:30", "Cafe society", "open source coffee", "sourcing beans"])])
    assert await search(store, {"search": "cafe"}) == ["Cafe society", "the café opens at 10:30"]
    assert await search(store, {"search": "café 10:30"}) == ["the café opens at 10:30"]
    assert await search(store, {"search": '"open source"'}) == ["open source coffee"]
    assert await search(store, {"search": '"source open"'}) == []
    assert sorted(await search(store, {"search": "sourc*"})) == ["open source coffee", "sourcing beans"]
    assert await search(store, {"search": "C++ NEAR( bitcoin OR"}) == []


async def test_cjk_words_are_found_inside_sentences_and_latin_keeps_its_word_boundaries(store):
    """A Japanese or Chinese word inside a sentence is found, and so are the Latin and the CJK words of mixed
    text; a CJK word is not found across punctuation, nor a Latin word inside a longer one."""
    notes = ["日本語の勉強は楽しいです", "人们如何能更好地治理自己？", "Bitcoinは比特币です", "日、本",
             "concatenate the strings", "Nostrって流行ってんの"]
    await store_events(store, [ALICE.sign(content=c, created_at=NOW - i) for i, c in enumerate(notes)])
    expected = {"日本語": [0], "勉強": [0], "楽しい": [0], "です": [0, 2], "治理": [1], "自己": [1], "Bitcoin": [2],
                "比特币": [2], "比特": [2], "Bitcoinは比特币": [2], "日本": [0], "本": [0, 3],
                "す": [0, 2], "nostr": [5], "流行": [5], "cat": [], "concat*": [4], "string": []}
    for word, found in expected.items():
        assert sorted(await search(store, {"search": word})) == sorted(notes[i] for i in found), word


async def test_relevance_then_newest_then_limit(store):
    """bm25 orders the results (more occurrences in a shorter text first), equal scores newest first; limit cuts."""
    await store_events(store, [ALICE.sign(content="zap zap zap", created_at=NOW - 50),
                               ALICE.sign(content="zap and a long sentence about other things", created_at=NOW - 1),
                               ALICE.sign(content="zap once", created_at=NOW - 30),
                               BOB.sign(content="zap once", created_at=NOW - 20)])
    got = await search(store, {"search": "zap"})
    assert got[0] == "zap zap zap" and got[-1] == "zap and a long sentence about other things"
    raws = await store.query([parse_filter({"search": "zap"})], 500, 5000)
    ties = [json.loads(r) for r in raws if json.loads(r)["content"] == "zap once"]
    assert [e["created_at"] for e in ties] == [NOW - 20, NOW - 30]
    assert await search(store, {"search": "zap", "limit": 1}) == ["zap zap zap"]


async def test_search_is_anded_with_every_other_key(store):
    """authors, kinds, since/until, ids and tags narrow a search; kinds that are not indexed return nothing."""
    a = ALICE.sign(content="relay news", created_at=NOW - 10, tags=[["t", "nostr"]])
    b = BOB.sign(content="relay gossip", created_at=NOW - 5)
    r = ALICE.sign(kind=7, content="relay", created_at=NOW - 3)
    await store_events(store, [a, b, r])
    assert await search(store, {"search": "relay", "authors": [ALICE.pubkey]}) == ["relay news"]
    assert await search(store, {"search": "relay", "since": NOW - 6}) == ["relay gossip"]
    assert await search(store, {"search": "relay", "#t": ["nostr"]}) == ["relay news"]
    assert await search(store, {"search": "relay", "ids": [b["id"]]}) == ["relay gossip"]
    assert await search(store, {"search": "relay", "kinds": [7]}) == []
    assert await store.count([parse_filter({"search": "relay"})]) == 2
    assert await store.count([parse_filter({"search": "relay", "authors": [BOB.pubkey]})]) == 1


async def test_profiles_and_articles_index_their_fields(store):
    """Kind 0: name, display_name, about, nip05 (not other fields); kind 30023: title, summary and content."""
    await store_events(store, [
        profile(ALICE, NOW - 9, name="Alice", about="gardener", website="https://hidden.example", nip05="a@x.io"),
        BOB.sign(30023, "the body text", [["d", "post"], ["title", "Solar power"], ["summary", "panels"]],
                 created_at=NOW - 8)])
    for word in ("alice", "gardener", "x.io"):
        assert len(await search(store, {"search": word})) == 1, word
    assert await search(store, {"search": "hidden"}) == []
    for word in ("solar", "panels", "body"):
        assert await search(store, {"search": word}) == ["the body text"], word


async def test_domain_matches_the_nip05_domain_exactly(store):
    """domain: selects profiles whose nip05 is at that domain (unverified), not its subdomains, and ANDs with words."""
    await store_events(store, [profile(ALICE, NOW - 3, name="alice", nip05="alice@Primal.net"),
                               profile(BOB, NOW - 2, name="bob", nip05="bob@sub.primal.net"),
                               Keys(3).sign(0, json.dumps({"name": "carol", "nip05": "primal.net"}),
                                            created_at=NOW - 1)])
    got = [json.loads(c)["name"] for c in await search(store, {"search": "domain:primal.net"})]
    assert sorted(got) == ["alice", "carol"]
    assert [json.loads(c)["name"] for c in await search(store, {"search": "bob domain:sub.primal.net"})] == ["bob"]
    assert await search(store, {"search": "bob domain:primal.net"}) == []
    got = [json.loads(c)["name"] for c in await search(store, {"search": "domain:sub.primal.net domain:PRIMAL.net"})]
    assert sorted(got) == ["alice", "bob", "carol"]  # any of several domains (the last alone was kept)
    assert [json.loads(c)["name"] for c in await search(store, {"search": "bob domain: domain:other.com"})] == []
    assert [json.loads(c)["name"] for c in await search(store, {"search": "alice domain:"})] == ["alice"]


async def test_index_follows_supersession_deletion_expiry_and_vanish(tmp_path):
    """A replaced profile, a NIP-09 deleted note, an expired note and a vanished author leave the index with
    their events, and `relay verify` agrees."""
    config = make_config(tmp_path, server={"public_url": "wss://relay.example.com"})
    store = await open_store(config, read_connections=1)
    carol = Keys(0xCA201)
    expires = int(time.time()) + 1
    try:
        note = ALICE.sign(content="ephemeral thoughts", created_at=NOW - 10)
        await store_events(store, [profile(ALICE, NOW - 20, name="oldname"),
                                   note,
                                   ALICE.sign(content="expiring thoughts", created_at=NOW - 10,
                                              tags=[["expiration", str(expires)]]),
                                   carol.sign(content="carol thoughts", created_at=NOW - 10)])
        assert len(await search(store, {"search": "thoughts"})) == 3
        await store_events(store, [profile(ALICE, NOW - 5, name="newname"),
                                   ALICE.sign(5, "", [["e", note["id"]]], created_at=NOW - 4),
                                   carol.sign(62, "", [["relay", "wss://relay.example.com"]], created_at=NOW - 2)])
        assert await search(store, {"search": "oldname"}) == []
        assert len(await search(store, {"search": "newname"})) == 1
        time.sleep(max(0.0, expires + 0.1 - time.time()))
        assert await store.purge_expired() == 1
        assert await search(store, {"search": "thoughts"}) == []
    finally:
        await store.close()
    assert run_verify(config) == 0


async def test_several_filters_keep_their_order_and_max_rows_keeps_the_best(store):
    """With a search among a REQ's filters, each filter's rows keep its order, in the REQ's order, each event
    once; max_query_rows keeps the leading (best scored) rows."""
    await store_events(store, [ALICE.sign(content="moon moon moon", created_at=NOW - 30),
                               ALICE.sign(content="moon and the sun", created_at=NOW - 20),
                               BOB.sign(content="newest by bob", created_at=NOW - 1)])
    got = await search(store, {"search": "moon"}, {"authors": [ALICE.pubkey, BOB.pubkey]})
    assert got == ["moon moon moon", "moon and the sun", "newest by bob"]
    got = await search(store, {"authors": [BOB.pubkey]}, {"search": "moon"})
    assert got == ["newest by bob", "moon moon moon", "moon and the sun"]
    assert await search(store, {"search": "moon"}, {"kinds": [1]}, max_rows=1) == ["moon moon moon"]
    assert await search(store, {"search": "moon"}, max_rows=1) == ["moon moon moon"]


async def test_the_query_plan_is_driven_by_the_index(store):
    """A search filter reads the FTS5 index first and each event by its primary key, whatever else it holds."""
    for f in ({"search": "x"}, {"search": "x", "authors": [ALICE.pubkey], "kinds": [1], "#t": ["a"]}):
        c = compile_filter(parse_filter(f), 10, NOW)
        conn = sqlite3.connect(store.path)
        try:
            plan = " | ".join(r[3] for r in conn.execute("EXPLAIN QUERY PLAN " + c.sql, c.params))
        finally:
            conn.close()
        assert plan.startswith(f"SCAN {TABLE} VIRTUAL TABLE INDEX"), plan
        assert "SEARCH e USING INTEGER PRIMARY KEY" in plan, plan


async def open_and_close(config) -> SearchIndex:
    store = await Store.open(config.store.path, config.store.options(1), hooks(config))
    await store.close()
    return next(h for h in store.hooks if isinstance(h, SearchIndex))


async def test_changing_search_rebuilds_and_unchanged_costs_nothing(tmp_path):
    """New kinds rebuild the index from the events; the same settings again do not; disabling drops it and
    enabling rebuilds it."""
    config = make_config(tmp_path)
    store = await open_store(config, read_connections=1)
    await store_events(store, [ALICE.sign(7, "reaction word", created_at=NOW), ALICE.sign(content="note word")])
    await store.close()
    assert (await open_and_close(config)).rebuilt is None
    with_reactions = make_config(tmp_path, search={"kinds": [1, 7]})
    assert (await open_and_close(with_reactions)).rebuilt == "settings changed"
    store = await open_store(with_reactions, read_connections=1)
    try:
        assert sorted(await search(store, {"search": "word"})) == ["note word", "reaction word"]
    finally:
        await store.close()
    assert (await open_and_close(with_reactions)).rebuilt is None
    store = await open_store(make_config(tmp_path, search={"enabled": False}), read_connections=1)
    await store.close()
    conn = sqlite3.connect(config.store.path)
    assert read_record(conn) is None and conn.execute("SELECT 1 FROM sqlite_master WHERE name = ?",
                                                       (TABLE,)).fetchone() is None
    conn.close()
    assert (await open_and_close(config)).rebuilt == "new"
    assert run_verify(config) == 0


OLD_LAYOUT = "fts5 unicode61 remove_diacritics 2; text 1"
"""The `layout` of the indexes made before CJK runs were indexed as bigrams (each run was one token)."""


async def test_an_index_of_the_old_tokenization_is_rebuilt_at_start(tmp_path, capsys):
    """An index made when a CJK run was one token (its rows and its `meta` layout as that version wrote them)
    does not find a word inside a Japanese sentence; `relay verify` says so, and the next start rebuilds it."""
    config = make_config(tmp_path)
    store = await open_store(config, read_connections=1)
    await store_events(store, [ALICE.sign(content="日本語の勉強は楽しい")])
    await store.close()
    conn = sqlite3.connect(config.store.path)
    with conn:
        conn.execute(f"INSERT INTO {TABLE} ({TABLE}) VALUES ('delete-all')")
        conn.executemany(f"INSERT INTO {TABLE} (rowid, text, domain) VALUES (?, ?, '')",
                         [(seq, json.loads(raw)["content"]) for seq, raw in conn.execute("SELECT seq, raw FROM events")])
        conn.execute("UPDATE meta SET value = json_set(value, '$.layout', ?) WHERE key = 'search_index'", (OLD_LAYOUT,))
    assert conn.execute(f"SELECT count(*) FROM {TABLE} WHERE {TABLE} MATCH ?",
                        (parse_search("勉強", 100).match_expression(),)).fetchone() == (0,)
    conn.close()
    assert run_verify(config) == 1
    assert "search index: not built for this configuration" in capsys.readouterr().out
    assert (await open_and_close(config)).rebuilt == "settings changed"
    store = await open_store(config, read_connections=1)
    try:
        assert await search(store, {"search": "勉強"}) == ["日本語の勉強は楽しい"]
    finally:
        await store.close()
    assert run_verify(config) == 0


async def test_an_interrupted_rebuild_is_done_again(tmp_path):
    """An index left "building" (a crash mid-rebuild) is rebuilt at the next start."""
    config = make_config(tmp_path)
    await open_and_close(config)
    conn = sqlite3.connect(config.store.path)
    with conn:
        conn.execute("UPDATE meta SET value = json_set(value, '$.state', 'building') WHERE key = 'search_index'")
    conn.close()
    assert (await open_and_close(config)).rebuilt == "state building"


def tamper(config, sql: str, *params) -> None:
    conn = sqlite3.connect(config.store.path)
    with conn:
        conn.execute(sql, params)
    conn.close()


@pytest.mark.parametrize("damage, says", [
    (lambda c, seq: tamper(c, DELETE_SQL, seq, "verify me", ""), "1 events missing, 0 rows without an event, 0"),
    (lambda c, seq: tamper(c, "DELETE FROM events WHERE seq = ?", seq), "0 events missing, 1 rows without an event"),
    (lambda c, seq: (tamper(c, DELETE_SQL, seq, "verify me", ""),
                     tamper(c, f"INSERT INTO {TABLE} (rowid, text, domain) VALUES (?, 'other words', '')", seq)),
     "0 events missing, 0 rows without an event, 1 mismatched"),
])
async def test_verify_finds_missing_extra_and_mismatched_rows(tmp_path, capsys, damage, says):
    """An event without its row, a row without its event, a row with other tokens: exit 1, named by events.seq."""
    config = make_config(tmp_path)
    store = await open_store(config, read_connections=1)
    await store_events(store, [ALICE.sign(content="verify me"), ALICE.sign(content="and me")])
    await store.close()
    conn = sqlite3.connect(config.store.path)
    seq = conn.execute("SELECT seq FROM events WHERE raw LIKE '%verify me%'").fetchone()[0]
    conn.close()
    assert run_verify(config) == 0
    damage(config, seq)
    capsys.readouterr()
    assert run_verify(config) == 1
    out = capsys.readouterr().out
    assert says in out and f"(events.seq): {seq}" in out


async def test_verify_says_when_the_index_is_not_built_for_the_configuration(tmp_path, capsys):
    """Kinds changed since the relay last started, or the table gone: verify says so and fails."""
    config = make_config(tmp_path)
    await open_and_close(config)
    assert run_verify(make_config(tmp_path, search={"kinds": [1]})) == 1
    assert "search index: not built for this configuration" in capsys.readouterr().out
    tamper(config, f"DROP TABLE {TABLE}")
    assert run_verify(config) == 1
    assert "search index: not built for this configuration" in capsys.readouterr().out

