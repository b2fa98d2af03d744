"""`relay verify` for the NIP-77 negentropy index: recompute each indexed filter's items from `events` and compare.

An index agrees with the events when its bucket items are exactly the
(created_at, id) of the stored events its filter matches, and every bucket
and group node holds the count and limb sums of the items it covers
(docs/architecture.md, invariant 4).  Reads only: run it on a read-only connection.
"""

from __future__ import annotations

import bisect
import json
import sqlite3
import struct
from dataclasses import dataclass, field

from relay.protocol.filters import Filter, parse_filter
from relay.store.db import read_transaction
from relay.store.negentropy.index import FULL_SET_SPEC, matching_items
from relay.store.negentropy.tree import SENTINEL, SUM_COLUMNS, Key, unpack_bucket

_LIMBS = struct.Struct("<8I")


def recompute(conn: sqlite3.Connection, spec: str) -> list[Key]:
    """What the index of `spec` should hold, recomputed from `events`: sorted (created_at, id) (for checks)."""
    f = Filter() if spec == FULL_SET_SPEC or spec.startswith("public:") else parse_filter(json.loads(spec))
    return sorted((c, bytes(i)) for c, i in matching_items(conn, spec, f))


def indexed_items(conn: sqlite3.Connection, number: int) -> list[Key]:
    """Every item of filter `number`'s index, in bucket order, from the buckets' rows (for checks)."""
    rows = conn.execute("SELECT ts, ids FROM neg_nodes WHERE filter_no = ? AND level = 1 ORDER BY created_at, id",
                        (number,)).fetchall()
    return [item for ts_blob, ids_blob in rows for item in unpack_bucket(ts_blob, ids_blob)]


def check_nodes(conn: sqlite3.Connection, number: int, items: list[Key] | None = None) -> list[str]:
    """Every disagreement between filter `number`'s nodes and its items (empty when consistent).

    `items` are its `indexed_items` if the caller has read them already.
    """
    problems = []
    if items is None:
        items = indexed_items(conn, number)
    if any(a >= b for a, b in zip(items, items[1:])):
        problems.append("bucket items out of order or repeated")
    for level in (1, 2):
        nodes = conn.execute(f"SELECT created_at, id, count, children, {SUM_COLUMNS} FROM neg_nodes"
                             " WHERE filter_no = ? AND level = ? ORDER BY created_at, id", (number, level)).fetchall()
        if not nodes or (nodes[0][0], nodes[0][1]) != SENTINEL:
            problems.append(f"level {level}: no sentinel first node")
            continue
        starts = [(n[0], n[1]) for n in nodes]
        for k, n in enumerate(nodes):
            lo = bisect.bisect_left(items, starts[k])
            hi = len(items) if k + 1 == len(nodes) else bisect.bisect_left(items, starts[k + 1])
            ids = [i for _, i in items[lo:hi]]
            sums = [sum(_LIMBS.unpack(i)[j] for i in ids) for j in range(8)]
            if n[2] != len(ids) or list(n[4:12]) != sums:
                problems.append(f"level {level} node {starts[k]}: count/sums disagree with its items")
            if level == 1 and n[3] != n[2]:
                problems.append(f"bucket {starts[k]}: children {n[3]} != count {n[2]}")
        if level == 1:
            bucket_starts = starts
        else:
            known = set(bucket_starts)
            for k, start in enumerate(starts):
                if start not in known:
                    problems.append(f"group {start} does not start at a bucket")
                end = starts[k + 1] if k + 1 < len(starts) else None
                inside = [s for s in bucket_starts if s >= start and (end is None or s < end)]
                if nodes[k][3] != len(inside):
                    problems.append(f"group {start}: children {nodes[k][3]} != {len(inside)} buckets")
    return problems


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
