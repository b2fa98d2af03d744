"""The store against real and curated Nostr data (see /work/shared/data/SOURCES.md).

The expected live set is computed by `nip_live_ids`, a deliberately simple
model of NIP-01 / NIP-09 / NIP-40 written from the NIPs over the whole input
at once (order-independent), independently of `relay/store/writes.py`.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import sqlite3
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import orjson
import pytest

from relay.protocol.event import EventLimits, parse_event, verify_signature
from relay.protocol.filters import Filter, parse_filter
from relay.protocol.rejection import Rejection
from relay.store.store import Store
from tests.helpers import DATA, REAL_EVENTS, import_into, read_jsonl

NIP01_KEYS = ("id", "pubkey", "created_at", "kind", "tags", "content", "sig")
CONTROL_CHAR_EVENT = "aa72e0c89dd2a7f2d7e586630069093aba4ce4bfab14343d9c9956a40e5efe10"
BIG = 10**6


# --------------------------------------------------------------------------- the independent model

def canonical(event: dict) -> bytes:
    """Compact NIP-01 JSON of an event, keys in NIP-01 order, non-ASCII verbatim."""
    return json.dumps({k: event[k] for k in NIP01_KEYS}, separators=(",", ":"), ensure_ascii=False).encode()


def _replaceable(kind: int) -> bool:
    return kind in (0, 3) or 10000 <= kind <= 19999


def _addressable(kind: int) -> bool:
    return 30000 <= kind <= 39999


def _ephemeral(kind: int) -> bool:
    return 20000 <= kind <= 29999


def _d_value(event: dict) -> str:
    for tag in event["tags"]:
        if tag and tag[0] == "d":
            return tag[1] if len(tag) > 1 else ""
    return ""


def _coordinate(event: dict):
    if _replaceable(event["kind"]):
        return (event["kind"], event["pubkey"], "")
    if _addressable(event["kind"]):
        return (event["kind"], event["pubkey"], _d_value(event))
    return None


def nip40_expiration(event: dict) -> int | None:
    """NIP-40: the first `expiration` tag's value when it is a decimal unix timestamp, else None."""
    for tag in event["tags"]:
        if len(tag) > 1 and tag[0] == "expiration":
            return int(tag[1]) if re.fullmatch(r"[0-9]+", tag[1]) else None
    return None


def nip_live_ids(events: Iterable[dict], now: float) -> tuple[set[str], Counter]:
    """The ids NIP-01/09/40 leave live from `events` (first of each id wins), and why the others went.

    Ephemeral kinds are never stored, and kind 22242 (NIP-42 AUTH) is refused;
    expired events (NIP-40) are refused;
    a replaceable/addressable coordinate keeps its newest version (ties: lowest
    id), chosen among every accepted version, deleted or not (the high-water
    mark survives deletion); kind-5 `e` tags delete the deleter's own non-kind-5
    events; `a` tags delete the deleter's own coordinate up to the deletion's
    created_at.
    """
    first: dict[str, dict] = {}
    for event in events:
        first.setdefault(event["id"], event)
    why: Counter = Counter()
    accepted = []
    for event in first.values():
        if event["kind"] == 22242:
            why["AUTH kind (refused)"] += 1
        elif _ephemeral(event["kind"]):
            why["ephemeral (not stored)"] += 1
        elif (exp := nip40_expiration(event)) is not None and exp <= now:
            why["expired (refused)"] += 1
        else:
            accepted.append(event)

    deleted: set[tuple[str, str]] = set()  # (target id, deleter pubkey)
    deleted_until: dict[tuple, int] = {}   # coordinate -> newest deletion created_at
    for event in accepted:
        if event["kind"] != 5:
            continue
        for tag in event["tags"]:
            if len(tag) < 2:
                continue
            if tag[0] == "e":
                deleted.add((tag[1], event["pubkey"]))
            elif tag[0] == "a":
                parts = tag[1].split(":", 2)
                if len(parts) != 3 or not re.fullmatch(r"[0-9]+", parts[0]) or parts[1] != event["pubkey"]:
                    continue
                kind = int(parts[0])
                if _replaceable(kind):
                    coord = (kind, parts[1], "")
                elif _addressable(kind):
                    coord = (kind, parts[1], parts[2])
                else:
                    continue
                deleted_until[coord] = max(deleted_until.get(coord, -1), event["created_at"])

    newest: dict[tuple, dict] = {}
    for event in accepted:
        coord = _coordinate(event)
        if coord is None:
            continue
        best = newest.get(coord)
        if best is None or (event["created_at"], best["id"]) > (best["created_at"], event["id"]):
            newest[coord] = event

    live = set()
    for event in accepted:
        coord = _coordinate(event)
        if event["kind"] != 5 and (event["id"], event["pubkey"]) in deleted:
            why["deleted by e tag"] += 1
        elif coord is not None and newest[coord] is not event:
            why["superseded"] += 1
        elif coord is not None and event["created_at"] <= deleted_until.get(coord, -1):
            why["deleted by a tag"] += 1
        else:
            why["live"] += 1
            live.add(event["id"])
    return live, why


# --------------------------------------------------------------------------- helpers

async def stored_raw(store: Store) -> dict[str, bytes]:
    """id -> raw JSON of every live event in `store` (a full scan)."""
    out = {}
    async for raw in store.scan(Filter()):
        out[orjson.loads(raw)["id"]] = bytes(raw)
    return out


async def query(store: Store, obj: dict) -> list[bytes]:
    return [bytes(r) for r in await store.query([parse_filter(obj)], BIG, BIG)]


def _lines(path: Path) -> list[bytes]:
    return [line for line in path.read_bytes().splitlines() if line.strip()]


def _import(path: Path, lines: list[bytes]):
    async def run():
        store = await Store.open(path)
        try:
            return await import_into(store, lines)
        finally:
            await store.close()
    return asyncio.run(run())


@pytest.fixture(scope="module")
def real():
    """(events as dicts, raw lines) of all_real_valid_dedup.jsonl."""
    lines = _lines(REAL_EVENTS)
    return [json.loads(line) for line in lines], lines


@pytest.fixture(scope="module")
def imported(real, tmp_path_factory):
    """A SQLite file holding all_real_valid_dedup.jsonl imported with `import_lines`, and the report."""
    path = tmp_path_factory.mktemp("real") / "relay.db"
    return path, _import(path, real[1])


@pytest.fixture
async def real_store(imported):
    store = await Store.open(imported[0])
    yield store
    await store.close()


# --------------------------------------------------------------------------- the real data set

async def test_import_leaves_exactly_the_nip_live_set(real, imported, real_store):
    """Importing all_real_valid_dedup.jsonl leaves exactly the ids the independent NIP-01/09/40 model keeps."""
    events, _ = real
    live, why = nip_live_ids(events, time.time())
    report = imported[1]
    print(f"\nmodel breakdown: {dict(why)}\nimport report: stored={report.stored} "
          f"duplicate={report.duplicate} ephemeral={report.ephemeral} rejected={dict(report.rejected)}")
    assert report.total == len(events)
    assert report.ephemeral == why["ephemeral (not stored)"]
    invalid = {m: n for m, n in report.rejected.items() if m.startswith("invalid:")}
    assert invalid == {"invalid: event has expired": why["expired (refused)"],
                       "invalid: kind 22242 is sent with AUTH, not EVENT (NIP-42)": why["AUTH kind (refused)"]}, \
        report.rejected
    stored = set(await stored_raw(real_store))
    assert stored == live, (f"missing {sorted(live - stored)[:10]} ({len(live - stored)}), "
                            f"extra {sorted(stored - live)[:10]} ({len(stored - live)})")
    # The data must exercise every rule, or this test proves less than it says.
    for reason in ("superseded", "deleted by e tag", "deleted by a tag", "expired (refused)",
                   "ephemeral (not stored)"):
        assert why[reason] > 0, reason


async def test_every_live_event_is_stored_byte_identical(real, real_store):
    """Every stored event's raw JSON equals its compact NIP-01 serialization (and its line in the file)."""
    events, lines = real
    by_id = {e["id"]: (e, line) for e, line in zip(events, lines)}
    stored = await stored_raw(real_store)
    assert stored
    for event_id, raw in stored.items():
        event, line = by_id[event_id]
        assert raw == canonical(event) == line, event_id


@pytest.mark.parametrize("obj", [{}, {"kinds": [1]}, {"kinds": [1], "limit": 37}, {"limit": 1}])
async def test_query_answers_newest_first_ties_by_lowest_id_within_the_limit(real, real_store, obj):
    """NIP-01 order of stored results: created_at descending, the lowest id first on a tie, `limit` newest."""
    events = [orjson.loads(raw) for raw in (await stored_raw(real_store)).values()]
    matching = [e for e in events if "kinds" not in obj or e["kind"] in obj["kinds"]]
    expected = [e["id"] for e in sorted(matching, key=lambda e: (-e["created_at"], e["id"]))][:obj.get("limit", BIG)]
    ties = Counter(e["created_at"] for e in matching)
    assert max(ties.values()) > 1, "the data must hold ties on created_at, or the tie order is untested"
    assert [orjson.loads(raw)["id"] for raw in await query(real_store, obj)] == expected


def test_tag_index_holds_exactly_the_single_letter_tags_of_live_events(real, imported):
    """After the import, the tag index rows are exactly (letter, first value, created_at, id) of every live event's tags."""
    events, _ = real
    live, _ = nip_live_ids(events, time.time())
    expected = {(t[0], t[1], e["created_at"], e["id"]) for e in events if e["id"] in live for t in e["tags"]
                if len(t) > 1 and len(t[0]) == 1 and t[0].isascii() and t[0].isalpha()}
    conn = sqlite3.connect(imported[0])
    try:
        rows = {(n, v, c, i.hex()) for n, v, c, i in conn.execute(
            "SELECT t.name, t.value, t.created_at, e.id FROM tags t JOIN events e ON e.seq = t.seq")}
        orphans = conn.execute("SELECT count(*) FROM tags WHERE seq NOT IN (SELECT seq FROM events)").fetchone()[0]
    finally:
        conn.close()
    assert orphans == 0
    assert rows == expected, (f"missing {len(expected - rows)}: {sorted(expected - rows)[:5]}, "
                              f"extra {len(rows - expected)}: {sorted(rows - expected)[:5]}")


async def test_every_live_event_is_found_by_its_first_single_letter_tag(real, real_store):
    """Every live event with a single-letter tag is served byte-identical by a tag query on its first such tag."""
    events, _ = real
    live, _ = nip_live_ids(events, time.time())
    checked, missing = 0, []
    for event in events:
        if event["id"] not in live:
            continue
        tag = next((t for t in event["tags"]
                    if len(t) > 1 and len(t[0]) == 1 and t[0].isascii() and t[0].isalpha()), None)
        if tag is None:
            continue
        checked += 1
        got = await query(real_store, {f"#{tag[0]}": [tag[1]], "since": event["created_at"],
                                       "until": event["created_at"]})
        if canonical(event) not in got:
            missing.append((event["id"], event["kind"], tag[:2]))
    assert checked > 3000
    assert missing == [], f"{len(missing)} live events not found by their tag: {missing[:5]}"


async def test_sample_served_byte_identical_by_id_author_kind_and_tag(real, real_store):
    """A sample of live events comes back byte-identical through id, author, author+kind, kind and tag queries."""
    events, _ = real
    live, _ = nip_live_ids(events, time.time())
    by_id = {e["id"]: e for e in events}
    sample = [by_id[i] for i in random.Random(1).sample(sorted(live), 300)]
    kind_cache: dict[int, set[bytes]] = {}
    tag_queries = 0
    for event in sample:
        expected = canonical(event)
        assert await query(real_store, {"ids": [event["id"]]}) == [expected]
        assert expected in await query(real_store, {"authors": [event["pubkey"]]})
        assert expected in await query(real_store, {"authors": [event["pubkey"]], "kinds": [event["kind"]]})
        if event["kind"] not in kind_cache:
            kind_cache[event["kind"]] = set(await query(real_store, {"kinds": [event["kind"]]}))
        assert expected in kind_cache[event["kind"]]
        single = [t for t in event["tags"] if len(t) > 1 and len(t[0]) == 1 and t[0].isascii() and t[0].isalpha()]
        for tag in single[:2]:
            tag_queries += 1
            assert expected in await query(real_store, {f"#{tag[0]}": [tag[1]]}), tag
            assert await query(real_store, {f"#{tag[0]}": [tag[1]], "ids": [event["id"]]}) == [expected]
    assert tag_queries > 100


async def test_sample_served_byte_identical_through_the_server(real, relay, client):
    """Live real events published over the WebSocket come back in REQ frames byte-identical, newest first."""
    events, _ = real
    live, _ = nip_live_ids(events, time.time())
    by_id = {e["id"]: e for e in events}
    sample = [by_id[i] for i in random.Random(2).sample(sorted(live), 150)]
    for event in sample:
        assert await client.publish(event) == ["OK", event["id"], True, ""]
    ordered = sorted(sample, key=lambda e: (-e["created_at"], e["id"]))
    await client.send(["REQ", "all", {"ids": [e["id"] for e in sample]}])
    frames = [await client.ws.recv() for _ in range(len(sample) + 1)]
    assert frames[-1] == '["EOSE","all"]'
    assert [f.encode() for f in frames[:-1]] == [b'["EVENT","all",' + canonical(e) + b"]" for e in ordered]
    for event in sample[:40]:
        await client.send(["REQ", "one", {"authors": [event["pubkey"]], "kinds": [event["kind"]]}])
        frames = []
        while (frame := await client.ws.recv()) != '["EOSE","one"]':
            frames.append(frame.encode())
        assert b'["EVENT","one",' + canonical(event) + b"]" in frames


# --------------------------------------------------------------------------- negative cases

def _invalid_lines() -> list[dict]:
    return [row for path in sorted((DATA / "invalid").glob("*.jsonl")) for row in read_jsonl(path)]


def _refusal(obj: object) -> str | None:
    """The "prefix: reason" refusal of parse_event + verify_signature, or None when the event passes."""
    try:
        event = parse_event(obj, EventLimits(), time.time())
    except Rejection as rejection:
        return str(rejection)
    return None if verify_signature(event) else "invalid: bad signature"


def test_every_invalid_event_is_refused_invalid():
    """The `event` of every line under DATA/invalid/ is refused by parse_event + verify_signature with "invalid:"."""
    rows = _invalid_lines()
    assert len(rows) == 162
    for row in rows:
        message = _refusal(row["event"])
        assert message is not None and message.startswith("invalid:"), (row["source"], row["reason"], message)


async def test_invalid_events_are_refused_invalid_by_the_server(client):
    """Invalid events sent over the WebSocket get OK false "invalid:" echoing their id when it is a 64-character
    string, even a malformed one (NOTICE "invalid:" when there is no such id to echo)."""
    rows = _invalid_lines()
    sample = random.Random(3).sample(rows, 60)
    sample += [r for r in rows if r["reason"] in ("bad_signature", "bad_id_format", "bad_sig_format")]
    for row in sample:
        event = row["event"]
        await client.send(json.dumps(["EVENT", event]))
        reply = await client.recv()
        ref = event.get("id") if isinstance(event, dict) else None
        if isinstance(ref, str) and len(ref) == 64:
            assert reply[:3] == ["OK", ref, False] and reply[3].startswith("invalid:"), (row["reason"], reply)
        else:
            assert reply[0] == "NOTICE" and reply[1].startswith("invalid:"), (row["reason"], reply)
    await client.send(["REQ", "any", {}])
    assert await client.recv() == ["EOSE", "any"]


# --------------------------------------------------------------------------- edge cases

async def test_same_id_with_several_valid_signatures_is_stored_once(tmp_path):
    """Events repeating one id with different valid signatures are stored once (the first), as NIP-01/09 leave them."""
    path = DATA / "edge_cases" / "same_id_multiple_valid_sigs.jsonl"
    lines = _lines(path)
    events = [json.loads(line) for line in lines]
    first: dict[str, dict] = {}
    for event in events:
        first.setdefault(event["id"], event)
    assert len(first) < len(events)
    assert any(len({e["sig"] for e in events if e["id"] == i}) > 1 for i in first)
    now = time.time()
    # Beyond NIP-01: the relay refuses created_at more than 900 s ahead (one id here says 2100-01-01).
    future = [e for e in events if e["created_at"] > now + EventLimits().max_created_at_future_seconds]
    live, why = nip_live_ids([e for e in events if e not in future], now)
    store = await Store.open(tmp_path / "relay.db")
    try:
        report = await import_into(store, lines)
        invalid = {m: n for m, n in report.rejected.items() if m.startswith("invalid:")}
        assert invalid == ({"invalid: created_at is too far in the future": len(future)} if future else {})
        stored = await stored_raw(store)
        ids = sql_ids(tmp_path / "relay.db")
        assert len(ids) == len(set(ids)) == len(stored)
    finally:
        await store.close()
    print(f"\nsame-id edge cases: {len(events)} lines, {len(first)} ids, model: {dict(why)}")
    assert set(stored) == live
    for event_id, raw in stored.items():
        assert raw == canonical(first[event_id]), event_id


def sql_ids(path: Path) -> list[bytes]:
    """Every id in the events table of the SQLite file at `path`, read with plain sqlite3."""
    conn = sqlite3.connect(path)
    try:
        return [row[0] for row in conn.execute("SELECT id FROM events")]
    finally:
        conn.close()


async def test_control_character_event_verifies_and_is_served_byte_identical(tmp_path, relay, client):
    """The synthetic event with \\b, \\f, \\u0001, \\u001f, U+2028 and U+2029 verifies, is stored and served byte-identical."""
    lines = _lines(DATA / "events_synthetic" / "nostrbook-synthetic.jsonl")
    line = next(line for line in lines if json.loads(line)["id"] == CONTROL_CHAR_EVENT)
    obj = json.loads(line)
    for needle in ("\b", "\f", "\x01", "\x1f", "\u2028", "\u2029"):
        assert needle in obj["content"] or any(needle in v for t in obj["tags"] for v in t), repr(needle)
    assert canonical(obj) == line
    assert b"\\u0001" in line and b"\\u001f" in line and "\u2028".encode() in line
    event = parse_event(obj, EventLimits(), time.time())
    assert verify_signature(event)
    assert event.raw == line

    store = await Store.open(tmp_path / "own.db")
    try:
        assert await store.submit(event) == (True, "")
        assert await query(store, {"ids": [obj["id"]]}) == [line]
        assert await query(store, {"kinds": [obj["kind"]], "authors": [obj["pubkey"]]}) == [line]
    finally:
        await store.close()

    assert await client.publish(obj) == ["OK", obj["id"], True, ""]
    await client.send(["REQ", "cc", {"ids": [obj["id"]]}])
    assert (await client.ws.recv()).encode() == b'["EVENT","cc",' + line + b"]"
    assert await client.ws.recv() == '["EOSE","cc"]'
