"""NIP-42 authentication (the relay's side) and the private kinds it unlocks: pure checks, no I/O.

A client proves that it holds a key by answering the relay's `["AUTH",
<challenge>]` with a signed kind-22242 event whose `challenge` tag repeats
the challenge and whose `relay` tag names this relay.  Private kinds (kind 4
DMs and kind 1059 gift wraps by default, NIP-42's own example) are served
only to a connection authenticated as their author or a `p`-tagged recipient.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from relay.protocol.event import Event, EventLimits, parse_event, verify_signature
from relay.protocol.filters import Filter
from relay.protocol.rejection import invalid

AUTH_KIND = 22242  # NIP-42: the ephemeral kind of AUTH events, never stored nor broadcast
_SCHEMES = ("ws", "wss", "http", "https")


def relay_url_key(url: str) -> tuple[str, int | None, str] | None:
    """(host, port, path) that identify a relay URL, or None when `url` is not one.

    Lenient as khatru and nostr-tools are: the scheme is ignored (a TLS proxy
    makes wss:// and ws:// the same relay), the host is lowercased, a default
    port (80, 443) counts as none, and a trailing slash as none.
    """
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        return None
    if parts.scheme.lower() not in _SCHEMES or not parts.hostname:
        return None
    if port in (80, 443):
        port = None
    return parts.hostname.lower(), port, parts.path.rstrip("/")


def check_auth_event(obj: object, challenge: str, relay_url: str, now: float, max_age_seconds: int,
                     limits: EventLimits) -> Event:
    """The validated kind-22242 event of a client's `["AUTH", <event>]` (NIP-42), signature included.

    `challenge` is what this connection was sent; `relay_url` what the
    `relay` tag must name (see `relay_url_key`); `created_at` must be within
    `max_age_seconds` of `now` (unix seconds).

    Raises:
        Rejection: "invalid:" for a malformed event, another kind, a stale or
        future created_at, a wrong challenge or relay tag, or a bad signature.
    """
    event = parse_event(obj, limits, now)
    if event.kind != AUTH_KIND:
        raise invalid(f"AUTH event must be of kind {AUTH_KIND}")
    if abs(event.created_at - now) > max_age_seconds:
        raise invalid(f"AUTH event created_at is more than {max_age_seconds} seconds from now")
    if event.tag_values("challenge")[:1] != [challenge]:
        raise invalid("AUTH event does not answer this connection's challenge")
    named = event.tag_values("relay")[:1]
    named_key = relay_url_key(named[0]) if named else None
    if named_key is None or named_key != relay_url_key(relay_url):
        raise invalid(f"AUTH event relay tag does not name this relay ({relay_url})")
    if not verify_signature(event):
        raise invalid("bad signature")
    return event


@dataclass(frozen=True, slots=True)
class PrivateKinds:
    """Kinds one reader may see only as author or `p`-tagged recipient (NIP-42 "restricted resources").

    `kinds` are the private kinds; `readers` the 64-hex pubkeys the reader's
    connection authenticated as (empty: it sees no event of those kinds).
    """

    kinds: frozenset[int]
    readers: frozenset[str] = frozenset()

    def touches(self, f: Filter) -> bool:
        """True when `f` can match an event of a private kind (it names none of its kinds, or one of them)."""
        return f.kinds is None or not self.kinds.isdisjoint(f.kinds)

    def may_read(self, event: Event) -> bool:
        """True unless `event` is of a private kind and neither by nor `p`-tagging one of `readers`."""
        if event.kind not in self.kinds or event.pubkey in self.readers:
            return True
        readers = self.readers
        return any(len(t) > 1 and t[0] == "p" and t[1] in readers for t in event.tags)
