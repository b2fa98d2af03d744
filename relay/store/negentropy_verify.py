"""`relay verify` for the NIP-77 negentropy index: recompute each indexed filter's items from `events` and compare.

An index agrees with the events when its bucket items are exactly the
(created_at, id) of the stored events its filter matches, and every bucket
and group node holds the count and limb sums of the items it covers
(DESIGN.md, invariant 4).  Reads only: run it on a read-only connection.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field

from relay.store.db import read_transaction
from relay.store.negentropy_index import check_nodes, indexed_items, recompute


@dataclass
class IndexCheck:
    """The comparison of one indexed filter (`spec`, canonical JSON) with its recomputation.

    `missing`: events stored but absent from the index; `extra`: index items
    with no stored event; `nodes`: bucket/group disagreements (text);
    `problem`: why it could not be compared (not built for this configuration).
    """

    spec: str
    items: int = 0
    missing: int = 0
    extra: int = 0
    nodes: list[str] = field(default_factory=list)
    problem: str | None = None

    @property
    def ok(self) -> bool:
        """True when the index equals its recomputation."""
        return self.problem is None and not (self.missing or self.extra or self.nodes)


def verify_index(conn: sqlite3.Connection, configured: list[str]) -> list[IndexCheck]:
    """Check every stored negentropy index, and those `configured` (`NegentropyIndex.specs`), against `events`.

    An index configured but not stored, or stored but not configured, is a
    problem.  One read transaction, so the comparison is of one snapshot.
    """
    checks = []
    with read_transaction(conn):
        stored = dict(conn.execute("SELECT spec, filter_no FROM neg_filters").fetchall())
        for spec in dict.fromkeys([*configured, *stored]):
            check = IndexCheck(spec)
            checks.append(check)
            if spec not in stored or spec not in configured:
                check.problem = "not built for this configuration: restart the relay"
                continue
            listed = indexed_items(conn, stored[spec])
            items, expected = set(listed), set(recompute(conn, spec))
            check.items = len(items)
            check.missing = len(expected - items)
            check.extra = len(items - expected)
            check.nodes = check_nodes(conn, stored[spec], listed)
    return checks
