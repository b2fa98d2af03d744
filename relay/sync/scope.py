"""What this node syncs with a peer that holds shards: shard by shard (docs/peers.md, "Shards").

A peer's shards are read from its live claims (kind 30803) signed by the pubkey of its `[[sync.peers]]` entry,
a pubkey of the fleet: a claim signed by anyone else never narrows what is synced with a peer.  With such a
peer (and the entry's filter left at `{}`), each of its shards is one NIP-77 session:

| the peer's claim    | this node holds the shard (or all events)    | this node does not hold it |
|---------------------|----------------------------------------------|----------------------------|
| building, complete  | both ways                                    | up: pushed to its holder   |
| leaving             | down: fetched from it                        | not synced                 |

("all events": no shards, or a held shard of filter `{}`), plus one session of the fleet-wide kinds
(deletions, requests to vanish, claims), both ways.  Each direction
is also bounded by the entry's `direction`.  A peer without such claims, or whose entry names a filter, is
synced as a full replica, exactly as before: it counts as no copy of anything (relay/sync/guard.py).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from relay.config import Config, PeerConfig, fleet_pubkeys, shards_of
from relay.protocol.claims import FLEET_WIDE_FILTER_JSON, LEAVING, Claim
from relay.protocol.filters import Filter
from relay.sync.guard import claim_filter


@dataclass(frozen=True)
class Session:
    """One reconciliation with the peer: a filter (compact JSON, the shard's) and a direction."""

    filter: str
    direction: str

    @property
    def filter_obj(self) -> dict:
        """The filter as a JSON object, as NEG-OPEN and REQ send it."""
        return json.loads(self.filter)


@dataclass(frozen=True)
class Scope:
    """The sessions of one peer that holds shards, and the shard ids they came from (for the log)."""

    sessions: tuple[Session, ...]
    shards: tuple[str, ...]

    def filters(self, direction: str) -> list[Filter]:
        """The filters of the sessions that go `direction` ("down" or "up"), a "both" session in each."""
        return [claim_filter(s.filter) for s in self.sessions if s.direction in (direction, "both")]


def _direction(wanted: str, allowed: str) -> str | None:
    """`wanted` ("down", "up", "both") within what the peer's entry `allowed`; None: nothing left."""
    ways = {"down", "up"} if wanted == "both" else {wanted}
    ways &= {"down", "up"} if allowed == "both" else {allowed}
    return None if not ways else ways.pop() if len(ways) == 1 else "both"


def peer_scope(config: Config, peer: PeerConfig, claims: list[Claim], now: int | None = None) -> Scope | None:
    """The sessions with `peer` given the stored `claims` (see the module docstring); None: a full replica."""
    now = int(time.time()) if now is None else now
    if not peer.pubkey or peer.pubkey not in fleet_pubkeys(config) or peer.filter != "{}":
        return None
    theirs: dict[str, Claim] = {}
    for claim in claims:  # newest first: the first of each shard id is the one in force
        if claim.pubkey == peer.pubkey and claim.is_live(now) and claim_filter(claim.filter) is not None:
            theirs.setdefault(claim.shard_id, claim)
    if not theirs:
        return None
    ours = shards_of(config)
    held = {(s.id, s.filter) for s in ours if s.hold}
    everything = not ours or any(f == "{}" for _, f in held)  # a full replica, or an archive node's shard
    sessions, shard_ids = {}, []
    for claim in sorted(theirs.values(), key=lambda c: c.shard_id):
        mine = everything or (claim.shard_id, claim.filter) in held
        wanted = ("down" if mine else None) if claim.status == LEAVING else ("both" if mine else "up")
        direction = wanted and _direction(wanted, peer.direction)
        if direction is not None and claim.filter not in sessions:
            sessions[claim.filter] = direction
            shard_ids.append(claim.shard_id)
    if (both := _direction("both", peer.direction)) is not None:
        sessions.setdefault(FLEET_WIDE_FILTER_JSON, both)
    return Scope(tuple(Session(f, d) for f, d in sessions.items()), tuple(shard_ids))
