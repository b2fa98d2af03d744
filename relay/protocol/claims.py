"""Coverage claims: the addressable event of kind 30803 by which a node says it holds a shard (README, "Shards").

    {"kind": 30803, "pubkey": <node key>, "content": "",
     "tags": [["d", <shard id>], ["filter", <NIP-01 filter, compact JSON>], ["r", <the node's relay URL>],
              ["instance", <random id of the node's database>], ["since", <unix s>], ["until", <unix s>],
              ["status", "building" | "complete" | "leaving"], ["expiration", <unix s>]]}

The node holds every event of the shard with `since <= created_at`, and is complete up to `until` (its last
complete reconciliation of the shard with every other holder, or the claim's own time when it is the only
holder).  A claim is republished every `[sharding] claim_interval_seconds` with a NIP-40 expiration: a dead
node's claims lapse.  A claim is a hint: before removing an event on the word of other nodes, a node confirms
they hold it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import cache
from dataclasses import dataclass

from relay.protocol.filters import Filter

CLAIM_KIND = 30803
FLEET_WIDE_KINDS = frozenset({5, 62, CLAIM_KIND})
"""Deletions (NIP-09), requests to vanish (NIP-62) and claims: every node holds them whatever its shards."""
FLEET_WIDE_FILTER_JSON = '{"kinds":[5,62,30803]}'
FLEET_WIDE_FILTER = Filter(kinds=FLEET_WIDE_KINDS)
"""The fleet-wide kinds as the filter peers reconcile them by (NIP-01, compact JSON and parsed)."""

BUILDING, COMPLETE, LEAVING = "building", "complete", "leaving"
STATUSES = (BUILDING, COMPLETE, LEAVING)

_TAGS = ("d", "filter", "r", "instance", "since", "until", "status", "expiration")


@dataclass(frozen=True, slots=True)
class Claim:
    """One node's claim on one shard, read from a kind-30803 event (times in unix seconds)."""

    pubkey: str
    shard_id: str
    filter: str
    url: str
    instance: str
    since: int
    until: int
    status: str
    expiration: int
    created_at: int
    event_id: str

    def is_live(self, now: int) -> bool:
        """Not yet expired at `now` (NIP-40: an event is expired once `expiration` has passed)."""
        return now < self.expiration

    def covers(self, created_at: int) -> bool:
        """A complete claim whose range holds an event of `created_at`: the hint that this node has it."""
        return self.status == COMPLETE and self.since <= created_at <= self.until


@cache
def filter_covers(outer_json: str, inner_json: str) -> bool:
    """Whether every event the shard filter `inner_json` matches is matched by `outer_json` too (both filters of
    kinds, authors and `#x` tags, as JSON objects; each field narrows, its values widen): each field of the
    outer filter is in the inner one with no value the outer lacks.  `{}` covers every filter; an unparsable
    filter covers nothing and is covered by nothing."""
    try:
        outer, inner = json.loads(outer_json), json.loads(inner_json)
    except ValueError:
        return False
    if not (isinstance(outer, dict) and isinstance(inner, dict)):
        return False
    return all(isinstance(inner.get(field), list) and isinstance(values, list) and set(map(str, inner[field]))
               <= set(map(str, values)) for field, values in outer.items())


def claim_tags(shard_id: str, filter_json: str, url: str, instance: str, since: int, until: int, status: str,
               expiration: int) -> list[list[str]]:
    """The tags of a claim, in the order of the module docstring; `status` one of STATUSES.

    Raises:
        ValueError: an unknown status.
    """
    if status not in STATUSES:
        raise ValueError(f"claim status must be one of {', '.join(STATUSES)}, got {status!r}")
    return [["d", shard_id], ["filter", filter_json], ["r", url], ["instance", instance], ["since", str(since)],
            ["until", str(until)], ["status", status], ["expiration", str(expiration)]]


def parse_claim(event: Mapping) -> Claim | None:
    """The Claim of a kind-30803 event (a dict of NIP-01 fields), or None when it is not one: another kind, a
    missing or repeated tag, a time that is not a decimal integer, an unknown status."""
    if event.get("kind") != CLAIM_KIND:
        return None
    values: dict[str, str] = {}
    for tag in event.get("tags", ()):
        if len(tag) >= 2 and tag[0] in _TAGS:
            if tag[0] in values:
                return None  # two values: which one the node meant is unknown
            values[tag[0]] = tag[1]
    if len(values) != len(_TAGS) or values["status"] not in STATUSES:
        return None
    times = [values[name] for name in ("since", "until", "expiration")]
    if not all(t.isascii() and t.isdigit() and len(t) <= 12 for t in times):
        return None
    since, until, expiration = map(int, times)
    return Claim(event["pubkey"], values["d"], values["filter"], values["r"], values["instance"], since, until,
                 values["status"], expiration, event["created_at"], event["id"])

