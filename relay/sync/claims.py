"""This node's coverage claims (kind 30803, relay/protocol/claims.py): what it says of its shards, and what it
reads of the fleet's (README, "Shards").

Every `[sharding] claim_interval_seconds`, the writer signs one claim per declared shard with the node key and
takes it through ingest like a record (stored, fanned out, pushed to peers).  A held shard is claimed
`complete` when no other fleet node holds it (a first holder), or once this node has completed a
reconciliation with every node that does (`sync_peers.last_success`, by the claim's `r` URL or the peer's
pubkey); `building` until then; a shard with `hold = false` is claimed `leaving`.  A claim of this node's key
with another database's `instance` (a copied node key) is never overwritten: the shard goes unclaimed (its
claims lapse, so no node counts this one as a copy) and `node_key_copied` is logged each interval.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import sqlite3
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import orjson
import structlog

from relay.config import Config, ShardConfig, fleet_pubkeys, shards_of
from relay.ingest.pipeline import Ingest
from relay.ingest.source import RECORD
from relay.keys import NodeKey
from relay.processes import is_running
from relay.protocol.claims import (BUILDING, CLAIM_KIND, COMPLETE, LEAVING, Claim, claim_tags, filter_covers,
                                   parse_claim)
from relay.runtime import replace_json, runtime_dir
from relay.store import db
from relay.store.retention import Protection
from relay.store.store import Store
from relay.store.writes import Changes
from relay.sync.guard import Cut, Guard, GuardReport, read_cuts
from relay.sync.state import read_states

log = structlog.get_logger(__name__)

INSTANCE_KEY = "fleet_instance"
"""`meta` key of this database's random instance id (the claims' `instance` tag)."""
MAX_CLAIMS = 100_000  # claims read at once: nodes x shards of a fleet, with room
GUARD_FILE = "shards.json"
"""The runtime directory's file of the last guard round (`ShardKeeper.round`), read by `relay status`."""


def read_claims(conn: sqlite3.Connection) -> list[Claim]:
    """Every stored live (not expired, NIP-40) kind-30803 event that is a well-formed claim, newest first."""
    rows = conn.execute("SELECT raw FROM events WHERE kind = ? AND (expiration IS NULL OR expiration > ?) "
                        "ORDER BY created_at DESC, id LIMIT ?", (CLAIM_KIND, int(time.time()), MAX_CLAIMS))
    return [claim for (raw,) in rows if (claim := parse_claim(orjson.loads(raw))) is not None]


def read_instance(conn: sqlite3.Connection) -> str | None:
    """This database's instance id, or None before its first claim."""
    row = conn.execute("SELECT value FROM meta WHERE key = ?", (INSTANCE_KEY,)).fetchone()
    return None if row is None else (row[0].decode() if isinstance(row[0], bytes) else row[0])


def ensure_instance(conn: sqlite3.Connection, hooks: tuple) -> tuple[Changes, str]:
    """This database's instance id, drawn (16 random bytes, hex) and stored at first use (a `Store.run_job`)."""
    with db.transaction(conn) as cur:
        cur.execute("INSERT OR IGNORE INTO meta (key, value) VALUES (?, ?)", (INSTANCE_KEY, secrets.token_hex(16)))
    return Changes(), read_instance(conn)


@dataclass(frozen=True)
class PlannedClaim:
    """What this node claims for `shard` now: `status`, `since` and `until` (unix seconds)."""

    shard: ShardConfig
    status: str
    since: int
    until: int


@dataclass(frozen=True)
class Plan:
    """The claims to publish, and the shards left unclaimed because a claim of this node's key names another
    database (`copied`: shard id -> the other instance)."""

    claims: tuple[PlannedClaim, ...]
    copied: dict[str, str]


def holders(claims: list[Claim], shard: ShardConfig, fleet: frozenset[str], exclude: str, now: int,
            building: bool = False) -> list[Claim]:
    """The live claims of other fleet nodes (not `exclude`) on `shard` (same id and filter), newest per node:
    complete or leaving (a leaving node still holds its copy), and with `building` those still building too."""
    found: dict[str, Claim] = {}
    for claim in claims:
        if claim.pubkey in fleet and claim.pubkey != exclude and claim.shard_id == shard.id and \
                claim.filter == shard.filter and (building or claim.status != BUILDING) and claim.is_live(now):
            found.setdefault(claim.pubkey, claim)
    return list(found.values())


def copies(claims: list[Claim], shard: ShardConfig, fleet: frozenset[str], exclude: str, now: int) -> list[Claim]:
    """What the guard may rely on for `shard`'s events, one claim per other fleet node (not `exclude`): its live
    claims on the shard itself (`holders`, building ones too) and those of other shards whose filter covers
    this one's (an archive's `{}` covers every shard), a complete one first."""
    found = {c.pubkey: c for c in holders(claims, shard, fleet, exclude, now, building=True)}
    for claim in claims:
        if claim.pubkey not in fleet or claim.pubkey == exclude or claim.status == BUILDING \
                or not claim.is_live(now) or not filter_covers(claim.filter, shard.filter):
            continue
        current = found.get(claim.pubkey)
        if current is None or (current.status != COMPLETE and claim.status == COMPLETE):
            found[claim.pubkey] = claim
    return list(found.values())


def plan(config: Config, claims: list[Claim], pubkey: str, instance: str, reconciled: dict[str, int | None],
         now: int, cuts: dict[str, Cut] | None = None) -> Plan:
    """The claims this node (`pubkey`, database `instance`) publishes at `now`, given the stored `claims`,
    `reconciled` (peer URL -> unix time of its last complete reconciliation, None: never) and the guard's
    announced `cuts` (relay/sync/guard.py: a shard's `since`)."""
    fleet = fleet_pubkeys(config)
    peer_urls = {p.pubkey: p.url for p in config.sync.peers if p.pubkey}
    planned, copied = [], {}
    for shard in shards_of(config):
        ours = next((c for c in claims if c.pubkey == pubkey and c.shard_id == shard.id), None)
        if ours is not None and ours.instance != instance:
            copied[shard.id] = ours.instance
            continue
        same = ours if ours is not None and ours.filter == shard.filter else None  # a new filter: a new shard
        since = (cuts or {})[shard.id].claimed_since if shard.id in (cuts or {}) else 0
        others = holders(claims, shard, fleet, pubkey, now)
        synced = [reconciled.get(c.url) or reconciled.get(peer_urls.get(c.pubkey, "")) for c in others]
        if not others:
            status, until = COMPLETE, now  # the only holder: complete by definition
        elif all(synced):
            status, until = COMPLETE, min(synced)
        elif same is not None and same.status == COMPLETE:
            status, until = COMPLETE, same.until  # a new holder appeared: what this node had, it still has
        else:
            status, until = BUILDING, 0
        if not shard.hold:
            status = LEAVING
        planned.append(PlannedClaim(shard, status, since, until))
    declared = {shard.id for shard in shards_of(config)}
    for claim in claims:  # a shard no longer declared: withdrawn by one `leaving` claim, left to expire
        if claim.pubkey == pubkey and claim.instance == instance and claim.shard_id not in declared and \
                claim.status != LEAVING and claim.is_live(now):
            declared.add(claim.shard_id)
            planned.append(PlannedClaim(ShardConfig(claim.shard_id, claim.filter, hold=False), LEAVING,
                                        claim.since, claim.until))
    return Plan(tuple(planned), copied)


def claim_event(key: NodeKey, claim: PlannedClaim, url: str, instance: str, ttl_seconds: float,
                created_at: int) -> dict:
    """The signed kind-30803 event of `claim`, created at `created_at` (unix seconds)."""
    tags = claim_tags(claim.shard.id, claim.shard.filter, url, instance, claim.since, claim.until, claim.status,
                      created_at + int(ttl_seconds))
    return key.sign_event(CLAIM_KIND, tags, "", created_at)


async def publish_claims(config: Config, store: Store, ingest: Ingest, key: NodeKey, url: str,
                         now: int | None = None) -> Plan:
    """Sign and store this node's claims once (see the module docstring); returns what was planned."""
    instance = await store.run_job(ensure_instance)
    claims = await store.read_snapshot(read_claims)
    # an addressable event replaces only an older one: a second publication within a second comes just after
    # (this database's own claims: one of a copied key, left unclaimed, must not drag ours along)
    now = max([int(time.time()) if now is None else now] +
              [c.created_at + 1 for c in claims if c.pubkey == key.pubkey and c.instance == instance])
    reconciled = {s.url: s.last_success for s in await store.read_snapshot(read_states)}
    found = plan(config, claims, key.pubkey, instance, reconciled, now, await store.read_snapshot(read_cuts))
    for shard_id, other in found.copied.items():
        log.error("node_key_copied", shard=shard_id, pubkey=key.pubkey, instance=instance, other_instance=other,
                  hint="another database signs claims with this node key: give one of them its own key "
                       "([sync] secret_key_file); this shard stays unclaimed meanwhile")
    events = [claim_event(key, c, url, instance, config.sharding.ttl_seconds(), now) for c in found.claims]
    for event, (outcome, _) in zip(events, await ingest.accept_many(events, RECORD)):
        if not outcome.accepted:
            log.warning("claim_refused", shard=event["tags"][0][1], reason=outcome.message)
    return found


class ShardKeeper:
    """This node's side of the fleet, two tasks of the writer, each every `[sharding] claim_interval_seconds`:
    this node's claims are published (`publish`), and the guard removes what other nodes confirm and announces
    the cuts due, the claims then published at once when a cut changed (`round`; relay/sync/guard.py, whose
    `protection` keeps what retention never removes).  Apart, so a long guard round never lets the claims lapse.
    A failed step is logged and tried again.  `stats()` gives the last figures (metrics); `GUARD_FILE` in the
    runtime directory, for `relay status`, the events held back."""

    def __init__(self, config: Config, store: Store, ingest: Ingest, key: Callable[[], NodeKey], url: str,
                 protection: Protection) -> None:
        self.config, self.store, self.ingest, self.url = config, store, ingest, url
        self._key, self._protection = key, protection
        self.guard: Guard | None = None
        self._copies: dict[str, int] = {}  # shard id -> other nodes' complete claims, at the last publication
        self._claimed_at: dict[str, int | None] = {}  # shard id -> unix time of this node's claim
        self._held_back: dict[str, int] = {}
        self._publishing = asyncio.Lock()  # one publication at a time: each reads the claims the last one wrote

    async def run(self) -> None:
        """Both tasks until cancelled; first, a warning for each peer whose claims cannot count (no pubkey)."""
        for peer in self.config.sync.peers:
            if not peer.pubkey:
                log.warning("shard_peer_without_pubkey", peer=peer.url,
                            hint="synced as a full replica and never counted as a copy; give its node pubkey in "
                                 "[[sync.peers]] (docs/peers.md, \"Shards\")")
        await asyncio.gather(self._every(self.publish, "claims_failed"), self._every(self.round, "guard_failed"))

    async def _every(self, step: Callable[[], Awaitable[object]], failure: str) -> None:
        while True:
            try:
                await step()
            except Exception as exc:  # the one place these tasks catch: log, try again next interval
                log.error(failure, error=repr(exc), exc_info=exc)
            await asyncio.sleep(self.config.sharding.claim_interval_seconds)

    def _guard(self) -> Guard:
        self.guard = self.guard or Guard(self.config, self.store, self._key(), self._protection)
        return self.guard

    async def publish(self) -> None:
        """Publish this node's claims now, and refresh the figures of `stats()`."""
        guard = self._guard()
        async with self._publishing:
            await publish_claims(self.config, self.store, self.ingest, guard.key, self.url)
        now = int(time.time())
        states = await self.store.read_snapshot(shard_states, self.config, now, self._held_back)
        self._copies = {s["id"]: s["claimed_copies"] for s in states}
        self._claimed_at = {s["id"]: now - s["claim"]["age_seconds"] if s["claim"] else None for s in states}

    async def round(self) -> GuardReport:
        """One guard round, then the cuts due (their claims published at once); returns the guard's report."""
        guard = self._guard()
        report = await guard.round(await self.store.read_snapshot(read_claims))
        if report.removed or report.held_back:
            log.info("shard_guard_round", removed=report.removed, held_back=report.held_back,
                     confirmations=report.confirmations)
        self._held_back = report.held_back
        try:
            replace_json(runtime_dir(self.config.store.path) / GUARD_FILE,
                         {"pid": os.getpid(), "at": int(time.time()), "held_back": report.held_back})
        except OSError:  # status only: the log says the same
            pass
        if await guard.announce(int(time.time())):
            await self.publish()
        return report

    def stats(self) -> dict[str, dict[str, float]]:
        """Shard id -> {"copies": complete claims of other fleet nodes (as of this node's last publication),
        "held_back": events the guard kept for want of confirmed copies in its last round, "claim_age": seconds
        since this node's last claim, now (-1: none)}."""
        now = time.time()
        return {shard: {"copies": copies, "held_back": self._held_back.get(shard, 0),
                        "claim_age": -1 if self._claimed_at[shard] is None else now - self._claimed_at[shard]}
                for shard, copies in self._copies.items()}


def read_guard_state(runtime: Path) -> dict[str, int]:
    """Events held back in the running relay's last guard round, by shard id ("": foreign events); {} when
    the file cannot be read or its writer is no longer running."""
    try:
        body = json.loads((runtime / GUARD_FILE).read_text(encoding="utf-8"))
        pid, held = int(body["pid"]), {str(k): int(v) for k, v in body["held_back"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}
    return held if is_running(pid) else {}


def shard_states(conn: sqlite3.Connection, config: Config, now: int | None = None,
                 held_back: dict[str, int] | None = None) -> list[dict]:
    """Each declared shard as `relay status` shows it (JSON-ready; times in unix seconds):
    `{"id", "filter": {...}, "hold", "claim": this node's claim or None, "holders": [other fleet
    nodes' live claims on it or on a shard that covers it, `copies`], "claimed_copies": how many of them are
    complete, "under_replicated":
    claimed_copies < [sharding] min_copies, "copied_key": the other instance when a claim of this node's key
    names another database, else None, "held_back": events the guard kept in its last round for want of
    confirmed copies}`; a claim as `claim_dict` gives it.  `held_back` by shard id: given, else the running
    relay's (`read_guard_state`)."""
    now = int(time.time()) if now is None else now
    claims, instance = read_claims(conn), read_instance(conn)
    fleet = fleet_pubkeys(config)
    mine = {c.pubkey for c in claims if c.instance == instance}
    held_back = read_guard_state(runtime_dir(config.store.path, create=False)) if held_back is None else held_back
    out = []
    for shard in shards_of(config):
        ours = next((c for c in claims if c.shard_id == shard.id and c.instance == instance), None)
        copied = next((c.instance for c in claims if c.shard_id == shard.id and c.pubkey in mine
                       and c.instance != instance), None)
        others = copies(claims, shard, fleet, ours.pubkey if ours else "", now)
        complete = sum(1 for c in others if c.status == COMPLETE)
        out.append({"id": shard.id, "filter": orjson.loads(shard.filter), "hold": shard.hold,
                    "claim": claim_dict(ours, now) if ours else None,
                    "holders": [claim_dict(c, now) for c in others], "claimed_copies": complete,
                    "under_replicated": complete < config.sharding.min_copies, "copied_key": copied,
                    "held_back": held_back.get(shard.id, 0)})
    return out


def claim_dict(claim: Claim, now: int) -> dict:
    """A claim as JSON: `{"pubkey", "shard", "url", "instance", "status", "since", "until", "age_seconds",
    "expires_in_seconds", "id"}`."""
    return {"pubkey": claim.pubkey, "shard": claim.shard_id, "url": claim.url, "instance": claim.instance, "status": claim.status,
            "since": claim.since, "until": claim.until, "age_seconds": now - claim.created_at,
            "expires_in_seconds": claim.expiration - now, "id": claim.event_id}
