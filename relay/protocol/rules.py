"""Rules about one parsed event that need no I/O: expiry, the AUTH kind, the kinds a relay accepts, NIP-70.

Ingest (relay/ingest/) applies them after `parse_event` and before the
signature check, which costs more than all of them; which apply is the
event's source's to say (`relay.ingest.Source`).
"""

from __future__ import annotations

from collections.abc import Iterable, Set
from dataclasses import dataclass

import orjson

from relay.protocol.auth import AUTH_KIND
from relay.protocol.event import Event
from relay.protocol.rejection import Rejection, invalid

EXPIRED = "event has expired"
"""The reason of the "invalid:" refusal of an event whose NIP-40 expiration has passed."""


def reject_expired(event: Event, now: float) -> None:
    """NIP-40: an event whose expiration has already passed is refused with "invalid:"."""
    if event.has_expired(now):
        raise invalid(EXPIRED)


def reject_auth_kind(event: Event, now: float) -> None:
    """NIP-42: a kind-22242 event is sent with AUTH, never stored nor broadcast: refused with "invalid:"
    (before its signature is checked: that costs more than everything else here)."""
    if event.kind == AUTH_KIND:
        raise invalid(f"kind {AUTH_KIND} is sent with AUTH, not EVENT (NIP-42)")


CHECKS = (reject_expired, reject_auth_kind)


def check_event(event: Event, now: float) -> None:
    """Run every check of `CHECKS` on `event` (`now` in unix seconds); raises `Rejection` on the first refusal."""
    for check in CHECKS:
        check(event, now)


@dataclass(frozen=True, slots=True)
class KindRules:
    """The kinds a relay accepts (`[auth] allow_kinds` / `deny_kinds`): `allow` None means every kind."""

    allow: frozenset[int] | None = None
    deny: frozenset[int] = frozenset()

    @classmethod
    def of(cls, allow: Iterable[int] = (), deny: Iterable[int] = ()) -> KindRules:
        """The rules of an allow list (empty: every kind) and a deny list."""
        return cls(frozenset(allow) or None, frozenset(deny))

    def check(self, kind: int) -> None:
        """Refuse a kind that `allow` leaves out or `deny` names.

        Raises:
            Rejection: "blocked:".
        """
        if (self.allow is not None and kind not in self.allow) or kind in self.deny:
            raise Rejection("blocked", f"kind {kind} is not accepted here")


REPOST_KINDS = frozenset({6, 16})
"""NIP-18: a repost (6) and a generic repost (16), whose content may hold the reposted event's JSON."""


def is_protected(tags: object) -> bool:
    """NIP-70: True when `tags` (an event's tag list) holds the `["-"]` tag."""
    return type(tags) is list and any(type(t) is list and len(t) == 1 and t[0] == "-" for t in tags)


def check_protected(event: Event, pubkeys: Set[str]) -> None:
    """NIP-70: a protected event is accepted only from a connection authenticated (NIP-42) as its author, whose
    `pubkeys` are given; a repost (kinds 6, 16) embedding a protected event is refused from anyone.

    Raises:
        Rejection: "auth-required:" (not authenticated), "restricted:" (authenticated as someone else),
        "blocked:" (a repost of a protected event).
    """
    if event.kind in REPOST_KINDS and event.content.startswith("{") and _embeds_protected(event.content):
        raise Rejection("blocked", "a repost of a protected event (NIP-70)")
    if not is_protected(event.tags) or event.pubkey in pubkeys:
        return
    if not pubkeys:
        raise Rejection("auth-required", "this event is protected: authenticate as its author (NIP-70)")
    raise Rejection("restricted", "this event is protected: only its author may publish it (NIP-70)")


def _embeds_protected(content: str) -> bool:
    try:
        embedded = orjson.loads(content)
    except orjson.JSONDecodeError:
        return False
    return type(embedded) is dict and is_protected(embedded.get("tags"))
