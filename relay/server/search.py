"""NIP-50 on the server side: whether the store answers `search`, and what a refused search filter gets."""

from __future__ import annotations

from relay.protocol.filters import Filter
from relay.store.search import LiveSearch, SearchIndex
from relay.store.reads import ReadPool

NEG_OPEN_REFUSAL = "blocked: search (NIP-50) cannot be reconciled with negentropy (NIP-77)"
DISABLED_REFUSAL = "blocked: search (NIP-50) is not enabled on this relay"


def search_index(store: ReadPool) -> SearchIndex | None:
    """The store's search index hook, or None when `[search]` is disabled."""
    return next((h for h in store.hooks if isinstance(h, SearchIndex)), None)


def live_search(store: ReadPool) -> LiveSearch | None:
    """A matcher for live events of the kinds `store` indexes, or None when search is disabled."""
    index = search_index(store)
    return None if index is None else LiveSearch(index.kinds)


def search_refusal(filters: list[Filter], store: ReadPool) -> str | None:
    """Why a REQ or COUNT with a `search` filter is refused (search disabled), or None."""
    if any(f.search is not None for f in filters) and search_index(store) is None:
        return DISABLED_REFUSAL
    return None
