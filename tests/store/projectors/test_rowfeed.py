"""The change feed of projected rows (relay/store/projectors/rowfeed.py, `relay changes --table`): a consumer that
reads by cursor while rows are inserted, replaced and removed (and while the table is built) sees each change
once, in order, with ops that hold (no insert of a key it has, no replace or remove of one it lacks), and its
reconstructed table equals the real one."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relay.store import feed
from relay.store.feed import StaleCursor
from relay.store.projectors import BUILTIN_PROJECTORS
from relay.store.projectors import rowfeed
from relay.store.projectors.engine import ProjectorHook
from relay.store.projectors.tables import quote
from relay.store.writes import Changes
from tests.served import relay_cli
from tests.store.projectors.common import connect, event, open_store, submit_batches
from tests.store.projectors.test_convergence import POOL
from tests.helpers import Keys

LOGGED = ("profiles", "follows", "relay_lists", "articles")
SPECS = {s.table: s for s in BUILTIN_PROJECTORS}


class Consumer:
    """An application's copy of the logged tables, kept in step by reading the row feed from a cursor."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.tables: dict[str, dict[str, dict]] = {t: {} for t in LOGGED}
        self.cursors: dict[str, int] = {}
        self.seen: list[int] = []

    def catch_up(self, page: int = 3) -> None:
        """Read every table's new changes, `page` at a time, resuming from the cursor each time."""
        conn = connect(self.path)
        try:
            for table in LOGGED:
                cursor = self.cursors.setdefault(table, rowfeed.oldest(conn, table))
                while changes := rowfeed.read(conn, table, cursor, page):
                    for change in changes:
                        self.apply(change)
                        assert change.cursor > cursor  # in order, each once
                        cursor = change.cursor
                self.cursors[table] = cursor
        finally:
            conn.close()

    def apply(self, change: rowfeed.RowChange) -> None:
        rows = self.tables[change.table]
        key = change.key.decode()
        self.seen.append(change.cursor)
        if change.op == "insert":
            assert key not in rows, change
            rows[key] = json.loads(change.row)
        elif change.op == "replace":
            assert key in rows, change
            rows[key] = json.loads(change.row)
        else:
            assert change.op == "remove" and change.row is None
            del rows[key]


def real_table(path: Path, table: str) -> dict[str, dict]:
    """The table's rows by their key as the feed writes it (a JSON object of the key columns)."""
    spec = SPECS[table]
    conn = connect(path)
    try:
        cols = list(spec.columns)
        found = conn.execute(f"SELECT {', '.join(quote(c) for c in cols)} FROM {quote(table)}").fetchall()
    finally:
        conn.close()
    rows = [dict(zip(cols, row)) for row in found]
    return {json.dumps({k: row[k] for k in spec.key_columns()}, separators=(",", ":"), ensure_ascii=False): row for row in rows}


async def _run(path: Path, before: list, during: list, batch: int, consumer: Consumer) -> None:
    store, _ = await open_store(path, ())
    await submit_batches(store, before, [50])
    await store.close()
    store, hook = await open_store(path, BUILTIN_PROJECTORS, background=True, build_batch=batch, row_tables=LOGGED)
    queue = list(during)
    for build in hook.builds:
        while True:
            await submit_batches(store, queue[:2], [2])
            del queue[:2]
            consumer.catch_up()
            if await store.run_job(lambda conn, hooks, b: (Changes(), b.step(conn)), build):
                break
    while queue:
        await submit_batches(store, queue[:3], [3])
        del queue[:3]
        consumer.catch_up()
    await store.purge_expired()
    await store.close()
    consumer.catch_up()


@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_a_consumer_by_cursor_rebuilds_every_table_exactly(data):
    """Writes before and during the build and after it; the consumer, reading a few changes at a time from its
    cursor, ends with each table equal to the real one."""
    chosen = data.draw(st.lists(st.booleans(), min_size=len(POOL), max_size=len(POOL)), label="kept")
    events = [e for e, keep in zip(POOL, chosen) if keep or e.kind == 5]
    order = data.draw(st.permutations(events), label="order")
    cut = data.draw(st.integers(0, len(events)), label="events before the build")
    batch = data.draw(st.integers(1, 4), label="events per build step")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "relay.db"
        consumer = Consumer(path)
        asyncio.run(_run(path, list(order[:cut]), list(order[cut:]), batch, consumer))
        assert len(consumer.seen) == len(set(consumer.seen))  # each change once (in order per table: catch_up)
        for table in LOGGED:
            assert consumer.tables[table] == real_table(path, table), table


def test_a_replaced_follow_list_is_one_replace_per_kept_row(tmp_path):
    """A newer kind 3 keeping A, dropping B, adding C: replace A, remove B, insert C, in one transaction."""
    path = tmp_path / "relay.db"
    alice, a, b, c = Keys(0x5001), "a" * 64, "b" * 64, "c" * 64

    async def run():
        store, _ = await open_store(path, BUILTIN_PROJECTORS, row_tables=["follows"])
        await submit_batches(store, [event(alice, 3, "", [["p", a], ["p", b]], 100)])
        await submit_batches(store, [event(alice, 3, "", [["p", a], ["p", c]], 200)])
        await store.close()

    asyncio.run(run())
    conn = connect(path)
    changes = rowfeed.read(conn, "follows", rowfeed.oldest(conn, "follows"), 100)
    ops = [(ch.op, json.loads(ch.key)["followed"]) for ch in changes]
    assert ops == [("insert", a), ("insert", b), ("remove", b), ("replace", a), ("insert", c)]


def test_a_table_built_again_from_empty_makes_older_cursors_stale(tmp_path):
    """After `relay projectors rebuild` empties the table, a cursor from before is refused, even with nothing
    else logged since; from the new oldest cursor the log holds the table again."""
    path = tmp_path / "relay.db"

    async def run():
        store, _ = await open_store(path, BUILTIN_PROJECTORS, row_tables=["profiles"])
        await submit_batches(store, [event(Keys(0x6000 + i), 0, {"name": str(i)}) for i in range(3)])
        await store.close()

    asyncio.run(run())
    conn = connect(path)
    head = rowfeed.head(conn)
    conn.close()
    rebuilt = relay_cli("projectors", "rebuild", "profiles", "--db", path, "--config", _config(tmp_path))
    assert rebuilt.returncode == 0, rebuilt.stderr
    conn = connect(path)
    with pytest.raises(StaleCursor):
        rowfeed.read(conn, "profiles", head, 10)
    assert len(rowfeed.read(conn, "profiles", rowfeed.oldest(conn, "profiles"), 10)) == 3


def _config(tmp_path: Path) -> Path:
    config = tmp_path / "relay.toml"
    config.write_text('[store]\nrow_change_tables = ["profiles"]\n')
    return config


def test_relay_changes_table_resumes_by_cursor(tmp_path):
    """`relay changes --table follows --since CURSOR` between writes: each change printed once; a table that is
    not logged exits 2."""
    path = tmp_path / "relay.db"
    alice, bob = Keys(0x7001), Keys(0x7002)
    bobs = event(bob, 3, "", [["p", "a" * 64]], 100)
    rounds = [[event(alice, 3, "", [["p", "a" * 64], ["p", "b" * 64]], 100)],
              [bobs, event(alice, 3, "", [["p", "b" * 64]], 200)],
              [event(bob, 5, "", [["e", bobs.id]], 300)]]  # NIP-09: bob's list goes
    lines: list[dict] = []

    async def write(events):
        store, _ = await open_store(path, BUILTIN_PROJECTORS, row_tables=["follows"])
        await submit_batches(store, events)
        await store.close()

    cursor = None
    for events in rounds:
        asyncio.run(write(events))
        args = ["changes", "--table", "follows", "--db", path] + ([] if cursor is None else ["--since", cursor])
        out = relay_cli(*args)
        assert out.returncode == 0, out.stderr
        got = [json.loads(line) for line in out.stdout.splitlines()]
        assert got, "each round changes rows"
        cursor = got[-1]["cursor"]
        lines += got
    assert [(c["op"], c["key"]["pubkey"][:4], c["key"]["followed"][0]) for c in lines] == [
        ("insert", alice.pubkey[:4], "a"), ("insert", alice.pubkey[:4], "b"),
        # one transaction: the keys removed and not put again first, then the rows put, in the events' order
        ("remove", alice.pubkey[:4], "a"), ("insert", bob.pubkey[:4], "a"), ("replace", alice.pubkey[:4], "b"),
        ("remove", bob.pubkey[:4], "a")]
    assert all(c["table"] == "follows" for c in lines)
    not_logged = relay_cli("changes", "--table", "profiles", "--db", path)
    assert not_logged.returncode == 2 and "row_change_tables" in not_logged.stderr


def test_row_change_tables_must_name_plain_projectors():
    """A table no [[projectors]] writes is refused when the hook is made."""
    with pytest.raises(ValueError):
        ProjectorHook(BUILTIN_PROJECTORS, row_tables=["nope"])
    assert sqlite3.sqlite_version_info >= (3, 35)  # RETURNING


def test_relay_changes_table_from_the_start_exits_3_once_its_start_is_dropped(tmp_path):
    """With more changes than the log keeps, reading a table's changes from the start would print a partial
    table: it exits 3 naming the position to follow from after `relay query`; a rebuild starts the log again."""
    path = tmp_path / "relay.db"

    async def run():
        store, _ = await open_store(path, BUILTIN_PROJECTORS, row_tables=["profiles"])
        await store.run_job(lambda conn, hooks: (Changes(), feed.set_max_entries(conn, 2)))
        await submit_batches(store, [event(Keys(0x6100 + i), 0, {"name": str(i)}) for i in range(3)], [1, 1])
        await store.close()

    asyncio.run(run())
    out = relay_cli("changes", "--table", "profiles", "--db", path)
    conn = connect(path)
    head = rowfeed.head(conn)
    conn.close()
    assert out.returncode == 3 and out.stdout == ""
    assert "relay query profiles --json" in out.stderr and f"--since {head}" in out.stderr
    with sqlite3.connect(path) as writable:  # room for the whole table again, then a build logs it anew
        feed.set_max_entries(writable, 100)
    rebuilt = relay_cli("projectors", "rebuild", "profiles", "--db", path, "--config", _config(tmp_path))
    assert rebuilt.returncode == 0, rebuilt.stderr
    again = relay_cli("changes", "--table", "profiles", "--db", path)
    assert again.returncode == 0 and len(again.stdout.splitlines()) == 3
    stale = relay_cli("changes", "--table", "profiles", "--db", path, "--since", head)
    assert stale.returncode == 3 and "from before profiles was built again from empty" in stale.stderr


def test_relay_changes_refuses_a_cursor_past_the_newest_and_a_table_that_does_not_exist(tmp_path):
    """A cursor beyond the newest position exits 2 naming it (not a silent empty answer); so does --table of a
    table that does not exist, saying so."""
    path = tmp_path / "relay.db"

    async def run():
        store, _ = await open_store(path, BUILTIN_PROJECTORS, row_tables=["profiles"])
        await submit_batches(store, [event(Keys(0x6200), 0, {"name": "x"})])
        await store.close()

    asyncio.run(run())
    conn = connect(path)
    head = rowfeed.head(conn)
    conn.close()
    ahead = relay_cli("changes", "--table", "profiles", "--db", path, "--since", head + 5)
    assert ahead.returncode == 2 and f"past the newest position, {head}" in ahead.stderr
    assert relay_cli("changes", "--db", path, "--since", 10**6).returncode == 2
    nosuch = relay_cli("changes", "--table", "nosuch", "--db", path)
    assert nosuch.returncode == 2 and "no such table: 'nosuch'" in nosuch.stderr
