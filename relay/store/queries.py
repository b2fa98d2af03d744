"""NIP-01 filters compiled to SQL, and the read jobs run on a read connection's thread.

Each filter becomes ONE statement with bound parameters, ordered
`created_at DESC, id` (newest first, ties lowest id first) with its own
limit.  The driving index is chosen by the filter's shape: `ids` by the
primary key, `authors` by (pubkey[, kind], created_at), a tag condition by the
tag index, `kinds` by (kind, created_at), else by created_at.  Expired events
(NIP-40) are never returned, nor, given `PrivateKinds`, events of a private
kind that the reader is neither author nor `p`-tagged recipient of (NIP-42).

A filter with a NIP-50 `search` is driven by the full-text index instead
(relay/store/search/, rowid = events.seq), its other conditions ANDed, and
ordered by relevance (FTS5's bm25, text column only), then newest: it is
`ranked`, and a REQ holding one sends each filter's rows in the REQ's order.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from relay.protocol.auth import PrivateKinds
from relay.protocol.filters import Filter
from relay.store.search import TABLE as SEARCH_TABLE


@dataclass(frozen=True, slots=True)
class Compiled:
    """One filter as SQL: `sql` selects (created_at, id, raw); `params` binds it; `ranked`: ordered by
    relevance (a search), not newest first."""

    sql: str
    params: tuple
    ranked: bool = False


def _in(column: str, values, params: list, convert=None) -> str:
    items = sorted(values)
    params.extend(convert(v) for v in items) if convert else params.extend(items)
    if len(items) == 1:
        return f"{column} = ?"
    return f"{column} IN ({','.join('?' * len(items))})"


def _tag_exists(name: str, values, params: list, row: str = "e") -> str:
    """The event of table alias `row` (events `e`, or the driving tags row `t`) has tag `name` with one of `values`."""
    params.append(name)
    # The whole primary key is bound, so this is one index probe per value.
    return ("EXISTS (SELECT 1 FROM tags t2 WHERE t2.name = ? AND " + _in("t2.value", values, params)
            + f" AND t2.created_at = {row}.created_at AND t2.seq = {row}.seq)")


def _private(private: PrivateKinds, params: list) -> str:
    """Events of the private kinds only when by or `p`-tagging one of the readers (checked only for those kinds)."""
    hidden = f"NOT ({_in('e.kind', private.kinds, params)})"
    if not private.readers:
        return hidden
    return f"({hidden} OR {_in('e.pubkey', private.readers, params, bytes.fromhex)} OR " \
           f"{_tag_exists('p', private.readers, params)})"


def _conditions(f: Filter, now: int, params: list, time_column: str, skip_tag: str | None,
                counting: bool = False, private: PrivateKinds | None = None, row: str = "e") -> list[str]:
    """`f`'s conditions on the event of table alias `row` (see `_tag_exists`); ids, authors, kinds, private
    kinds and (unless `counting`) expiry read the events table `e`."""
    where = []
    if f.ids is not None:
        where.append(_in("e.id", f.ids, params, bytes.fromhex))
    if f.authors is not None:
        where.append(_in("e.pubkey", f.authors, params, bytes.fromhex))
    if f.kinds is not None:
        where.append(_in("e.kind", f.kinds, params))
    if f.since is not None:
        where.append(f"{time_column} >= ?")
        params.append(f.since)
    if f.until is not None:
        where.append(f"{time_column} <= ?")
        params.append(f.until)
    for name, values in f.tags:
        if name != skip_tag:
            where.append(_tag_exists(name, values, params, row))
    if private is not None and private.touches(f):
        where.append(_private(private, params))
    if counting:
        # Expired rows not yet purged are few: exclude them through the partial
        # expiration index, so a count can stay inside covering indexes.
        where.append(f"{row}.seq NOT IN (SELECT seq FROM events WHERE expiration IS NOT NULL AND expiration <= ?)")
    else:
        where.append("(e.expiration IS NULL OR e.expiration > ?)")
    params.append(now)
    return where


def _driving_tag(f: Filter) -> str | None:
    """The tag condition that drives the query through the tag index, if any should."""
    if not f.tags or f.ids is not None or f.authors is not None:
        return None
    return min(f.tags, key=lambda item: len(item[1]))[0]


def _from_clause(f: Filter, params: list) -> tuple[str, str, str | None]:
    if f.search is not None:
        params.append(f.search.match_expression())
        # The index drives: only the matching rows are joined to events, by primary key.
        return (f"FROM {SEARCH_TABLE} CROSS JOIN events e ON e.seq = {SEARCH_TABLE}.rowid AND {SEARCH_TABLE} MATCH ?",
                "e.created_at", None)
    tag = _driving_tag(f)
    if tag is None:
        return "FROM events e", "e.created_at", None
    values = dict(f.tags)[tag]
    params.append(tag)
    clause = "FROM tags t CROSS JOIN events e ON e.seq = t.seq AND t.name = ? AND " + _in("t.value", values, params)
    return clause, "t.created_at", tag


def compile_filter(f: Filter, limit: int, now: int, private: PrivateKinds | None = None) -> Compiled:
    """SQL selecting (created_at, id, raw) of live events matching `f`, at most `limit`: newest first, or
    for a search (NIP-50) best scored first (bm25), then newest.

    `now` is unix seconds, for NIP-40 expiry; `private` hides the private
    kinds' events from a reader who may not see them (None: hide nothing).
    """
    params: list = []
    from_clause, time_column, tag = _from_clause(f, params)
    where = " AND ".join(_conditions(f, now, params, time_column, tag, private=private))
    params.append(limit)
    # One event can hold several of the driving tag's values: DISTINCT keeps it once.
    distinct = "DISTINCT " if tag is not None and len(dict(f.tags)[tag]) > 1 else ""
    # bm25 weighs the text column only: every row a `domain:` search returns holds the same domain token
    relevance = f"bm25({SEARCH_TABLE}, 1.0, 0.0), " if f.search is not None else ""
    sql = (f"SELECT {distinct}e.created_at, e.id, e.raw {from_clause} WHERE {where}"
           f" ORDER BY {relevance}{time_column} DESC, e.id LIMIT ?")
    return Compiled(sql, tuple(params), ranked=f.search is not None)


def compile_count(f: Filter, now: int, private: PrivateKinds | None = None) -> Compiled:
    """SQL selecting `e.seq` of every live event matching `f`, each once (NIP-45 counts ignore `limit`).

    `private` as for `compile_filter`.
    """
    params: list = []
    from_clause, time_column, tag = _from_clause(f, params)
    distinct = "DISTINCT " if tag is not None and len(dict(f.tags)[tag]) > 1 else ""
    if tag is not None and f.kinds is None and not (private is not None and private.touches(f)):
        # Tags and times alone: the tags rows hold both (a row lives as long as its event), so the count
        # reads the tag index's range and never the events' pages (cold, one random page per event).
        params = [tag]
        from_clause = "FROM tags t WHERE t.name = ? AND " + _in("t.value", dict(f.tags)[tag], params)
        where = " AND ".join(_conditions(f, now, params, time_column, tag, counting=True, row="t"))
        return Compiled(f"SELECT {distinct}t.seq {from_clause} AND {where}", tuple(params))
    where = " AND ".join(_conditions(f, now, params, time_column, tag, counting=True, private=private))
    return Compiled(f"SELECT {distinct}e.seq {from_clause} WHERE {where}", tuple(params))


def run_query(conn: sqlite3.Connection, compiled: list[Compiled], max_rows: int | None = None,
              max_bytes: int | None = None) -> list[bytes]:
    """Run the statements of one REQ and merge them: raw events newest first, each id once, at most
    `max_rows` of them and at most `max_bytes` bytes of them together (the newest that fit).

    With a `ranked` statement (NIP-50 search) among them, each statement's
    rows keep its own order and come in the REQ's order instead, each id
    once (its first place), and the bounds keep the leading rows: a search's
    best scored.  Each statement's own LIMIT should not exceed `max_rows`:
    the merge then holds at most twice `max_rows` rows, however many filters
    the REQ has, and about twice `max_bytes` bytes.
    """
    if len(compiled) > 1 and any(c.ranked for c in compiled):
        return _newest(_in_filter_order(conn, compiled), max_rows, max_bytes)[0]
    if len(compiled) == 1:
        c = compiled[0]
        try:
            joined = _concatenated(conn, c, max_bytes)
        except sqlite3.DataError:  # "string or blob too big": over max_bytes, so its newest rows that fit
            return _newest(((row[2], len(row[2])) for row in conn.execute(c.sql, c.params)), max_rows, max_bytes)[0]
        return joined.split(b"\n")[:max_rows] if joined else []
    rows, held, cutoff = {}, 0, None

    def keep_newest() -> None:
        nonlocal rows, held, cutoff
        kept, stop = _newest(((row, len(row[2])) for row in sorted(rows.values())), max_rows, max_bytes)
        rows, held = {row[1]: row for row in kept}, sum(len(row[2]) for row in kept)
        if stop is not None:  # the answer ends before this row: no row from there on can be in it
            cutoff = stop[:2] if cutoff is None else min(cutoff, stop[:2])

    for c in compiled:
        for created_at, id_, raw in conn.execute(c.sql, c.params):
            if id_ not in rows and (cutoff is None or (-created_at, id_) < cutoff):
                held += len(raw)
                rows[id_] = (-created_at, id_, raw)
                if max_bytes and held > 2 * max_bytes:
                    keep_newest()
        if max_rows is not None and len(rows) > max_rows:
            keep_newest()
    return _newest(((row[2], len(row[2])) for row in sorted(rows.values())), max_rows, max_bytes)[0]


def _in_filter_order(conn: sqlite3.Connection, compiled: list[Compiled]):
    """(raw, size) of each statement's rows in turn, each id once, read only as far as the caller goes."""
    sent = set()
    for c in compiled:
        for _, id_, raw in conn.execute(c.sql, c.params):
            if id_ not in sent:
                sent.add(id_)
                yield raw, len(raw)


def _concatenated(conn: sqlite3.Connection, c: Compiled, max_bytes: int | None) -> bytes | None:
    """`c`'s raw events joined by newlines in one row: SQLite steps the rows without the GIL, which a
    reader thread would otherwise wait for once per row while the writer thread runs.

    Raises:
        sqlite3.DataError: the join (or one event) is longer than `max_bytes`.
    """
    previous = conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, max_bytes) if max_bytes else None
    try:
        return conn.execute(f"SELECT group_concat(raw, char(10)) FROM ({c.sql})", c.params).fetchone()[0]
    finally:
        if previous is not None:
            conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, previous)


def _newest(items, max_rows: int | None, max_bytes: int | None) -> tuple[list, object]:
    """The leading items of `items` ((item, size in bytes), in answer order): at most `max_rows` of them,
    of `max_bytes` bytes at most together (None: no bound); and the item it stopped at (None: none left).
    An item larger than `max_bytes` alone is passed over (stored before the bound was lowered, or
    imported): it could never be sent."""
    kept, held = [], 0
    for item, size in items:
        if max_bytes and size > max_bytes:
            continue
        held += size
        if (max_rows is not None and len(kept) >= max_rows) or (max_bytes and held > max_bytes):
            return kept, item
        kept.append(item)
    return kept, None


_COMPOUND_TERMS = 250  # SELECTs per UNION, under SQLite's default SQLITE_MAX_COMPOUND_SELECT of 500


def run_count(conn: sqlite3.Connection, compiled: list[Compiled]) -> int:
    """NIP-45: the number of distinct live events matching any of the `compile_count` statements."""
    selects = [c.sql for c in compiled]
    while len(selects) > _COMPOUND_TERMS:  # nest: each UNION stays within SQLite's limit on terms
        selects = [f"SELECT seq FROM ({' UNION '.join(selects[k:k + _COMPOUND_TERMS])})"
                   for k in range(0, len(selects), _COMPOUND_TERMS)]
    union = " UNION ".join(selects)  # UNION: an event matched twice counts once
    params = tuple(p for c in compiled for p in c.params)
    return conn.execute(f"SELECT COUNT(*) FROM ({union})", params).fetchone()[0]
