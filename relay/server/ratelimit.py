"""Rate limits per connection and per client IP: token buckets (the `token_bucket` library), and each
IP's share of the relay's budget for unsent REQ results.

How this works: every limited connection holds a `ConnectionRate` with its
own buckets (EVENT/AUTH, REQ/COUNT, NEG-OPEN) and the buckets of its client
IP, shared by all connections from that IP; a message passes when both have
a token.  An IP has at most `ip_connections` limited connections open.  An
IP's buckets (and share) are kept while it has connections open and, after
its last one closes, until they would have refilled anyway
(`burst / rate` seconds), at most `max_idle_ips` of them, so memory is bounded
by the open connections.  The client IP is the socket's peer address, or the
`X-Forwarded-For` client when the peer is a trusted proxy; exempt IPs are not
limited at all, nor (`exempt_loopback`) a loopback client whose request
carries no `X-Forwarded-For` or `Forwarded` header: behind a proxy on this
host every client is loopback, so such a request is limited (and a warning
logged once) unless a trusted proxy named its client.

With worker processes, each IP's state lives in the relay's shared table
instead (`table`: relay/server/iptable.py), so `ip_connections`, the per-IP
buckets and the per-IP share of unsent results hold across all workers.
`admits` then counts the connection in the same locked step that checks the
cap (two workers cannot both admit the last place), and the `open` for that
IP that follows it on this process takes that place.  An IP whose group of
the table is full falls back to this process's own state (logged once).
"""

from __future__ import annotations

import ipaddress
import sys
import time
from collections import OrderedDict
from pathlib import Path

import structlog
from token_bucket import Limiter, MemoryStorage

from relay.config import RateLimitConfig
from relay.ingest.outcome import RATE_LIMITED
from relay.server.budget import ByteBudget
from relay.server.iptable import IpTable, TableFull

EVENTS, REQS, NEG_OPENS = 0, 1, 2
"""The limited actions: EVENT and AUTH; REQ and COUNT; NEG-OPEN."""
TOO_MANY_CONNECTIONS = "rate-limited: too many connections from this address"
"""The close reason (code 1008) of a connection past `ip_connections`."""
REFUSALS = (RATE_LIMITED.message, "rate-limited: too many REQ and COUNT requests, slow down",
            "rate-limited: too many negentropy sessions, slow down")
"""The NIP-01 reply of each refused action."""
MAX_IDLE_IPS = 100_000
"""Default: IPs without an open connection whose buckets are kept (the oldest are dropped first)."""
_KEYS = ("events", "reqs", "neg_opens")
IP_TABLE = "ip-limits"
"""The shared per-IP table's file name in the relay's runtime directory."""

log = structlog.get_logger(__name__)


def ip_buckets(config: RateLimitConfig) -> tuple[tuple[float, int], ...]:
    """The per-IP buckets' (rate per second, burst) for EVENTS, REQS, NEG_OPENS."""
    return ((config.ip_events_per_second, config.ip_events_burst),
            (config.ip_reqs_per_second, config.ip_reqs_burst),
            (config.ip_neg_opens_per_second, config.ip_neg_opens_burst))


def create_ip_table(runtime: Path, config: RateLimitConfig, workers: int) -> IpTable:
    """The writer's fresh shared per-IP table for `workers` workers, in the relay's runtime directory
    (relay/runtime.py); made before the workers start, cleared of a dead worker with `clear_worker(i)`."""
    return IpTable.create(runtime / IP_TABLE, workers, ip_buckets(config))


def open_ip_table(runtime: Path, config: RateLimitConfig, worker: int) -> IpTable:
    """Worker `worker`'s view of the table `create_ip_table` made, for `RateLimits(..., table=...)`.

    Raises:
        OSError: there is no table; ValueError: the file is not one, or `worker` is past its workers.
    """
    return IpTable.open(runtime / IP_TABLE, worker, ip_buckets(config))


def _networks(items) -> list:
    return [ipaddress.ip_network(item, strict=False) for item in items]


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def _within(address: str, networks: list) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in network for network in networks)


class _Buckets:
    """One token bucket per action (None: not limited), in one `MemoryStorage`."""

    __slots__ = ("limiters",)

    def __init__(self, specs: tuple[tuple[float, int], ...]) -> None:
        storage = MemoryStorage()
        self.limiters = tuple(Limiter(rate, burst, storage) if rate > 0 else None for rate, burst in specs)

    def take(self, action: int) -> bool:
        limiter = self.limiters[action]
        return limiter is None or limiter.consume(_KEYS[action])


class _IpState:
    """An IP's state in this process alone (no worker processes, or the shared table's group was full)."""

    __slots__ = ("buckets", "stored_results", "connections", "idle_since")

    def __init__(self, buckets: _Buckets, stored_results: ByteBudget) -> None:
        self.buckets = buckets
        self.stored_results = stored_results
        self.connections = 0
        self.idle_since = 0.0

    def take(self, action: int) -> bool:
        return self.buckets.take(action)


class _SharedShare(ByteBudget):
    """An IP's share of unsent REQ results counted in the shared table (all workers together), each byte
    also taken from this worker's part of the relay's budget (`within`); `held` is this worker's bytes."""

    def __init__(self, table: IpTable, slot: int, max_bytes: int, within: ByteBudget) -> None:
        super().__init__(max_bytes, within)
        self._table, self._slot = table, slot

    def short_of(self, n: int) -> ByteBudget | None:
        if self._table.held(self._slot) + n > self.max_bytes:
            return self
        return self.within.short_of(n)

    def take(self, n: int) -> bool:
        if self.within.short_of(n) is not None or not self._table.reserve(self._slot, n, self.max_bytes):
            return False
        self.held += n
        self.within.take(n)
        return True

    def release(self, n: int) -> None:
        self._table.release(self._slot, n)
        self.held -= n
        self.within.release(n)


class _SharedIp:
    """An IP's state in the shared table: its slot, whose buckets every worker draws on."""

    __slots__ = ("table", "slot", "stored_results")

    def __init__(self, table: IpTable, slot: int, stored_results: ByteBudget) -> None:
        self.table = table
        self.slot = slot
        self.stored_results = stored_results

    def take(self, action: int) -> bool:
        return self.table.take(self.slot, action)


class ConnectionRate:
    """The buckets one connection draws on: its own, then its client IP's."""

    __slots__ = ("ip", "_own", "_shared")

    def __init__(self, ip: str, own: _Buckets, shared: _IpState | _SharedIp) -> None:
        self.ip = ip
        self._own = own
        self._shared = shared

    @property
    def stored_results(self) -> ByteBudget:
        """The client IP's share of the relay's budget for unsent REQ results (bytes), for all its connections."""
        return self._shared.stored_results

    def allow(self, action: int) -> bool:
        """Take a token for `action` (EVENTS, REQS, NEG_OPENS); False when over the rate (reply REFUSALS[action])."""
        return self._own.take(action) and self._shared.take(action)


class RateLimits:
    """`[rate_limits]` for the whole relay: resolves client IPs and hands out `ConnectionRate`s."""

    def __init__(self, config: RateLimitConfig, max_idle_ips: int = MAX_IDLE_IPS,
                 stored_results: ByteBudget | None = None, table: IpTable | None = None) -> None:
        """`stored_results`: the budget each IP's share is taken from (None: no bound; in a worker, its part of
        the relay's); `table`: the per-IP state all workers share (None: this process's own, no workers)."""
        self.config = config
        self.table = table
        self._reserved: dict[str, int] = {}  # IP -> the slot `admits` counted a connection in, for `open`
        self._warned_full = False
        self._stored_results = stored_results or ByteBudget(sys.maxsize)
        self.max_idle_ips = max_idle_ips
        self._exempt = _networks(config.exempt)
        self._trusted = _networks(config.trusted_proxies)
        self._own = ((config.events_per_second, config.events_burst), (config.reqs_per_second, config.reqs_burst),
                     (config.neg_opens_per_second, config.neg_opens_burst))
        self._per_ip = ip_buckets(config)
        # An idle IP's buckets are full again after this long: forgetting them then changes nothing.
        self._refill_seconds = max((burst / rate for rate, burst in self._per_ip if rate > 0), default=0.0)
        self._ips: dict[str, _IpState] = {}
        self._idle: OrderedDict[str, _IpState] = OrderedDict()
        self._warned_proxy = False

    def client_ip(self, peer: str, forwarded_for: str | None) -> str:
        """The client's IP: `peer` (the socket's), or from `forwarded_for` when `peer` is a trusted proxy.

        `forwarded_for` is the X-Forwarded-For value ("client, proxy1, ...",
        several headers joined by commas); it is read from the right, past
        trusted proxies, since only the hops our proxies appended are true.
        """
        if forwarded_for is None or not self._trusted or not _within(peer, self._trusted):
            return peer
        client = peer
        for hop in reversed(forwarded_for.split(",")):
            hop = hop.strip()
            try:
                ipaddress.ip_address(hop)
            except ValueError:
                return client  # not written by a proxy of ours: the last trusted hop is all we know
            client = hop
            if not _within(hop, self._trusted):
                break
        return client

    def admits(self, ip: str, proxied: bool = False) -> bool:
        """False when `ip` is limited and has `ip_connections` connections open already (0: no bound):
        the new one is closed with TOO_MANY_CONNECTIONS.  `proxied`: the request carried X-Forwarded-For
        or Forwarded.  With the shared table, True also counts the connection across workers, for the `open`
        of `ip` that follows."""
        cap = self.config.ip_connections
        if not cap or not self._limited(ip, proxied):
            return True
        if self.table is not None:
            if (stale := self._reserved.pop(ip, None)) is not None:  # admitted, then never opened: give it back
                self.table.disconnect(stale)
            try:
                slot = self.table.connect(ip, cap)
            except TableFull:
                self._table_full(ip)
            else:
                if slot is not None:
                    self._reserved[ip] = slot
                return slot is not None
        state = self._ips.get(ip)
        return state is None or state.connections < cap

    def open(self, ip: str, proxied: bool = False) -> ConnectionRate | None:
        """The rate of a new connection from `ip`; None when it is not limited (disabled, or `ip` exempt);
        `proxied` as for `admits`."""
        if not self._limited(ip, proxied):
            return None
        if self.table is not None and (shared := self._open_shared(ip)) is not None:
            return ConnectionRate(ip, _Buckets(self._own), shared)
        self._forget_idle()
        state = self._ips.get(ip) or self._idle.pop(ip, None)
        if state is None:
            share = self.config.ip_stored_results_bytes  # 0: no share, only the relay's budget
            budget = ByteBudget(share, within=self._stored_results) if share else self._stored_results
            state = _IpState(_Buckets(self._per_ip), budget)
        self._ips[ip] = state
        state.connections += 1
        return ConnectionRate(ip, _Buckets(self._own), state)

    def _open_shared(self, ip: str) -> _SharedIp | None:
        """The IP's state in the table with this connection counted (by `admits` already, or now); None when
        its group is full."""
        assert self.table is not None
        slot = self._reserved.pop(ip, None)
        if slot is None:
            try:
                slot = self.table.connect(ip)
            except TableFull:
                self._table_full(ip)
                return None
        assert slot is not None  # connect refuses only past a cap, and none was given
        share = self.config.ip_stored_results_bytes
        budget = _SharedShare(self.table, slot, share, self._stored_results) if share else self._stored_results
        return _SharedIp(self.table, slot, budget)

    def _table_full(self, ip: str) -> None:
        if not self._warned_full:
            self._warned_full = True
            log.warning("rate_limits_table_full", remote=ip,
                        hint="an IP's group of the shared rate-limit table is full: its limits hold per worker")

    def _limited(self, ip: str, proxied: bool) -> bool:
        if not self.config.enabled or _within(ip, self._exempt):
            return False
        if self.config.exempt_loopback and _is_loopback(ip):
            if not proxied:
                return False
            if not self._warned_proxy:
                self._warned_proxy = True
                log.warning("rate_limits_proxy_not_trusted", remote=ip,
                            hint="a loopback request named a client in X-Forwarded-For or Forwarded: it is rate "
                                 "limited; list the proxy in [rate_limits] trusted_proxies")
        return True

    def close(self, rate: ConnectionRate | None) -> None:
        """The connection holding `rate` is gone (or no longer limited); None does nothing."""
        if rate is None:
            return
        state = rate._shared
        if isinstance(state, _SharedIp):
            state.table.disconnect(state.slot)
            return
        state.connections -= 1
        if state.connections <= 0:
            del self._ips[rate.ip]
            state.idle_since = time.monotonic()
            self._idle[rate.ip] = state

    def _forget_idle(self) -> None:
        now = time.monotonic()
        idle = self._idle
        while idle:
            state = next(iter(idle.values()))
            if len(idle) <= self.max_idle_ips and now - state.idle_since < self._refill_seconds:
                break
            idle.popitem(last=False)
