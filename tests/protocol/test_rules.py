"""The event rules that need no I/O (relay/protocol/rules.py): expiry, the AUTH kind, the `[auth]` kinds."""

from __future__ import annotations

import time

import pytest

from relay.protocol.event import EventLimits, parse_event
from relay.protocol.rejection import Rejection
from relay.protocol.rules import KindRules, check_event
from tests.helpers import Keys

NOW = int(time.time())
KEYS = Keys(0xA11CE)


def event(kind: int = 1, tags: list | None = None):
    return parse_event(KEYS.sign(kind=kind, tags=tags, created_at=NOW - 60), EventLimits(), NOW)


def refusal(check, *args) -> str:
    with pytest.raises(Rejection) as raised:
        check(*args)
    return str(raised.value)


def test_an_expired_event_is_refused_and_one_not_yet_expired_passes():
    """NIP-40: an expiration at or before now is "invalid: event has expired"; a later one passes."""
    assert refusal(check_event, event(tags=[["expiration", str(NOW)]]), NOW) == "invalid: event has expired"
    check_event(event(tags=[["expiration", str(NOW + 60)]]), NOW)


def test_an_auth_event_is_refused_as_an_event():
    """NIP-42: kind 22242 goes with AUTH, never EVENT: "invalid:" naming the kind."""
    assert refusal(check_event, event(kind=22242), NOW) == "invalid: kind 22242 is sent with AUTH, not EVENT (NIP-42)"


def test_kind_rules_allow_a_list_and_deny_within_it():
    """An allow list keeps every other kind out, a deny list keeps its kinds out: "blocked:"; none: every kind."""
    rules = KindRules.of(allow=[0, 1, 7], deny=[7])
    rules.check(1)
    for kind in (7, 3):
        assert refusal(rules.check, kind) == f"blocked: kind {kind} is not accepted here"
    assert refusal(KindRules.of(deny=[7]).check, 7) == "blocked: kind 7 is not accepted here"
    for kind in (0, 7, 30023):
        KindRules().check(kind)
