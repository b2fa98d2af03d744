"""Configuration: TOML file, then `RELAY_<SECTION>__<KEY>` environment variables, then CLI flags.

Each section is a frozen dataclass; every key has a default, documented with
its unit in `config/relay.toml`.  Unknown keys and values of the wrong type
or range stop the start with the key and the reason (`ConfigError`).
Environment variables override scalar keys only; lists and tables come from
the file.
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from relay.protocol.auth import relay_url_key
from relay.protocol.event import EventLimits
from relay.store.projectors.builtin import builtin_projectors  # [[projectors]]
from relay.store.projectors.spec import ProjectorSpec, SpecError, parse_specs  # [[projectors]]
from relay.store.checkpoint import CHECKPOINT_MODES
from relay.store.store import StoreOptions

ENV_PREFIX = "RELAY_"


class ConfigError(ValueError):
    """A configuration key that is unknown or has a bad value; the message names it."""


@dataclass(frozen=True)
class ServerConfig:
    """[server]: where to listen."""

    host: str = "127.0.0.1"
    port: int = 7777
    public_url: str = ""
    shutdown_timeout_seconds: float = 10.0
    ping_interval_seconds: float = 30.0  # a WebSocket ping to each client this often
    ping_timeout_seconds: float = 30.0  # a client neither answering nor reading this long is closed (1011)
    memory_trim_seconds: float = 30.0  # freed heap memory is handed back to the OS this often (glibc); 0: never
    max_http_body_bytes: int = 65_536  # body of one plain HTTP request on the relay's port; larger: 413


@dataclass(frozen=True)
class InfoConfig:
    """[info]: the NIP-11 relay information document."""

    name: str = "relay"
    description: str = "A Nostr relay on SQLite"
    pubkey: str = ""
    contact: str = ""


@dataclass(frozen=True)
class LimitsConfig:
    """[limits]: what one client may send and ask for (bytes, counts, seconds)."""

    max_message_bytes: int = 1_048_576
    max_subscriptions: int = 50
    max_filters: int = 20
    max_filter_items: int = 10_000
    default_limit: int = 500
    max_limit: int = 5_000
    max_event_tags: int = 10_000
    max_content_bytes: int = 262_144
    max_created_at_future_seconds: int = 900
    max_events_in_flight: int = 1_024
    max_live_queue: int = 2_048
    max_live_queue_bytes: int = 16_777_216
    max_query_rows: int = 10_000  # events one REQ returns at most, all filters together
    max_query_bytes: int = 16_777_216  # bytes of events one REQ returns at most (the newest that fit)
    query_timeout_seconds: float = 5.0  # database time of one REQ or COUNT; 0: unbounded
    max_stored_results_bytes: int = 268_435_456  # stored REQ results not yet sent, all connections together
    stored_results_timeout_seconds: float = 15.0  # a reader taking none of its stored results this long is
                                                  # dropped (1008) and its share of the budget freed
    stored_results_min_bytes_per_second: int = 16_384  # a reader taking its stored results slower, over each
                                                       # stored_results_timeout_seconds, is dropped too; 0: none

    def event_limits(self) -> EventLimits:
        """The per-event limits `parse_event` checks."""
        return EventLimits(self.max_event_tags, self.max_content_bytes, self.max_created_at_future_seconds)


@dataclass(frozen=True)
class StoreConfig:
    """[store]: the SQLite file and the writer."""

    path: str = "data/relay.db"
    synchronous: str = "normal"
    read_connections: int = 4
    writer_queue_size: int = 4_096
    max_batch: int = 1_024
    max_batch_bytes: int = 4_194_304
    expiry_purge_interval_seconds: float = 60.0
    checkpoint_interval_seconds: float = 1.0
    checkpoint_mode: str = "passive"
    checkpoint_truncate_wal_bytes: int = 67_108_864
    verify_threads: int = 2
    max_projector_refusals: int = 10_000  # [[projectors]]: rows kept in the refusal log
    projector_rebuild_batch: int = 10_000  # [[projectors]]: events per rebuild transaction

    def options(self, read_connections: int | None = None, relay_url: str = "") -> StoreOptions:
        """The Store's options; `read_connections` overrides the pool size (offline commands need one);
        `relay_url` is `[server] public_url` (NIP-62 requests naming it are honoured)."""
        return StoreOptions(
            synchronous=self.synchronous, read_connections=read_connections or self.read_connections,
            writer_queue_size=self.writer_queue_size, max_batch=self.max_batch,
            max_batch_bytes=self.max_batch_bytes,
            checkpoint_interval_seconds=self.checkpoint_interval_seconds, checkpoint_mode=self.checkpoint_mode,
            checkpoint_truncate_wal_bytes=self.checkpoint_truncate_wal_bytes,
            relay_urls=frozenset([relay_url_key(relay_url)] if relay_url else []))


@dataclass(frozen=True)
class LogConfig:
    """[log]: structlog output."""

    level: str = "info"
    format: str = "auto"


# --- [sync] (relay/sync/) ---------------------------------------------------------------------------

SYNC_DIRECTIONS = ("down", "up", "both")


@dataclass(frozen=True)
class PeerConfig:
    """One `[[sync.peers]]` table: a relay kept in sync with this one.

    `filter` is the NIP-01 filter as compact JSON (from a TOML table or a JSON
    string); `direction` is "down" (fetch), "up" (push) or "both"; `pubkey`
    is the peer node's 64-hex key ("" when unknown): a connection that
    authenticates with it (NIP-42) is this peer (see relay/server/access.py).
    """

    url: str
    direction: str = "both"
    filter: str = "{}"
    pubkey: str = ""


@dataclass(frozen=True)
class SyncConfig:
    """[sync]: peer sync with NIP-77 (seconds, bytes, counts); `peers` come from the file only."""

    secret_key_file: str = ""
    interval_seconds: float = 300.0
    frame_size_limit: int = 60_000
    fetch_batch: int = 500
    fetch_in_flight: int = 2
    push_in_flight: int = 500
    live_queue: int = 10_000
    timeout_seconds: float = 30.0
    connect_timeout_seconds: float = 10.0
    backoff_initial_seconds: float = 1.0
    backoff_max_seconds: float = 300.0
    lease_seconds: float = 60.0
    peers: tuple[PeerConfig, ...] = ()


def _tables(value: Any, section: str, keys: tuple[str, ...] | None) -> Iterator[tuple[str, dict]]:
    """The tables of the `[[section]]` array as (`section[i]`, table), each holding only `keys` (None: any).

    Raises:
        ConfigError: `value` is not an array of tables, or a table has another key.
    """
    if type(value) is not list:
        raise ConfigError(f"{section}: must be an array of tables ([[{section}]])")
    for i, table in enumerate(value):
        name = f"{section}[{i}]"
        if type(table) is not dict:
            raise ConfigError(f"{name}: must be a table")
        for key in table if keys is not None else ():
            if key not in keys:
                raise ConfigError(f"{name}.{key}: unknown key")
        yield name, table


def _parse_peers(value: Any) -> tuple[PeerConfig, ...]:
    """`[[sync.peers]]` tables into PeerConfigs; raises ConfigError naming `sync.peers[i].<key>`."""
    import json

    from relay.protocol.event import is_hex64
    from relay.protocol.filters import parse_filter
    from relay.protocol.rejection import Rejection

    peers, urls = [], set()
    for name, table in _tables(value, "sync.peers", ("url", "direction", "filter", "pubkey")):
        url = table.get("url")
        if type(url) is not str or not url.startswith(("ws://", "wss://")):
            raise ConfigError(f"{name}.url: must be a ws:// or wss:// URL, got {url!r}")
        url = url.rstrip("/") if url.count("/") <= 3 else url
        if url in urls:
            raise ConfigError(f"{name}.url: {url} is listed twice")
        urls.add(url)
        direction = table.get("direction", "both")
        if direction not in SYNC_DIRECTIONS:
            raise ConfigError(f"{name}.direction: must be one of {', '.join(SYNC_DIRECTIONS)}, got {direction!r}")
        filter_obj = table.get("filter", {})
        try:
            if type(filter_obj) is str:
                filter_obj = json.loads(filter_obj)
            parsed = parse_filter(filter_obj)
            # Sent to the peer as JSON: a TOML datetime or a NaN (ignored keys) has no JSON form.
            filter_json = json.dumps(filter_obj, separators=(",", ":"), sort_keys=True, allow_nan=False)
        except RecursionError:
            raise ConfigError(f"{name}.filter: nested too deeply") from None
        except (ValueError, TypeError, Rejection) as exc:
            raise ConfigError(f"{name}.filter: {exc}") from None
        if parsed.limit is not None:
            raise ConfigError(f"{name}.filter: limit has no meaning for sync")
        pubkey = table.get("pubkey", "")
        if pubkey != "" and not is_hex64(pubkey):
            raise ConfigError(f"{name}.pubkey: must be 64 lowercase hex characters, got {pubkey!r}")
        peers.append(PeerConfig(url, direction, filter_json, pubkey))
    return tuple(peers)


# --- [negentropy] (NIP-77, relay side: relay/server/negentropy.py, relay/store/negentropy_index.py) ---------


@dataclass(frozen=True)
class NegentropyConfig:
    """[negentropy]: answering NIP-77 NEG-OPEN (bytes, counts of items, seconds); `filters` from the file only.

    `filters` are NIP-01 filter tables without since/until/limit whose
    (created_at, id) index is kept in the write transaction, as it always is
    for the full set; other NEG-OPEN filters are answered from a query.
    """

    enabled: bool = True
    frame_size_limit: int = 500_000
    max_sync_events: int = 1_000_000
    max_session_items: int = 4_000_000
    max_sessions_per_connection: int = 8
    idle_timeout_seconds: float = 60.0
    cache_items: int = 2_000_000
    filters: tuple[dict, ...] = ()
    protected_filters: tuple[dict, ...] = ()  # indexed like `filters`, and never evicted by [retention]


NEG_ENVELOPE_BYTES = 512
"""Room for `["NEG-MSG","<subscription id, JSON-escaped>",""]` around a hex frame, in bytes."""


def _parse_negentropy_filters(value: Any, setting: str) -> tuple[dict, ...]:
    """`[negentropy] filters` or `protected_filters` (arrays of filter tables) checked with parse_filter;
    raises ConfigError."""
    from relay.protocol.filters import parse_filter
    from relay.protocol.rejection import Rejection

    for name, table in _tables(value, f"negentropy.{setting}", None):  # each a NIP-01 filter
        for key in ("since", "until", "limit"):
            if key in table:
                raise ConfigError(f"{name}.{key}: an indexed filter has no {key}")
        try:
            if parse_filter(table).is_empty():
                raise ConfigError(f"{name}: matches no event")
        except Rejection as exc:
            raise ConfigError(f"{name}: {exc}") from None
    return tuple(value)


# --- [auth] and [rate_limits] (NIP-42 and access control: relay/server/access.py, relay/server/ratelimit.py) ---

WRITE_MODES = ("all", "authenticated", "listed")


@dataclass(frozen=True)
class AuthConfig:
    """[auth]: NIP-42 authentication, who may write, which kinds, private kinds (seconds, kinds, 64-hex pubkeys)."""

    challenge_on_connect: bool = True
    max_age_seconds: int = 600
    write: str = "all"
    write_pubkeys: tuple[str, ...] = ()
    allow_kinds: tuple[int, ...] = ()
    deny_kinds: tuple[int, ...] = ()
    private_kinds: tuple[int, ...] = (4, 1059)

    @property
    def restricts_writes(self) -> bool:
        """True when not everyone may publish every kind (NIP-11 `restricted_writes`)."""
        return self.write != "all" or bool(self.allow_kinds or self.deny_kinds)


@dataclass(frozen=True)
class RateLimitConfig:
    """[rate_limits]: token buckets per connection and per client IP (messages per second, burst in messages).

    A rate of 0 means no limit.  `exempt` and `trusted_proxies` hold IP
    addresses or networks ("10.0.0.0/8").
    """

    enabled: bool = True
    events_per_second: float = 10.0
    events_burst: int = 100
    reqs_per_second: float = 10.0
    reqs_burst: int = 50
    neg_opens_per_second: float = 1.0
    neg_opens_burst: int = 10
    ip_events_per_second: float = 50.0
    ip_events_burst: int = 500
    ip_reqs_per_second: float = 50.0
    ip_reqs_burst: int = 250
    ip_neg_opens_per_second: float = 5.0
    ip_neg_opens_burst: int = 20
    ip_stored_results_bytes: int = 67_108_864  # unsent REQ results of one IP's connections together; 0: no bound
    ip_connections: int = 100  # connections open at once from one IP; 0: no bound
    exempt: tuple[str, ...] = ()
    trusted_proxies: tuple[str, ...] = ()


def _parse_list(name: str, value: Any, item: str) -> tuple:
    """A TOML array of `item`s ("pubkey", "kind" or "network") as a tuple; raises ConfigError naming `name`."""
    import ipaddress

    from relay.protocol.event import MAX_KIND, is_hex64

    if type(value) not in (list, tuple):
        raise ConfigError(f"{name}: must be an array")
    for v in value:
        if item == "pubkey" and not is_hex64(v):
            raise ConfigError(f"{name}: must hold 64 lowercase hex characters, got {v!r}")
        if item == "kind" and (type(v) is not int or not 0 <= v <= MAX_KIND):
            raise ConfigError(f"{name}: must hold kinds from 0 to {MAX_KIND}, got {v!r}")
        if item == "network":
            try:
                ipaddress.ip_network(v, strict=False)
            except (TypeError, ValueError):
                raise ConfigError(f"{name}: must hold IP addresses or networks, got {v!r}") from None
    return tuple(value)


_LISTS = {("auth", "write_pubkeys"): "pubkey", ("auth", "allow_kinds"): "kind", ("auth", "deny_kinds"): "kind",
          ("auth", "private_kinds"): "kind", ("rate_limits", "exempt"): "network",
          ("rate_limits", "trusted_proxies"): "network"}

# --- [retention] (relay/retention.py, relay/store/retention.py; NIP-62: relay/store/vanish.py) ----------------


@dataclass(frozen=True)
class RetentionRule:
    """One `[[retention.rules]]` table: events of `kinds` (empty: every kind) older than `max_age_days`
    (by created_at) are removed."""

    max_age_days: float
    kinds: tuple[int, ...] = ()


@dataclass(frozen=True)
class RetentionConfig:
    """[retention]: removing old events (days, seconds, counts), and this relay's URL for NIP-62."""

    interval_seconds: float = 3600.0
    batch_size: int = 100
    max_events: int = 0
    rules: tuple[RetentionRule, ...] = ()


def _parse_retention_rules(value: Any) -> tuple[RetentionRule, ...]:
    """`[[retention.rules]]` tables into RetentionRules; raises ConfigError naming `retention.rules[i].<key>`."""
    from relay.protocol.event import MAX_KIND

    rules = []
    for name, table in _tables(value, "retention.rules", ("kinds", "max_age_days")):
        age = table.get("max_age_days")
        if type(age) not in (int, float) or not age > 0:
            raise ConfigError(f"{name}.max_age_days: must be a number of days > 0, got {age!r}")
        kinds = table.get("kinds", [])
        if type(kinds) is not list or not all(type(k) is int and 0 <= k <= MAX_KIND for k in kinds):
            raise ConfigError(f"{name}.kinds: must be an array of kinds 0..{MAX_KIND}, got {kinds!r}")
        rules.append(RetentionRule(float(age), tuple(sorted(set(kinds)))))
    return tuple(rules)


@dataclass(frozen=True)
class Config:
    """The whole configuration, one attribute per TOML section."""

    server: ServerConfig = field(default_factory=ServerConfig)
    info: InfoConfig = field(default_factory=InfoConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    store: StoreConfig = field(default_factory=StoreConfig)
    log: LogConfig = field(default_factory=LogConfig)
    sync: SyncConfig = field(default_factory=SyncConfig)
    negentropy: NegentropyConfig = field(default_factory=NegentropyConfig)
    auth: AuthConfig = field(default_factory=AuthConfig)
    rate_limits: RateLimitConfig = field(default_factory=RateLimitConfig)

    retention: RetentionConfig = field(default_factory=RetentionConfig)
    # [[projectors]]: an array of tables, not a section; absent from the file means the built-in ones.
    projectors: tuple[ProjectorSpec, ...] = field(default_factory=builtin_projectors)


_CHOICES = {
    ("store", "synchronous"): ("off", "normal", "full", "extra"),
    ("store", "checkpoint_mode"): CHECKPOINT_MODES,
    ("log", "level"): ("debug", "info", "warning", "error"),
    ("log", "format"): ("auto", "json", "console"),
    ("auth", "write"): WRITE_MODES,
}
_MINIMUM_SYNC = {"frame_size_limit": 4096, "fetch_batch": 1, "fetch_in_flight": 1, "push_in_flight": 1,
                 "live_queue": 1, "interval_seconds": 0.1, "timeout_seconds": 0.1,
                 "connect_timeout_seconds": 0.1, "backoff_initial_seconds": 0.01, "backoff_max_seconds": 0.01,
                 "lease_seconds": 1.0}
_SQLITE_MAX_LENGTH = 1_000_000_000  # SQLite's default bound on one string or blob (bytes)
_MINIMUM = {("server", "port"): 0, ("server", "ping_interval_seconds"): 0.1, ("server", "ping_timeout_seconds"): 0.1,
            ("store", "read_connections"): 1, ("store", "verify_threads"): 1,
            ("store", "max_batch"): 1, ("store", "writer_queue_size"): 1,
            ("store", "max_projector_refusals"): 1, ("store", "projector_rebuild_batch"): 1,
            ("retention", "interval_seconds"): 0.01, ("retention", "batch_size"): 1,
            ("limits", "max_query_rows"): 1, ("limits", "stored_results_timeout_seconds"): 0.1}
_MINIMUM.update({("sync", key): low for key, low in _MINIMUM_SYNC.items()})
_MINIMUM.update({("negentropy", "frame_size_limit"): 4096,  # the engine's MIN_FRAME_SIZE_LIMIT
                 ("negentropy", "max_sessions_per_connection"): 1, ("negentropy", "idle_timeout_seconds"): 0.1,
                 ("negentropy", "cache_items"): 0})
_MINIMUM.update({("rate_limits", f"{scope}{what}_burst"): 1  # a token bucket holds at least one token
                 for scope in ("", "ip_") for what in ("events", "reqs", "neg_opens")})


@cache  # called per key: building the section's defaults each time cost most of a load
def _section_types(section: str) -> dict[str, type]:
    cls = {f.name: f.default_factory for f in dataclasses.fields(Config)}[section]
    return {f.name: type(getattr(cls(), f.name)) for f in dataclasses.fields(cls)}


def _check_value(section: str, key: str, value: Any) -> Any:
    if (section, key) == ("sync", "peers"):
        return _parse_peers(value)
    if (section, key) in _LISTS:
        return _parse_list(f"{section}.{key}", value, _LISTS[section, key])
    if (section, key) in (("negentropy", "filters"), ("negentropy", "protected_filters")):
        return _parse_negentropy_filters(value, key)
    if (section, key) == ("retention", "rules"):
        return _parse_retention_rules(value)
    expected = _section_types(section)[key]
    name = f"{section}.{key}"
    if expected is float and type(value) is int:
        value = float(value) if abs(value) < 2**1023 else math.inf  # no OverflowError past double range
    if type(value) is not expected:
        raise ConfigError(f"{name}: expected {expected.__name__}, got {type(value).__name__} {value!r}")
    if expected is float and not math.isfinite(value):
        # nan passes every `<` check; inf overflows asyncio timers.
        raise ConfigError(f"{name}: must be a finite number, got {value!r}")
    if expected in (int, float) and value < _MINIMUM.get((section, key), 0):
        raise ConfigError(f"{name}: must be >= {_MINIMUM.get((section, key), 0)}, got {value!r}")
    choices = _CHOICES.get((section, key))
    if choices and value not in choices:
        raise ConfigError(f"{name}: must be one of {', '.join(choices)}, got {value!r}")
    if (section, key) == ("server", "port") and value > 65535:
        raise ConfigError(f"{name}: must be <= 65535, got {value!r}")
    return value


def _parse_env_value(section: str, key: str, text: str) -> Any:
    expected = _section_types(section)[key]
    if expected is tuple:
        raise ConfigError(f"{section}.{key}: lists and tables come from the configuration file only")
    if expected is str:
        return text
    if not text.isascii():
        # int() and float() also read other scripts' digits ("٣" is 3).
        raise ConfigError(f"{section}.{key}: expected {expected.__name__}, got {text!r}")
    if expected is bool:
        if text.lower() not in ("true", "false", "1", "0"):
            raise ConfigError(f"{section}.{key}: expected true or false, got {text!r}")
        return text.lower() in ("true", "1")
    try:
        return expected(text)
    except ValueError:
        raise ConfigError(f"{section}.{key}: expected {expected.__name__}, got {text!r}") from None


_TABLE_ARRAYS = ("projectors",)  # top-level arrays of tables ([[projectors]]), from the file only


def _sections() -> set[str]:
    return {f.name for f in dataclasses.fields(Config)} - set(_TABLE_ARRAYS)


def _parse_projectors(value: Any) -> tuple[ProjectorSpec, ...]:
    """`[[projectors]]` tables (or `projectors = []`) into specs; raises ConfigError naming projector and field."""
    try:
        return parse_specs(value)
    except SpecError as exc:
        raise ConfigError(f"projectors: {exc}") from None


def _merge_file(values: dict[str, dict[str, Any]], data: dict[str, Any]) -> None:
    for section, table in data.items():
        if section == "projectors":
            values["projectors"] = _parse_projectors(table)  # type: ignore[assignment]
            continue
        if section not in _sections():
            raise ConfigError(f"{section}: unknown section")
        if not isinstance(table, dict):
            raise ConfigError(f"{section}: must be a table")
        for key, value in table.items():
            if key not in _section_types(section):
                raise ConfigError(f"{section}.{key}: unknown key")
            values[section][key] = _check_value(section, key, value)


def _merge_env(values: dict[str, dict[str, Any]], env: Mapping[str, str]) -> None:
    for name, text in env.items():
        if not name.startswith(ENV_PREFIX) or "__" not in name:
            continue
        section, _, key = name[len(ENV_PREFIX):].lower().partition("__")
        if section not in _sections() or key not in _section_types(section):
            raise ConfigError(f"{name}: unknown setting {section}.{key}")
        values[section][key] = _check_value(section, key, _parse_env_value(section, key, text))


def load_config(
    path: Path | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
) -> Config:
    """Build the Config: defaults < TOML file at `path` < `env` < `overrides` (CLI flags).

    `overrides` maps section -> key -> value; None values are ignored.

    Raises:
        ConfigError: an unreadable file, an unknown section or key, or a bad
        value; the message names the key and the reason.
    """
    values: dict[str, Any] = {s: {} for s in _sections()}
    if path is not None:
        try:
            data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"{path}: {exc}") from None
        _merge_file(values, data)
    _merge_env(values, env or {})
    for section, table in (overrides or {}).items():
        for key, value in table.items():
            if value is not None:
                values[section][key] = _check_value(section, key, value)
    config = Config(**{
        f.name: f.default_factory(**values[f.name]) for f in dataclasses.fields(Config) if f.name in _sections()
    }, projectors=values.get("projectors", builtin_projectors()))
    _check_consistency(config)
    return config


def _check_consistency(config: Config) -> None:
    limits = config.limits
    if limits.default_limit > limits.max_limit:
        raise ConfigError("limits.default_limit: must not exceed limits.max_limit")
    if limits.max_live_queue <= config.store.max_batch:
        # One commit can queue a whole batch for a reader at once.
        raise ConfigError("limits.max_live_queue: must exceed store.max_batch")
    if config.store.max_batch_bytes < limits.max_message_bytes:
        raise ConfigError("store.max_batch_bytes: must be at least limits.max_message_bytes")
    if limits.max_live_queue_bytes < limits.max_message_bytes:
        raise ConfigError("limits.max_live_queue_bytes: must be at least limits.max_message_bytes")
    if limits.max_message_bytes < 1024:
        raise ConfigError("limits.max_message_bytes: must be at least 1024")
    # One event must fit in an answer, one answer in the budget for unsent results (else it is refused
    # every time), and SQLite holds strings of at most SQLITE_MAX_LENGTH bytes.
    if not limits.max_message_bytes <= limits.max_query_bytes <= min(limits.max_stored_results_bytes,
                                                                      _SQLITE_MAX_LENGTH):
        raise ConfigError(f"limits.max_query_bytes: must be from limits.max_message_bytes ({limits.max_message_bytes})"
                          f" to limits.max_stored_results_bytes ({limits.max_stored_results_bytes}) and at most"
                          f" {_SQLITE_MAX_LENGTH:,}, got {limits.max_query_bytes}")
    ip_share = config.rate_limits.ip_stored_results_bytes
    if ip_share and ip_share < limits.max_query_bytes:
        # one IP's share must hold one answer, or its large REQs would be refused every time
        raise ConfigError(f"rate_limits.ip_stored_results_bytes: must be 0 (no bound) or at least"
                          f" limits.max_query_bytes ({limits.max_query_bytes}), got {ip_share}")
    url = config.server.public_url
    if url and (not url.startswith(("ws://", "wss://")) or relay_url_key(url) is None):
        raise ConfigError(f"server.public_url: must be a ws:// or wss:// URL, got {url!r}")
    if config.sync.backoff_initial_seconds > config.sync.backoff_max_seconds:
        raise ConfigError("sync.backoff_initial_seconds: must not exceed sync.backoff_max_seconds")
    neg = config.negentropy
    if neg.enabled and limits.max_message_bytes < 2 * neg.frame_size_limit + NEG_ENVELOPE_BYTES:
        # NIP-77 frames travel as hex: a NEG-MSG of a full frame is twice its size plus the envelope.
        raise ConfigError(f"limits.max_message_bytes: must be at least 2 * negentropy.frame_size_limit"
                          f" + {NEG_ENVELOPE_BYTES} = {2 * neg.frame_size_limit + NEG_ENVELOPE_BYTES}")
    if neg.max_session_items < neg.max_sync_events:
        raise ConfigError("negentropy.max_session_items: must be at least negentropy.max_sync_events")
