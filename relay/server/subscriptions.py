"""Live subscriptions, indexed so that one new event costs time in proportion to its matches.

How this works: each filter of a live REQ is filed under ONE key of the most
selective condition it states (an id, else an author, else a tag value, else
a kind); a filter with none of these is a wildcard.  A new event looks up its
own id, pubkey, kind and single-letter tag values, gathers the filters filed
there plus the wildcards, and runs `Filter.matches` only on those.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Protocol

from relay.protocol.event import Event
from relay.protocol.filters import Filter


class Subscriber(Protocol):
    """The receiving end of a live subscription (a connection's REQ)."""

    def deliver(self, event: Event) -> None:
        """Take one matching event; must not block."""


def _index_keys(f: Filter) -> list[tuple] | None:
    if f.ids is not None:
        return [("id", v) for v in f.ids]
    if f.authors is not None:
        return [("pubkey", v) for v in f.authors]
    if f.tags:
        name, values = min(f.tags, key=lambda item: len(item[1]))
        return [("tag", name, v) for v in values]
    if f.kinds is not None:
        return [("kind", v) for v in f.kinds]
    return None


def _event_keys(event: Event) -> Iterable[tuple]:
    yield ("id", event.id)
    yield ("pubkey", event.pubkey)
    yield ("kind", event.kind)
    for tag in event.tags:
        if len(tag) > 1 and len(tag[0]) == 1:
            yield ("tag", tag[0], tag[1])


class SubscriptionIndex:
    """Live filters by key; `match(event)` returns the subscribers with a matching filter."""

    def __init__(self) -> None:
        self._by_key: dict[tuple, dict[tuple[Subscriber, Filter], None]] = defaultdict(dict)
        self._wildcards: dict[tuple[Subscriber, Filter], None] = {}

    def add(self, subscriber: Subscriber, filters: list[Filter]) -> None:
        """File every non-empty filter of `subscriber` in the index."""
        for f in filters:
            if f.is_empty():
                continue
            keys = _index_keys(f)
            if keys is None:
                self._wildcards[(subscriber, f)] = None
            for key in keys or ():
                self._by_key[key][(subscriber, f)] = None

    def remove(self, subscriber: Subscriber, filters: list[Filter]) -> None:
        """Take `subscriber`'s filters out of the index."""
        for f in filters:
            self._wildcards.pop((subscriber, f), None)
            for key in _index_keys(f) or ():
                entries = self._by_key.get(key)
                if entries is not None:
                    entries.pop((subscriber, f), None)
                    if not entries:
                        del self._by_key[key]

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
                if f.matches(event):
                    found[subscriber] = None
        return list(found)
