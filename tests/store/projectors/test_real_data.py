"""The real events (../shared/data/all_real_valid_dedup.jsonl) through `import_lines` into the built-in
projectors: row counts and rows equal a direct computation over the file (NIP-01 live set from the
independent model in tests/store/test_real_data.py), and malformed profiles become refusals, not lost events."""

from __future__ import annotations

import json
import time

import orjson
import pytest

from relay.store.projectors import BUILTIN_PROJECTORS, ProjectorHook
from relay.store.store import Store
from tests.helpers import REAL_EVENTS, Keys, import_into, read_jsonl
from tests.store.projectors.common import OPTIONS, problems, rows
from tests.store.test_real_data import nip_live_ids

MALFORMED = [Keys(0xBAD0 + i).sign(kind=0, content=content, created_at=1_700_000_000)
             for i, content in enumerate(["not json", "[1, 2]", '{"name": 5}', '{"about": {"x": 1}}', '"text"'])]


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """(database path, the input events) after importing the real events plus the malformed profiles."""
    db = tmp_path_factory.mktemp("real") / "relay.db"
    events = read_jsonl(REAL_EVENTS) + MALFORMED
    lines = [orjson.dumps(e) for e in events]

    async def load():
        store = await Store.open(db, OPTIONS, [ProjectorHook(BUILTIN_PROJECTORS)])
        try:
            return await import_into(store, lines)
        finally:
            await store.close()

    import asyncio
    report = asyncio.run(load())
    assert report.stored > 5000
    return db, events


def _live(events):
    live_ids, _ = nip_live_ids(events, time.time())
    return [e for e in {e["id"]: e for e in events}.values() if e["id"] in live_ids]


def _object(content: str):
    try:
        value = json.loads(content)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def test_profiles_are_the_newest_kind0_with_object_content(imported):
    """One row per author whose live (newest by NIP-01) kind 0 has JSON-object content with string fields."""
    db, events = imported
    expected = {}
    for e in _live(events):
        body = _object(e["content"]) if e["kind"] == 0 else None
        if body is None:
            continue
        values = tuple(body.get(k) for k in ("name", "display_name", "about", "picture", "nip05", "lud16"))
        if all(v is None or isinstance(v, str) for v in values):
            expected[e["pubkey"]] = (e["id"], *values)
    stored = {r[0]: r[1:] for r in rows(db, "SELECT pubkey, _event_id, name, display_name, about, picture, nip05,"
                                            " lud16 FROM profiles")}
    assert len(expected) > 1000
    assert stored == expected


def test_follows_and_relay_lists_have_one_row_per_distinct_tag_value(imported):
    """follows: distinct p values of each live kind 3; relay_lists: distinct r values of each live kind 10002."""
    db, events = imported
    live = _live(events)
    follows = {(e["pubkey"], t[1]) for e in live if e["kind"] == 3 for t in e["tags"] if len(t) > 1 and t[0] == "p"}
    relays = {(e["pubkey"], t[1]) for e in live if e["kind"] == 10002 for t in e["tags"] if len(t) > 1 and t[0] == "r"}
    assert len(follows) > 10_000 and len(relays) > 50
    assert set(rows(db, "SELECT pubkey, followed FROM follows")) == follows
    assert set(rows(db, "SELECT pubkey, url FROM relay_lists")) == relays
    markers = {(e["pubkey"], t[1]): t[2] for e in live if e["kind"] == 10002 for t in reversed(e["tags"])
               if len(t) > 2 and t[0] == "r"}
    assert {(p, u): m for p, u, m in rows(db, "SELECT pubkey, url, marker FROM relay_lists") if m} == markers


def test_articles_have_one_row_per_coordinate(imported):
    """articles: one row per live kind 30023 (author, d), with its NIP-23 tags."""
    db, events = imported
    live = [e for e in _live(events) if e["kind"] == 30023]
    expected = {}
    for e in live:
        tags = {}
        for t in e["tags"]:
            if len(t) > 1:
                tags.setdefault(t[0], t[1])
        expected[(e["pubkey"], tags.get("d", ""))] = (tags.get("title"), tags.get("published_at") and
                                                      int(tags["published_at"]))
    stored = {(r[0], r[1]): r[2:] for r in rows(db, "SELECT pubkey, d, title, published_at FROM articles")}
    assert stored == expected and len(stored) >= 1


def test_malformed_profiles_are_stored_and_refused(imported):
    """Each malformed profile is a stored event, has no row, and is in the refusal log with its reason."""
    db, _ = imported
    refusals = dict(rows(db, "SELECT event_id, reason FROM projector_refusals WHERE projector = 'profiles'"))
    for e in MALFORMED:
        assert rows(db, "SELECT count(*) FROM events WHERE id = ?", (bytes.fromhex(e["id"]),)) == [(1,)]
        assert rows(db, "SELECT count(*) FROM profiles WHERE pubkey = ?", (e["pubkey"],)) == [(0,)]
    assert [refusals.get(e["id"]) for e in MALFORMED] == [
        "content is not valid JSON", "content is not a JSON object", "field 'name': expected TEXT, got integer 5",
        "field 'about': expected TEXT, got object {'x': 1}", "content is not a JSON object"]


def test_verify_is_clean_on_the_real_store(imported):
    """`verify` recomputes all four tables from the stored events and finds nothing wrong."""
    assert problems(imported[0], BUILTIN_PROJECTORS) == []
