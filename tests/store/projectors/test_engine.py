"""The projector hook on a real Store: rows follow insert, supersession, deletion and expiry in the same
transaction; refusals; the SAVEPOINT fallback; start-up rebuilds and schema evolution."""

from __future__ import annotations

import dataclasses
import json

import pytest

from relay.store.projectors import BUILTIN_PROJECTORS, FieldSpec, ProjectorHook, ProjectorSpec
from relay.store.projectors.builtin import ARTICLES, FOLLOWS, PROFILES, RELAY_LISTS
from relay.store.projectors.tables import read_meta
from relay.store.store import Store
from tests.helpers import Keys
from tests.store.projectors.common import OPTIONS, connect, event, open_store, problems, rows, submit_batches

ALICE, BOB = Keys(0xA11CE), Keys(0xB0B)


async def test_rows_follow_insert_supersession_and_deletion(tmp_path):
    """A newer kind 0 replaces the row, an older one changes nothing, a NIP-09 deletion drops it."""
    db = tmp_path / "r.db"
    store, _ = await open_store(db)
    v1 = event(ALICE, 0, {"name": "one", "nip05": "a@x"}, created_at=100)
    v2 = event(ALICE, 0, {"name": "two"}, created_at=200)
    old = event(ALICE, 0, {"name": "old"}, created_at=50)
    await submit_batches(store, [v1])
    assert rows(db, "SELECT name, nip05, _event_id FROM profiles") == [("one", "a@x", v1.id)]
    await submit_batches(store, [v2, old])
    assert rows(db, "SELECT name, nip05, _event_id, _created_at FROM profiles") == [("two", None, v2.id, 200)]
    await submit_batches(store, [event(ALICE, 5, "", [["e", v2.id]], 300)])
    assert rows(db, "SELECT count(*) FROM profiles") == [(0,)]
    await store.close()
    assert problems(db, BUILTIN_PROJECTORS) == []


async def test_per_tag_rows_are_replaced_whole_by_a_newer_list(tmp_path):
    """A newer follow list replaces every row of the older one; an `a` deletion removes an article row."""
    db = tmp_path / "r.db"
    store, _ = await open_store(db)
    await submit_batches(store, [event(ALICE, 3, "", [["p", "aa"], ["p", "bb"], ["p", "cc"]], 100),
                                 event(ALICE, 30023, "x", [["d", "post"], ["title", "T"]], 100)])
    await submit_batches(store, [event(ALICE, 3, "", [["p", "bb", "wss://r"], ["p", "dd"]], 200)])
    assert rows(db, "SELECT followed, relay FROM follows ORDER BY followed") == [("bb", "wss://r"), ("dd", None)]
    await submit_batches(store, [event(ALICE, 5, "", [["a", f"30023:{ALICE.pubkey}:post"]], 150)])
    assert rows(db, "SELECT count(*) FROM articles") == [(0,)]
    await store.close()
    assert problems(db, BUILTIN_PROJECTORS) == []


async def test_expiry_purge_drops_projected_rows(tmp_path):
    """NIP-40: when the purge removes an expired event, its projected row leaves with it."""
    db = tmp_path / "r.db"
    store, _ = await open_store(db)
    await submit_batches(store, [event(ALICE, 0, {"name": "brief"}, [["expiration", "1000"]], 500),
                                 event(BOB, 0, {"name": "stays"}, created_at=500)])
    assert rows(db, "SELECT count(*) FROM profiles") == [(2,)]
    assert await store.purge_expired() == 1
    await store.close()
    assert rows(db, "SELECT name FROM profiles") == [("stays",)]
    assert problems(db, BUILTIN_PROJECTORS) == []


async def test_unprojectable_event_is_stored_and_refused(tmp_path):
    """Malformed content: the event is stored (OK true), no row, and the refusal is in the log."""
    db = tmp_path / "r.db"
    store, _ = await open_store(db, clock=lambda: 1234.0)
    bad = event(ALICE, 0, "this is not json", created_at=100)
    assert await submit_batches(store, [bad]) == [(True, "")]
    await store.close()
    assert rows(db, "SELECT count(*) FROM events WHERE id = ?", (bytes.fromhex(bad.id),)) == [(1,)]
    assert rows(db, "SELECT count(*) FROM profiles") == [(0,)]
    assert rows(db, "SELECT projector, event_id, reason, at FROM projector_refusals") == [
        ("profiles", bad.id, "content is not valid JSON", 1234)]


async def test_sql_failure_falls_back_to_one_savepoint_per_event(tmp_path):
    """When the batch's executemany fails, only the failing event is refused; the others' rows are written."""
    db = tmp_path / "r.db"
    store, _ = await open_store(db)
    await store.close()
    conn = connect(db)
    conn.execute("CREATE TRIGGER no_boom BEFORE INSERT ON profiles WHEN NEW.name = 'boom'"
                 " BEGIN SELECT RAISE(ABORT, 'boom is not a name'); END")
    conn.close()
    store, _ = await open_store(db)
    good1, boom, good2 = (event(k, 0, {"name": n}) for k, n in ((ALICE, "a"), (BOB, "boom"), (Keys(7), "c")))
    assert await submit_batches(store, [good1, boom, good2]) == [(True, "")] * 3
    await store.close()
    assert rows(db, "SELECT name FROM profiles ORDER BY name") == [("a",), ("c",)]
    assert rows(db, "SELECT event_id, reason FROM projector_refusals") == [(boom.id, "sqlite: boom is not a name")]
    assert rows(db, "SELECT count(*) FROM events") == [(3,)]


async def test_refusal_log_is_bounded(tmp_path):
    """Past `max_refusals`, the oldest refusals are dropped."""
    db = tmp_path / "r.db"
    store, _ = await open_store(db, max_refusals=5)
    bad = [event(Keys(100 + i), 0, "nope") for i in range(12)]
    await submit_batches(store, bad, [4, 4])
    await store.close()
    assert [r[0] for r in rows(db, "SELECT event_id FROM projector_refusals ORDER BY seq")] == [e.id for e in bad[-5:]]


# ------------------------------------------------------------------ start-up

async def fill(db, specs=BUILTIN_PROJECTORS):
    store, hook = await open_store(db, specs)
    await submit_batches(store, [event(ALICE, 0, {"name": "a", "about": "x"}, created_at=10),
                                 event(BOB, 0, {"name": "b"}, created_at=10),
                                 event(ALICE, 3, "", [["p", BOB.pubkey]], 10),
                                 event(ALICE, 10002, "", [["r", "wss://a", "read"]], 10),
                                 event(ALICE, 1, "note")])
    await store.close()
    return hook


async def test_unchanged_projectors_are_not_rebuilt(tmp_path):
    """Reopening with the same specs rebuilds nothing (the table keeps even a row added behind its back)."""
    db = tmp_path / "r.db"
    first = await fill(db)
    assert [name for name, _ in first.rebuilt] == ["profiles", "follows", "relay_lists", "articles"]
    connect(db).execute("INSERT INTO follows (_event_id, _created_at, pubkey, followed) VALUES ('x', 1, 'x', 'sentinel')")
    _, hook = await open_store(db)
    await _.close()
    assert hook.rebuilt == [] and hook.removed == []
    assert rows(db, "SELECT count(*) FROM follows WHERE followed = 'sentinel'") == [(1,)]


async def test_revision_bump_rebuilds_only_that_projector(tmp_path):
    """profiles at revision 2: profiles is rebuilt (sentinel gone), follows is not (sentinel kept)."""
    db = tmp_path / "r.db"
    await fill(db)
    conn = connect(db)
    conn.execute("INSERT INTO follows (_event_id, _created_at, pubkey, followed) VALUES ('x', 1, 'x', 'sentinel')")
    conn.execute("INSERT INTO profiles (_event_id, _created_at, pubkey) VALUES ('x', 1, 'sentinel')")
    conn.close()
    specs = (dataclasses.replace(PROFILES, revision=2), FOLLOWS, RELAY_LISTS, ARTICLES)
    store, hook = await open_store(db, specs)
    await store.close()
    assert hook.rebuilt == [("profiles", "revision 1 -> 2")]
    assert rows(db, "SELECT count(*) FROM profiles WHERE pubkey = 'sentinel'") == [(0,)]
    assert rows(db, "SELECT count(*) FROM follows WHERE followed = 'sentinel'") == [(1,)]
    assert json.loads(rows(db, "SELECT value FROM meta WHERE key = 'projector:profiles'")[0][0])["revision"] == 2


async def test_new_field_is_added_with_alter_table_and_filled(tmp_path):
    """A field added to a spec becomes a new column (ALTER TABLE) filled from the stored events."""
    db = tmp_path / "r.db"
    narrow = ProjectorSpec("names", 0, (FieldSpec("pubkey", "TEXT", "pubkey"), FieldSpec("name", "TEXT", "content.name")),
                           ("pubkey",))
    await fill(db, (narrow,))
    conn = connect(db)
    conn.execute("CREATE VIEW name_view AS SELECT name FROM names")  # would not survive a DROP TABLE
    conn.close()
    wide = dataclasses.replace(narrow, fields=narrow.fields + (FieldSpec("about", "TEXT", "content.about"),))
    store, hook = await open_store(db, (wide,))
    await store.close()
    assert hook.rebuilt == [("names", "spec changed")]
    assert rows(db, "SELECT name, about FROM names ORDER BY name") == [("a", "x"), ("b", None)]
    assert rows(db, "SELECT count(*) FROM name_view") == [(2,)]
    assert problems(db, (wide,)) == []


async def test_removed_projector_keeps_its_table_and_is_reported(tmp_path):
    """A projector dropped from the configuration leaves its table; it is reported and marked removed."""
    db = tmp_path / "r.db"
    await fill(db)
    store, hook = await open_store(db, (PROFILES,))
    await store.close()
    assert sorted(hook.removed) == ["articles", "follows", "relay_lists"]
    assert rows(db, "SELECT count(*) FROM follows") == [(1,)]
    conn = connect(db)
    assert read_meta(conn)["follows"]["state"] == "removed"
    conn.close()
    store, hook = await open_store(db)  # configured again: stale, so rebuilt
    await store.close()
    assert sorted(name for name, _ in hook.rebuilt) == ["articles", "follows", "relay_lists"]


async def test_interrupted_rebuild_is_redone_at_next_start(tmp_path):
    """A rebuild that did not finish ("building" in meta) is done again at the next start."""
    db = tmp_path / "r.db"
    await fill(db)
    conn = connect(db)
    conn.execute("UPDATE meta SET value = replace(value, '\"current\"', '\"building\"') WHERE key = 'projector:follows'")
    conn.execute("DELETE FROM follows")
    conn.close()
    store, hook = await open_store(db)
    await store.close()
    assert hook.rebuilt == [("follows", "state building")]
    assert problems(db, BUILTIN_PROJECTORS) == []


async def test_rebuild_in_small_batches_equals_live_projection(tmp_path):
    """Rebuilding with 2 events per transaction gives the tables the live writes gave."""
    db = tmp_path / "r.db"
    await fill(db)
    before = rows(db, "SELECT * FROM profiles ORDER BY pubkey")
    connect(db).execute("UPDATE meta SET value = replace(value, '\"current\"', '\"building\"')"
                        " WHERE key = 'projector:profiles'")
    store = await Store.open(db, OPTIONS, [ProjectorHook(BUILTIN_PROJECTORS, rebuild_batch=1)])
    await store.close()
    assert rows(db, "SELECT * FROM profiles ORDER BY pubkey") == before


def test_hook_refuses_two_projectors_on_one_table():
    """Two specs writing one table are refused before anything opens."""
    with pytest.raises(ValueError, match="declared twice"):
        ProjectorHook((PROFILES, PROFILES))


async def test_projector_never_takes_over_a_table_it_did_not_make(tmp_path):
    """A spec naming an existing non-projector table stops the open; the table is untouched."""
    from relay.store.projectors.engine import TableTaken

    db = tmp_path / "r.db"
    store, _ = await open_store(db, ())
    await store.close()
    connect(db).execute("CREATE TABLE mine (x TEXT)")
    connect(db).execute("INSERT INTO mine VALUES ('keep')")
    squatter = dataclasses.replace(PROFILES, table="mine")
    conn = connect(db)
    with pytest.raises(TableTaken, match="table 'mine' exists and is not a projector's"):
        ProjectorHook((squatter,)).setup(conn)  # what Store.open runs first
    conn.close()
    assert rows(db, "SELECT x FROM mine") == [("keep",)]
