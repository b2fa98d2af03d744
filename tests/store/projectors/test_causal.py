"""Causal projector: ordered operation logs per (log, author) with gaps, forks, losing branches and deletions;
order independence property-tested against a direct fold of the operations."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relay.store.projectors import CausalSpec, Operation, SpecError
from relay.store.projectors.causal import chain_of
from tests.helpers import Keys
from tests.store.projectors.common import dumps, event, open_store, problems, rows, submit_batches

OP_KIND = 4242
ALICE, BOB = Keys(0xA11CE), Keys(0xB0B)


def apply_op(conn: sqlite3.Connection, op: Operation) -> None:
    """A key-value document: {"key", "value"} sets a key; every applied operation is appended to a history."""
    body = json.loads(op.event.content)
    if body.get("fail"):
        raise ValueError("this operation cannot be applied")
    conn.execute("INSERT INTO doc_values (_log, _author, key, value) VALUES (?, ?, ?, ?)"
                 " ON CONFLICT (_log, _author, key) DO UPDATE SET value = excluded.value",
                 (op.log_id, op.author, body["key"], body["value"]))
    conn.execute("INSERT INTO doc_history (_log, _author, seq, event_id) VALUES (?, ?, ?, ?)",
                 (op.log_id, op.author, op.seq, op.event.id))


DOCS = CausalSpec(
    name="docs", kind=OP_KIND, apply=apply_op,
    tables=(("doc_values", "key TEXT NOT NULL, value TEXT, PRIMARY KEY (_log, _author, key)"),
            ("doc_history", "seq INTEGER NOT NULL, event_id TEXT NOT NULL")),
)


def op(keys: Keys, log: str, seq: int, prev: str | None, key: str, value: str, at: int = 1000, **extra):
    """An operation event: tags log, seq, prev (from 1 on)."""
    tags = [["log", log], ["seq", str(seq)]] + ([["prev", prev]] if prev else [])
    return event(keys, OP_KIND, {"key": key, "value": value, **extra}, tags, at)


def history(db: Path, log: str = "doc", author: str = ALICE.pubkey) -> list[str]:
    return [r[0] for r in rows(db, "SELECT event_id FROM doc_history WHERE _log = ? AND _author = ? ORDER BY seq",
                               (log, author))]


def states(db: Path) -> dict[str, str]:
    return dict(rows(db, "SELECT event_id, state FROM causal_ops"))


async def run(db: Path, *batches) -> None:
    store, _ = await open_store(db, (DOCS,))
    for batch in batches:
        await submit_batches(store, list(batch), [len(batch)])
    await store.close()


async def test_operations_apply_in_order_once_the_gap_fills(tmp_path):
    """Operations 2 and 1 wait for 0; when 0 arrives all three apply, in order."""
    db = tmp_path / "r.db"
    o0 = op(ALICE, "doc", 0, None, "title", "a")
    o1 = op(ALICE, "doc", 1, o0.id, "title", "b")
    o2 = op(ALICE, "doc", 2, o1.id, "body", "c")
    await run(db, [o2], [o1])
    assert history(db) == [] and set(states(db).values()) == {"waiting"}
    await run(db, [o0])
    assert history(db) == [o0.id, o1.id, o2.id]
    assert rows(db, "SELECT key, value FROM doc_values ORDER BY key") == [("body", "c"), ("title", "b")]
    assert set(states(db).values()) == {"applied"}
    assert problems(db, (DOCS,)) == []


@pytest.mark.parametrize("order", ["winner first", "loser first"])
async def test_fork_lowest_id_wins_whatever_the_order(tmp_path, order):
    """Two operations at seq 1 with the right back-link: the lower id is applied, the other is lost."""
    db = tmp_path / "r.db"
    o0 = op(ALICE, "doc", 0, None, "title", "a")
    x, y = op(ALICE, "doc", 1, o0.id, "title", "x"), op(ALICE, "doc", 1, o0.id, "title", "y")
    winner, loser = sorted((x, y), key=lambda e: e.id)
    await run(db, [o0], [winner] if order == "winner first" else [loser],
              [loser] if order == "winner first" else [winner])
    assert history(db) == [o0.id, winner.id]
    assert rows(db, "SELECT value FROM doc_values") == [(json.loads(winner.content)["value"],)]
    assert states(db)[loser.id] == "lost"
    assert rows(db, "SELECT reason FROM projector_refusals WHERE event_id = ?", (loser.id,)) == [
        (f"lost the fork at seq 1 to {winner.id}",)]
    assert problems(db, (DOCS,)) == []


async def test_operations_on_a_losing_branch_are_held_and_apply_when_it_wins(tmp_path):
    """An operation chained to the fork loser is held; deleting the winner makes the loser's branch apply."""
    db = tmp_path / "r.db"
    o0 = op(ALICE, "doc", 0, None, "k", "0")
    x, y = op(ALICE, "doc", 1, o0.id, "k", "x"), op(ALICE, "doc", 1, o0.id, "k", "y")
    winner, loser = sorted((x, y), key=lambda e: e.id)
    on_loser = op(ALICE, "doc", 2, loser.id, "k", "after loser")
    await run(db, [o0, loser, on_loser], [winner])
    assert history(db) == [o0.id, winner.id]
    assert states(db)[on_loser.id] == "held"
    await run(db, [event(ALICE, 5, "", [["e", winner.id]], 2000)])
    assert history(db) == [o0.id, loser.id, on_loser.id]
    assert rows(db, "SELECT value FROM doc_values") == [("after loser",)]
    assert problems(db, (DOCS,)) == []


async def test_deleting_an_applied_operation_rebuilds_the_log(tmp_path):
    """NIP-09 deletion of operation 1: the log's tables are rebuilt from operation 0 alone; others are untouched."""
    db = tmp_path / "r.db"
    o0 = op(ALICE, "doc", 0, None, "a", "0")
    o1 = op(ALICE, "doc", 1, o0.id, "b", "1")
    o2 = op(ALICE, "doc", 2, o1.id, "c", "2")
    other = op(BOB, "doc", 0, None, "z", "bob")
    await run(db, [o0, o1, o2, other])
    await run(db, [event(ALICE, 5, "", [["e", o1.id]], 2000)])
    assert history(db) == [o0.id]
    assert rows(db, "SELECT key FROM doc_values WHERE _author = ?", (ALICE.pubkey,)) == [("a",)]
    assert history(db, "doc", BOB.pubkey) == [other.id]
    assert states(db)[o2.id] == "waiting"
    assert problems(db, (DOCS,)) == []


async def test_failing_apply_is_contained_and_recorded(tmp_path):
    """An exception in `apply` undoes that operation only; the chain goes on and the failure is logged."""
    db = tmp_path / "r.db"
    o0 = op(ALICE, "doc", 0, None, "a", "0")
    o1 = op(ALICE, "doc", 1, o0.id, "b", "1", fail=True)
    o2 = op(ALICE, "doc", 2, o1.id, "c", "2")
    bad = event(ALICE, OP_KIND, {"key": "x", "value": "y"}, [["log", "doc"], ["seq", "one"]])
    await run(db, [o0, o1, o2, bad])
    assert history(db) == [o0.id, o2.id]
    reasons = dict(rows(db, "SELECT event_id, reason FROM projector_refusals"))
    assert reasons[o1.id].startswith("apply failed: ValueError")
    assert reasons[bad.id] == "operation without a decimal 'seq' tag"
    assert problems(db, (DOCS,)) == []


async def test_causal_projector_is_built_from_existing_events(tmp_path):
    """Operations stored before the causal projector existed are applied at start-up."""
    db = tmp_path / "r.db"
    o0 = op(ALICE, "doc", 0, None, "a", "0")
    o1 = op(ALICE, "doc", 1, o0.id, "b", "1")
    store, _ = await open_store(db, ())
    await submit_batches(store, [o1, o0])
    await store.close()
    store, hook = await open_store(db, (DOCS,))
    await store.close()
    assert hook.rebuilt == [("docs", "new")]
    assert history(db) == [o0.id, o1.id]


def test_causal_spec_validation():
    """Operations must be a regular kind; tag names distinct; tables named."""
    with pytest.raises(SpecError, match="kind must be a regular kind"):
        CausalSpec("c", 30001, (("t", "x TEXT"),), apply_op)
    with pytest.raises(SpecError, match="three different tag names"):
        CausalSpec("c", OP_KIND, (("t", "x TEXT"),), apply_op, seq_tag="log")
    with pytest.raises(SpecError, match="table 'events'"):
        CausalSpec("c", OP_KIND, (("events", "x TEXT"),), apply_op)


# ------------------------------------------------------------------ order independence, property-tested

def _pool() -> tuple[list, list]:
    """Two logs of ALICE and one of BOB with gaps, forks (several at one seq), branches on losers, and deletions."""
    ops = []
    for keys, log in ((ALICE, "a"), (ALICE, "b"), (BOB, "a")):
        o0 = op(keys, log, 0, None, "k0", f"{log}0")
        o0b = op(keys, log, 0, None, "k0", f"{log}0-fork")
        f1 = [op(keys, log, 1, o0.id, "k1", f"{log}1-{n}") for n in range(3)]
        f1b = op(keys, log, 1, o0b.id, "k1", f"{log}1-on-fork0")
        o2 = [op(keys, log, 2, f.id, "k2", f"{log}2-on-{n}") for n, f in enumerate(f1)]
        o3 = op(keys, log, 3, o2[0].id, "k0", f"{log}3")
        ops += [o0, o0b, *f1, f1b, *o2, o3]
    deletions = [event(ALICE if e.pubkey == ALICE.pubkey else BOB, 5, "", [["e", e.id]], 5000) for e in ops]
    return ops, deletions


OPS, DELETIONS = _pool()  # DELETIONS[i] deletes OPS[i]


def expected_tables(ops: list, deleted: set[str]) -> dict[tuple, tuple[list[str], dict[str, str]]]:
    """Direct fold per (log, author): the chain by the lowest-id rule over the live operations, then the values."""
    live = [e for e in ops if e.id not in deleted]
    logs: dict[tuple, list] = {}
    for e in live:
        tags = {t[0]: t[1] for t in e.tags}
        logs.setdefault((tags["log"], e.pubkey), []).append((int(tags["seq"]), e.id, tags.get("prev"), e))
    out = {}
    for key, items in logs.items():
        chain = chain_of((s, i, p) for s, i, p, _ in items)
        by_id = {i: e for _, i, _, e in items}
        values: dict[str, str] = {}
        for event_id in chain:
            body = json.loads(by_id[event_id].content)
            values[body["key"]] = body["value"]
        out[key] = (chain, values)
    return out


@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_causal_tables_do_not_depend_on_arrival_order(data):
    """Any subset of operations and deletions, in two orders and batchings: identical tables, equal to the fold."""
    kept = data.draw(st.lists(st.booleans(), min_size=len(OPS), max_size=len(OPS)), label="kept ops")
    deletions = data.draw(st.lists(st.sampled_from(DELETIONS), unique_by=lambda e: e.id, max_size=4), label="del")
    events = [e for e, k in zip(OPS, kept) if k] + deletions
    order_a = data.draw(st.permutations(events), label="order A")
    order_b = data.draw(st.permutations(events), label="order B")
    sizes = data.draw(st.lists(st.integers(1, 8), max_size=6), label="batches")
    with tempfile.TemporaryDirectory() as tmp:
        a, b = Path(tmp) / "a.db", Path(tmp) / "b.db"

        async def fill():
            store, _ = await open_store(a, (DOCS,))
            await submit_batches(store, list(order_a), sizes)
            await store.close()
            store, _ = await open_store(b, (DOCS,))
            await submit_batches(store, list(order_b), [1] * len(order_b))
            await store.close()

        asyncio.run(fill())
        assert dumps(a, (DOCS,)) == dumps(b, (DOCS,))
        assert problems(a, (DOCS,)) == [] and problems(b, (DOCS,)) == []
        deleted = {d.tags[0][1] for d in deletions}
        for (log, author), (chain, values) in expected_tables([e for e, k in zip(OPS, kept) if k], deleted).items():
            assert history(a, log, author) == chain
            assert dict(rows(a, "SELECT key, value FROM doc_values WHERE _log = ? AND _author = ?",
                             (log, author))) == values
