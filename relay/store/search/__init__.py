"""NIP-50 full-text search in SQLite FTS5: the index kept in the write transaction, live matching, verify.

* text.py: what an event of each kind puts in the index;
* index.py: `SearchIndex`, the transaction hook, its settings in `meta` and
  the rebuild; `DropSearchIndex` when search is disabled;
* live.py: `LiveSearch`, a new event against a subscription's query;
* verify.py: `relay verify`, the index recomputed and compared.

Queries join the index to `events` in relay/store/queries.py; the user's
text is parsed in relay/protocol/search.py.
"""

from relay.store.search.index import TABLE, DropSearchIndex, SearchIndex
from relay.store.search.live import LiveSearch
from relay.store.search.verify import verify_search

DEFAULT_SEARCH_KINDS = (0, 1, 30023)
"""`[search] kinds` by default: profiles (NIP-01 kind 0), notes (kind 1), long-form articles (NIP-23)."""

__all__ = ["DEFAULT_SEARCH_KINDS", "TABLE", "DropSearchIndex", "LiveSearch", "SearchIndex",
           "verify_search"]
