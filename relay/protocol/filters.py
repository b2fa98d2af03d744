"""NIP-01 filters: parsing and in-memory matching.

A filter matches an event when every condition it states holds: `ids`,
`authors`, `kinds` and each `#<letter>` list are OR-ed within themselves and
AND-ed together; `since` and `until` are inclusive; an empty list matches
nothing.  Several filters in one REQ are OR-ed, each with its own `limit`.
A NIP-50 `search` is parsed here (relay/protocol/search.py) but matched by
the search index, not by `Filter.matches`.
"""

from __future__ import annotations

from dataclasses import dataclass

from relay.protocol.event import MAX_KIND, Event, is_hex64
from relay.protocol.rejection import invalid
from relay.protocol.search import SearchQuery, parse_search

_INT64_MAX = 2**63 - 1
MAX_SEARCH_BYTES = 256
"""The `limits.max_search_bytes` default: UTF-8 bytes of one filter's `search` (NIP-50)."""


@dataclass(frozen=True, slots=True, eq=False)
class Filter:
    """One parsed REQ filter (NIP-01).

    `ids`/`authors` hold 64-char lowercase hex; `kinds` ints; `tags` maps a
    single letter to the tag values it accepts; `since`/`until` are unix
    seconds, inclusive; `limit` is None when the client gave none; `search`
    is the parsed NIP-50 query, or None. A None field states no condition;
    an empty set matches nothing.
    """

    ids: frozenset[str] | None = None
    authors: frozenset[str] | None = None
    kinds: frozenset[int] | None = None
    tags: tuple[tuple[str, frozenset[str]], ...] = ()
    since: int | None = None
    until: int | None = None
    limit: int | None = None
    search: SearchQuery | None = None

    def is_empty(self) -> bool:
        """True when the filter can match no event at all (an empty list, or since > until)."""
        if self.ids is not None and not self.ids:
            return True
        if self.authors is not None and not self.authors:
            return True
        if self.kinds is not None and not self.kinds:
            return True
        if any(not values for _, values in self.tags):
            return True
        return self.since is not None and self.until is not None and self.since > self.until

    def matches(self, event: Event) -> bool:
        """True when `event` satisfies every condition of this filter (limit and search aside).

        A `search` is matched by the search index: relay/store/search/ (stored
        events) and its `LiveSearch` (live ones).
        """
        if self.ids is not None and event.id not in self.ids:
            return False
        if self.authors is not None and event.pubkey not in self.authors:
            return False
        if self.kinds is not None and event.kind not in self.kinds:
            return False
        if self.since is not None and event.created_at < self.since:
            return False
        if self.until is not None and event.created_at > self.until:
            return False
        for name, values in self.tags:
            if not any(len(t) > 1 and t[0] == name and t[1] in values for t in event.tags):
                return False
        return True


def _hex_set(value: object, key: str, max_items: int) -> frozenset[str]:
    if type(value) is not list:
        raise invalid(f"{key} must be an array")
    if len(value) > max_items:
        raise invalid(f"too many {key} (max {max_items})")
    for item in value:
        if not is_hex64(item):
            raise invalid(f"{key} must hold 64 lowercase hex characters")
    return frozenset(value)


def _kind_set(value: object, max_items: int) -> frozenset[int]:
    if type(value) is not list:
        raise invalid("kinds must be an array")
    if len(value) > max_items:
        raise invalid(f"too many kinds (max {max_items})")
    for item in value:
        if type(item) is not int or not 0 <= item <= MAX_KIND:
            raise invalid("kinds must hold integers from 0 to 65535")
    return frozenset(value)


def _text_set(value: object, key: str, max_items: int) -> frozenset[str]:
    if type(value) is not list:
        raise invalid(f"{key} must be an array")
    if len(value) > max_items:
        raise invalid(f"too many {key} values (max {max_items})")
    for item in value:
        if type(item) is not str:
            raise invalid(f"{key} must hold strings")
        if not item.isascii():
            try:
                item.encode()
            except UnicodeEncodeError:
                raise invalid("string holds a lone surrogate (not valid UTF-8)") from None
    return frozenset(value)


def _timestamp(value: object, key: str) -> int:
    if type(value) is not int or not 0 <= value <= _INT64_MAX:
        raise invalid(f"{key} must be an integer from 0 to {_INT64_MAX}")
    return value


def parse_filter(obj: object, max_items: int = 10_000, max_search_bytes: int = MAX_SEARCH_BYTES) -> Filter:
    """Build a Filter from one JSON object of a REQ or COUNT (NIP-01; `search`: NIP-50).

    `max_items` caps the length of each list, a bound on work per filter;
    `max_search_bytes` the UTF-8 length of `search`.  Keys other than `ids`,
    `authors`, `kinds`, `#<letter>`, `since`, `until`, `limit` and `search`
    are ignored, but for other keys starting with `#`.

    Raises:
        Rejection: "invalid:" for a wrong type, bad hex, a negative limit or
        timestamp, a list longer than `max_items`, a `#` key that is not
        `#` and one ASCII letter, or an empty or too long `search`.
    """
    if type(obj) is not dict:
        raise invalid("filter must be a JSON object")
    ids = authors = kinds = since = until = limit = search = None
    tags = []
    for key, value in obj.items():
        if key == "ids":
            ids = _hex_set(value, key, max_items)
        elif key == "authors":
            authors = _hex_set(value, key, max_items)
        elif key == "kinds":
            kinds = _kind_set(value, max_items)
        elif key == "since":
            since = _timestamp(value, key)
        elif key == "until":
            until = _timestamp(value, key)
        elif key == "limit":
            limit = _timestamp(value, key)
        elif key == "search":
            search = parse_search(value, max_search_bytes)
        elif key[:1] == "#":
            if not (len(key) == 2 and key[1].isascii() and key[1].isalpha()):
                # matching nothing or everything would both be wrong answers
                raise invalid("a tag filter's key is # and one letter a-z or A-Z (NIP-01)")
            tags.append((key[1], _text_set(value, key, max_items)))
    tags.sort()
    return Filter(ids, authors, kinds, tuple(tags), since, until, limit, search)

