"""The NIP-77 negentropy index (relay/store/negentropy/): cost, agreement, consistency.

* Cost, measured by counting the rows every statement returns through a
  wrapped sqlite3 connection: a full-range fingerprint over 100,000 items
  reads at most 2,000 rows, and a whole reconciliation message far fewer
  than the items.
* Agreement: fingerprints, items, lower bounds and id lists of the index
  (with since/until/limit windows) equal those of the engine's SortedVector
  over the same items.
* Consistency (hypothesis): after random inserts, replacements, deletions
  and expiries through the real `Store`, every persisted index equals the
  one recomputed from `events`, node sums included.
"""

from __future__ import annotations

import asyncio
import random
import sqlite3
import tempfile
import time
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relay.protocol.event import EventLimits, parse_event
from relay.protocol.filters import Filter, parse_filter
from relay.protocol.negentropy import INFINITY, Bound, Negentropy, SortedVector, fingerprint
from relay.store import db
from relay.store.negentropy import (
    DropNegentropyIndex,
    GroupCache,
    IndexReader,
    IndexView,
    NegentropyIndex,
    build_nodes,
    check_nodes,
    filter_spec,
    indexed_items,
    public_spec,
    reconcile_from_index,
    recompute,
    update_items,
    window_segments,
)
from relay.store.store import Store, StoreOptions
from tests.helpers import Keys

T0 = 1_700_000_000


class CountingConnection:
    """A sqlite3 connection whose statements count the rows they return (`rows`)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.rows = 0

    def execute(self, sql: str, params=()):
        return _CountingCursor(self.conn.execute(sql, params), self)


class _CountingCursor:
    def __init__(self, cursor: sqlite3.Cursor, owner: CountingConnection) -> None:
        self.cursor = cursor
        self.owner = owner

    def _count(self, rows):
        self.owner.rows += len(rows)
        return rows

    def fetchall(self):
        return self._count(self.cursor.fetchall())

    def fetchmany(self, size: int):
        return self._count(self.cursor.fetchmany(size))

    def fetchone(self):
        row = self.cursor.fetchone()
        self.owner.rows += row is not None
        return row

    def __iter__(self):
        for row in self.cursor:
            self.owner.rows += 1
            yield row


def open_index(path: Path, max_children: int = 256) -> tuple[sqlite3.Connection, NegentropyIndex, int]:
    """A migrated database with the full-set index set up: (connection, hook, filter_no of {})."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = OFF")
    db.migrate(conn)
    index = NegentropyIndex(max_children=max_children)
    index.setup(conn)
    return conn, index, index.filter_no(Filter())


def write(conn: sqlite3.Connection, number: int, adds, removes=(), max_children: int = 256) -> None:
    cur = conn.cursor()
    cur.execute("BEGIN IMMEDIATE")
    update_items(cur, number, list(adds), list(removes), max_children)
    cur.execute("COMMIT")


def synthetic(n: int, rng: random.Random, span: int) -> list[tuple[int, bytes]]:
    return [(T0 + rng.randrange(span), rng.randbytes(32)) for _ in range(n)]


# ---------------------------------------------------------------- cost


def test_full_range_fingerprint_of_100k_items_reads_at_most_2000_rows(tmp_path):
    """100,000 items added in time order through the hook's API: a full-range fingerprint reads <= 2,000 rows."""
    conn, _, number = open_index(tmp_path / "n.db")
    rng = random.Random(1)
    items = []
    for batch in range(20):  # 20 transactions of 5,000 newer items each, as a relay receives them
        chunk = sorted((T0 + batch * 5000 + rng.randrange(5000), rng.randbytes(32)) for _ in range(5000))
        write(conn, number, chunk)
        items.extend(chunk)
    counting = CountingConnection(conn)
    reader = IndexReader(counting, number)
    view = IndexView(reader, [(0, reader.size)])
    assert view.size() == 100_000
    assert view.fingerprint(0, view.size()) == fingerprint(i for _, i in items)
    assert counting.rows <= 2_000, counting.rows
    assert check_nodes(conn, number) == []

    # A freshly built index is as cheap.
    conn.execute("BEGIN")
    build_nodes(conn, number, indexed_items(conn, number))
    conn.execute("COMMIT")
    counting = CountingConnection(conn)
    reader = IndexReader(counting, number)
    assert IndexView(reader, [(0, reader.size)]).fingerprint(0, 100_000) == fingerprint(i for _, i in items)
    assert counting.rows <= 2_000, counting.rows


def test_reconciliation_messages_read_far_fewer_rows_than_items(tmp_path):
    """A peer 500 events behind (plus 30 of its own) reconciles 100,000 indexed items exactly, < 10,000 rows a message."""
    conn, _, number = open_index(tmp_path / "n.db")
    rng = random.Random(2)
    items = sorted(synthetic(100_000, rng, 10**7))
    conn.execute("BEGIN")
    build_nodes(conn, number, items)
    conn.execute("COMMIT")
    ours = set(items[:-500]) | {(T0 + 10**7 + k, rng.randbytes(32)) for k in range(30)}
    client = Negentropy(SortedVector.from_items(ours), 500_000)
    message, have, need, rows = client.initiate(), set(), set(), []
    while message is not None:
        counting = CountingConnection(conn)
        conn.execute("BEGIN")
        reply = reconcile_from_index(counting, number, Filter(), message, 500_000)
        conn.execute("COMMIT")
        rows.append(counting.rows)
        message, h, n = client.reconcile_with_ids(reply)
        have |= set(h)
        need |= set(n)
    assert need == {i for _, i in items[-500:]}
    assert have == {i for _, i in ours - set(items)}
    assert max(rows) < 10_000, rows


def test_group_cache_serves_unchanged_groups_and_never_stale_ones(tmp_path):
    """A later message decodes no unchanged group again; a write below a group makes readers decode it anew."""
    conn, _, number = open_index(tmp_path / "n.db", 16)  # small nodes: many groups
    rng = random.Random(4)
    items = sorted(synthetic(3000, rng, 10**6))
    write(conn, number, items, (), 16)
    groups = conn.execute("SELECT count(*) FROM neg_nodes WHERE filter_no = ? AND level = 2", (number,)).fetchone()[0]
    assert groups > 10
    cache = GroupCache(10**6)
    everything = np.arange(len(items) + 1)
    first = CountingConnection(conn)
    reader = IndexReader(first, number, cache)
    sums = IndexView(reader, [(0, reader.size)]).prefix_sums(everything)
    assert first.rows > groups  # decoded every group from its buckets
    again = CountingConnection(conn)
    reader = IndexReader(again, number, cache)
    assert np.array_equal(IndexView(reader, [(0, reader.size)]).prefix_sums(everything), sums)
    assert again.rows == groups  # only the group rows, to check the stamps

    extra = (items[1500][0], rng.randbytes(32))  # lands inside a middle group
    write(conn, number, [extra], [items[10]], 16)
    reader = IndexReader(conn, number, cache)
    expected = sorted(set(items) - {items[10]} | {extra})
    assert_same_storage(IndexView(reader, [(0, reader.size)]), SortedVector.from_items(expected), rng)


# ---------------------------------------------------------------- agreement with SortedVector


def nip01_window(items, since, until, limit) -> SortedVector:
    """The reference set of a NEG-OPEN window: since/until inclusive, then the newest `limit` (ties: lowest id)."""
    chosen = [it for it in items if (since is None or it[0] >= since) and (until is None or it[0] <= until)]
    if limit is not None:
        chosen = sorted(chosen, key=lambda it: (-it[0], it[1]))[:limit]
    return SortedVector.from_items(chosen)


def assert_same_storage(view: IndexView, vector: SortedVector, rng: random.Random) -> None:
    n = vector.size()
    assert view.size() == n
    assert [view.get_item(i) for i in range(n)] == [vector.get_item(i) for i in range(n)]
    assert view.fingerprint(0, n) == vector.fingerprint(0, n)
    for _ in range(40):
        a = rng.randrange(n + 1)
        b = rng.randrange(a, n + 1)
        assert view.fingerprint(a, b) == vector.fingerprint(a, b), (a, b)
        assert view.id_bytes(a, b) == vector.id_bytes(a, b)
    # the bulk methods the reconciler uses
    edges = np.array([0, n] + [rng.randrange(n + 1) for _ in range(30)])
    assert np.array_equal(view.prefix_sums(edges), vector.prefix_sums(edges))
    if n:
        at = np.array([rng.randrange(n) for _ in range(30)])
        assert all(np.array_equal(x, y) for x, y in zip(view.items_at(at), vector.items_at(at)))
    bounds = [Bound(T0 + rng.randrange(-2, 60), rng.randbytes(rng.randrange(0, 4))) for _ in range(30)]
    bounds += [Bound(INFINITY), *(Bound(*vector.get_item(i)) for i in range(0, n, max(1, n // 10)))]
    assert view.lower_bounds(bounds).tolist() == vector.lower_bounds(bounds).tolist()


def test_index_agrees_with_sorted_vector_on_random_ranges_and_windows(tmp_path):
    """After scattered inserts and removals (many created_at ties), every query equals SortedVector's."""
    max_children = 16  # small nodes: many splits and merges on few items
    conn, _, number = open_index(tmp_path / "n.db", max_children)
    rng = random.Random(3)
    items: set[tuple[int, bytes]] = set()
    for _ in range(60):
        adds = set(synthetic(rng.randrange(0, 120), rng, 50)) - items
        removes = rng.sample(sorted(items), min(len(items), rng.randrange(0, 80)))
        write(conn, number, sorted(adds), removes, max_children)
        items = (items | adds) - set(removes)
    assert check_nodes(conn, number) == []
    ordered = sorted(items)
    reader = IndexReader(conn, number)
    assert_same_storage(IndexView(reader, [(0, reader.size)]), SortedVector.from_items(ordered), rng)
    for _ in range(25):
        since = rng.choice([None, T0 + rng.randrange(-5, 55)])
        until = rng.choice([None, T0 + rng.randrange(-5, 55)])
        limit = rng.choice([None, 0, 1, rng.randrange(0, len(items) + 5)])
        reader = IndexReader(conn, number)  # one per message, as the relay does
        view = IndexView(reader, window_segments(reader, since, until, limit))
        assert_same_storage(view, nip01_window(ordered, since, until, limit), rng)


# ---------------------------------------------------------------- the index follows the events (hypothesis)

KEYS = [Keys(0xA11CE), Keys(0xB0B), Keys(0xCA401)]
INDEXED = [{"kinds": [0, 30000]}, {"#t": ["x"]}, {"authors": [KEYS[0].pubkey], "kinds": [1]}]
PRIVATE = (0, 4)  # NIP-42 private kinds: the public set leaves their events out
_signed: dict[tuple, dict] = {}


def sign(keys: Keys, kind: int, tags: list, created_at: int, content: str = "") -> dict:
    key = (keys.pubkey, kind, repr(tags), created_at, content)
    if key not in _signed:
        _signed[key] = keys.sign(kind, content, tags, created_at)
    return _signed[key]


operation = st.one_of(
    st.tuples(st.just("note"), st.integers(0, 2), st.integers(0, 20), st.booleans()),
    st.tuples(st.just("replaceable"), st.integers(0, 2), st.integers(0, 20), st.just(False)),
    st.tuples(st.just("addressable"), st.integers(0, 2), st.integers(0, 20), st.booleans()),
    st.tuples(st.just("delete"), st.integers(0, 2), st.integers(0, 20), st.booleans()),
    st.tuples(st.just("expiring"), st.integers(0, 2), st.integers(0, 20), st.booleans()),
    st.tuples(st.just("purge"), st.just(0), st.just(0), st.just(False)),
    st.tuples(st.just("commit"), st.just(0), st.just(0), st.just(False)),
)


def event_for(op: tuple, now: int, published: list[dict]) -> dict | None:
    """The event an operation publishes (None for purge/commit)."""
    verb, who, t, flag = op
    keys, created_at = KEYS[who], T0 + t
    if verb == "note":
        return sign(keys, 1, [["t", "x"]] if flag else [], created_at)
    if verb == "replaceable":
        return sign(keys, 0, [], created_at)
    if verb == "addressable":
        return sign(keys, 30000, [["d", "b" if flag else "a"]] + ([["t", "x"]] if t % 2 else []), created_at)
    if verb == "delete":
        if flag:  # by coordinate (NIP-09 `a` tag)
            return sign(keys, 5, [["a", f"30000:{keys.pubkey}:a"]], created_at)
        targets = [e["id"] for e in published if e["pubkey"] == keys.pubkey][-3:]
        return sign(keys, 5, [["e", target] for target in targets], created_at)
    if verb == "expiring":  # expired already, or far in the future
        expiration = now - 5 if flag else now + 10**6
        return sign(keys, 1, [["expiration", str(expiration)], ["t", "x"]], created_at, content=str(expiration))
    return None


async def run_operations(path: Path, ops: list[tuple], max_children: int) -> None:
    hook = NegentropyIndex([parse_filter(f) for f in INDEXED], max_children=max_children, private_kinds=PRIVATE)
    store = await Store.open(path, StoreOptions(read_connections=1, checkpoint_interval_seconds=0), [hook])
    now = int(time.time())
    # Expiring events are built once per run, so their expirations do not vary between examples.
    now = now - now % 10**6
    published: list[dict] = []
    pending: list = []
    try:
        for op in ops + [("commit", 0, 0, False)]:
            if op[0] == "commit":  # submitted together: one transaction (inserts and removals mixed)
                await asyncio.gather(*pending)
                pending = []
            elif op[0] == "purge":
                await asyncio.gather(*pending)
                pending = []
                await store.purge_expired()
            else:
                event = event_for(op, now, published)
                published.append(event)
                pending.append(store.submit(parse_event(event, EventLimits(), time.time())))
    finally:
        await store.close()


def assert_index_matches_events(path: Path) -> None:
    conn = sqlite3.connect(path)
    try:
        numbers = dict(conn.execute("SELECT spec, filter_no FROM neg_filters").fetchall())
        assert set(numbers) == {"{}", public_spec(PRIVATE)} | {filter_spec(parse_filter(f)) for f in INDEXED}
        for spec, number in numbers.items():
            stored = indexed_items(conn, number)
            assert stored == recompute(conn, spec), spec
            assert check_nodes(conn, number) == [], spec
            reader = IndexReader(conn, number)
            assert IndexView(reader, [(0, reader.size)]).fingerprint(0, reader.size) == fingerprint(
                i for _, i in stored)
    finally:
        conn.close()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(operation, min_size=1, max_size=40), max_children=st.sampled_from([4, 8, 256]))
def test_index_equals_recomputation_after_random_writes(ops, max_children):
    """Inserts, replacements, NIP-09 deletions and NIP-40 purges leave every index equal to its recomputation."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "p.db"
        asyncio.run(run_operations(path, ops, max_children))
        assert_index_matches_events(path)


# ---------------------------------------------------------------- setup: built, dropped, rebuilt


def test_setup_builds_new_filters_drops_old_ones_and_rebuilds_after_disable(tmp_path):
    """A filter added to the config is built from `events`; one removed is dropped; disabling empties the index."""
    path = tmp_path / "s.db"
    options = StoreOptions(read_connections=1)
    kinds0 = parse_filter({"kinds": [0]})

    async def publish(hooks, events):
        store = await Store.open(path, options, hooks)
        try:
            for e in events:
                await store.submit(parse_event(e, EventLimits(), time.time()))
        finally:
            await store.close()

    a, b = KEYS[0], KEYS[1]
    await_ = asyncio.run
    await_(publish([NegentropyIndex()], [sign(a, 0, [], T0), sign(b, 1, [], T0 + 1)]))
    await_(publish([NegentropyIndex([kinds0])], [sign(b, 0, [], T0 + 2)]))
    conn = sqlite3.connect(path)
    specs = dict(conn.execute("SELECT spec, filter_no FROM neg_filters").fetchall())
    assert set(specs) == {"{}", '{"kinds":[0]}'}
    assert len(recompute(conn, '{"kinds":[0]}')) == 2
    conn.close()
    assert_built(path)

    await_(publish([NegentropyIndex()], [sign(a, 1, [], T0 + 3)]))
    conn = sqlite3.connect(path)
    assert dict(conn.execute("SELECT spec, filter_no FROM neg_filters").fetchall()).keys() == {"{}"}
    assert conn.execute("SELECT count(*) FROM neg_nodes WHERE filter_no != ?", (specs["{}"],)).fetchone() == (0,)
    conn.close()
    assert_built(path)

    await_(publish([DropNegentropyIndex()], [sign(b, 1, [], T0 + 4)]))  # written while no index is kept
    conn = sqlite3.connect(path)
    assert [conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in ("neg_filters", "neg_nodes")] == [0, 0]
    conn.close()
    await_(publish([NegentropyIndex([kinds0])], []))
    assert_built(path)


def assert_built(path: Path) -> None:
    conn = sqlite3.connect(path)
    try:
        for spec, number in conn.execute("SELECT spec, filter_no FROM neg_filters").fetchall():
            stored = indexed_items(conn, number)
            assert stored == recompute(conn, spec)
            assert check_nodes(conn, number) == []
    finally:
        conn.close()
