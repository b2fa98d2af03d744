"""Live subscriptions, indexed so that one new event costs time in proportion to its matches.

How this works: each filter of a live REQ is filed under ONE key of the most
selective condition it states (an id, else an author, else a tag value, else
a kind; a NIP-50 search filter with none of these, each kind the search index
holds); a filter with none of these is a wildcard.  A new event looks up its
own id, pubkey, kind and single-letter tag values, gathers the filters filed
there plus the wildcards, and runs `Filter.matches` only on those, then a
filter's `search` on the one-row FTS5 table of `LiveSearch`
(relay/store/search/live.py), so a live match agrees with a stored query.

Each connection keeps its own REQs in a `Subscriptions` (by subscription id),
which files them in the relay's index and takes them out again; a
`LiveSubscription` queues matching events in its connection's outbox, or
holds them until its stored results and EOSE have been sent.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Iterable
from typing import Protocol

from relay.protocol.envelopes import encode_event
from relay.protocol.event import Event
from relay.protocol.filters import Filter
from relay.server.access import ConnectionAccess
from relay.server.outbox import Outbox
from relay.store.search import LiveSearch


class Subscriber(Protocol):
    """The receiving end of a live subscription (a connection's REQ)."""

    def deliver(self, event: Event, seq: int | None = None) -> None:
        """Take one matching event (at change feed position `seq`, None: not known); must not block."""


def _index_keys(f: Filter, search_kinds: frozenset[int]) -> list[tuple] | None:
    if f.ids is not None:
        return [("id", v) for v in f.ids]
    if f.authors is not None:
        return [("pubkey", v) for v in f.authors]
    if f.tags:
        name, values = min(f.tags, key=lambda item: len(item[1]))
        return [("tag", name, v) for v in values]
    if f.kinds is not None:
        return [("kind", v) for v in f.kinds]
    if f.search is not None:  # only events of the indexed kinds can match a search
        return [("kind", v) for v in search_kinds]
    return None


def _event_keys(event: Event) -> Iterable[tuple]:
    yield ("id", event.id)
    yield ("pubkey", event.pubkey)
    yield ("kind", event.kind)
    for tag in event.tags:
        if len(tag) > 1 and len(tag[0]) == 1:
            yield ("tag", tag[0], tag[1])


class SubscriptionIndex:
    """Live filters by key; `match(event)` returns the subscribers with a matching filter.

    `search` matches NIP-50 searches (None: search disabled, a search filter matches nothing).
    """

    def __init__(self, search: LiveSearch | None = None) -> None:
        self._by_key: dict[tuple, dict[tuple[Subscriber, Filter], None]] = defaultdict(dict)
        self._wildcards: dict[tuple[Subscriber, Filter], None] = {}
        self._search = search
        self._search_kinds = frozenset() if search is None else search.kinds

    def add(self, subscriber: Subscriber, filters: list[Filter]) -> None:
        """File every non-empty filter of `subscriber` in the index."""
        for f in filters:
            if f.is_empty():
                continue
            keys = _index_keys(f, self._search_kinds)
            if keys is None:
                self._wildcards[(subscriber, f)] = None
            for key in keys or ():
                self._by_key[key][(subscriber, f)] = None

    def remove(self, subscriber: Subscriber, filters: list[Filter]) -> None:
        """Take `subscriber`'s filters out of the index."""
        for f in filters:
            self._wildcards.pop((subscriber, f), None)
            for key in _index_keys(f, self._search_kinds) or ():
                entries = self._by_key.get(key)
                if entries is not None:
                    entries.pop((subscriber, f), None)
                    if not entries:
                        del self._by_key[key]

    def empty(self) -> bool:
        """Whether no filter is filed (no live subscription could match anything)."""
        return not self._by_key and not self._wildcards

    def match(self, event: Event) -> list[Subscriber]:
        """Subscribers with at least one filter matching `event`, each once."""
        found: dict[Subscriber, None] = {}
        seen: set[tuple[Subscriber, Filter]] = set()
        candidates = [self._wildcards]
        for key in _event_keys(event):
            entries = self._by_key.get(key)
            if entries:
                candidates.append(entries)
        for entries in candidates:
            for pair in entries:
                subscriber, f = pair
                if subscriber in found or pair in seen:
                    continue
                seen.add(pair)
                if f.matches(event) and (f.search is None or self._matches_search(event, f)):
                    found[subscriber] = None
        return list(found)

    def _matches_search(self, event: Event, f: Filter) -> bool:
        return self._search is not None and self._search.matches(event, f.search)


class LiveSubscription:
    """A REQ's live side: `deliver` queues each matching event in `outbox`, or holds it in `pending` until
    the REQ's EOSE is sent (then `pending` is None); `access` says which private events it may get (NIP-42)."""

    __slots__ = ("sub_id", "filters", "access", "outbox", "pending", "task", "seen_through")

    def __init__(self, sub_id: str, filters: list[Filter], access: ConnectionAccess, outbox: Outbox) -> None:
        self.sub_id = sub_id
        self.filters = filters
        self.access = access
        self.outbox = outbox
        self.pending: list[tuple[Event, int | None]] | None = []  # (event, its change feed position)
        self.task: asyncio.Task | None = None  # sends the stored results, then EOSE
        # The change feed's head when the stored query read its snapshot: an event at a position up to it was
        # there to be found (None: not queried yet).  A worker process learns of commits late, from the feed.
        self.seen_through: int | None = None

    def deliver(self, event: Event, seq: int | None = None) -> None:
        """Take a matching new event without blocking (held until EOSE, at most `outbox.max_live` of them);
        `seq`, its change feed position when known, drops it if the stored query's snapshot already held it."""
        if seq is not None and self.seen_through is not None and seq <= self.seen_through:
            return
        if self.pending is None:
            self.outbox.push_live(encode_event(self.sub_id, event.raw))
        elif len(self.pending) < self.outbox.max_live:
            self.pending.append((event, seq))
        else:
            self.outbox.slow_reader()


class Subscriptions:
    """One connection's live subscriptions by subscription id, filed in the relay's `index` while open."""

    def __init__(self, index: SubscriptionIndex) -> None:
        self._index = index
        self._open: dict[str, LiveSubscription] = {}

    def __len__(self) -> int:
        return len(self._open)

    def open(self, sub: LiveSubscription) -> None:
        """File `sub` in the index: from now on it gets every matching event."""
        self._index.add(sub, sub.filters)
        self._open[sub.sub_id] = sub

    def close(self, sub_id: str) -> None:
        """End subscription `sub_id` if open: out of the index, its stored-results task cancelled."""
        sub = self._open.pop(sub_id, None)
        if sub is None:
            return
        self._index.remove(sub, sub.filters)
        if sub.task is not None and not sub.task.done():
            sub.task.cancel()
        sub.task = None  # no task <-> subscription cycle left for the GC

    def close_all(self) -> None:
        """End every subscription (the connection is closing)."""
        for sub_id in list(self._open):
            self.close(sub_id)
