"""Relay policies applied to a parsed event before it is stored: small checks, cheapest first."""

from __future__ import annotations

from relay.protocol.auth import AUTH_KIND
from relay.protocol.event import Event
from relay.protocol.rejection import invalid


def reject_expired(event: Event, now: float) -> None:
    """NIP-40: an event whose expiration has already passed is refused with "invalid:"."""
    if event.has_expired(now):
        raise invalid("event has expired")


def reject_auth_kind(event: Event, now: float) -> None:
    """NIP-42: a kind-22242 event is sent with AUTH, never stored nor broadcast: refused with "invalid:"
    (before its signature is checked: that costs more than everything else here)."""
    if event.kind == AUTH_KIND:
        raise invalid(f"kind {AUTH_KIND} is sent with AUTH, not EVENT (NIP-42)")


CHECKS = (reject_expired, reject_auth_kind)


def check_event(event: Event, now: float) -> None:
    """Run every policy check on `event` (`now` in unix seconds); raises `Rejection` on the first refusal."""
    for check in CHECKS:
        check(event, now)
