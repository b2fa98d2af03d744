"""Property tests of NIP-50 search (hypothesis): a live match (`LiveSearch`, one-row FTS5 table) agrees with
what the stored query returns, and no user text makes FTS5 fail."""

from __future__ import annotations

import json
import re
import sqlite3
import time
import unicodedata

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relay.protocol.event import EventLimits, parse_event
from relay.protocol.filters import parse_filter
from relay.protocol.rejection import Rejection
from relay.protocol.search import parse_search
from relay.store.db import migrate
from relay.store.queries import compile_filter, run_query
from relay.store.search import LiveSearch, SearchIndex
from relay.store.writes import Write, apply_batch
from tests.helpers import Keys

SETTINGS = settings(deadline=None, max_examples=100, suppress_health_check=[HealthCheck.too_slow])
KINDS = (0, 1, 30023)
KEYS = [Keys(k) for k in range(1, 4)]
NOW = int(time.time())
WORDS = ["café", "cafe", "CAFÉ", "naïve", "naive", "bitcoin", "bit", "coin", "10:30", "C++", "don't", "über",
         "日本語", "emoji😀", "a-b", "x_y", "OR", "NEAR", "AND", "NOT", "(", ")", '"', "*", ":", "^", "-", "+",
         "domain:example.com", "ﬁ", "İstanbul", "ß", "\u0301", "日本語です", "比特币", "Bitcoinは比特币", "東京", "猫",
         "ビットコイン", "한국어를", "、"]
DOMAINS = ["example.com", "Example.COM", "sub.example.com", "other.org"]

texts = st.lists(st.sampled_from(WORDS), max_size=6).flatmap(
    lambda words: st.sampled_from([" ", "", ".", "\n"]).map(lambda sep: sep.join(words)))
documents = st.tuples(st.sampled_from((1, 0, 30023, 7)), texts, texts, st.sampled_from(DOMAINS))


def variants(word: str) -> list[str]:
    """`word` as a searcher may type it: as written, in other case, without its accents."""
    plain = "".join(c for c in unicodedata.normalize("NFKD", word) if not unicodedata.combining(c))
    return [word, word.upper(), word.lower(), plain]


@st.composite
def queries(draw, pool: list[str]) -> str:
    """A search of 1-3 terms (words, two-word phrases, prefixes) drawn from `pool`, perhaps with a domain:."""
    parts = []
    for _ in range(draw(st.integers(1, 3))):
        word = draw(st.sampled_from(variants(draw(st.sampled_from(pool)))))
        shape = draw(st.sampled_from(("word", "word", "phrase", "prefix")))
        if shape == "phrase":
            word = '"' + word + " " + draw(st.sampled_from(pool)) + '"'
        elif shape == "prefix":
            word = word[:draw(st.integers(1, max(1, len(word))))] + "*"
        parts.append(word)
    if draw(st.booleans()):
        parts.append("domain:" + draw(st.sampled_from(DOMAINS)).lower())
    return " ".join(parts)


def event(i: int, kind: int, text: str, other: str, domain: str):
    keys = KEYS[i % len(KEYS)]
    if kind == 0:
        signed = keys.sign(0, json.dumps({"name": text, "about": other, "nip05": "me@" + domain}),
                           created_at=NOW - i)
    elif kind == 30023:
        signed = keys.sign(30023, other, [["d", str(i)], ["title", text]], created_at=NOW - i)
    else:
        signed = keys.sign(kind, text + " " + other, created_at=NOW - i)
    return parse_event(signed, EventLimits(), time.time())


@SETTINGS
@given(data=st.data(), docs=st.lists(documents, min_size=1, max_size=8))
def test_live_match_agrees_with_the_stored_query(data, docs):
    """For random texts and queries (mostly of the texts' words, as typed in other case or without accents),
    the events a stored search returns are exactly those LiveSearch matches."""
    pool = [w for _, text, other, _ in docs for w in (text + " " + other).split()] or WORDS
    searches = data.draw(st.lists(queries(pool + WORDS[:8]), min_size=1, max_size=4))
    events = [event(i, *doc) for i, doc in enumerate(docs)]
    conn = sqlite3.connect(":memory:", isolation_level=None)
    live = LiveSearch(KINDS)
    try:
        migrate(conn)
        hook = SearchIndex(KINDS)
        hook.setup(conn)
        _, changes = apply_batch(conn, [Write(e) for e in events], [hook])
        kept, _ = changes.net()
        conn.text_factory = bytes  # as the store's read connections, which run_query is written for
        for text in searches:
            try:
                f = parse_filter({"search": text})
            except Rejection:  # e.g. a lone `"`: an empty query, refused before any matching
                continue
            stored = {json.loads(raw)["id"] for raw in run_query(conn, [compile_filter(f, 100, NOW)])}
            assert stored == {e.id for e in kept if live.matches(e, f.search)}, text
    finally:
        live.close()
        conn.close()


@SETTINGS
@given(text=st.text(max_size=80))
def test_no_user_text_makes_fts5_fail(text):
    """Any text is either refused with "invalid:" or becomes a MATCH expression that holds the user's strings
    only inside double quotes and that FTS5 runs without error."""
    try:
        query = parse_search(text, 1024)
    except Rejection as exc:
        assert exc.prefix == "invalid"
        return
    outside = re.sub(r'"(?:[^"]|"")*"', "", query.match_expression())
    assert re.fullmatch(r'(text : \(( \*| )*\))?( AND )?(domain : \(( OR )*\))?', outside), query.match_expression()
    live = LiveSearch(KINDS)
    try:
        live.matches(event(0, 1, text, "", "example.com"), query)
    finally:
        live.close()
