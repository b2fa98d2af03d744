"""`relay changes`: the change feed as JSON lines, beside a serving relay; a stale cursor exits 3."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from dataclasses import replace

from relay.store.store import Store
from tests.conftest import make_config
from tests.helpers import Client, eventually
from tests.inprocess import Relay
from tests.served import clean_env, relay_cli
from tests.store.projectors.common import event, open_store, submit_batches
from tests.store.test_properties import OPTIONS, parsed


def _ops(lines: list[dict]) -> list[tuple[str, str, str | None]]:
    return [(c["op"], c["id"], c.get("reason")) for c in lines]


async def test_a_follower_sees_each_change_once_in_commit_order(tmp_path, alice):
    """`relay changes --since 0 --follow`, started while a relay serves: events written, superseded, deleted and
    expired through the relay each reach it once, in commit order, as a later read of the whole feed says."""
    relay = Relay(make_config(tmp_path, store={"expiry_purge_interval_seconds": 0.2}))
    await relay.start()
    follower = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "relay", "changes", "--since", "0", "--follow", "--db", relay.config.store.path,
        stdout=asyncio.subprocess.PIPE, env=clean_env())
    lines: list[dict] = []

    async def read_lines() -> None:
        while line := await follower.stdout.readline():
            lines.append(json.loads(line))

    reader = asyncio.create_task(read_lines())
    now = int(time.time())
    note, v1, v2 = alice.sign(1, "note", [], now - 3), alice.sign(0, "v1", [], now - 2), alice.sign(0, "v2", [], now - 1)
    deletion = alice.sign(5, "", [["e", note["id"]]], now)
    expiring = alice.sign(1, "soon gone", [["expiration", str(now + 4)]], now)
    client = await Client.connect(relay.url)
    try:
        for event in (note, v1, v2, deletion, expiring):
            assert (await client.publish(event))[2] is True
            # Read before the next write: an insertion read after its event was removed carries no event.
            await eventually(lambda: ("insert", event["id"], None) in _ops(lines))
        await eventually(lambda: ("remove", expiring["id"], "expired") in _ops(lines), timeout=15)
    finally:
        await client.close()
        follower.terminate()
        await follower.wait()
        reader.cancel()
        await relay.stop()
    assert _ops(lines) == [
        ("insert", note["id"], None), ("insert", v1["id"], None), ("insert", v2["id"], None),
        ("remove", v1["id"], "superseded"), ("insert", deletion["id"], None), ("remove", note["id"], "deleted"),
        ("insert", expiring["id"], None), ("remove", expiring["id"], "expired")]
    assert [c["event"] for c in lines if c["op"] == "insert"] == [note, v1, v2, deletion, expiring]
    assert all(set(c) == {"cursor", "op", "id", "kind", "pubkey", "created_at", "reason"}
               for c in lines if c["op"] == "remove")
    whole = [json.loads(line) for line in relay_cli("changes", "--db", relay.config.store.path).stdout.splitlines()]
    assert [c["cursor"] for c in whole] == [c["cursor"] for c in lines] == sorted({c["cursor"] for c in lines})
    assert _ops(whole) == _ops(lines)


async def test_a_cursor_older_than_the_log_keeps_exits_3(tmp_path, alice):
    """With room for one removal, three versions drop the first removal: `--since` before it exits 3 naming the
    oldest cursor kept, and `--since` that cursor prints the rest; `--kinds` selects."""
    db = tmp_path / "relay.db"
    store = await Store.open(db, replace(OPTIONS, change_log_max_entries=1))
    now = int(time.time())
    try:
        for i in range(3):  # positions: v0 1, v1 2, v0 gone 3 (dropped), v2 4, v1 gone 5
            await store.submit(parsed(alice.sign(0, f"v{i}", [], now - 10 + i)))
        await store.submit(parsed(alice.sign(1, "note", [], now)))  # 6
    finally:
        await store.close()
    stale = await asyncio.to_thread(relay_cli, "changes", "--since", "2", "--db", db)
    assert (stale.returncode, stale.stdout, stale.stderr.strip()) == (3, "", "cursor 2 is older than the oldest kept, 3")
    kept = await asyncio.to_thread(relay_cli, "changes", "--since", "3", "--db", db)
    assert kept.returncode == 0
    assert [(c["cursor"], c["op"]) for c in map(json.loads, kept.stdout.splitlines())] == [
        (4, "insert"), (5, "remove"), (6, "insert")]
    notes = await asyncio.to_thread(relay_cli, "changes", "--kinds", "1,7", "--db", db)
    assert [c["cursor"] for c in map(json.loads, notes.stdout.splitlines())] == [6]


def test_a_cursor_past_sqlite_integers_is_an_argument_error(tmp_path):
    """`--since` past 2**63-1 (SQLite's largest INTEGER) exits 2 with argparse's one line, no traceback."""
    done = relay_cli("changes", "--since", str(2**63), "--db", tmp_path / "relay.db")
    assert done.returncode == 2 and "a cursor is a whole number" in done.stderr and "Traceback" not in done.stderr
    assert relay_cli("changes", "--since", str(2**63 - 1), "--db", tmp_path / "relay.db").returncode == 2  # no db


async def test_since_0_reads_a_table_never_rebuilt_from_its_start_and_rebuilt_is_said_only_when_it_was(tmp_path,
                                                                                                        alice, bob):
    """`--table follows --since 0` on a table logged from the start prints its rows (exit 0, no "built
    again"); a cursor from before the table's log began (it was added to row_change_tables later) exits 3
    saying so, not that the table was built again."""
    path = tmp_path / "relay.db"
    store, _ = await open_store(path, row_tables=["profiles"])
    await submit_batches(store, [event(alice, 0, {"name": "a"}), event(bob, 0, {"name": "b"})])
    await store.close()
    store, _ = await open_store(path, row_tables=["profiles", "follows"])
    await submit_batches(store, [event(alice, 3, "", [["p", bob.pubkey]])])
    await store.close()
    fresh = await asyncio.to_thread(relay_cli, "changes", "--table", "follows", "--since", "0", "--db", path)
    assert fresh.returncode == 0 and "built again" not in fresh.stderr, fresh
    assert [c["op"] for c in map(json.loads, fresh.stdout.splitlines())] == ["insert"]
    before = await asyncio.to_thread(relay_cli, "changes", "--table", "follows", "--since", "1", "--db", path)
    assert before.returncode == 3 and "built again" not in before.stderr, before
    assert "before follows' row changes were logged" in before.stderr, before.stderr


async def test_since_now_prints_only_what_comes_next(tmp_path, alice):
    """`--since now` prints nothing of what is stored (exit 0); with --follow, only the events stored after it
    started."""
    db = tmp_path / "relay.db"
    store = await Store.open(db, OPTIONS)
    try:
        old = alice.sign(1, "old")
        await store.submit(parsed(old))
        done = await asyncio.to_thread(relay_cli, "changes", "--since", "now", "--db", db)
        assert (done.returncode, done.stdout) == (0, ""), done
        follower = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "relay", "changes", "--since", "now", "--follow", "--db", str(db),
            stdout=asyncio.subprocess.PIPE, env=clean_env())
        try:
            new = []
            for i in range(40):  # one more each half second until it prints (its start takes a while)
                new.append(alice.sign(1, f"new {i}"))
                await store.submit(parsed(new[-1]))
                try:
                    line = await asyncio.wait_for(follower.stdout.readline(), 0.5)
                    break
                except TimeoutError:
                    continue
            first = json.loads(line)
            assert first["op"] == "insert" and first["id"] in {e["id"] for e in new}
        finally:
            follower.terminate()
            await follower.wait()
    finally:
        await store.close()
