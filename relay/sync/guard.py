"""The shards' guard: an event of a shard is removed here only once `[sharding] min_copies` other nodes are
confirmed to hold it (docs/peers.md, "Shards").

How this works
--------------
Three things remove events of shards, each only through this guard: the `[[retention.rules]]` (for the events
of a held shard: `relay.retention` leaves them to the guard), a handover (`hold = false`: every event of the
shard that no held shard and no fleet-wide kind keeps), and the events a client published here that belong to
no held shard but to another node's (foreign events: pushed to their holders, then removed).

A removal that other nodes may count this node for is announced first, as a *cut* (`meta` key
`shard_cut:<id>`: the raised `since` of the shard, or its handover, and when it was announced): the claims are
republished at once (relay/sync/claims.py), and nothing is removed before `claim_ttl_seconds +
max_clock_skew_seconds` have passed, so every claim of this node that covered the events has expired
everywhere.  Two nodes can then never remove the last copies on each other's word: the later of the two sees
the earlier one's raised `since`, which no longer covers the events.

Then each step reads a batch of the oldest candidates, finds for each the other nodes whose claims are the
hint (`[sharding] fleet_pubkeys`, live, `complete`, the claim's filter matching the event, `since <=
created_at <= until`), asks each such node for the batch's ids it should hold (one REQ by ids on a connection
signed in with the node key), and removes an event only when at least `min_copies` distinct nodes returned
it.  Each removal batch is logged (`shard_events_removed`) with the claims and the confirmations it relied
on; events without enough confirmed copies are held back (counted in the report) and tried again next round.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import defaultdict
from dataclasses import dataclass, field
from functools import cache

import structlog

from relay.config import Config, ShardConfig, fleet_pubkeys, shards_of
from relay.keys import NodeKey
from relay.protocol.claims import COMPLETE, FLEET_WIDE_KINDS, Claim
from relay.protocol.event import Event, EventLimits, is_addressable, is_replaceable, parse_event, verify_signature
from relay.protocol.filters import Filter, parse_filter
from relay.protocol.rejection import Rejection
from relay.store import db
from relay.store.batch import Row, is_newer
from relay.store.projectors.rows import stored_event
from relay.store.retention import START, Protection, Scan, count_events, evict_ids, forget_evictions, scan_rows
from relay.store.store import Store
from relay.store.writes import Changes
from relay.sync.peer import PeerConnection, PeerError

log = structlog.get_logger(__name__)

CUT_PREFIX = "shard_cut:"
_ANY_SIZE = EventLimits(max_tags=1 << 30, max_content_bytes=1 << 40, max_created_at_future_seconds=1 << 40)
_DAY_SECONDS = 86_400
AUTH_WAIT_SECONDS = 5.0  # for a confirming node to accept our AUTH before a REQ for events of private kinds


@dataclass(frozen=True)
class Cut:
    """An announced removal in a shard of `filter`: events created before `since` (unix seconds) of the kinds
    a `[[retention.rules]]` removes by then, events of any kind created before `by_count` (`[retention]
    max_events`), or, `leaving`, every event of a handover; removable from `announced_at` + the claims'
    lifetime + the clock skew.  A held shard has one from its first round (0 until a rule applies)."""

    since: int
    announced_at: int
    leaving: bool = False
    filter: str = ""
    by_count: int = 0

    @property
    def claimed_since(self) -> int:
        """The `since` of the shard's claims: every event from then on is held."""
        return max(self.since, self.by_count)


def read_cuts(conn) -> dict[str, Cut]:
    """The announced cuts by shard id (read job)."""
    rows = conn.execute("SELECT key, value FROM meta WHERE key >= ? AND key < ?", (CUT_PREFIX, CUT_PREFIX + "\x7f"))
    return {_text(k)[len(CUT_PREFIX):]: Cut(**json.loads(_text(v))) for k, v in rows}


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def write_cut(conn, hooks: tuple, shard_id: str, cut: Cut | None) -> tuple[Changes, None]:
    """Store (None: drop) the cut of `shard_id` (a `Store.run_job`)."""
    with db.transaction(conn) as cur:
        cur.execute("DELETE FROM meta WHERE key = ?", (CUT_PREFIX + shard_id,))
        if cut is not None:
            cur.execute("INSERT INTO meta (key, value) VALUES (?, ?)",
                        (CUT_PREFIX + shard_id, json.dumps(cut.__dict__)))
    return Changes(), None


@cache
def claim_filter(filter_json: str) -> Filter | None:
    """The Filter of a claim's `filter` tag, or None when it is not a filter this relay reads."""
    try:
        return parse_filter(json.loads(filter_json))
    except (ValueError, TypeError, RecursionError, Rejection):
        return None


FOREIGN = ""
"""The `GuardReport.held_back` key of foreign events (in none of this node's shards)."""


@dataclass
class GuardReport:
    """One round: events `removed`, events `held_back` by shard id (FOREIGN: foreign events) for too few
    confirmed copies, and the `confirmations` asked (REQs by ids sent to other nodes)."""

    removed: int = 0
    held_back: dict[str, int] = field(default_factory=dict)
    confirmations: int = 0

    def hold_back(self, shard: ShardConfig | None, count: int = 1) -> None:
        """Count `count` events of `shard` (None: foreign) kept for want of confirmed copies."""
        key = FOREIGN if shard is None else shard.id
        self.held_back[key] = self.held_back.get(key, 0) + count


def count_cutoff(conn, max_events: int) -> int:
    """The created_at before which events of any kind go for at most `max_events` to stay (0: none), oldest
    first as `[retention] max_events` removes them (read job)."""
    excess = count_events(conn) - max_events
    if excess <= 0:
        return 0
    row = conn.execute("SELECT created_at FROM events ORDER BY created_at, id DESC LIMIT 1 OFFSET ?",
                       (excess - 1,)).fetchone()
    return row[0] + 1 if row else 0


def rule_cutoff(config: Config, kinds: frozenset[int] | None, now: int) -> int | None:
    """The newest cut-off at `now` (created_at, exclusive) of the `[[retention.rules]]` that remove events of
    any of `kinds` (None: of every kind, so every rule), or None when none does."""
    cuts = [now - int(r.max_age_days * _DAY_SECONDS) for r in config.retention.rules
            if kinds is None or not r.kinds or kinds & set(r.kinds)]
    return max(cuts) if cuts else None


class Guard:
    """The removals of events of shards on this node (see the module docstring): `round(now)` announces the
    cuts due, then removes what other nodes confirm, batch by batch."""

    def __init__(self, config: Config, store: Store, key: NodeKey, protection: Protection) -> None:
        self.config = config
        self.store = store
        self.key = key
        self.protection = protection
        self.shards = shards_of(config)
        self.held = [claim_filter(s.filter) for s in self.shards if s.hold]
        self.declared = [claim_filter(s.filter) for s in self.shards]
        self.fleet = fleet_pubkeys(config)
        # kinds all of whose events are in a shard of this node: no foreign event to look for among them
        whole = [f for f in self.declared if f.authors is None and not f.tags]
        self.everything_declared = any(f.kinds is None for f in whole)
        self.declared_kinds = {k for f in whole if f.kinds is not None for k in f.kinds}
        self._cursors: dict[tuple[str, int | None], tuple[int, bytes]] = {}  # where each scan goes on next round
        self._withdrawn: list[Filter] = []  # the filters of shards withdrawn whose cut has not matured
        self._connections: dict[str, PeerConnection | None] = {}  # a round's, by URL (None: it failed this round)

    def matured(self, cut: Cut, now: int) -> bool:
        """Whether every claim this node published before `cut` has expired everywhere at `now`."""
        sharding = self.config.sharding
        return now >= cut.announced_at + sharding.ttl_seconds() + sharding.max_clock_skew_seconds

    async def announce(self, now: int) -> list[str]:
        """Store the cuts due at `now` (a `since` raised once the cut before has matured, a new handover, a
        shard no longer declared; a shard newly held or taken back forgets what was handed over and what was
        removed as foreign, which sync may then fetch again); returns the ids of the shards whose claims must
        be republished.  Run after `round`, which removes what the matured cuts allow."""
        cuts = await self.store.read_snapshot(read_cuts)
        maximum = self.config.retention.max_events
        by_count = await self.store.read_snapshot(count_cutoff, maximum) if maximum > 0 else 0
        changed = []
        for shard in self.shards:
            cut, since = cuts.get(shard.id), rule_cutoff(self.config, claim_filter(shard.filter).kinds, now) or 0
            if not shard.hold:
                new = cut if cut is not None and cut.leaving else Cut(now, now, True, shard.filter)
            elif cut is None or cut.leaving or cut.filter != shard.filter:
                # newly held (or taken back): what was handed over or removed as foreign may be fetched again
                for forgotten in (shard.id, FOREIGN):
                    await self.store.run_job(forget_evictions, forgotten)
                new = Cut(since, now, filter=shard.filter, by_count=by_count)
            elif not self.matured(cut, now):
                new = cut  # raised again only once its removals have had their turn
            else:
                since = max(since, cut.since)
                raised = since > cut.since or by_count > cut.by_count
                new = Cut(since, now, filter=shard.filter, by_count=max(by_count, cut.by_count)) if raised else cut
            if new != cut:
                await self.store.run_job(write_cut, shard.id, new)
                changed.append(shard.id)
        declared = {shard.id for shard in self.shards}
        for shard_id, cut in cuts.items():  # withdrawn from the configuration: a handover, of foreign events
            if shard_id not in declared and not cut.leaving:
                await self.store.run_job(write_cut, shard_id, Cut(now, now, True, cut.filter))
                changed.append(shard_id)
        return changed

    def _removable(self, row: Row, event: Event, shard: ShardConfig, cut: Cut | None, now: int) -> bool:
        """Whether `row` may go once confirmed: in the shard of `cut` (or, with no shard, a foreign event),
        not protected, not fleet-wide, and past the cut (a handover: kept by no held shard)."""
        if row.kind in FLEET_WIDE_KINDS or self.protection.protects(row):
            return False
        if cut is None:  # a foreign event: in none of this node's shards
            return not any(f.matches(event) for f in self.declared)
        if not claim_filter(shard.filter).matches(event):
            return False
        if cut.leaving:
            return not any(f.matches(event) for f in self.held)
        before = rule_cutoff(self.config, frozenset((row.kind,)), now)
        return row.created_at < cut.by_count or (before is not None and row.created_at < min(before, cut.since))

    async def round(self, claims: list[Claim], now: int | None = None, batch: int = 500,
                    max_batches: int = 20) -> GuardReport:
        """Remove, in up to `max_batches` batches of `batch` rows read per shard, the events of every cut
        past its wait, and the foreign events; `claims` are the stored claims (the hints).

        Raises:
            StoreFailed: the writer failed.
        """
        now = int(time.time()) if now is None else now
        report = GuardReport()
        cuts = await self.store.read_snapshot(read_cuts)
        hints = [c for c in claims if c.pubkey in self.fleet and c.pubkey != self.key.pubkey and c.status == COMPLETE
                 and c.is_live(now) and claim_filter(c.filter) is not None]
        # shards withdrawn from the configuration: until their cut matures, other nodes may still count this
        # node's copy of their events (now foreign here)
        declared = {shard.id for shard in self.shards}
        self._withdrawn = [claim_filter(c.filter) for i, c in cuts.items() if i not in declared
                           and (not c.leaving or not self.matured(c, now)) and claim_filter(c.filter) is not None]
        try:
            for shard in self.shards:
                cut = cuts.get(shard.id)
                if cut is not None and self.matured(cut, now):
                    for kind in _kinds(shard.filter):
                        scan = Scan(kind, None if cut.leaving else cut.claimed_since)
                        await self._remove(shard, cut, scan, hints, now, batch, max_batches, report)
            if self.shards and not self.everything_declared:  # foreign events: other nodes' shards, none of ours
                kinds = {k for c in hints for k in _kinds(c.filter)} - self.declared_kinds
                for kind in [None] if None in kinds else sorted(kinds):
                    await self._remove(None, None, Scan(kind, None), hints, now, batch, max_batches, report)
        finally:
            connections, self._connections = self._connections, {}
            for conn in connections.values():
                if conn is not None:
                    await conn.close()
        return report

    async def _remove(self, shard: ShardConfig | None, cut: Cut | None, scan: Scan, hints: list[Claim], now: int,
                      batch: int, max_batches: int, report: GuardReport) -> None:
        """Up to `max_batches` batches of `scan`, from where the last round's scan of it stopped (a held-back
        event is not read again until the scan has gone round)."""
        where = (shard.id if shard is not None else "", scan.kind)
        scan = Scan(scan.kind, scan.before, self._cursors.pop(where, START))
        for _ in range(max_batches):
            rows = await self.store.read_snapshot(scan_rows, scan, batch)
            candidates = []
            for row in rows:
                event = stored_event(row.raw)
                if self._removable(row, event, shard, cut, now):
                    holders = [c for c in hints if claim_filter(c.filter).matches(event)]
                    if cut is None and not holders:
                        continue  # in no node's shard: today's rules keep it
                    if cut is None and any(f.matches(event) for f in self._withdrawn):
                        report.hold_back(None)  # in a shard withdrawn here: its cut has not matured
                        continue
                    holders = [c for c in holders if c.covers(row.created_at)]
                    if len({c.pubkey for c in holders}) >= self.config.sharding.min_copies:
                        candidates.append((row, holders))
                    else:
                        report.hold_back(shard)
            if candidates:
                await self._confirm_and_remove(shard, candidates, now, report)
            if len(rows) < batch:
                return
            scan = Scan(scan.kind, scan.before, (rows[-1].created_at, rows[-1].id))
        self._cursors[where] = scan.cursor

    async def _confirm_and_remove(self, shard: ShardConfig | None, candidates: list[tuple[Row, list[Claim]]],
                                  now: int, report: GuardReport) -> None:
        """Ask each hinted node for the ids it should hold; remove those at least `min_copies` nodes returned."""
        asked: dict[tuple[str, str], list[Row]] = defaultdict(list)  # (pubkey, url) -> rows
        for row, holders in candidates:
            for claim in {c.pubkey: c for c in holders}.values():
                asked[(claim.pubkey, claim.url)].append(row)
        confirmed: dict[str, set[str]] = defaultdict(set)  # id -> pubkeys that returned it
        for (pubkey, url), rows in asked.items():
            report.confirmations += 1
            for event_id in await self._held_by(url, rows):
                confirmed[event_id].add(pubkey)
        minimum = self.config.sharding.min_copies
        removable = [row for row, _ in candidates if len(confirmed[row.id.hex()]) >= minimum]
        report.hold_back(shard, len(candidates) - len(removable))
        if not removable:
            return
        remembered = FOREIGN if shard is None else None if shard.hold else shard.id  # forgotten when taken
        removed = await self.store.run_job(evict_ids, [r.id for r in removable], now, remembered)
        report.removed += removed
        relied = sorted({c.event_id for row, holders in candidates if row in removable for c in holders})
        log.info("shard_events_removed", shard=shard.id if shard else None, why=_why(shard), removed=removed,
                 claims=relied, confirmed_by={r.id.hex(): sorted(confirmed[r.id.hex()]) for r in removable})

    async def _held_by(self, url: str, rows: list[Row]) -> set[str]:
        """The ids of `rows` the node at `url` holds: returned to a REQ by ids, or (a replaceable or addressable
        event) superseded there by a newer version of its coordinate; each event checked (id and signature).  An
        unreachable node confirms none.  When some are of `[auth] private_kinds` (which a relay leaves out of an
        unauthenticated answer), the REQ waits for our AUTH to be accepted first, up to AUTH_WAIT_SECONDS;
        without it those are not confirmed (kept here)."""
        s = self.config.sync
        if (conn := await self._connection(url)) is None:
            return set()
        ids = [row.id.hex() for row in rows]
        try:
            if any(row.kind in self.config.auth.private_kinds for row in rows) and \
                    not await conn.authenticated(AUTH_WAIT_SECONDS):
                log.warning("shard_confirmation_unauthenticated", url=url,
                            hint="events of private kinds are confirmed only by a node that accepts our NIP-42 AUTH")
            found = set()
            for start in range(0, len(ids), s.fetch_batch):
                found |= {e.id for e in await _checked(await conn.fetch(ids[start:start + s.fetch_batch]))}
            versioned = [r for r in rows
                         if r.id.hex() not in found and (is_replaceable(r.kind) or is_addressable(r.kind))]
            return (found & set(ids)) | await _superseded(conn, versioned)
        except PeerError as exc:
            log.warning("shard_confirmation_failed", url=url, error=str(exc))
            self._connections[url] = None  # (asked no more this round)
            await conn.close()
            return set()

    async def _connection(self, url: str) -> PeerConnection | None:
        """The round's connection to the node at `url`, opened at its first use; None when it cannot be reached
        (logged once a round)."""
        if url not in self._connections:
            s = self.config.sync
            try:
                self._connections[url] = await PeerConnection.open(url, self.key, s.connect_timeout_seconds,
                                                                   s.timeout_seconds,
                                                                   self.config.limits.max_message_bytes * 4)
            except PeerError as exc:
                log.warning("shard_confirmation_failed", url=url, error=str(exc))
                self._connections[url] = None
        return self._connections[url]


async def _checked(objs: list[object]) -> list[Event]:
    """The events among `objs` (a peer's answer) that parse and whose id and signature are right: a copy is a
    copy only if it is the event.  Checked on a thread: the writer's loop goes on meanwhile."""
    return await asyncio.to_thread(_valid, objs)


def _valid(objs: list[object]) -> list[Event]:
    events = []
    for obj in objs:
        try:
            event = parse_event(obj, _ANY_SIZE, time.time())
        except Rejection:
            continue
        if verify_signature(event):
            events.append(event)
    return events


async def _superseded(conn: PeerConnection, rows: list[Row]) -> set[str]:
    """The ids of `rows` (replaceable or addressable events) whose coordinate the peer holds a newer version of
    (NIP-01: a later created_at, or the same with a lower id): the fleet keeps that one, and would refuse this
    one as a duplicate.  One REQ per kind, by the rows' authors (and `d` tags)."""
    by_kind: dict[int, list[Row]] = defaultdict(list)
    for row in rows:
        by_kind[row.kind].append(row)
    superseded = set()
    for kind, group in by_kind.items():
        filter_obj: dict = {"kinds": [kind], "authors": sorted({r.pubkey.hex() for r in group})}
        if is_addressable(kind):
            filter_obj["#d"] = sorted({_d_tag(r) for r in group})
        held = {(e.pubkey, e.d_tag if is_addressable(kind) else None): e
                for e in await _checked(await conn.query(filter_obj, f"REQ of the versions of {len(group)} events"))}
        for row in group:
            event = held.get((row.pubkey.hex(), _d_tag(row) if is_addressable(kind) else None))
            if event is not None and is_newer(event.created_at, bytes.fromhex(event.id), (row.created_at, row.id)):
                superseded.add(row.id.hex())
    return superseded


def _d_tag(row: Row) -> str:
    """The `d` tag of an addressable event's row ("" when it has none; a read connection gives TEXT as bytes)."""
    d_tag = row.d_tag or ""
    return d_tag.decode() if isinstance(d_tag, bytes) else d_tag


def _kinds(filter_json: str) -> list[int | None]:
    """The kinds a scan of a shard's events reads one by one (by the kind index); [None]: every kind."""
    kinds = claim_filter(filter_json).kinds
    return [None] if kinds is None else sorted(kinds)


def _why(shard: ShardConfig | None) -> str:
    if shard is None:
        return "foreign: in no held shard, held by its shard's nodes"
    return "handover" if not shard.hold else "retention"
