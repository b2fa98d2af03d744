"""What a verb's handler is given: the relay's shared services it uses and its own connection's state."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Protocol

from prometheus_client import Counter, Histogram

from relay.config import LimitsConfig
from relay.ingest import Ingest, Outcome, Source
from relay.protocol.envelopes import encode_auth_challenge
from relay.protocol.event import EventLimits
from relay.protocol.filters import Filter
from relay.protocol.rejection import Rejection
from relay.server.access import ConnectionAccess
from relay.server.budget import ByteBudget
from relay.server.negentropy import ConnectionSessions
from relay.server.outbox import Outbox
from relay.server.ratelimit import EVENTS, REFUSALS, ConnectionRate, RateLimits
from relay.server.search import search_refusal
from relay.server.subscriptions import Subscriptions
from relay.store.reads import ReadPool
from relay.wire.websocket import RateWindow

class HandlerMetrics(Protocol):
    """What the handlers count (relay/metrics.py's `Metrics`): EVENTs received and answered, query seconds."""

    events_received: Counter
    req_seconds: Histogram
    count_seconds: Histogram

    def event_answered(self, outcome: Outcome) -> None:
        """Count one EVENT's OK by its NIP-01 prefix."""


@dataclass(frozen=True, slots=True)
class Services:
    """The parts of the relay that every connection's handlers share (built once, at start).

    `ingest` takes every EVENT (relay/ingest/: rules of the connection's
    `Source`, signature, writer); `internal_error(what, exc, **fields)` logs a
    failure and returns the client's "error: internal"; `stored_results`
    bounds the unsent REQ results of all connections (bytes); `trusted(pubkey)`: a connection
    authenticated as `pubkey` is no longer rate limited.
    """

    limits: LimitsConfig
    event_limits: EventLimits
    store: ReadPool
    ingest: Ingest
    stored_results: ByteBudget
    rate_limits: RateLimits
    metrics: HandlerMetrics
    internal_error: Callable[..., str]
    trusted: Callable[[str], bool] = lambda pubkey: False  # not rate limited once authenticated (moderation.py)


class Context:
    """One connection as its handlers see it.

    `send(message)` writes one frame and waits for the socket;
    `send_watched(messages, seconds, window)` writes frames and returns False
    when the peer stops taking them (see `Wire.send_watched`); OKs, live events
    and the AUTH challenge go through `outbox`.  `rate` is None when the
    connection is not rate limited; `draining` is set when the relay shuts
    down (EVENTs are no longer taken); `query_slot` lets one stored query run
    at a time; `drop_slow_reader(reason)` disconnects the client (1008);
    `source` says which ingest rules its EVENTs get (relay/ingest/source.py), with the client's `ip`.
    """

    __slots__ = ("services", "limits", "send", "send_watched", "outbox", "access", "rate", "subscriptions",
                 "negentropy", "query_slot", "drop_slow_reader", "draining", "source")

    def __init__(self, services: Services, send: Callable[[bytes], Awaitable[None]],
                 send_watched: Callable[[list[bytes], float, RateWindow | None], Awaitable[bool]],
                 outbox: Outbox, access: ConnectionAccess, rate: ConnectionRate | None,
                 subscriptions: Subscriptions, negentropy: ConnectionSessions,
                 drop_slow_reader: Callable[[str], None], ip: str = "") -> None:
        self.services = services
        self.limits = services.limits
        self.send = send
        self.send_watched = send_watched
        self.outbox = outbox
        self.access = access
        self.rate = rate
        self.subscriptions = subscriptions
        self.negentropy = negentropy
        self.query_slot = asyncio.Semaphore(1)
        self.drop_slow_reader = drop_slow_reader
        self.draining = False
        self.source = Source.client(access.check_write if access.checks_writes else None,
                                    None if rate is None else partial(rate.allow, EVENTS), ip=ip,
                                    pubkeys=access.pubkeys)

    def challenge(self) -> None:
        """Queue `["AUTH", <challenge>]` (NIP-42), once per connection."""
        if not self.access.challenged:
            self.access.challenged = True
            self.outbox.push(encode_auth_challenge(self.access.challenge))

    def read_refusal(self, filters: list[Filter], action: int) -> str | None:
        """Why a REQ, COUNT (action REQS) or NEG-OPEN (NEG_OPENS) is refused: rate limit, NIP-42, a search with
        search disabled (NIP-50); None: go ahead."""
        if self.rate is not None and not self.rate.allow(action):
            return REFUSALS[action]
        if refusal := search_refusal(filters, self.services.store):
            return refusal
        try:
            self.access.check_read(filters)
        except Rejection as rejection:
            self.challenge()
            return str(rejection)
        return None

    def query_failure(self, what: str, exc: Exception, **fields) -> str:
        """The client's message for a failed REQ or COUNT query: a Rejection is a query past its time bound
        (relay/store/bounds.py); anything else is a bug, logged as `what` with `fields`."""
        return str(exc) if isinstance(exc, Rejection) else self.services.internal_error(what, exc, **fields)
