"""Property tests of the store (hypothesis): SQL queries agree with `Filter.matches`, the
live set does not depend on arrival order or batching, and hostile `a` / `expiration`
tag values are handled as NIP-09 / NIP-40 say.

Each example opens fresh SQLite files in a temporary directory and drives the
real `Store` with `asyncio.run` (hypothesis needs a synchronous test body).
Signed events are cached, so signing costs nothing after the first examples.
"""

from __future__ import annotations

import asyncio
import json
import random
import sqlite3
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import orjson
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from relay.protocol.event import EventLimits, parse_event
from relay.protocol.filters import Filter, parse_filter
from relay.protocol.rejection import Rejection
from relay.store.store import Store, StoreOptions
from tests.helpers import Keys
from tests.store.test_real_data import canonical, nip40_expiration, nip_live_ids

BIG = 10**6
OPTIONS = StoreOptions(read_connections=2)
SETTINGS = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])

_signed: dict[tuple, dict] = {}


def sign(keys: Keys, kind: int, content: str, tags: list, created_at: int) -> dict:
    """A signed event, cached by its content so each distinct event is signed once per run."""
    key = (keys.pubkey, kind, content, json.dumps(tags), created_at)
    if key not in _signed:
        _signed[key] = keys.sign(kind, content, tags, created_at)
    return _signed[key]


def parsed(event: dict):
    return parse_event(event, EventLimits(), time.time())


def ids_of(raws) -> list[str]:
    return [orjson.loads(r)["id"] for r in raws]


async def submit_all(store: Store, events: list[dict]) -> None:
    for event in events:
        await store.submit(parsed(event))


async def live_ids(store: Store) -> set[str]:
    return {orjson.loads(raw)["id"] async for raw in store.scan(Filter())}


def table_rows(path: Path) -> tuple[set[str], set[tuple], int]:
    """(ids in `events`, tag index rows as (name, value, created_at, id), orphan tag rows) of a closed store file."""
    conn = sqlite3.connect(path)
    try:
        ids = {r[0].hex() for r in conn.execute("SELECT id FROM events")}
        tags = {(n, v, c, i.hex()) for n, v, c, i in conn.execute(
            "SELECT t.name, t.value, t.created_at, e.id FROM tags t JOIN events e ON e.seq = t.seq")}
        orphans = conn.execute("SELECT count(*) FROM tags WHERE seq NOT IN (SELECT seq FROM events)").fetchone()[0]
        return ids, tags, orphans
    finally:
        conn.close()


def expected_tag_rows(events: list[dict]) -> set[tuple]:
    """The single-letter tag index rows NIP-01 filters need for `events`."""
    return {(t[0], t[1], e["created_at"], e["id"]) for e in events for t in e["tags"]
            if len(t) > 1 and len(t[0]) == 1 and t[0].isascii() and t[0].isalpha()}


# =========================================================================== queries vs Filter.matches

AUTHORS = [Keys(0xF11_7E5 + i) for i in range(3)]
PUBKEYS = [k.pubkey for k in AUTHORS]
UNKNOWN = "f" * 64
E_VALUES = ["%064x" % (0xE0 + i) for i in range(3)]
T_VALUES = ["x", "y", "z"]
KINDS = [1, 7, 42]  # regular kinds: no supersession interferes with matching
TIMES = range(1000, 1004)


def _pool() -> list[dict]:
    """A fixed pool of regular events by 3 authors with ties on created_at and overlapping e/p/t tags."""
    rng = random.Random(20261129)
    candidates = (
        [["e", v] for v in E_VALUES] + [["e", E_VALUES[0], "wss://r.example", "reply"]]
        + [["p", v] for v in PUBKEYS] + [["t", v] for v in T_VALUES]
        + [["t"], ["T", "x"], ["tt", "x"], ["expiration", "9999999999"]]
    )
    pool = [sign(AUTHORS[0], 1, "pool 0", [["t", "x"], ["t", "y"], ["p", PUBKEYS[1]]], 1001)]
    for i in range(1, 60):
        tags = [rng.choice(candidates) for _ in range(rng.randint(0, 4))]
        pool.append(sign(rng.choice(AUTHORS), rng.choice(KINDS), f"pool {i}", tags, rng.choice(TIMES)))
    return pool


POOL = _pool()
POOL_EVENTS = [parsed(e) for e in POOL]


def _values(options: list) -> st.SearchStrategy:
    return st.lists(st.sampled_from(options), max_size=3)  # empty lists too: they match nothing


filter_objects = st.fixed_dictionaries({}, optional={
    "ids": _values([e["id"] for e in POOL[:12]] + [UNKNOWN]),
    "authors": _values(PUBKEYS + [UNKNOWN]),
    "kinds": _values(KINDS + [5]),
    "#e": _values(E_VALUES + ["nope"]),
    "#p": _values(PUBKEYS + [UNKNOWN]),
    "#t": _values(T_VALUES + ["nope"]),
    "#T": _values(["x", "y"]),
    "since": st.integers(999, 1004),
    "until": st.integers(999, 1004),
    "limit": st.just(BIG),
})


def _newest_first(events) -> list[str]:
    return [e.id for e in sorted(events, key=lambda e: (-e.created_at, e.id))]


@settings(SETTINGS, max_examples=50)
@given(chosen=st.sets(st.integers(0, len(POOL) - 1), min_size=1, max_size=40),
       objs=st.lists(filter_objects, min_size=1, max_size=4), small=st.integers(1, 5))
@example(chosen={0}, objs=[{"#t": ["x", "y"]}], small=1)
def test_query_and_count_agree_with_filter_matches(chosen, objs, small):
    """store.query returns exactly the events Filter.matches accepts, newest first then lowest id, each once; COUNT agrees."""
    events = [POOL_EVENTS[i] for i in sorted(chosen)]

    async def run(path: Path) -> None:
        store = await Store.open(path, OPTIONS)
        try:
            await submit_all(store, [POOL[i] for i in sorted(chosen)])
            filters = [parse_filter(o) for o in objs]
            for obj, f in zip(objs, filters):
                expected = _newest_first(e for e in events if f.matches(e))
                assert ids_of(await store.query([f], BIG, BIG)) == expected, obj
                limited = parse_filter({**obj, "limit": small})
                assert ids_of(await store.query([limited], BIG, BIG)) == expected[:small], obj
                assert await store.count([f]) == len(expected), obj
            union = [e for e in events if any(f.matches(e) for f in filters)]
            assert ids_of(await store.query(filters, BIG, BIG)) == _newest_first(union), objs
            assert await store.count(filters) == len(union), objs
        finally:
            await store.close()

    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(run(Path(tmp) / "q.db"))


# =========================================================================== order independence

WRITERS = [Keys(0xD0C5 + i) for i in range(2)]
BASE_KINDS = [1, 0, 3, 10002, 30000, 30001]


@dataclass(frozen=True)
class Spec:
    """One event to sign: author index, kind, created_at, content, d tag, and for kind 5 its targets.

    `e_refs` are indices of earlier specs (so deletions of deletions happen);
    `a_refs` are (kind, author index, d) coordinates.
    """

    author: int
    kind: int
    created_at: int
    content: str = ""
    d: str | None = None
    e_refs: tuple[int, ...] = ()
    a_refs: tuple[tuple[int, int, str], ...] = ()


@dataclass
class Scenario:
    specs: list[Spec]
    order1: list[int]        # fed one event at a time
    order2: list[int]        # fed in batches (may repeat events)
    cuts: list[int] = field(default_factory=list)  # batch sizes for order2

    def events(self) -> list[dict]:
        out: list[dict] = []
        for s in self.specs:
            tags = [["d", s.d]] if s.d is not None else []
            tags += [["e", out[i]["id"]] for i in s.e_refs]
            tags += [["a", f"{k}:{WRITERS[a].pubkey}:{d}"] for k, a, d in s.a_refs]
            out.append(sign(WRITERS[s.author], s.kind, s.content, tags, s.created_at))
        return out

    def batches(self, events: list[dict]) -> list[list[dict]]:
        seq = [events[i] for i in self.order2]
        out, start = [], 0
        for size in self.cuts + [len(seq)]:
            if start >= len(seq):
                break
            out.append(seq[start:start + size])
            start += size
        return out


@st.composite
def scenarios(draw) -> Scenario:
    specs: list[Spec] = []
    for _ in range(draw(st.integers(1, 8))):
        kind = draw(st.sampled_from(BASE_KINDS))
        d = draw(st.sampled_from([None, "", "x", "y"])) if kind >= 30000 else None
        specs.append(Spec(draw(st.integers(0, 1)), kind, draw(st.integers(10, 12)),
                          draw(st.sampled_from(["", "a", "b"])), d))
    for _ in range(draw(st.integers(0, 4))):
        e_refs = draw(st.lists(st.integers(0, len(specs) - 1), max_size=3, unique=True))
        a_refs = draw(st.lists(st.tuples(st.sampled_from([0, 3, 10002, 30000, 30001, 1]),
                                         st.integers(0, 1), st.sampled_from(["", "x"])), max_size=2))
        specs.append(Spec(draw(st.integers(0, 1)), 5, draw(st.integers(9, 13)),
                          e_refs=tuple(e_refs), a_refs=tuple(a_refs)))
    n = len(specs)
    order1 = draw(st.permutations(range(n)))
    repeats = draw(st.lists(st.integers(0, n - 1), max_size=3))
    order2 = draw(st.permutations(list(range(n)) + repeats))
    cuts = draw(st.lists(st.integers(1, 6), max_size=4))
    return Scenario(specs, list(order1), list(order2), cuts)


# A replaceable event, a newer version, and a deletion (e tag) of the newer one. Arriving
# deletion-first must leave what arriving deletion-last leaves: no version (NIP-09 + the
# high-water mark of invariant 5, docs/architecture.md).
_TOMBSTONE_FIRST = Scenario(
    [Spec(0, 0, 10, "old"), Spec(0, 0, 11, "new"), Spec(0, 5, 12, e_refs=(1,))],
    order1=[0, 1, 2], order2=[2, 0, 1], cuts=[1, 1, 1])


# Two versions of one addressable coordinate in ONE batch: the newer must keep its tag rows (#d).
_SAME_BATCH_VERSIONS = Scenario(
    [Spec(0, 30000, 10, "v1", "x"), Spec(0, 30000, 11, "v2", "x")],
    order1=[0, 1], order2=[0, 1], cuts=[2])


@settings(SETTINGS, max_examples=100)
@given(scenario=scenarios())
@example(scenario=_TOMBSTONE_FIRST)
@example(scenario=_SAME_BATCH_VERSIONS)
def test_live_set_is_independent_of_order_and_batching(scenario):
    """Two orders (one at a time vs gathered batches, with repeats) of replacements and deletions leave the same live set, the NIP one."""
    events = scenario.events()
    expected, _ = nip_live_ids(events, time.time())

    async def one_at_a_time(path: Path) -> set[str]:
        store = await Store.open(path, OPTIONS)
        try:
            for i in scenario.order1:
                accepted, message = await store.submit(parsed(events[i]))
                assert accepted or not message.startswith("invalid:"), message
            return await live_ids(store)
        finally:
            await store.close()

    async def batched(path: Path) -> set[str]:
        store = await Store.open(path, OPTIONS)
        try:
            for batch in scenario.batches(events):
                await asyncio.gather(*[store.submit(parsed(e)) for e in batch])
            return await live_ids(store)
        finally:
            await store.close()

    with tempfile.TemporaryDirectory() as tmp:
        first = asyncio.run(one_at_a_time(Path(tmp) / "one.db"))
        second = asyncio.run(batched(Path(tmp) / "batched.db"))
        rows1 = table_rows(Path(tmp) / "one.db")
        rows2 = table_rows(Path(tmp) / "batched.db")
    by_id = {e["id"]: e for e in events}
    described = [(s.kind, s.created_at, s.author, s.d, s.e_refs, s.a_refs, events[i]["id"][:8])
                 for i, s in enumerate(scenario.specs)]
    assert first == second == expected, (described, sorted(first), sorted(second), sorted(expected))
    for ids, tags, orphans in (rows1, rows2):
        assert ids == expected
        assert tags == expected_tag_rows([by_id[i] for i in expected])
        assert orphans == 0


# =========================================================================== hostile tag values

DELETER = WRITERS[0]
_TARGETS = [sign(DELETER, 3, "follows", [], 20), sign(DELETER, 0, "profile", [], 20),
            sign(DELETER, 30000, "set", [["d", "x"]], 20), sign(DELETER, 1, "note", [], 20)]

kind_texts = st.one_of(
    st.text(max_size=6),
    st.text(st.characters(categories=["Nd", "No", "Nl"]), min_size=1, max_size=5),
    st.sampled_from(["3", "0", "30000", "00003", "1", "99999", "-3", " 3", "3.0"]),
)


@settings(SETTINGS, max_examples=40)
@given(kind_text=kind_texts, d=st.sampled_from(["", "x", "x:y"]))
@example(kind_text="²", d="x")        # str.isdigit() is True, int() raises
@example(kind_text="٣", d="")         # ARABIC-INDIC DIGIT THREE: not a NIP-01 kind integer
def test_any_a_tag_value_in_a_deletion_is_handled_as_nip09_says(kind_text, d):
    """A kind-5 `a` tag with any text as its kind is accepted, deletes only a real own coordinate, and the store keeps working."""
    deletion = sign(DELETER, 5, "", [["a", f"{kind_text}:{DELETER.pubkey}:{d}"]], 30)
    later = sign(DELETER, 1, "after", [], 40)
    expected, _ = nip_live_ids(_TARGETS + [deletion, later], time.time())

    async def run(path: Path) -> set[str]:
        store = await Store.open(path, OPTIONS)
        try:
            await submit_all(store, _TARGETS)
            assert await store.submit(parsed(deletion)) == (True, "")
            assert await store.submit(parsed(later)) == (True, "")
            return await live_ids(store)
        finally:
            await store.close()

    with tempfile.TemporaryDirectory() as tmp:
        assert asyncio.run(run(Path(tmp) / "a.db")) == expected


@settings(SETTINGS, max_examples=60)
@given(value=st.one_of(st.text(max_size=12),
                       st.text(st.characters(categories=["Nd", "No"]), min_size=1, max_size=4),
                       st.integers(0, 10**20).map(str)))
@example(value="²")          # str.isdigit() is True, int() raises ValueError
@example(value="１２３")     # FULLWIDTH digits: not a unix timestamp
def test_any_expiration_value_parses_to_the_nip40_expiry_or_a_rejection(value):
    """parse_event on an `expiration` tag of any text returns the NIP-40 expiry (decimal digits only) or refuses "invalid:"."""
    event = sign(DELETER, 1, "exp", [["expiration", value]], 50)
    try:
        got = parse_event(event, EventLimits(), time.time())
    except Rejection as rejection:
        assert str(rejection).startswith("invalid:")
        return
    wanted = nip40_expiration(event)
    # Past 18 digits (beyond year 30 billion) "never" is as good as the exact value.
    assert got.expiration == wanted or (got.expiration is None and wanted >= 10**18), (value, got.expiration)
    assert got.raw == canonical(event)
