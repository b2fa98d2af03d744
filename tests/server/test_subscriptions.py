"""The live subscription index: one new event costs matcher calls only for subscriptions it may match."""

from __future__ import annotations

import time

import pytest

from relay.protocol.event import EventLimits, parse_event
from relay.protocol.filters import Filter, parse_filter
from relay.server.subscriptions import SubscriptionIndex
from tests.helpers import Keys


class Sink:
    def __init__(self) -> None:
        self.events = []

    def deliver(self, event) -> None:
        self.events.append(event)


def _event(keys: Keys, **kwargs):
    return parse_event(keys.sign(**kwargs), EventLimits(), time.time())


@pytest.fixture
def counted(monkeypatch):
    calls = {"n": 0}
    original = Filter.matches

    def matches(self, event):
        calls["n"] += 1
        return original(self, event)

    monkeypatch.setattr(Filter, "matches", matches)
    return calls


def test_non_matching_subscriptions_cost_no_matcher_calls(counted):
    """With 10,000 subscriptions that cannot match, the matcher runs only for matching + wildcard ones."""
    index = SubscriptionIndex()
    author = Keys(7)
    others = [f"{i:064x}" for i in range(1, 2_501)]
    for i in range(10_000):
        shape = i % 4
        if shape == 0:
            f = {"authors": [others[i % 2500]]}
        elif shape == 1:
            f = {"ids": [f"{i + 10**6:064x}"]}
        elif shape == 2:
            f = {"#e": [f"{i:064x}"], "kinds": [1]}
        else:
            f = {"kinds": [30_000 + i % 5000]}
        index.add(Sink(), [parse_filter(f)])
    matching, wildcard = Sink(), Sink()
    index.add(matching, [parse_filter({"authors": [author.pubkey], "kinds": [1]})])
    index.add(wildcard, [parse_filter({"since": 10**10})])
    event = _event(author, tags=[["e", "f" * 64], ["p", "e" * 64]])
    found = index.match(event)
    assert found == [matching]
    assert counted["n"] <= 2


def test_each_subscriber_is_returned_once_and_removal_works():
    """A subscriber with several matching filters is delivered once; removed filters stop matching."""
    index = SubscriptionIndex()
    keys = Keys(9)
    sink = Sink()
    filters = [parse_filter({"authors": [keys.pubkey]}), parse_filter({"kinds": [1]}), parse_filter({})]
    index.add(sink, filters)
    event = _event(keys)
    assert index.match(event) == [sink]
    index.remove(sink, filters)
    assert index.match(event) == []


def test_empty_filters_are_never_indexed(counted):
    """A filter that can match nothing (an empty list) costs nothing at publish time."""
    index = SubscriptionIndex()
    index.add(Sink(), [parse_filter({"ids": []}), parse_filter({"kinds": [1], "#e": []})])
    assert index.match(_event(Keys(3))) == []
    assert counted["n"] == 0


def test_search_filters_are_filed_under_the_indexed_kinds(counted):
    """A search with no other key is no wildcard: it is looked at only for events of the kinds the search index
    holds, and then matched by FTS5 (NIP-50)."""
    from relay.store.search import LiveSearch

    live = LiveSearch((0, 1))
    index = SubscriptionIndex(live)
    try:
        sink = Sink()
        index.add(sink, [parse_filter({"search": "comet"})])
        author = Keys(7)
        assert index.match(_event(author, kind=7, content="comet")) == []
        assert counted["n"] == 0
        assert index.match(_event(author, kind=1, content="no match")) == []
        assert index.match(_event(author, kind=1, content="a Comet")) == [sink]
        assert counted["n"] == 2
    finally:
        live.close()
