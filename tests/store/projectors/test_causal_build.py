"""Builds of causal projectors that resume (relay/store/projectors/causal_build.py): a build interleaved with live
operations and deletions ends equal to a from-scratch projection, and a build cut short resumes after its checkpoint
while `relay verify` and `relay query` exit 3."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relay.commands.projectors import BUILDING_EXIT, run_query, run_verify
from relay.config import load_config
from relay.store.projectors.tables import build_progress, read_meta
from tests.causal_app import TOML
from tests.helpers import Keys
from tests.store.projectors.common import (build_step, build_while_writing, built_and_live, connect, event,
                                           open_store, problems, rows, submit_batches)
from tests.store.projectors.test_causal import DELETIONS, DOCS, OPS, history

KIND = 4242


async def _built_while_writing(path: Path, before: list, during: list, batch: int, sizes: list[int]) -> None:
    """`before` stored with no projector; then DOCS is added and built in steps of `batch` events, with a batch
    of `during` (sizes from `sizes`) committed before each step, and the rest after the build."""
    store, _ = await open_store(path, ())
    await submit_batches(store, before, [50])
    await store.close()
    store, hook = await open_store(path, (DOCS,), background=True, build_batch=batch)
    await build_while_writing(store, hook, during, sizes, [3] * 40)
    assert read_meta(connect(path))["docs"]["state"] == "current"
    await store.close()


async def _live(path: Path, events: list) -> None:
    store, _ = await open_store(path, (DOCS,))
    await submit_batches(store, events, [1] * len(events))
    await store.close()


@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_causal_build_with_writes_during_it_equals_a_from_scratch_projection(data):
    """Operations (gaps, forks, branches on losers) and deletions of them, some stored before the projector
    existed and the rest committed between build steps: the finished tables and `causal_ops` states equal those of
    a relay that projected every event live, and `verify`'s replay."""
    kept = data.draw(st.lists(st.booleans(), min_size=len(OPS), max_size=len(OPS)), label="kept ops")
    deletions = data.draw(st.lists(st.sampled_from(DELETIONS), unique_by=lambda e: e.id, max_size=4), label="del")
    events = [e for e, k in zip(OPS, kept) if k] + deletions
    built, live, found = built_and_live(data, events, (DOCS,), _built_while_writing, _live)
    assert found == []
    assert built == live


def _operations(logs: int, length: int) -> list:
    """`logs` chains of `length` operations each, one author per chain, in log order."""
    out = []
    for n in range(logs):
        keys, prev = Keys(0x5000 + n), None
        for seq in range(length):
            tags = [["log", "doc"], ["seq", str(seq)]] + ([["prev", prev]] if prev else [])
            out.append(event(keys, KIND, {"key": f"k{seq % 3}", "value": f"v{seq}"}, tags, 1000 + seq))
            prev = out[-1].id
    return out


def test_a_causal_build_cut_short_resumes_after_its_checkpoint(tmp_path):
    """Three steps, then the store closes (as after a crash: the build task never ran again); `relay verify` and
    `relay query` exit 3 meanwhile; the next start resumes with the events after the checkpoint only, and the
    tables end complete and verified."""
    path = tmp_path / "relay.db"
    config_file = tmp_path / "relay.toml"
    config_file.write_text(f'[store]\npath = "{path}"\n[negentropy]\nenabled = false\n[search]\nenabled = false\n'
                           + TOML.format(revision=1), encoding="utf-8")
    loaded = load_config(config_file)
    specs = [s for s in loaded.projectors if s.name == "docs"]
    config = dataclasses.replace(loaded, projectors=tuple(specs))  # the built-in projectors are not built here
    operations = _operations(4, 10)

    async def run() -> tuple:
        store, _ = await open_store(path, ())
        await submit_batches(store, operations, [100])
        await store.close()
        store, hook = await open_store(path, specs, background=True, build_batch=5)
        assert [await build_step(store, hook.builds[0]) for _ in range(3)] == [False] * 3
        await store.close()
        assert build_progress(connect(path), "docs") == {"done": 15, "total": 40}
        assert run_verify(config) == BUILDING_EXIT
        assert run_query(config, "doc_values", None, "json", None) == BUILDING_EXIT
        store, hook = await open_store(path, specs, background=True, build_batch=5)
        left = hook.builds[0].remaining
        await build_while_writing(store, hook, [], [], [])
        await store.close()
        return hook.rebuilt, left, hook.builds[0].read

    rebuilt, left, read = asyncio.run(run())
    assert rebuilt == [("docs", "building (15 of 40)")]
    assert left == read == 40 - 15  # nothing before the checkpoint is read again
    assert problems(path, specs) == []
    assert run_verify(config) == 0
    for n in range(4):
        assert len(history(path, "doc", Keys(0x5000 + n).pubkey)) == 10
    assert rows(path, "SELECT count(*) FROM doc_values")[0][0] == 4 * 3
    assert rows(path, "SELECT value FROM doc_values WHERE _author = ? AND key = 'k0'",
                (Keys(0x5000).pubkey,)) == [("v9",)]  # seq 9 set k0 last
