"""`relay verify` for the NIP-77 negentropy index: recompute each indexed filter's items from `events` and compare.

An index agrees with the events when its `neg_items` are exactly the
(created_at, id) of the stored events its filter matches, and every bucket
and group node holds the count and limb sums of the items it covers
(DESIGN.md, invariant 4).  Reads only: run it on a read-only connection.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field

from relay.protocol.filters import parse_filter
from relay.store.negentropy_index import FULL_SET_SPEC, check_nodes, filter_spec, recompute


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


def verify_index(conn: sqlite3.Connection, enabled: bool, filters: tuple[dict, ...] = ()) -> list[IndexCheck]:
    """Check the negentropy index of the full set and of `filters` (`[negentropy] filters`) against `events`.

    With `enabled` false no index is kept and none may be stored.  One
    read transaction, so the comparison is of one snapshot.
    """
    configured = [FULL_SET_SPEC, *(filter_spec(parse_filter(f)) for f in filters)] if enabled else []
    checks = []
    conn.execute("BEGIN")
    try:
        stored = dict(conn.execute("SELECT spec, filter_no FROM neg_filters").fetchall())
        for spec in dict.fromkeys([*configured, *stored]):
            check = IndexCheck(spec)
            checks.append(check)
            if spec not in stored or spec not in configured:
                check.problem = "not built for this configuration: restart the relay"
                continue
            items = set(conn.execute("SELECT created_at, id FROM neg_items WHERE filter_no = ?", (stored[spec],)))
            expected = set(recompute(conn, spec))
            check.items = len(items)
            check.missing = len(expected - items)
            check.extra = len(items - expected)
            check.nodes = check_nodes(conn, stored[spec])
    finally:
        conn.execute("COMMIT")
    return checks
