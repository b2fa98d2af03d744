"""Relay policies applied to a parsed event before it is stored: small checks, cheapest first."""

from __future__ import annotations

from relay.protocol.event import Event
from relay.protocol.rejection import invalid


def reject_expired(event: Event, now: float) -> None:
    """NIP-40: an event whose expiration has already passed is refused with "invalid:"."""
    if event.has_expired(now):
        raise invalid("event has expired")


CHECKS = (reject_expired,)


def check_event(event: Event, now: float) -> None:
    """Run every policy check on `event` (`now` in unix seconds); raises `Rejection` on the first refusal."""
    for check in CHECKS:
        check(event, now)
