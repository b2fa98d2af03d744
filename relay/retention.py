"""Retention runs: the `[retention]` rules applied to a store, once (`run_retention`) or periodically.

A run applies each `[[retention.rules]]` (events of its kinds older than
`max_age_days`, by created_at), then `max_events` (the oldest events go
until at most that many are stored), each as a scan of short steps through
the store's writer (relay/store/retention.py).  Protected events are never
removed and still count towards `max_events`, so a store whose protected
events alone exceed it stays above it.  Neither is an event of one of this
node's `[[shards]]`: the shards' guard removes those once other nodes are
confirmed to hold them (relay/sync/guard.py).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, replace

import structlog

from relay.config import Config, shards_of
from relay.protocol.claims import FLEET_WIDE_FILTER
from relay.protocol.filters import Filter, parse_filter
from relay.store.retention import Protection, Scan, count_events, evict_step
from relay.store.store import Store

log = structlog.get_logger(__name__)

_DAY_SECONDS = 86_400


def protection(config: Config) -> Protection:
    """What `config` protects: the kinds of projectors marked `protected`, and `[negentropy] protected_filters`."""
    return Protection(frozenset(s.kind for s in config.projectors if s.protected),
                      tuple(parse_filter(f) for f in config.negentropy.protected_filters))


@dataclass
class RetentionReport:
    """Counts of one run: rows `read` by its steps, events `evicted`, `steps` (transactions)."""

    read: int = 0
    evicted: int = 0
    steps: int = 0


async def _scan(store: Store, scan: Scan, budget: int, batch: int, guard: Protection, now: int,
                report: RetentionReport) -> None:
    while budget > 0:
        step = await store.run_retried("retention", evict_step, scan, batch, budget, guard, now)
        report.read += step.read
        report.evicted += step.evicted
        report.steps += 1
        budget -= step.evicted
        if step.done:
            return
        scan = replace(scan, cursor=step.cursor)


def _keeping_shards(config: Config) -> Protection:
    """`protection(config)`, and with shards every event of this node's shards (those only the shards' guard
    removes, by the same rules and `max_events`, once other nodes hold enough copies: relay/sync/guard.py) and
    of the fleet-wide kinds (deletions, requests to vanish, claims: every node of a fleet holds them)."""
    guard, shards = protection(config), shards_of(config)
    if not shards:
        return guard
    kinds, filters = set(guard.kinds), list(guard.filters)
    for f in [FLEET_WIDE_FILTER] + [parse_filter(json.loads(s.filter)) for s in shards]:
        if f.kinds is not None and f.authors is None and not f.tags:
            kinds |= f.kinds  # (kept by kind: a scan of such a kind is skipped, its rows never read)
        else:
            filters.append(f)
    return replace(guard, kinds=frozenset(kinds), filters=tuple(filters))


async def run_retention(store: Store, config: Config, now: int | None = None) -> RetentionReport:
    """Apply `config.retention` once at `now` (unix seconds; default: the clock); the events of this node's
    shards are left to the shards' guard (relay/sync/guard.py).  Returns the counts."""
    settings = config.retention
    now = int(time.time()) if now is None else now
    guard = _keeping_shards(config)
    report = RetentionReport()
    if any(f == Filter() for f in guard.filters):  # a shard of every event (an archive): the guard removes, not this
        return report
    unbounded = 1 << 62
    for rule in settings.rules:
        before = now - int(rule.max_age_days * _DAY_SECONDS)
        for kind in rule.kinds or (None,):
            if kind not in guard.kinds:
                await _scan(store, Scan(kind, before), unbounded, settings.batch_size, guard, now, report)
    if settings.max_events > 0:
        excess = await store.read_snapshot(count_events) - settings.max_events
        if excess > 0:
            await _scan(store, Scan(None, None), excess, settings.batch_size, guard, now, report)
    return report


def is_configured(config: Config) -> bool:
    """True when `config` asks for any retention (a rule or a maximum event count)."""
    return bool(config.retention.rules) or config.retention.max_events > 0


async def retention_forever(store: Store, config: Config) -> None:
    """Run retention every `[retention] interval_seconds` until cancelled; a failed run is logged and retried."""
    while True:
        await asyncio.sleep(config.retention.interval_seconds)
        started = time.monotonic()
        try:
            report = await run_retention(store, config)
        except Exception as exc:  # the one place this task catches: log, try again next interval
            log.error("retention_failed", error=repr(exc), exc_info=exc)
            continue
        if report.evicted:
            log.info("retention_run", evicted=report.evicted, read=report.read, steps=report.steps,
                     seconds=round(time.monotonic() - started, 3))
