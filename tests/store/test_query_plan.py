"""Every NIP-01 filter shape is answered through an index: EXPLAIN QUERY PLAN shows SEARCH, never SCAN."""

from __future__ import annotations

import sqlite3

import pytest

from relay.protocol.filters import parse_filter
from relay.store.db import migrate
from relay.store.queries import compile_count, compile_filter

A, B = "a" * 64, "b" * 64

SHAPES = {
    "id": {"ids": [A]},
    "100 ids": {"ids": [f"{i:064x}" for i in range(100)]},
    "author": {"authors": [A]},
    "authors + kinds": {"authors": [A, B], "kinds": [1, 6]},
    "kind": {"kinds": [1]},
    "kind + since": {"kinds": [1], "since": 1_700_000_000},
    "tag e": {"#e": [A]},
    "tag p + kind": {"#p": [A], "kinds": [1, 7]},
    "two tags": {"#e": [A], "#t": ["nostr", "relay"]},
    "author + tag": {"authors": [A], "#t": ["x"]},
    "since only": {"since": 1_700_000_000},
    "everything": {},
}


@pytest.fixture(scope="module")
def conn(tmp_path_factory):
    conn = sqlite3.connect(tmp_path_factory.mktemp("plan") / "plan.db", isolation_level=None)
    migrate(conn)
    yield conn
    conn.close()


def _plan(conn, compiled) -> list[str]:
    return [row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + compiled.sql, compiled.params)]


def _assert_indexed(plan: list[str]) -> None:
    for line in plan:
        assert not line.startswith("SCAN e") and not line.startswith("SCAN t"), plan
        assert "SCAN events" not in line and "SCAN tags" not in line, plan


@pytest.mark.parametrize("shape", [s for s in SHAPES if s not in ("everything", "since only")])
def test_filter_shape_uses_search(conn, shape):
    """Filters by id, author, kind, kind + since and tag read through an index (SEARCH)."""
    plan = _plan(conn, compile_filter(parse_filter(SHAPES[shape]), 500, 0))
    assert any(line.startswith("SEARCH") for line in plan), plan
    _assert_indexed(plan)


@pytest.mark.parametrize("shape", ["everything", "since only"])
def test_time_ordered_filters_walk_the_created_at_index(conn, shape):
    """Filters with no selective field walk the created_at index in order instead of sorting the table."""
    plan = " | ".join(_plan(conn, compile_filter(parse_filter(SHAPES[shape]), 500, 0)))
    assert "events_by_created" in plan and "TEMP B-TREE FOR ORDER BY" not in plan, plan


@pytest.mark.parametrize("shape", [s for s in SHAPES if s not in ("everything", "since only")])
def test_count_shape_uses_search(conn, shape):
    """COUNT statements use the same indexes."""
    _assert_indexed(_plan(conn, compile_count(parse_filter(SHAPES[shape]), 0)))
