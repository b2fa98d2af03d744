"""Live NIP-50 matching: a new event against a subscription's search, by FTS5 itself.

How this works: `LiveSearch` holds a one-row FTS5 table in an in-memory
SQLite database, with the same columns and tokenizer as the stored index.
To match an event it puts that event's document (text.py) in the row, once
per event, and runs the query's MATCH expression on it; so a live match
agrees with what a stored query would return for the same event.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable

from relay.protocol.event import Event
from relay.protocol.search import SearchQuery
from relay.store.search.index import INSERT_SQL, TABLE, create_sql
from relay.store.search.text import document


class LiveSearch:
    """Matches events one at a time against parsed queries; events of kinds not in `kinds` never match.

    Runs on the caller's thread (the event loop): an in-memory statement
    costs microseconds.  Not thread-safe.
    """

    def __init__(self, kinds: Iterable[int]) -> None:
        self.kinds = frozenset(kinds)
        self._db = sqlite3.connect(":memory:", isolation_level=None)
        self._db.execute(create_sql(contentless=False))
        self._loaded: Event | None = None

    def matches(self, event: Event, query: SearchQuery) -> bool:
        """True when a stored query with `query` would return `event` (its other conditions aside)."""
        if event.kind not in self.kinds:
            return False
        if self._loaded is not event:
            self._db.execute(f"DELETE FROM {TABLE}")
            self._db.execute(INSERT_SQL, (1, *document(event.kind, event.content, event.tags)))
            self._loaded = event
        return self._db.execute(f"SELECT 1 FROM {TABLE} WHERE {TABLE} MATCH ?",
                                (query.match_expression(),)).fetchone() is not None

    def close(self) -> None:
        """Close the in-memory database."""
        self._db.close()
