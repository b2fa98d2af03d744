"""Prometheus metrics of one relay process, served at `GET /metrics` (text format 0.0.4).

How this works: every node owns a `Metrics` with its own `CollectorRegistry`
(tests run many relays in one process).  The counters of what happens
(EVENTs received and answered, events stored and ephemeral, query seconds,
write transactions) are its own, bound once (labelled children included),
so a call site costs one `inc()` or `observe()`.  Values other parts hold
are read only when scraped, at no cost in between, through the `stats()` of
the providers given to `watch` and `watch_peers` (the server's connections, subscriptions,
NIP-77 sessions and closed connections; the projector hook's refusals; each
configured peer's errors), plus the store's file sizes and its `sync_peers`
table.

With worker processes (prometheus-client's multiprocess mode), every process
writes its metrics to files of its own in one directory (`start_multiprocess`
in the writer, `join_multiprocess` in each worker, before `Metrics()`), and
the process that answers `/metrics` renders the sum of them all
(`MultiProcessCollector`), under the same names and labels.  Custom
collectors do not run there: each scrape-time value (`SCRAPED`) is copied
into a Counter or Gauge of the process that owns it by `refresh`, every
`REFRESH_SECONDS` (`refresh_forever`) and before that process renders the
page: per-worker counts as `livesum` gauges (a dead worker's go with
`mark_process_dead`), the writer's values as `mostrecent` gauges, counters by
their increase since the last refresh.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from prometheus_client import (CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest,
                               multiprocess, values)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from relay.ingest import Outcome
from relay.protocol.rejection import PREFIXES
from relay.store.checkpoint import file_bytes, wal_bytes
from relay.store.store import Store
from relay.sync.state import PeerState, read_states

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# No `*_created` series: they double the output and say only when the process started.
disable_created_metrics()

_QUERY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)

_Stats = TypeVar("_Stats", covariant=True)
MULTIPROCESS_DIR = "metrics"
"""The directory of every process's metrics files, in the relay's runtime directory (relay/runtime.py)."""
REFRESH_SECONDS = 1.0
"""How often each process copies its scrape-time values into its files, with worker processes."""
_ENV = "PROMETHEUS_MULTIPROC_DIR"


def start_multiprocess(runtime: Path) -> Path:
    """The writer, before it builds its `Metrics` and starts workers: a fresh metrics directory in `runtime`
    (the files of a previous run removed), joined (`join_multiprocess`); returns its path.  Workers started
    after this inherit it through the environment (PROMETHEUS_MULTIPROC_DIR)."""
    directory = runtime / MULTIPROCESS_DIR
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(mode=0o700)
    join_multiprocess(directory)
    return directory


def join_multiprocess(directory: Path) -> None:
    """Make this process's metrics write to files in `directory`: PROMETHEUS_MULTIPROC_DIR set, and
    prometheus-client's value class switched (it chose it when first imported).  Call before `Metrics()`."""
    os.environ[_ENV] = str(directory)
    if not getattr(values.ValueClass, "_multiprocess", False):
        values.ValueClass = values.MultiProcessValue()


def inherited_multiprocess() -> Path | None:
    """A worker: the metrics directory its writer made (`start_multiprocess`: PROMETHEUS_MULTIPROC_DIR, inherited),
    joined; None when there is none (a writer inside a test's process keeps one registry per process)."""
    directory = os.environ.get(_ENV)
    if directory is None:
        return None
    join_multiprocess(Path(directory))
    return Path(directory)


def mark_process_dead(pid: int, directory: Path) -> None:
    """A worker `pid` died: its live gauges (connections, subscriptions, ...) leave the sums; its counters stay."""
    multiprocess.mark_process_dead(pid, str(directory))


def render_multiprocess(directory: Path) -> bytes:
    """The exposition text of the sum of every process's files in `directory`."""
    registry = CollectorRegistry(auto_describe=False)
    multiprocess.MultiProcessCollector(registry, str(directory))
    return generate_latest(registry)


class Provider(Protocol[_Stats]):
    """A part that reports its own counts when asked (cheap: called at each scrape, on the event loop)."""

    def stats(self) -> _Stats:
        """The counts now."""


class Metrics:
    """The metrics of one node; call sites use the bound children below (counts of events, seconds)."""

    def __init__(self, multiprocess_dir: Path | None = None, writer: bool = True) -> None:
        """`multiprocess_dir`: with worker processes, the metrics directory this process joined (None: one
        process, today's registry and scrape-time collector); `writer`: this process owns the writer's values
        (the store, projectors, peers, policies), else a worker's (its server)."""
        self.multiprocess_dir = multiprocess_dir
        self._writer = writer
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        self.events_received = Counter("relay_events_received", "EVENT messages received from clients", registry=r)
        self.worker_restarts = Counter("relay_worker_restarts", "worker processes restarted after they died "
                                       "(server.workers; relay/supervisor.py)", registry=r)
        self.events_stored = Counter("relay_events_stored", "events committed to the database (clients, sync, "
                                     "import in this process)", registry=r)
        self.events_ephemeral = Counter("relay_events_ephemeral", "ephemeral events accepted and fanned out, "
                                        "never stored", registry=r)
        refused = Counter("relay_events_refused", "EVENTs answered OK false, or OK true with 'duplicate:', "
                          "by NIP-01 prefix", ["reason"], registry=r)
        self._refused = {prefix: refused.labels(prefix) for prefix in PREFIXES}
        query = Histogram("relay_query_seconds", "seconds to read the stored results of one REQ or COUNT",
                          ["verb"], buckets=_QUERY_BUCKETS, registry=r)
        self.req_seconds = query.labels("REQ")
        self.count_seconds = query.labels("COUNT")
        self._batch_events = Histogram("relay_writer_batch_events", "events in one write transaction",
                                       buckets=_BATCH_BUCKETS, registry=r)
        self._commit_seconds = Histogram("relay_writer_commit_seconds", "seconds from BEGIN to COMMIT of one write "
                                         "transaction (as the writer task waits for it)", buckets=_QUERY_BUCKETS,
                                         registry=r)
        self._scrape = _ScrapeCollector()
        r.register(self._scrape)
        # With workers: this process's share of the scrape-time values, copied by `refresh` into its files.
        self._copies: dict[str, Counter | Gauge] = {}
        self._counted: dict[tuple[str, tuple[str, ...]], float] = {}
        if multiprocess_dir is not None:
            for spec in SCRAPED:
                if spec.writer == writer:
                    self._copies[spec.name] = (Counter(spec.name, spec.doc, spec.labels, registry=None) if spec.counter
                                               else Gauge(spec.name, spec.doc, spec.labels, registry=None,
                                                          multiprocess_mode=spec.mode))

    def watch(self, store: Store | None, server: Provider[Any] | None,
              projectors: Provider[Mapping[str, int]] | None) -> None:
        """Read these at each scrape: `store`'s files and `sync_peers` table, the `server`'s counts (the
        fields of relay/server/app.py's `ServerStats`), and the refusals per projector (None: no projectors).
        With workers, the writer watches no server and a worker no projectors."""
        self._scrape.store, self._scrape.server, self._scrape.projectors = store, server, projectors

    def watch_peers(self, sync: Provider[Mapping[str, int]]) -> None:
        """Read the failed sync attempts per configured peer URL from `sync` at each scrape."""
        self._scrape.sync = sync

    def watch_shards(self, shards: Provider[Mapping[str, Mapping[str, float]]]) -> None:
        """Read each shard's copies, held-back events and claim age (relay/sync/claims.py `ShardKeeper.stats`)
        at each scrape."""
        self._scrape.shards = shards

    def watch_policies(self, policies: Provider[Mapping[str, Mapping[str, int]]]) -> None:
        """Read the counts per write policy (relay/ingest/policies.py `Policies.stats`) at each scrape."""
        self._scrape.policies = policies

    def event_answered(self, outcome: Outcome) -> None:
        """Count an EVENT's OK reply: refusals (OK false) and duplicates (OK true "duplicate: ...") by prefix."""
        if not outcome.accepted or outcome.prefix:
            self._refused.get(outcome.prefix, self._refused["error"]).inc()

    def writer_batch(self, events: int, seconds: float) -> None:
        """One write transaction of `events` events took `seconds` (`Store.on_batch`)."""
        self._batch_events.observe(events)
        self._commit_seconds.observe(seconds)

    async def render(self) -> bytes:
        """The exposition text; reads the `sync_peers` table first (one short read job).  With workers: this
        process's values refreshed, then the sum of every process's files."""
        if self.multiprocess_dir is not None:
            await self.refresh()
            return render_multiprocess(self.multiprocess_dir)
        await self._read_peers()
        return generate_latest(self.registry)

    async def _read_peers(self) -> None:
        store = self._scrape.store
        self._scrape.peers = await store.read_snapshot(read_states) if store is not None else []

    async def refresh(self) -> None:
        """With workers: copy this process's scrape-time values into its metrics files (gauges set, counters
        increased by what they grew since the last refresh)."""
        if self._writer:
            await self._read_peers()
        for spec, samples in self._scrape.readings():
            metric = self._copies.get(spec.name)
            for labels, value in samples if metric is not None else ():
                child = metric.labels(*labels) if labels else metric
                if not spec.counter:
                    child.set(value)
                    continue
                grown = value - self._counted.get((spec.name, labels), 0)
                self._counted[spec.name, labels] = value
                child.inc(max(grown, 0))  # a count that went down (a restarted part) starts again from there

    async def refresh_forever(self) -> None:
        """With workers: `refresh` every REFRESH_SECONDS until cancelled (a task of the process's node)."""
        while True:
            await self.refresh()
            await asyncio.sleep(REFRESH_SECONDS)


@dataclass(frozen=True)
class Scraped:
    """A value other parts hold, read from them: at each scrape with one process; with worker processes, by
    `Metrics.refresh` in the process that owns it (`writer`: the writer's store, projectors, peers and
    policies; else each worker's server), into a Counter (by its increase) or a Gauge with `mode`
    (prometheus-client's multiprocess_mode: `livesum` sums the live workers, `mostrecent` keeps the
    writer's last value)."""

    name: str
    doc: str
    counter: bool = False
    labels: tuple[str, ...] = ()
    writer: bool = True
    mode: str = "mostrecent"


def _worker(name: str, doc: str, counter: bool = False) -> Scraped:
    return Scraped(name, doc, counter, writer=False, mode="livesum")


CONNECTIONS = _worker("relay_connections", "open WebSocket connections")
SUBSCRIPTIONS = _worker("relay_subscriptions", "open REQ subscriptions, all connections")
NEG_SESSIONS = _worker("relay_negentropy_sessions", "open NIP-77 (NEG-OPEN) sessions, all connections")
NEG_ITEMS = _worker("relay_negentropy_items_held", "items held in memory by NIP-77 sessions answered from a query")
SLOW_READERS = _worker("relay_slow_readers_disconnected", "connections closed (1008) for not reading live events or "
                       "stored results in time", counter=True)
KEEPALIVE = _worker("relay_keepalive_timeouts", "connections closed (1011) for neither answering a ping nor "
                    "reading in time", counter=True)
REFUSED_CONNECTIONS = _worker("relay_connections_refused", "connections closed (1008) at once: their client IP had "
                              "rate_limits.ip_connections open", counter=True)
DATABASE_BYTES = Scraped("relay_database_bytes", "size of the SQLite files: the database (db) and its write-ahead "
                         "log (wal)", labels=("file",))
PROJECTOR_REFUSALS = Scraped("relay_projector_refusals", "events stored but not projected, by projector", True,
                             ("projector",))
SYNC_IN = Scraped("relay_sync_events_in", "events fetched from the peer and stored (all time, from sync_peers)",
                  True, ("peer",))
SYNC_OUT = Scraped("relay_sync_events_out", "events pushed to the peer and accepted by it (all time, from "
                   "sync_peers)", True, ("peer",))
SYNC_SUCCESS = Scraped("relay_sync_last_success_timestamp_seconds", "unix time of the last complete "
                       "reconciliation with the peer (0: never)", labels=("peer",))
SYNC_LASTING = Scraped("relay_sync_lasting_differences", "ids the last two reconciliations with the peer both found "
                       "different: refused on one side, not closed by sync (from sync_peers)", labels=("peer",))
SYNC_REFUSED = Scraped("relay_sync_refused_events", "events the peer refused for good (invalid:, blocked:, ...) in "
                       "the last complete reconciliation: settled, not errors (from sync_peers)", labels=("peer",))
SYNC_ERRORS = Scraped("relay_sync_errors", "failed sync attempts with a configured peer since this process started, "
                      "reconciliations whose events errored included", True, ("peer",))
POLICY_OUTCOMES = Scraped("relay_policy_outcomes", "write policies' events by what happened: rejected, "
                          "shadow_rejected, failed, overruns (of the time budget); plugins: restarts, bad_lines", True,
                          ("policy", "outcome"))
SHARD_COPIES = Scraped("relay_shard_copies", "other fleet nodes claiming a complete copy of the shard (kind "
                       "30803); under [sharding] min_copies, its retention and handover wait", labels=("shard",))
SHARD_HELD_BACK = Scraped("relay_shard_held_back_events", "events the shards' guard kept in its last round for want "
                          "of min_copies confirmed copies", labels=("shard",))
SHARD_CLAIM_AGE = Scraped("relay_shard_claim_age_seconds", "seconds since this node's last claim on the shard "
                          "(-1: none)", labels=("shard",))
SCRAPED = (CONNECTIONS, SUBSCRIPTIONS, NEG_SESSIONS, NEG_ITEMS, SLOW_READERS, KEEPALIVE, REFUSED_CONNECTIONS,
           DATABASE_BYTES, PROJECTOR_REFUSALS, SYNC_IN, SYNC_OUT, SYNC_SUCCESS, SYNC_LASTING, SYNC_REFUSED,
           SYNC_ERRORS, POLICY_OUTCOMES, SHARD_COPIES, SHARD_HELD_BACK, SHARD_CLAIM_AGE)
"""Every scrape-time value, in the order of the page."""

_Samples = list[tuple[tuple[str, ...], float]]


class _ScrapeCollector:
    """Values read from the watched parts (see the module docstring)."""

    def __init__(self) -> None:
        self.store: Store | None = None
        self.server: Provider[Any] | None = None
        self.projectors: Provider[Mapping[str, int]] | None = None
        self.sync: Provider[Mapping[str, int]] | None = None
        self.policies: Provider[Mapping[str, Mapping[str, int]]] | None = None
        self.shards: Provider[Mapping[str, Mapping[str, float]]] | None = None
        self.peers: list[PeerState] = []

    def readings(self) -> Iterator[tuple[Scraped, _Samples]]:
        """Each scrape-time value the watched parts give now, with its samples (label values, value)."""
        if self.server is not None:
            server = self.server.stats()
            for spec, value in ((CONNECTIONS, server.connections), (SUBSCRIPTIONS, server.subscriptions),
                                (NEG_SESSIONS, server.negentropy_sessions), (NEG_ITEMS, server.negentropy_items_held),
                                (SLOW_READERS, server.slow_readers), (KEEPALIVE, server.keepalive_timeouts),
                                (REFUSED_CONNECTIONS, server.connections_refused)):
                yield spec, [((), value)]
        if self.store is None:  # not watching a started node yet, or a worker's metrics without a store
            return
        yield DATABASE_BYTES, [(("db",), file_bytes(self.store.path)), (("wal",), wal_bytes(self.store.path))]
        projectors = self.projectors.stats() if self.projectors is not None else {}
        yield PROJECTOR_REFUSALS, [((name,), count) for name, count in sorted(projectors.items())]
        yield SYNC_IN, [((p.url,), p.events_in) for p in self.peers]
        yield SYNC_OUT, [((p.url,), p.events_out) for p in self.peers]
        yield SYNC_SUCCESS, [((p.url,), p.last_success or 0) for p in self.peers]
        yield SYNC_LASTING, [((p.url,), p.lasting_differences) for p in self.peers]
        yield SYNC_REFUSED, [((p.url,), p.refused) for p in self.peers]
        yield SYNC_ERRORS, [((url,), count) for url, count in (self.sync.stats().items() if self.sync is not None else ())]
        if self.policies is not None:
            yield POLICY_OUTCOMES, [((name, outcome), count) for name, counts in sorted(self.policies.stats().items())
                                    for outcome, count in sorted(counts.items())]
        if self.shards is not None:
            shards = sorted(self.shards.stats().items())
            for spec, figure in ((SHARD_COPIES, "copies"), (SHARD_HELD_BACK, "held_back"),
                                 (SHARD_CLAIM_AGE, "claim_age")):
                yield spec, [((shard,), figures[figure]) for shard, figures in shards]

    def collect(self) -> Iterator[Metric]:
        for spec, samples in self.readings():
            family = (CounterMetricFamily if spec.counter else GaugeMetricFamily)(spec.name, spec.doc,
                                                                                  labels=spec.labels)
            for labels, value in samples:
                family.add_metric(labels, value)
            yield family
