"""One check that every table derived from `events` agrees with it: tag index, projected tables, negentropy index."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import orjson

from relay.config import Config
from relay.store.negentropy_index import check_nodes, recompute
from tests.store.projectors.common import problems
from tests.store.test_properties import expected_tag_rows, table_rows


def assert_consistent(path: Path, config: Config) -> None:
    """Fail unless the tag index, every projector of `config` (`verify`) and every negentropy filter's items
    and nodes equal what the stored events give."""
    conn = sqlite3.connect(path)
    try:
        events = [orjson.loads(raw) for (raw,) in conn.execute("SELECT raw FROM events")]
        filters = conn.execute("SELECT filter_no, spec FROM neg_filters").fetchall()
        assert filters, "no negentropy index"
        for number, spec in filters:
            items = conn.execute("SELECT created_at, id FROM neg_items WHERE filter_no = ? ORDER BY created_at, id",
                                 (number,)).fetchall()
            assert [(c, bytes(i)) for c, i in items] == recompute(conn, spec), spec
            assert check_nodes(conn, number) == [], spec
    finally:
        conn.close()
    ids, tags, orphans = table_rows(path)
    assert ids == {e["id"] for e in events}
    assert tags == expected_tag_rows(events) and orphans == 0
    assert problems(path, config.projectors) == []
