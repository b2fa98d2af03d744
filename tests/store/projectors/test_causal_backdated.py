"""Causal projectors hold a backdated operation (created_at earlier than its predecessor's) and record it."""

from __future__ import annotations

import pytest

from tests.store.projectors.common import problems, rows
from tests.store.projectors.test_causal import ALICE, DOCS, history, op, run, states


@pytest.mark.parametrize("order", ["in order", "reversed"])
async def test_backdated_operation_is_held_and_recorded(tmp_path, order):
    """An operation signed earlier than the one it follows is held, with its reason; nothing after it applies."""
    db = tmp_path / "r.db"
    o0 = op(ALICE, "doc", 0, None, "title", "a", at=2000)
    o1 = op(ALICE, "doc", 1, o0.id, "title", "b", at=1999)
    o2 = op(ALICE, "doc", 2, o1.id, "title", "c", at=2001)
    batches = [[o0], [o1], [o2]]
    await run(db, *(batches if order == "in order" else batches[::-1]))
    assert history(db) == [o0.id]
    assert states(db)[o1.id] == "held"
    assert rows(db, "SELECT reason FROM projector_refusals WHERE event_id = ?", (o1.id,)) == [
        ("held: backdated, created_at 1999 at seq 1 is earlier than its predecessor's (2000)",)]
    assert rows(db, "SELECT value FROM doc_values") == [("a",)]
    assert problems(db, (DOCS,)) == []


async def test_a_backdated_fork_never_wins_even_with_the_lower_id(tmp_path):
    """At a fork, the lowest id among operations that are not backdated wins; an equal created_at is not backdated."""
    db = tmp_path / "r.db"
    o0 = op(ALICE, "doc", 0, None, "title", "a", at=2000)
    forks = [op(ALICE, "doc", 1, o0.id, "title", f"v{i}", at=2000 if i % 2 else 1000) for i in range(6)]
    await run(db, [o0], forks)
    timely = min((f for f in forks if f.created_at == 2000), key=lambda f: f.id)
    assert history(db) == [o0.id, timely.id]
    assert {states(db)[f.id] for f in forks if f.created_at == 1000} == {"held"}
    assert problems(db, (DOCS,)) == []
