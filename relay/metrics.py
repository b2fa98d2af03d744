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
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Protocol, TypeVar

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics, generate_latest
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


class Provider(Protocol[_Stats]):
    """A part that reports its own counts when asked (cheap: called at each scrape, on the event loop)."""

    def stats(self) -> _Stats:
        """The counts now."""


class Metrics:
    """The metrics of one node; call sites use the bound children below (counts of events, seconds)."""

    def __init__(self) -> None:
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

    def watch(self, store: Store, server: Provider[Any], projectors: Provider[Mapping[str, int]] | None) -> None:
        """Read these at each scrape: `store`'s files and `sync_peers` table, the `server`'s counts (the
        fields of relay/server/app.py's `ServerStats`), and the refusals per projector (None: no projectors)."""
        self._scrape.store, self._scrape.server, self._scrape.projectors = store, server, projectors

    def watch_peers(self, sync: Provider[Mapping[str, int]]) -> None:
        """Read the failed sync attempts per configured peer URL from `sync` at each scrape."""
        self._scrape.sync = sync

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
        """The exposition text; reads the `sync_peers` table first (one short read job)."""
        store = self._scrape.store
        self._scrape.peers = await store.read_snapshot(read_states) if store is not None else []
        return generate_latest(self.registry)


class _ScrapeCollector:
    """Values read from the watched parts at scrape time (see the module docstring)."""

    def __init__(self) -> None:
        self.store: Store | None = None
        self.server: Provider[Any] | None = None
        self.projectors: Provider[Mapping[str, int]] | None = None
        self.sync: Provider[Mapping[str, int]] | None = None
        self.policies: Provider[Mapping[str, Mapping[str, int]]] | None = None
        self.peers: list[PeerState] = []

    def collect(self) -> Iterator[Metric]:
        if self.store is None or self.server is None:  # not watching a started node yet
            return
        server = self.server.stats()
        yield GaugeMetricFamily("relay_connections", "open WebSocket connections", value=server.connections)
        yield GaugeMetricFamily("relay_subscriptions", "open REQ subscriptions, all connections",
                                value=server.subscriptions)
        yield GaugeMetricFamily("relay_negentropy_sessions", "open NIP-77 (NEG-OPEN) sessions, all connections",
                                value=server.negentropy_sessions)
        yield GaugeMetricFamily("relay_negentropy_items_held", "items held in memory by NIP-77 sessions "
                                "answered from a query", value=server.negentropy_items_held)
        yield CounterMetricFamily("relay_slow_readers_disconnected", "connections closed (1008) for not reading "
                                  "live events or stored results in time", value=server.slow_readers)
        yield CounterMetricFamily("relay_keepalive_timeouts", "connections closed (1011) for neither answering a "
                                  "ping nor reading in time", value=server.keepalive_timeouts)
        yield CounterMetricFamily("relay_connections_refused", "connections closed (1008) at once: their client "
                                  "IP had rate_limits.ip_connections open", value=server.connections_refused)
        size = GaugeMetricFamily("relay_database_bytes", "size of the SQLite files: the database (db) and "
                                 "its write-ahead log (wal)", labels=["file"])
        size.add_metric(["db"], file_bytes(self.store.path))
        size.add_metric(["wal"], wal_bytes(self.store.path))
        yield size
        refusals = CounterMetricFamily("relay_projector_refusals", "events stored but not projected, by projector",
                                       labels=["projector"])
        for name, count in sorted(self.projectors.stats().items()) if self.projectors is not None else ():
            refusals.add_metric([name], count)
        yield refusals
        yield from self._peers()
        if self.policies is not None:
            outcomes = CounterMetricFamily("relay_policy_outcomes", "write policies' events by what happened: "
                                           "rejected, shadow_rejected, failed, overruns (of the time budget); "
                                           "plugins: restarts, bad_lines", labels=["policy", "outcome"])
            for name, counts in sorted(self.policies.stats().items()):
                for outcome, count in sorted(counts.items()):
                    outcomes.add_metric([name, outcome], count)
            yield outcomes

    def _peers(self) -> Iterator[Metric]:
        """Per-peer sync state: all-time counts from `sync_peers`, errors since this process started."""
        events_in = CounterMetricFamily("relay_sync_events_in", "events fetched from the peer and stored "
                                        "(all time, from sync_peers)", labels=["peer"])
        events_out = CounterMetricFamily("relay_sync_events_out", "events pushed to the peer and accepted by it "
                                         "(all time, from sync_peers)", labels=["peer"])
        success = GaugeMetricFamily("relay_sync_last_success_timestamp_seconds", "unix time of the last complete "
                                    "reconciliation with the peer (0: never)", labels=["peer"])
        lasting = GaugeMetricFamily("relay_sync_lasting_differences", "ids the last two reconciliations with the "
                                    "peer both found different: refused on one side, not closed by sync "
                                    "(from sync_peers)", labels=["peer"])
        refused = GaugeMetricFamily("relay_sync_refused_events", "events the peer refused for good (invalid:, "
                                    "blocked:, ...) in the last complete reconciliation: settled, not errors "
                                    "(from sync_peers)", labels=["peer"])
        errors = CounterMetricFamily("relay_sync_errors", "failed sync attempts with a configured peer since this "
                                     "process started, reconciliations whose events errored included",
                                     labels=["peer"])
        for state in self.peers:
            events_in.add_metric([state.url], state.events_in)
            events_out.add_metric([state.url], state.events_out)
            success.add_metric([state.url], state.last_success or 0)
            lasting.add_metric([state.url], state.lasting_differences)
            refused.add_metric([state.url], state.refused)
        for url, count in self.sync.stats().items() if self.sync is not None else ():
            errors.add_metric([url], count)
        yield from (events_in, events_out, success, lasting, refused, errors)
