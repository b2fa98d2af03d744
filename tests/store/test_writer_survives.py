"""The writer survives any job (docs/architecture.md, invariant 6): a job or an event that raises is refused alone, its caller
told, and the writer goes on; only a database that cannot be written at all (SQLite's FULL, IOERR, CORRUPT,
NOTADB, READONLY, NOMEM) stops it.

Failures are injected with real SQLite: a trigger that RAISEs (as an operator's own trigger or a bad row would),
a value SQLite cannot bind (a lone surrogate: not UTF-8), `max_page_count` for a full database.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path

import pytest

from relay.commands.bans import run_ban
from relay.config import load_config
from relay.node import open_store
from relay.protocol.event import EventLimits, parse_event
from relay.status import gather_status
from relay.store import bans, clock
from relay.store.projectors.background import build_in_background
from relay.store.projectors.tables import META_PREFIX
from relay.store.store import JobFailed, StoreFailed, is_fatal
from relay.store.writes import Changes
from tests.conftest import make_config
from tests.helpers import Client, Keys, eventually, store_events
from tests.served import Served, free_port, http_get
from tests.test_background_build import stored_without_projectors

KIND_REFUSED = 4242  # events of this kind meet the injected trigger


def _sql(path: Path, *statements: str) -> None:
    """Run `statements` on a connection of their own (as an operator's sqlite3 shell would)."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        for statement in statements:
            conn.execute(statement)
    finally:
        conn.close()


def _raise_on(table: str, when: str, name: str = "injected") -> str:
    return (f"CREATE TRIGGER {name} BEFORE {table} WHEN {when} BEGIN SELECT RAISE(ABORT, 'injected failure'); END")


async def _still_stores(url: str, keys: Keys) -> None:
    """A new event over a real WebSocket is accepted and served back."""
    client = await Client.connect(url)
    try:
        event = keys.sign(content=f"after {time.monotonic_ns()}")
        assert (await client.publish(event))[2] is True
        assert [e["id"] for e in await client.req("s", {"ids": [event["id"]]})] == [event["id"]]
    finally:
        await client.close()


def test_is_fatal_by_result_code(tmp_path):
    path = tmp_path / "x.db"
    _sql(path, "CREATE TABLE t (v TEXT UNIQUE)", "INSERT INTO t VALUES ('a')")
    readonly = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    with pytest.raises(sqlite3.Error) as refused:
        readonly.execute("INSERT INTO t VALUES ('b')")
    readonly.close()
    assert is_fatal(refused.value)  # SQLITE_READONLY: nothing could ever be written
    conn = sqlite3.connect(path)
    with pytest.raises(sqlite3.IntegrityError) as duplicate:
        conn.execute("INSERT INTO t VALUES ('a')")
    assert not is_fatal(duplicate.value)  # one row's problem
    with pytest.raises(UnicodeEncodeError) as not_utf8:
        conn.execute("INSERT INTO t VALUES (?)", ("\udcff",))
    conn.close()
    assert not is_fatal(not_utf8.value) and is_fatal(MemoryError())


async def test_a_batch_with_a_failing_event_stores_the_others(relay, alice):
    """One event the transaction cannot take is refused alone ("error: internal"); the batch's others are stored."""
    _sql(Path(relay.config.store.path), _raise_on("INSERT ON events", f"NEW.kind = {KIND_REFUSED}"))
    events = [alice.sign(content=f"n{i}") for i in range(8)]
    bad = alice.sign(kind=KIND_REFUSED, content="meets the trigger")
    parsed = [parse_event(e, EventLimits(), time.time()) for e in [*events[:4], bad, *events[4:]]]
    outcomes = await asyncio.gather(*(relay.store.submit(e) for e in parsed))  # queued at once: one batch
    assert outcomes[4] == (False, "error: internal")
    assert all(accepted for i, (accepted, _) in enumerate(outcomes) if i != 4), outcomes
    client = await Client.connect(relay.url)
    try:
        stored = {e["id"] for e in await client.req("all", {"authors": [alice.pubkey]})}
        assert stored == {e["id"] for e in events}
        assert (await client.publish(alice.sign(kind=KIND_REFUSED, content="again")))[2:] == [False, "error: internal"]
    finally:
        await client.close()
    await _still_stores(relay.url, alice)


async def test_failing_jobs_are_answered_alone(relay, alice):
    """A ban with a reason SQLite cannot store (not UTF-8), a record reservation of a coordinate it cannot bind, a
    purge step of a malformed pubkey: each raises JobFailed to its caller, and the relay goes on."""
    with pytest.raises(JobFailed):
        await relay.moderation.ban_pubkey("ab" * 32, reason="\udcff")
    with pytest.raises(JobFailed):
        await relay.store.run_job(clock.reserve, (30000, bytes(32), "\ud800"), int(time.time()), 2**40)
    with pytest.raises(JobFailed):
        await relay.store.run_job(bans.purge_step, "not hex", 10)
    assert not relay.store.writer_task.done()
    await relay.moderation.ban_pubkey("cd" * 32, reason="spam")  # the next job of the same kind works
    assert "cd" * 32 in relay.moderation.lists["banned_pubkey"]
    await _still_stores(relay.url, alice)


async def test_a_failing_background_purge_backs_off_and_shows_in_status(relay, alice, bob):
    """A purge step that keeps failing is tried again with back-off and listed by `relay status`; once it can
    run, it finishes and leaves the list."""
    path = Path(relay.config.store.path)
    await store_events(relay.store, [bob.sign(content=f"b{i}") for i in range(5)])
    _sql(path, _raise_on("DELETE ON events", f"OLD.pubkey = x'{bob.pubkey}'"))
    await relay.moderation.ban_pubkey(bob.pubkey, "spam", purge=True)  # the relay purges in the background
    failing = await eventually(lambda: gather_status(relay.config).get("failing"))
    assert failing and failing[0]["step"] == f"purge of banned pubkey {bob.pubkey}", failing
    assert "injected failure" in failing[0]["error"]
    await asyncio.sleep(2.5)  # back-off: tries after 1 s, then 2 s more; not a loop
    attempts = gather_status(relay.config)["failing"][0]["attempts"]
    assert 2 <= attempts <= 3, attempts
    await _still_stores(relay.url, alice)
    _sql(path, "DROP TRIGGER injected")
    assert await eventually(lambda: "failing" not in gather_status(relay.config), timeout=15)
    client = await Client.connect(relay.url)
    try:
        assert await client.req("b", {"authors": [bob.pubkey]}) == []
    finally:
        await client.close()


@pytest.fixture
def unbuilt(tmp_path) -> Path:
    """A database of 50 profiles (kind 0) stored without projectors: opened with them, it builds `profiles`."""
    return stored_without_projectors(tmp_path, [Keys(i + 1).sign(kind=0, content='{"name": "n"}') for i in range(50)])


async def test_a_failing_build_step_backs_off_then_finishes(unbuilt):
    """A projector build whose step keeps failing is retried with back-off, shown by `relay status`, and
    completes once the cause is gone; client writes go on meanwhile."""
    path = unbuilt
    # Steps of 10 events: builds longer than one step run in the background.
    config = load_config(None, {}, {"store": {"path": str(path), "projector_build_batch": 10}, "server": {"port": 0}})
    # The build's start inserts its record; each step updates it (relay/store/projectors/build.py).
    _sql(path, _raise_on("UPDATE ON meta", f"NEW.key = '{META_PREFIX}profiles'"))
    store = await open_store(config, background_builds=True)
    try:
        hook = next(h for h in store.hooks if getattr(h, "builds", None))
        builds = asyncio.create_task(build_in_background(store, hook.builds))
        failing = await eventually(lambda: gather_status(config).get("failing"))
        assert failing and failing[0]["step"].startswith("build of projector "), failing
        await store_events(store, [Keys(7).sign(content="written while the build fails")])
        assert not builds.done()
        _sql(path, "DROP TRIGGER injected")
        await asyncio.wait_for(builds, 15)
        assert "failing" not in gather_status(config)
        assert all(p["state"] == "current" for p in gather_status(config)["projectors"])
    finally:
        await store.close()


async def test_a_full_database_stops_the_writer(tmp_path, alice):
    """SQLITE_FULL is fatal: the writer stops, what waits is refused, nothing more is acknowledged."""
    store = await open_store(make_config(tmp_path))
    try:
        await store_events(store, [alice.sign(content="before")])

        def no_more_pages(conn, hooks):
            pages = conn.execute("PRAGMA page_count").fetchone()[0]
            conn.execute(f"PRAGMA max_page_count = {pages}")
            return Changes(), None

        await store.run_job(no_more_pages)
        big = [parse_event(alice.sign(content="x" * 50_000 + str(i)), EventLimits(), time.time())
               for i in range(20)]
        outcomes = await asyncio.gather(*(store.submit(e) for e in big))
        assert all(o == (False, "error: the relay cannot store events now") for o in outcomes), outcomes
        with pytest.raises(StoreFailed):
            await store.writer_task
        assert await store.submit(big[0]) == (False, "error: the relay cannot store events now")
    finally:
        await store.close()


def test_a_bad_ban_through_the_relay_leaves_it_serving(tmp_path, alice):
    """The reported crash: `relay ban pubkey X --reason <not UTF-8>` beside a relay serving with worker processes
    stopped its writer and every worker.  Below the command line's own checks the ban job still reaches the
    writer, which refuses it alone."""
    port = free_port()
    db = tmp_path / "relay.db"
    with Served(tmp_path, "--db", db, "--port", port, "--workers", 2) as served:
        served.wait_health(port)
        config = load_config(None, {}, {"store": {"path": str(db)}})
        with pytest.raises(JobFailed):
            asyncio.run(run_ban(config, "pubkey", "ab" * 32, "\udcff", False))
        assert http_get(port, "/health")[0] == 200
        asyncio.run(_still_stores(f"ws://127.0.0.1:{port}", alice))
        assert served.proc.poll() is None
        assert "writer_failed" not in served.stderr and "job_failed" in served.stderr
