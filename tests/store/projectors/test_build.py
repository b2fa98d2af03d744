"""Builds that resume (relay/store/projectors/build.py): a build interleaved with live writes ends equal to a
from-scratch projection, a build cut short resumes after its checkpoint, a spec that only adds fields keeps its
rows, and reads of a table being built are refused with the progress."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relay.store.projectors import BUILTIN_PROJECTORS
from relay.store.projectors.build import Build
from relay.store.projectors.spec import FieldSpec
from relay.store.projectors.tables import build_progress, read_meta
from relay.store.records import Records, TableBuilding
from tests.helpers import Keys
from tests.store.projectors.common import build_step, build_while_writing, built_and_live, connect, event
from tests.store.projectors.common import open_store, problems, rows, submit_batches
from tests.store.projectors.test_convergence import POOL

PROFILES = next(s for s in BUILTIN_PROJECTORS if s.table == "profiles")


async def _live_projection(path: Path, events: list) -> None:
    store, _ = await open_store(path)
    await submit_batches(store, events, [7] * 30)
    await store.purge_expired()
    await store.close()


async def _built_while_writing(path: Path, before: list, during: list, batch: int, sizes: list[int]) -> int:
    """`before` stored with no projector; then the projectors are added and built in steps of `batch` events,
    with a batch of `during` (sizes from `sizes`) committed before each step. Returns the steps run."""
    store, _ = await open_store(path, ())
    await submit_batches(store, before, [50])
    await store.close()
    store, hook = await open_store(path, BUILTIN_PROJECTORS, background=True, build_batch=batch)
    steps = await build_while_writing(store, hook, during, sizes, [5] * 40)
    await store.purge_expired()
    assert all(r["state"] == "current" for r in read_meta(connect(path)).values())
    await store.close()
    return steps


@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_build_with_writes_during_it_equals_a_from_scratch_projection(data):
    """Inserts, supersessions and deletions committed between build steps: the finished tables equal a live
    projection of the same events (byte for byte) and `verify`'s recomputation."""
    chosen = data.draw(st.lists(st.booleans(), min_size=len(POOL), max_size=len(POOL)), label="kept")
    events = [e for e, keep in zip(POOL, chosen) if keep or e.kind == 5]
    built, live, found = built_and_live(data, events, BUILTIN_PROJECTORS, _built_while_writing, _live_projection)
    assert found == []
    assert built == live


def test_build_writes_go_between_steps(tmp_path):
    """The build of a store's events takes several steps, each a writer job of its own."""
    steps = asyncio.run(_built_while_writing(tmp_path / "a.db", POOL, [], 2, []))
    assert steps > len(BUILTIN_PROJECTORS)


def _notes(count: int) -> list:
    keys = Keys(0x2000)
    return [event(keys, 0, {"name": f"n{i}"}, created_at=1000 + i) for i in range(1)] + \
        [event(Keys(0x3000 + i), 0, {"name": f"p{i}", "about": "a"}, created_at=1000) for i in range(count)]


async def _stored(path: Path, events: list) -> None:
    store, _ = await open_store(path, ())
    await submit_batches(store, events, [100])
    await store.close()


def test_a_build_cut_short_resumes_after_its_checkpoint(tmp_path):
    """Three steps, then the store closes (as after a crash: the build task never ran again); the next start
    resumes with the events after the checkpoint only, and the table ends complete."""
    path = tmp_path / "relay.db"

    async def run():
        await _stored(path, _notes(40))
        store, hook = await open_store(path, [PROFILES], background=True, build_batch=5)
        (build,) = hook.builds
        for _ in range(3):
            assert not await build_step(store, build)
        await store.close()
        assert build_progress(connect(path), "profiles") == {"done": 15, "total": 41}
        assert rows(path, "SELECT count(*) FROM profiles")[0][0] == 15
        store, hook = await open_store(path, [PROFILES], background=True, build_batch=5)
        assert hook.rebuilt == [("profiles", "building (15 of 41)")]
        (build,) = hook.builds
        assert build.remaining == 41 - 15  # nothing before the checkpoint is read again
        while not await build_step(store, build):
            pass
        assert build.read == 26
        await store.close()

    asyncio.run(run())
    assert problems(path, [PROFILES]) == []
    assert rows(path, "SELECT count(*) FROM profiles")[0][0] == 41


def test_reads_of_a_table_being_built_are_refused_with_the_progress(tmp_path):
    """query_records and get_record raise TableBuilding (done, total) until the last step commits."""
    path = tmp_path / "relay.db"

    async def run():
        await _stored(path, _notes(12))
        store, hook = await open_store(path, [PROFILES], background=True, build_batch=5)
        records = Records(store, [PROFILES])
        (build,) = hook.builds
        await build_step(store, build)
        with pytest.raises(TableBuilding) as refused:
            await records.query_records("profiles")
        assert refused.value.progress == {"done": 5, "total": 13}
        with pytest.raises(TableBuilding):
            await records.get_record("profiles", {"pubkey": Keys(0x2000).pubkey})
        while not await build_step(store, build):
            pass
        page = await records.query_records("profiles", limit=100)
        await store.close()
        return page

    assert len(asyncio.run(run()).rows) == 13


async def _respecified(path: Path, events: list, old, new) -> tuple:
    """`events` projected with spec `old`; then the store opened again with `new`: (store, its one build)."""
    await _stored(path, events)
    store, _ = await open_store(path, [old])
    await store.close()
    store, hook = await open_store(path, [new], background=True, build_batch=5)
    (build,) = hook.builds
    return store, build


async def _finish(store, build: Build) -> None:
    while not await build_step(store, build):
        pass
    await store.close()


def test_a_spec_that_only_adds_fields_keeps_its_rows_and_fills_them(tmp_path):
    """profiles without `lud16`, built; then with it: the column is added, the rows stay while it is filled."""
    path = tmp_path / "relay.db"
    narrow = dataclasses.replace(PROFILES, fields=tuple(f for f in PROFILES.fields if f.name != "lud16"))
    wider = dataclasses.replace(PROFILES, fields=(*narrow.fields, FieldSpec("zap", "TEXT", "content.lud16")))
    events = [event(Keys(0x4000 + i), 0, {"name": f"p{i}", "lud16": f"z{i}@x"}, created_at=1000) for i in range(20)]

    async def run():
        store, build = await _respecified(path, events, narrow, wider)
        assert build.progress["fill"] is True
        assert rows(path, "SELECT count(*), count(zap) FROM profiles")[0] == (20, 0)  # kept, not yet filled
        await build_step(store, build)
        assert rows(path, "SELECT count(*), count(zap) FROM profiles")[0] == (20, 5)
        await _finish(store, build)

    asyncio.run(run())
    assert problems(path, [wider]) == []
    assert rows(path, "SELECT count(zap) FROM profiles")[0][0] == 20


def test_a_changed_field_rebuilds_from_empty(tmp_path):
    """A field whose source changed is not a fill: the table is emptied and built again."""
    path = tmp_path / "relay.db"
    changed = dataclasses.replace(PROFILES, fields=tuple(
        FieldSpec(f.name, f.type, "content.display_name") if f.name == "name" else f for f in PROFILES.fields))

    async def run():
        store, build = await _respecified(path, _notes(12), PROFILES, changed)
        assert build.progress["fill"] is False
        assert rows(path, "SELECT count(*) FROM profiles")[0][0] == 0
        await _finish(store, build)

    asyncio.run(run())
    assert problems(path, [changed]) == []
