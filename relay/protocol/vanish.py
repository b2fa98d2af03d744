"""NIP-62 requests to vanish: which relays a kind-62 event names, and what it covers.

A request to vanish (kind 62) asks the relays named by its `relay` tags (or
every relay, with the value `ALL_RELAYS`) to delete every event of its
author up to its `created_at`, and the NIP-59 gift wraps (kind 1059) that
p-tag the author, and to never take them back.  Pure functions: the store
applies them in the write transaction (relay/store/vanish.py).
"""

from __future__ import annotations

from relay.protocol.auth import relay_url_key
from relay.protocol.event import Event

VANISH_KIND = 62
GIFT_WRAP_KIND = 1059  # NIP-59
ALL_RELAYS = "ALL_RELAYS"


def names_relay(event: Event, relay_urls: frozenset[tuple]) -> bool:
    """True when the kind-62 `event` asks this relay to act: a `relay` tag is `ALL_RELAYS` or one of
    `relay_urls` (as `relay_url_key` gives them: scheme, default port and trailing slash aside).
    Any other kind: False."""
    if event.kind != VANISH_KIND:
        return False
    return any(value == ALL_RELAYS or relay_url_key(value) in relay_urls
               for value in event.tag_values("relay"))


def covered(event: Event, vanished: dict[str, int]) -> bool:
    """True when `event` is within a request to vanish: `vanished` maps a hex pubkey to the newest
    `created_at` it asked to vanish up to.

    Covered: an event of that author with created_at <= it, or a gift wrap (kind 1059) p-tagging that
    author with created_at <= it.  Requests to vanish themselves are never covered (they are kept
    for bookkeeping and propagate by sync; NIP-62).
    """
    if event.kind == VANISH_KIND:
        return False
    until = vanished.get(event.pubkey)
    if until is not None and event.created_at <= until:
        return True
    if event.kind == GIFT_WRAP_KIND:  # only here are the p tags read
        return any(event.created_at <= vanished.get(p, -1) for p in event.tag_values("p"))
    return False
