"""`NegentropyIndex`: the transaction hook that keeps the NIP-77 index of each indexed filter.

How this works
--------------
`NegentropyIndex` is a `TransactionHook`.  It indexes the full event set
(filter `{}`), each filter configured under `[negentropy] filters` and, with
NIP-42 private kinds, the public set (every event of other kinds).  Each has
a `neg_filters` row whose `filter_no` numbers its tree (tree.py).  At setup
the stored trees are brought in line with the configuration: trees of
filters no longer configured are dropped, missing ones built from `events`,
and all of them rebuilt when the node scheme (`LAYOUT`) changed.  In each
write transaction the net inserted and removed events go to the tree of
every filter they match.  `DropNegentropyIndex` empties the index instead,
when negentropy is disabled.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable

from relay.protocol.filters import Filter
from relay.store.db import transaction
from relay.store.negentropy.tree import LAYOUT, MAX_CHILDREN, build_nodes, update_items
from relay.store.queries import compile_filter
from relay.store.writes import Changes

FULL_SET_SPEC = "{}"
"""`filter_spec` of the full event set, always indexed."""

_LAYOUT_KEY = "negentropy_index_layout"


def filter_spec(f: Filter) -> str:
    """Canonical JSON of `f` without since/until/limit: the identity of an indexed filter.

    Keys sorted, list values sorted, compact; `Filter()` gives "{}".
    """
    obj: dict[str, list] = {}
    if f.ids is not None:
        obj["ids"] = sorted(f.ids)
    if f.authors is not None:
        obj["authors"] = sorted(f.authors)
    if f.kinds is not None:
        obj["kinds"] = sorted(f.kinds)
    for name, values in f.tags:
        obj["#" + name] = sorted(values)
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def public_spec(private_kinds: Iterable[int]) -> str:
    """`filter_spec` of the public set: every event but those of the NIP-42 private kinds (not a NIP-01 filter)."""
    return "public:" + json.dumps({"excluded_kinds": sorted(set(private_kinds))}, separators=(",", ":"))


class NegentropyIndex:
    """TransactionHook: the negentropy index of the full set and of `filters` (NIP-01 filters).

    `filters` carry no since/until/limit (their spec ignores them).  With
    `private_kinds` (NIP-42 private kinds, e.g. 4 and 1059), the public set,
    every event of other kinds, is indexed too: it answers the full-set
    NEG-OPEN of a reader who may see none of those kinds' events.  Call
    `filter_no(f)` / `public_no()` after `setup` to learn what is indexed.
    """

    def __init__(self, filters: Iterable[Filter] = (), max_children: int = MAX_CHILDREN,
                 private_kinds: Iterable[int] = ()) -> None:
        if max_children < 4:
            raise ValueError("max_children must be at least 4")
        self.max_children = max_children
        self._filters: dict[str, Filter] = {FULL_SET_SPEC: Filter()}
        self._private = frozenset(private_kinds)
        self._public = public_spec(self._private) if self._private else None
        if self._public:
            self._filters[self._public] = Filter()  # matched by kind in `apply`, built by `_build`
        for f in filters:
            self._filters.setdefault(filter_spec(f), f)
        self._numbers: dict[str, int] = {}

    @property
    def specs(self) -> list[str]:
        """The `filter_spec` of every indexed filter, the full set first."""
        return list(self._filters)

    def filter_no(self, f: Filter) -> int | None:
        """The `neg_filters.filter_no` whose index serves `f` (since/until/limit aside), or None."""
        return self._numbers.get(filter_spec(f))

    def public_no(self, f: Filter, private_kinds: frozenset[int]) -> int | None:
        """The index serving `f` to a reader who may see no event of `private_kinds`, or None.

        Only the full-set filter `{}` (since/until/limit aside) is served, and
        only when `private_kinds` are the ones this index leaves out.
        """
        if self._public is None or private_kinds != self._private or filter_spec(f) != FULL_SET_SPEC:
            return None
        return self._numbers.get(self._public)

    def setup(self, conn: sqlite3.Connection) -> None:
        """Bring the stored indexes in line with the configured filters, in one transaction.

        Indexes of filters no longer configured are deleted; missing ones are
        built from `events` (reading every matching event once).
        """
        with transaction(conn):
            layout = conn.execute("SELECT value FROM meta WHERE key = ?", (_LAYOUT_KEY,)).fetchone()
            if layout is None or layout[0] != LAYOUT:
                _clear(conn)
                conn.execute("INSERT INTO meta (key, value) VALUES (?, ?)"
                             " ON CONFLICT (key) DO UPDATE SET value = excluded.value", (_LAYOUT_KEY, LAYOUT))
            stored = dict(conn.execute("SELECT spec, filter_no FROM neg_filters").fetchall())
            for spec, number in stored.items():
                if spec not in self._filters:
                    _drop_filter(conn, number)
            numbers = {}
            for spec, f in self._filters.items():
                number = stored.get(spec)
                if number is None:
                    number = conn.execute("INSERT INTO neg_filters (spec) VALUES (?)", (spec,)).lastrowid
                    _build(conn, number, spec, f, self.max_children // 2)
                numbers[spec] = number
        self._numbers = numbers

    def attach(self, conn: sqlite3.Connection) -> None:
        """Find the indexes `setup` made, without writing (a process that only reads: `ReadPool.open`)."""
        # (a read connection returns TEXT as bytes: relay/store/db.py)
        stored = {bytes(spec).decode(): number for spec, number in
                  conn.execute("SELECT CAST(spec AS BLOB), filter_no FROM neg_filters")}
        self._numbers = {spec: stored[spec] for spec in self._filters if spec in stored}

    def apply(self, cur: sqlite3.Cursor, changes: Changes) -> None:
        """Add the events inserted and remove the rows removed by one transaction (its `net()` changes)."""
        inserted, removed = changes.net()
        new = [((ev.created_at, bytes.fromhex(ev.id)), ev) for ev in inserted]
        gone = [(r.created_at, r.id) for r in removed]
        for spec, f in self._filters.items():
            if spec == FULL_SET_SPEC:
                adds = [key for key, _ in new]
            elif spec == self._public:
                adds = [key for key, ev in new if ev.kind not in self._private]
            else:
                adds = [key for key, ev in new if f.matches(ev)]
            if adds or gone:
                update_items(cur, self._numbers[spec], adds, gone, self.max_children)


class DropNegentropyIndex:
    """TransactionHook for `[negentropy] enabled = false`: empties the index at setup, then does nothing.

    An index not kept up to date must not survive to be trusted later: with
    negentropy enabled again, `NegentropyIndex.setup` rebuilds it.
    """

    def setup(self, conn: sqlite3.Connection) -> None:
        """Delete every index row, in one transaction."""
        with transaction(conn):
            _clear(conn)

    def apply(self, cur: sqlite3.Cursor, changes: Changes) -> None:
        """Nothing: no index is kept."""


def _clear(conn: sqlite3.Connection) -> None:
    for table in ("neg_nodes", "neg_filters"):
        conn.execute(f"DELETE FROM {table}")


def _drop_filter(conn: sqlite3.Connection, number: int) -> None:
    for table in ("neg_nodes", "neg_filters"):
        conn.execute(f"DELETE FROM {table} WHERE filter_no = ?", (number,))


def _build(conn: sqlite3.Connection, number: int, spec: str, f: Filter, fill: int) -> None:
    """Index every stored event of `spec` (expired ones too: they stay in `events` until the purge)."""
    build_nodes(conn, number, matching_items(conn, spec, f, "ORDER BY created_at, id"), fill)


def matching_items(conn: sqlite3.Connection, spec: str, f: Filter, order: str = "") -> sqlite3.Cursor:
    """(created_at, id) of the stored events of the indexed set `spec` (whose filter is `f`)."""
    if spec == FULL_SET_SPEC:
        return conn.execute(f"SELECT created_at, id FROM events {order}")
    if spec.startswith("public:"):
        kinds = json.loads(spec.removeprefix("public:"))["excluded_kinds"]
        return conn.execute(f"SELECT created_at, id FROM events WHERE kind NOT IN ({', '.join('?' * len(kinds))})"
                            f" {order}", kinds)
    # limit -1: none (SQLite); now -1: before every expiration, which is >= 0.
    compiled = compile_filter(f, -1, -1)
    return conn.execute(f"SELECT created_at, id FROM ({compiled.sql}) {order}", compiled.params)
