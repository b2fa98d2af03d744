"""`SearchIndex`: the transaction hook that keeps the NIP-50 full-text index of the events of some kinds.

How this works
--------------
The index is one SQLite FTS5 table, `search_text`, contentless (it keeps
the index, not a copy of the text), whose rowid is the event's
`events.seq`: a search joins it to `events` by that key.  Each row holds the
event's text and, for a profile, its `nip05` domain token (text.py).  In
every write transaction the net inserted events of the indexed kinds get a
row and the removed ones (superseded, deleted, expired, vanished, evicted)
lose theirs, deleted by their original values, which `document_of_raw`
recomputes from the removed row's JSON.

`meta` holds the index's settings under `search_index` (kinds, tokenizer,
version of the CJK bigrams, text layout) and its state.  At setup an
unchanged, "current" index costs one lookup; otherwise the table is
dropped, created again and filled from `events` in batches (one
transaction each, state "building" until the last commits, so a crash
mid-way rebuilds again at the next start): the way a changed projector is
rebuilt.  `DropSearchIndex` removes the table and its
record when search is disabled.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterable

import orjson
import structlog

from relay.protocol.search import CJK_SEGMENTATION
from relay.store.db import transaction
from relay.store.search.text import document, document_of_raw
from relay.store.writes import Changes, ids_in

log = structlog.get_logger(__name__)

TABLE = "search_text"
TOKENIZER = "unicode61 remove_diacritics 2"
LAYOUT = f"fts5 {TOKENIZER}; {CJK_SEGMENTATION}; text 1"
"""The index's form: a change (tokenizer, CJK bigrams, what text.py extracts) rebuilds every stored index."""
META_KEY = "search_index"
REBUILD_BATCH = 10_000
"""Events per rebuild transaction."""



def create_sql(contentless: bool = True) -> str:
    """CREATE of the index table; `contentless`: no copy of the text kept (the stored index), else a regular
    table (the live one, whose row is replaced without its old values)."""
    # rowid: events.seq; text: the words of text.py's `document`; domain: the kind-0 nip05 domain's token.
    content = "content='', " if contentless else ""
    return f"CREATE VIRTUAL TABLE {TABLE} USING fts5(text, domain, {content}tokenize='{TOKENIZER}')"


INSERT_SQL = f"INSERT INTO {TABLE} (rowid, text, domain) VALUES (?, ?, ?)"
# contentless FTS5: a row is deleted by giving its rowid and the values it was inserted with
DELETE_SQL = f"INSERT INTO {TABLE} ({TABLE}, rowid, text, domain) VALUES ('delete', ?, ?, ?)"


def settings(kinds: Iterable[int]) -> dict:
    """The `meta` record of an index of `kinds` once built (state "current")."""
    return {"kinds": sorted(set(kinds)), "layout": LAYOUT, "state": "current"}


def read_record(conn: sqlite3.Connection | sqlite3.Cursor) -> dict | None:
    """The index's `meta` record, or None when there is none (no index built)."""
    row = conn.execute("SELECT value FROM meta WHERE key = ?", (META_KEY,)).fetchone()
    return None if row is None else orjson.loads(row[0])


def _write_record(cur: sqlite3.Cursor, record: dict | None) -> None:
    if record is None:
        cur.execute("DELETE FROM meta WHERE key = ?", (META_KEY,))
    else:
        cur.execute("INSERT INTO meta (key, value) VALUES (?, ?)"
                    " ON CONFLICT (key) DO UPDATE SET value = excluded.value", (META_KEY, orjson.dumps(record).decode()))


def _present(cur: sqlite3.Cursor, seqs: list[int]) -> set[int]:
    """Which of `seqs` have a row (a rebuild by another process may not have reached them yet)."""
    return {r[0] for r in ids_in(cur, f"SELECT rowid FROM {TABLE} WHERE rowid IN ({{}})", seqs)}


class SearchIndex:
    """TransactionHook: the FTS5 index of the events of `kinds` (NIP-50); see the module docstring.

    After `setup`, `rebuilt` is None when the stored index was current, else
    why it was rebuilt ("new", "settings changed", "state building").
    """

    def __init__(self, kinds: Iterable[int], rebuild_batch: int = REBUILD_BATCH) -> None:
        self.kinds = frozenset(kinds)
        self.rebuild_batch = rebuild_batch
        self.rebuilt: str | None = None

    def setup(self, conn: sqlite3.Connection) -> None:
        """Rebuild the index if its settings or state in `meta` differ from this one's (module docstring)."""
        record = read_record(conn)
        wanted = settings(self.kinds)
        if record == wanted and table_exists(conn):
            return
        self.rebuilt = "new" if record is None else (
            "settings changed" if {**record, "state": "current"} != wanted else f"state {record.get('state')}")
        rebuild(conn, self.kinds, self.rebuilt, self.rebuild_batch)

    def apply(self, cur: sqlite3.Cursor, changes: Changes) -> None:
        """Index the inserted events of the indexed kinds, unindex the removed ones (their `net()` changes)."""
        inserted, removed = changes.net()
        gone = [r for r in removed if r.kind in self.kinds]
        if gone:
            present = _present(cur, [r.seq for r in gone])
            cur.executemany(DELETE_SQL, [(r.seq, *document_of_raw(r.raw)) for r in gone if r.seq in present])
        new = [e for e in inserted if e.kind in self.kinds]
        if new:
            seqs = {e.id: seq for e, seq in zip(changes.inserted, changes.seqs) if e.kind in self.kinds}
            cur.executemany(INSERT_SQL, [(seqs[e.id], *document(e.kind, e.content, e.tags)) for e in new])


def table_exists(conn: sqlite3.Connection | sqlite3.Cursor) -> bool:
    """True when the index table exists."""
    return conn.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (TABLE,)).fetchone() is not None


def indexed_seqs(conn: sqlite3.Connection | sqlite3.Cursor, kinds: Iterable[int]) -> list[int]:
    """`events.seq` of every stored event of `kinds`, ascending (what the index should hold)."""
    kinds = sorted(set(kinds))
    if not kinds:
        return []
    return [r[0] for r in conn.execute(
        f"SELECT seq FROM events WHERE kind IN ({','.join('?' * len(kinds))}) ORDER BY seq", kinds)]


def stored_documents(cur: sqlite3.Cursor, seqs: list[int]) -> list[tuple[int, str, str]]:
    """(seq, text, domain) of the stored events `seqs` (those still stored), computed from their JSON."""
    return [(seq, *document_of_raw(raw)) for seq, raw in ids_in(cur, "SELECT seq, raw FROM events WHERE seq IN ({})",
                                                                  seqs)]


def rebuild(conn: sqlite3.Connection, kinds: Iterable[int], reason: str, batch: int = REBUILD_BATCH) -> int:
    """Drop the index and fill it again from `events`, in transactions of `batch` events; returns the events indexed.

    Runs on an autocommit connection outside any transaction.  A process
    writing meanwhile with the same settings adds its own rows: a batch skips
    the rows already there.
    """
    started = time.perf_counter()
    log.info("search_rebuild_started", reason=reason, kinds=sorted(set(kinds)))
    with transaction(conn) as cur:
        cur.execute(f"DROP TABLE IF EXISTS {TABLE}")
        cur.execute(create_sql())
        _write_record(cur, {**settings(kinds), "state": "building"})
    seqs = indexed_seqs(conn, kinds)
    for start in range(0, len(seqs), batch):
        with transaction(conn) as cur:
            chunk = seqs[start:start + batch]
            present = _present(cur, chunk)
            cur.executemany(INSERT_SQL, [d for d in stored_documents(cur, chunk) if d[0] not in present])
    with transaction(conn) as cur:
        _write_record(cur, settings(kinds))
    log.info("search_rebuild_finished", events=len(seqs), seconds=round(time.perf_counter() - started, 3))
    return len(seqs)


class DropSearchIndex:
    """TransactionHook for `[search] enabled = false`: drops the index at setup, then does nothing.

    An index not kept up to date must not survive to be trusted later: with
    search enabled again, `SearchIndex.setup` rebuilds it.
    """

    def setup(self, conn: sqlite3.Connection) -> None:
        """Drop the table and its `meta` record, in one transaction."""
        with transaction(conn) as cur:
            cur.execute(f"DROP TABLE IF EXISTS {TABLE}")
            _write_record(cur, None)

    def apply(self, cur: sqlite3.Cursor, changes: Changes) -> None:
        """Nothing: no index is kept."""
