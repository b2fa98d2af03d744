"""Filter parsing and in-memory matching (NIP-01)."""

from __future__ import annotations

import time

import pytest

from relay.protocol.event import EventLimits, parse_event
from relay.protocol.filters import parse_filter
from relay.protocol.rejection import Rejection
from tests.helpers import Keys

KEYS = Keys(5)
EVENT = parse_event(KEYS.sign(kind=1, created_at=100, tags=[["e", "a" * 64], ["t", "x"], ["t", "y"], ["p"]]),
                    EventLimits(), time.time())


@pytest.mark.parametrize(
    "obj, expected",
    [
        ({}, True),
        ({"ids": [EVENT.id]}, True),
        ({"ids": []}, False),
        ({"authors": [KEYS.pubkey], "kinds": [1, 2]}, True),
        ({"kinds": [2]}, False),
        ({"since": 100, "until": 100}, True),
        ({"since": 101}, False),
        ({"until": 99}, False),
        ({"#t": ["y", "z"]}, True),
        ({"#t": ["x"], "#e": ["a" * 64]}, True),
        ({"#t": ["x"], "#e": ["b" * 64]}, False),
        ({"#p": [""]}, False),
        ({"#t": []}, False),
        ({"limit": 0}, True),
        ({"search": "ignored", "other": ["ignored"]}, True),
    ],
)
def test_matches(obj, expected):
    """Conditions AND across keys and OR within a list; empty lists match nothing."""
    assert parse_filter(obj).matches(EVENT) is expected


@pytest.mark.parametrize(
    "obj",
    [[], {"ids": "x"}, {"ids": ["A" * 64]}, {"authors": ["ab"]}, {"kinds": [1.0]}, {"kinds": [-1]},
     {"kinds": [True]}, {"since": -1}, {"until": "1"}, {"limit": -5}, {"limit": 1.5}, {"#e": "x"},
     {"#e": [None]}, {"authors": ["a" * 64] * 3}, {"#tt": ["x"]}, {"#": ["x"]}, {"#1": ["x"]}],
)
def test_bad_filters_are_invalid(obj):
    """Wrong types, bad hex, negatives, oversized lists and `#` keys other than # and one letter (which no
    tag index serves: matching everything or nothing would both be wrong) are refused with "invalid:"."""
    with pytest.raises(Rejection) as err:
        parse_filter(obj, max_items=2)
    assert err.value.prefix == "invalid"


def test_is_empty():
    """A filter with an empty list or since > until can match nothing."""
    assert parse_filter({"kinds": []}).is_empty()
    assert parse_filter({"since": 5, "until": 4}).is_empty()
    assert not parse_filter({"since": 5, "until": 5}).is_empty()
