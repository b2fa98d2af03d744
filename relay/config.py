"""Configuration: TOML file, then `RELAY_<SECTION>__<KEY>` environment variables, then CLI flags.

How this works: each section is a frozen dataclass and each key one of its
fields, whose metadata holds all of the key's rules (`key`): default, one-line
doc, unit, minimum and maximum, choices, whether it needs a restart, and the
parser of a list or table.  One validator (`_check_value`) applies them to the
file, the environment and the flags alike.  Keys the store or the protocol
read are declared on their own types (`StoreOptions`, `EventLimits`) with the
same metadata and named here (`_declared`), so neither imports this module.
config/relay.toml documents every key (tests/test_config.py holds it to these
fields).  Unknown keys and values of the wrong type or range stop the start
with the key and the reason (`ConfigError`).  Environment variables override
scalar keys only; lists and tables come from the file.
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cache, partial
from pathlib import Path
from typing import Any

from relay.protocol.auth import relay_url_key
from relay.protocol.event import EventLimits
from relay.protocol.filters import MAX_SEARCH_BYTES
from relay.store.projectors.builtin import builtin_projectors  # [[projectors]]
from relay.store.projectors.engine import BUILD_BATCH, MAX_REFUSALS, REBUILD_BATCH
from relay.store.projectors.causal import CausalSpec  # [[causal_projectors]]
from relay.store.projectors.causal_toml import parse_causal  # [[causal_projectors]]
from relay.store.projectors.spec import ProjectorSpec, SpecError, parse_specs  # [[projectors]]
from relay.store.location import os_reason
from relay.store.search import DEFAULT_SEARCH_KINDS
from relay.store.store import StoreOptions

ENV_PREFIX = "RELAY_"
ENV_NOT_SETTINGS = frozenset({"RELAY_CONFIG", "RELAY_TEST_WORKERS"})
"""`RELAY_` variables that are not settings: the configuration file's name (relay/cli.py), the tests' worker count."""
DEFAULT_DB_PATH = "data/relay.db"
"""`[store] path` by default: relative, so the quick start works in a fresh clone (its `data/` is created)."""
MIN_FRAME_SIZE_LIMIT = 4096
"""relay.protocol.negentropy's smallest frame size limit, in bytes (not imported: it loads numpy at start-up)."""


class ConfigError(ValueError):
    """A configuration key that is unknown or has a bad value; the message names it."""


SCOPES = {
    "per connection": "a connection lives in one worker process",
    "per REQ/COUNT": "one REQ or COUNT",
    "per event": "each event, from any source",
    "per message": "each NIP-77 message sent",
    "per NEG-OPEN": "one NIP-77 session",
    "per HTTP request": "one plain HTTP request (not a WebSocket upgrade)",
    "per client IP": "shared by all workers (the per-IP table in the runtime directory)",
    "per peer": "each configured peer (peer sync runs in the writer)",
    "per process": "each worker (and the writer) has its own",
    "per read connection": "each read connection of each process (address space; the pages are the shared OS "
                           "page cache)",
    "relay-wide, divided among workers": "each gets this // server.workers, never less than one answer",
    "relay-wide, the writer's": "one writer for the relay",
    "relay-wide, in the database": "one for the relay, held in the database",
}
"""What a limit or budget counts, across `server.workers` worker processes: each scope a key may declare (`key`),
with how it holds.  config/relay.toml heads each scope's keys of a section with it, once (`# Scope: <scope>: <how>.`)."""


def key(default: Any, doc: str, *, unit: str = "", min: float = 0, max: float | None = None,
        choices: tuple = (), restart: bool = False, parse: Callable[[str, Any], Any] | None = None,
        scope: str = "", toml_type: str = "") -> Any:
    """One configuration key as a dataclass field: its default and every rule about it.

    `doc` is one line (config/relay.toml says more); `unit` names what a number
    counts ("seconds", "bytes", "events"...); a number must be >= `min` and,
    if given, <= `max`; a string must be one of `choices` if given; `restart`:
    marked "(restart)" in config/relay.toml; `scope`: what a limit or budget
    counts, one of SCOPES ("": not a limit or budget).  A list or table is
    checked by `parse(name, value)`, which returns the value to keep or raises
    ConfigError; its type then comes from the default (a tuple), and
    `toml_type` says what the file holds ("array of kinds"), for
    docs/configuration.md (a scalar's type comes from its default).

    Raises:
        ValueError: `scope` is not one of SCOPES, or `parse` is given without `toml_type`.
    """
    if scope and scope not in SCOPES:
        raise ValueError(f"unknown scope {scope!r}: one of {', '.join(SCOPES)}")
    if parse is not None and not toml_type:
        raise ValueError(f"a key with a parser names its toml_type ({doc!r})")
    return field(default=default, metadata={"doc": doc, "unit": unit, "min": min, "max": max, "choices": choices,
                                            "restart": restart, "parse": parse, "scope": scope,
                                            "type": toml_type})


def _table_key(doc: str, toml_type: str, default: Any = dataclasses.MISSING, *, unit: str = "",
               choices: tuple = (), default_text: str = "") -> Any:
    """One key of the tables of an array (`[[sync.peers]]`, `[[retention.rules]]`, `[[policies]]`) as a field of
    the table's dataclass: its one-line doc, what the file holds (`toml_type`), `unit` and `choices`, for
    docs/configuration.md; without `default` (and `default_text`, which says what a key left out means) the key
    is required.  The array's parser checks the values."""
    return field(default=default, metadata={"doc": doc, "type": toml_type, "unit": unit, "choices": choices,
                                            "default": default_text})


def _table_keys(cls: type) -> tuple[str, ...]:
    """The keys a table of an array may hold: the fields of its dataclass (`_table_key`)."""
    return tuple(f.name for f in dataclasses.fields(cls))


def _declared(cls: type, name: str) -> Any:
    """The key declared by field `name` of `cls` (the store's or the protocol's own type): its default and rules."""
    declared = cls.__dataclass_fields__[name]
    return field(default=declared.default, metadata=declared.metadata)


def _section(cls: type, restart: bool = False) -> Any:
    """A section of `Config`; `restart`: all its keys are read only at start-up (marked on its header)."""
    return field(default_factory=cls, metadata={"restart": restart})


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


def _parse_names(name: str, value: Any) -> tuple[str, ...]:
    """An array of names (strings)."""
    if type(value) not in (list, tuple) or not all(type(v) is str for v in value):
        raise ConfigError(f"{name}: must be an array of names")
    return tuple(value)


def _parse_paths(name: str, value: Any) -> tuple[str, ...]:
    """`[server] paths`: a non-empty array of absolute URL paths ("/", "/nostr"), without query or fragment."""
    if type(value) not in (list, tuple) or not value:
        raise ConfigError(f"{name}: must be a non-empty array of paths")
    for path in value:
        if type(path) is not str or not path.startswith("/") or any(c in path for c in "?# \t"):
            raise ConfigError(f"{name}: must hold paths such as \"/\" or \"/nostr\", got {path!r}")
    return tuple(value)


MAX_WORKERS = 64


def _parse_workers(name: str, value: Any) -> int | str:
    """`[server] workers`: "auto" or a count from 0 to 64 (an environment variable's text included)."""
    if type(value) is str and value.isascii() and value.isdigit():
        try:
            value = int(value)
        except ValueError:  # past int()'s 4,300 digits: out of range, refused below
            pass
    if value != "auto" and (type(value) is not int or not 0 <= value <= MAX_WORKERS):
        raise ConfigError(f'{name}: must be "auto" or a count from 0 to {MAX_WORKERS}, got {value!r}')
    return value


_PUBKEYS = partial(_parse_list, item="pubkey")
_KINDS = partial(_parse_list, item="kind")
_NETWORKS = partial(_parse_list, item="network")


@dataclass(frozen=True)
class ServerConfig:
    """[server]: where to listen, this relay's URL, keepalive and shutdown."""

    host: str = key("127.0.0.1", 'address to listen on; "0.0.0.0" for all interfaces', restart=True)
    port: int = key(7777, "TCP port for WebSocket, NIP-11 and /health; 0 picks a free port", max=65535, restart=True)
    public_url: str = key("", "this relay's URL, as NIP-42 AUTH and NIP-62 requests to vanish must name it")
    shutdown_timeout_seconds: float = key(10.0, "on SIGINT/SIGTERM, time for connections to get their OKs and close",
                                          unit="seconds", scope="per process")
    ping_interval_seconds: float = key(30.0, "a WebSocket ping to each client this often", unit="seconds", min=0.1)
    ping_timeout_seconds: float = key(30.0, "a client neither answering nor reading this long is closed (1011)",
                                      unit="seconds", min=0.1)
    memory_trim_seconds: float = key(30.0, "freed heap memory is handed back to the OS this often (glibc); 0: never",
                                     unit="seconds", scope="per process")
    max_http_body_bytes: int = key(65_536, "body of one plain HTTP request (not a WebSocket upgrade) on this port; "
                                   "larger: 413", unit="bytes", restart=True,
                                   scope="per HTTP request")
    paths: tuple[str, ...] = key(("/",), "URL paths clients may connect to (NIP-01: one endpoint); others get 404",
                                 restart=True, parse=_parse_paths, toml_type="array of URL paths")
    workers: int | str = key("auto", 'worker processes serving the port beside the writer; "auto": the CPUs this '
                             "process may use, at most 8; 0: one process", restart=True, parse=_parse_workers,
                             toml_type='"auto" or integer')
    worker_nice: int = key(10, "the workers' scheduling priority below the writer's (Unix nice increment): on a "
                           "busy machine the one writer, the stage every event waits for, runs first; 0: equal",
                           unit="nice", max=19, restart=True)


@dataclass(frozen=True)
class InfoConfig:
    """[info]: the NIP-11 relay information document."""

    name: str = key("relay", "the relay's name")
    description: str = key("A Nostr relay on SQLite", "what the relay is for")
    pubkey: str = key("", "the operator's 64-hex pubkey; omitted when empty")
    contact: str = key("", "the operator's contact (URI); omitted when empty")


@dataclass(frozen=True)
class LimitsConfig:
    """[limits]: what one client may send and ask for (bytes, counts, seconds)."""

    max_message_bytes: int = key(1_048_576, "bytes per WebSocket frame (bigger: closed 1009)", unit="bytes",
                                 scope="per connection")
    max_subscriptions: int = key(50, "open REQ subscriptions per connection", unit="subscriptions",
                                 scope="per connection")
    max_filters: int = key(20, "filters per REQ or COUNT", unit="filters", scope="per REQ/COUNT")
    max_filter_items: int = key(10_000, "entries per list (ids, authors, kinds, #x) in one filter", unit="entries",
                                 scope="per REQ/COUNT")
    max_search_bytes: int = key(MAX_SEARCH_BYTES, "UTF-8 bytes of one filter's NIP-50 search (longer: invalid)",
                                unit="bytes", min=1, scope="per REQ/COUNT")
    default_limit: int = key(500, "events per filter when a REQ gives no limit", unit="events", scope="per REQ/COUNT")
    max_limit: int = key(5_000, "events per filter at most (a larger limit is clamped)", unit="events",
                         scope="per REQ/COUNT")
    max_event_tags: int = _declared(EventLimits, "max_tags")
    max_content_bytes: int = _declared(EventLimits, "max_content_bytes")
    max_created_at_future_seconds: int = _declared(EventLimits, "max_created_at_future_seconds")
    max_events_in_flight: int = key(1_024, "EVENTs per connection awaiting their OK before it stops being read",
                                    unit="EVENTs", scope="per connection")
    max_live_queue: int = key(2_048, "live messages queued per connection before it is dropped as a slow reader",
                              unit="messages", scope="per connection")
    max_live_queue_bytes: int = key(16_777_216, "bytes of live messages queued per connection before it is dropped",
                                    unit="bytes", scope="per connection")
    max_query_rows: int = key(10_000, "events one REQ returns at most, all filters together", unit="events", min=1,
                              scope="per REQ/COUNT")
    max_query_bytes: int = key(16_777_216, "bytes of events one REQ returns at most (the newest that fit)",
                               unit="bytes", scope="per REQ/COUNT")
    query_timeout_seconds: float = key(5.0, "database time of one REQ or COUNT; 0: unbounded", unit="seconds",
                                       scope="per REQ/COUNT")
    max_stored_results_bytes: int = key(268_435_456, "stored REQ results not yet sent, all connections together",
                                        unit="bytes", scope="relay-wide, divided among workers")
    stored_results_timeout_seconds: float = key(
        15.0, "a reader taking none of its stored results this long is dropped (1008)", unit="seconds", min=0.1,
        scope="per connection")
    stored_results_min_bytes_per_second: int = key(
        16_384, "a reader taking its stored results slower, over each timeout, is dropped too; 0: none",
        unit="bytes per second", scope="per connection")

    def event_limits(self) -> EventLimits:
        """The per-event limits `parse_event` checks."""
        return EventLimits(self.max_event_tags, self.max_content_bytes, self.max_created_at_future_seconds)


@dataclass(frozen=True)
class StoreConfig:
    """[store]: the SQLite file, the writer and the readers (the store's own `StoreOptions`), signature threads
    and projector upkeep."""

    path: str = key(DEFAULT_DB_PATH, "the SQLite file (WAL mode; -wal and -shm files beside it)", restart=True)
    synchronous: str = _declared(StoreOptions, "synchronous")
    read_connections: int = _declared(StoreOptions, "read_connections")
    read_mmap_bytes: int = _declared(StoreOptions, "read_mmap_bytes")
    writer_queue_size: int = _declared(StoreOptions, "writer_queue_size")
    max_batch: int = _declared(StoreOptions, "max_batch")
    max_batch_bytes: int = _declared(StoreOptions, "max_batch_bytes")
    expiry_purge_interval_seconds: float = key(60.0, "time between NIP-40 purges of expired events", unit="seconds")
    checkpoint_interval_seconds: float = _declared(StoreOptions, "checkpoint_interval_seconds")
    checkpoint_mode: str = _declared(StoreOptions, "checkpoint_mode")
    checkpoint_truncate_wal_bytes: int = _declared(StoreOptions, "checkpoint_truncate_wal_bytes")
    change_log_max_entries: int = _declared(StoreOptions, "change_log_max_entries")
    verify_threads: int = key(2, "threads checking BIP-340 signatures", unit="threads", min=1, scope="per process")
    max_projector_refusals: int = key(MAX_REFUSALS, "[[projectors]]: rows kept in the refusal log", unit="rows",
                                      min=1, scope="relay-wide, in the database")
    projector_rebuild_batch: int = key(REBUILD_BATCH, "[[projectors]]: events per rebuild transaction",
                                       unit="events", min=1, scope="relay-wide, the writer's")
    row_change_tables: tuple[str, ...] = key((), "[[projectors]] tables whose row changes are logged for "
                                             "`relay changes --table`", parse=_parse_names,
                                             toml_type="array of table names", scope="relay-wide, in the database")
    projector_build_batch: int = key(BUILD_BATCH, "[[projectors]]: events per step of a build while the relay "
                                     "serves", unit="events", min=1, scope="relay-wide, the writer's")

    def options(self, read_connections: int | None = None, relay_url: str = "") -> StoreOptions:
        """The Store's options; `read_connections` overrides the pool size (offline commands need one);
        `relay_url` is `[server] public_url` (NIP-62 requests naming it are honoured)."""
        shared = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                  if f.name in StoreOptions.__dataclass_fields__}
        shared["read_connections"] = read_connections or self.read_connections
        return StoreOptions(**shared, relay_urls=frozenset([relay_url_key(relay_url)] if relay_url else []))


@dataclass(frozen=True)
class LogConfig:
    """[log]: structlog output."""

    level: str = key("info", "the least severe level written", choices=("debug", "info", "warning", "error"))
    format: str = key("auto", "auto: console on a terminal, else JSON", choices=("auto", "json", "console"))


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

    url: str = _table_key("the peer's WebSocket URL (ws:// or wss://); events from it are stored with this origin",
                          "string")
    direction: str = _table_key("down: fetch from it; up: push to it; both", "string", "both",
                                choices=SYNC_DIRECTIONS)
    filter: str = _table_key("the events kept in sync: a NIP-01 filter (TOML table or JSON string) without limit "
                             "or search", "table or string", "{}", default_text="{} (every event)")
    pubkey: str = _table_key("the peer node's 64-hex key: a connection that authenticates as it (NIP-42) is this "
                             "peer; \"\": unknown", "string", "")
    nip70_events: bool = _table_key("take its protected events (NIP-70) although it is not their author",
                                    "boolean", False)


def _parse_peers(name: str, value: Any) -> tuple[PeerConfig, ...]:
    """`[[sync.peers]]` tables into PeerConfigs; raises ConfigError naming `sync.peers[i].<key>`."""
    import json

    from relay.protocol.event import is_hex64
    from relay.protocol.filters import parse_filter
    from relay.protocol.rejection import Rejection

    peers, urls = [], set()
    for name, table in _tables(value, name, _table_keys(PeerConfig)):
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
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{name}.filter: not a JSON object ({exc.msg} at character {exc.pos + 1}); give a "
                              "table, e.g. filter = {kinds = [1]}") from None
        except (ValueError, TypeError, Rejection) as exc:
            raise ConfigError(f"{name}.filter: {exc}") from None
        if parsed.limit is not None:
            raise ConfigError(f"{name}.filter: limit has no meaning for sync")
        if parsed.search is not None:
            raise ConfigError(f"{name}.filter: search has no meaning for sync (NIP-77 cannot reconcile it)")
        pubkey = table.get("pubkey", "")
        if pubkey != "" and not is_hex64(pubkey):
            raise ConfigError(f"{name}.pubkey: must be 64 lowercase hex characters, got {pubkey!r}")
        nip70_events = table.get("nip70_events", False)
        if type(nip70_events) is not bool:
            raise ConfigError(f"{name}.nip70_events: expected true or false, got {nip70_events!r}")
        peers.append(PeerConfig(url, direction, filter_json, pubkey, nip70_events))
    return tuple(peers)


@dataclass(frozen=True)
class SyncConfig:
    """[sync]: peer sync with NIP-77 (seconds, bytes, counts); `peers` come from the file only.

    relay/sync/ reads this section; `SyncOptions` carries the part one
    reconciliation needs.
    """

    secret_key_file: str = key("", 'file of this node\'s secret key, created at first start; "": the database\'s, '
                                   "store.path + .key beside it", restart=True)
    interval_seconds: float = key(300.0, "time between full reconciliations with each configured peer",
                                  unit="seconds", min=0.1)
    frame_size_limit: int = key(60_000, "bytes per negentropy message we send", unit="bytes", min=MIN_FRAME_SIZE_LIMIT,
                                scope="per message")
    fetch_batch: int = key(500, "event ids per REQ when fetching what we lack", unit="ids", min=1, scope="per peer")
    fetch_in_flight: int = key(2, "fetch REQs awaiting their EOSE at once", unit="REQs", min=1, scope="per peer")
    push_in_flight: int = key(500, "EVENTs sent to a peer awaiting their OK at once", unit="EVENTs", min=1, scope="per peer")
    live_queue: int = key(10_000, "events received live from one peer waiting to be stored", unit="events", min=1,
                              scope="per peer")
    timeout_seconds: float = key(30.0, "time without any message from a peer before a pending request fails",
                                 unit="seconds", min=0.1)
    connect_timeout_seconds: float = key(10.0, "time to open the WebSocket to a peer", unit="seconds", min=0.1)
    backoff_initial_seconds: float = key(1.0, "wait before reconnecting after a failure; doubles per failure",
                                         unit="seconds", min=0.01)
    backoff_max_seconds: float = key(300.0, "longest wait before reconnecting", unit="seconds", min=0.01)
    lease_seconds: float = key(60.0, "how long a process holds its claim on a peer", unit="seconds", min=1.0)
    peers: tuple[PeerConfig, ...] = key((), "relays to keep in sync with ([[sync.peers]] tables)", restart=True,
                                        parse=_parse_peers, toml_type="array of tables ([[sync.peers]])")


# --- [[shards]] and [sharding] (relay/sync/claims.py: coverage claims, kind 30803) -------------------

SHARD_ID_CHARS = 64
_SHARD_ID_ALPHABET = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


@dataclass(frozen=True)
class ShardConfig:
    """One `[[shards]]` table, or a projector's `shard_id`: a named NIP-01 filter whose events this node holds
    (`hold`) or hands over (`hold = false`); `filter` is compact JSON with sorted keys (the claim's `filter` tag).
    """

    id: str = _table_key("the shard's name: 1 to 64 letters, digits, '.', '_' or '-' (the claim's d tag)", "string")
    filter: str = _table_key("one NIP-01 filter: kinds, authors and #x tags (tags only with regular kinds); {}: "
                             "every event (an archive node)", "table")
    hold: bool = _table_key("false: hand the shard over (serve it until other nodes hold enough copies, then "
                            "remove it)", "boolean", True)


def _shard_filter_json(name: str, table: Any) -> str:
    """A `[[shards]]` filter table as compact JSON, once it is one a shard may have; raises ConfigError.

    A shard keeps every version of a replaceable or addressable coordinate together: a filter with tags must
    name kinds, all of them regular (a tag may differ between two versions of one coordinate).
    """
    import json

    from relay.protocol.claims import FLEET_WIDE_KINDS
    from relay.protocol.event import is_addressable, is_ephemeral, is_replaceable
    from relay.protocol.filters import parse_filter
    from relay.protocol.rejection import Rejection

    if type(table) is not dict:
        raise ConfigError(f"{name}: must be a table (one NIP-01 filter), e.g. {{kinds = [1]}}")
    for key in table:
        if key not in ("kinds", "authors") and not (key.startswith("#") and len(key) == 2):
            raise ConfigError(f"{name}.{key}: a shard's filter has kinds, authors and #x tags only")
    try:
        parsed = parse_filter(table)
        text = json.dumps(table, separators=(",", ":"), sort_keys=True, allow_nan=False)
    except (ValueError, TypeError, Rejection) as exc:
        raise ConfigError(f"{name}: {exc}") from None
    if parsed.is_empty():
        raise ConfigError(f"{name}: matches no event")
    if parsed.tags and (parsed.kinds is None or any(is_replaceable(k) or is_addressable(k) for k in parsed.kinds)):
        raise ConfigError(f"{name}: tags are allowed only with kinds that are all regular (the versions of a "
                          "replaceable or addressable coordinate may differ in tags, and must stay in one shard)")
    if parsed.kinds is not None and (ephemeral := sorted(k for k in parsed.kinds if is_ephemeral(k))):
        raise ConfigError(f"{name}.kinds: {ephemeral} are ephemeral kinds, never stored: no node holds them")
    if parsed.kinds is not None and parsed.kinds <= FLEET_WIDE_KINDS:
        raise ConfigError(f"{name}.kinds: kinds {sorted(FLEET_WIDE_KINDS)} are fleet-wide: every node holds them "
                          "whatever its shards")
    return text


def _parse_shards(value: Any) -> tuple[ShardConfig, ...]:
    """`[[shards]]` tables into ShardConfigs; raises ConfigError naming `shards[i].<key>`."""
    shards, ids = [], set()
    for name, table in _tables(value, "shards", _table_keys(ShardConfig)):
        if "id" not in table:
            raise ConfigError(f"{name}.id: missing (the shard's name in its coverage claims, e.g. \"notes\")")
        shard_id = table["id"]
        if type(shard_id) is not str or not 0 < len(shard_id) <= SHARD_ID_CHARS or \
                not set(shard_id) <= _SHARD_ID_ALPHABET:
            raise ConfigError(f"{name}.id: 1 to {SHARD_ID_CHARS} letters, digits, '.', '_' or '-', got {shard_id!r}")
        if shard_id in ids:
            raise ConfigError(f"{name}.id: {shard_id} is declared twice")
        ids.add(shard_id)
        if "filter" not in table:
            raise ConfigError(f"{name}.filter: missing (give {{}} for every event: an archive node)")
        hold = table.get("hold", True)
        if type(hold) is not bool:
            raise ConfigError(f"{name}.hold: expected true or false, got {hold!r}")
        shards.append(ShardConfig(shard_id, _shard_filter_json(f"{name}.filter", table["filter"]), hold))
    return tuple(shards)


@dataclass(frozen=True)
class ShardingConfig:
    """[sharding]: how the nodes holding shards count each other's copies (counts, seconds); relay/sync/claims.py."""

    min_copies: int = key(2, "confirmed complete copies on other nodes (distinct node pubkeys) before retention or "
                             "a handover may remove an event of a shard here", unit="nodes", min=1, max=64)
    fleet_pubkeys: tuple[str, ...] = key((), "node pubkeys whose coverage claims count; empty: the pubkeys of "
                                             "[[sync.peers]]", parse=_PUBKEYS, toml_type="array of 64-hex pubkeys")
    claim_interval_seconds: float = key(300.0, "time between republications of this node's coverage claims",
                                        unit="seconds", min=1.0)
    claim_ttl_seconds: float = key(0.0, "a claim's NIP-40 expiration after its publication; 0: 3 x "
                                        "claim_interval_seconds", unit="seconds")
    max_clock_skew_seconds: float = key(60.0, "clock difference allowed between nodes of the fleet",
                                        unit="seconds")

    def ttl_seconds(self) -> float:
        """`claim_ttl_seconds`, or 3 x `claim_interval_seconds` when it is 0 (seconds)."""
        return self.claim_ttl_seconds or 3 * self.claim_interval_seconds


# --- [negentropy] (NIP-77, relay side: relay/server/negentropy.py, relay/store/negentropy/) --------------

NEG_ENVELOPE_BYTES = 512
"""Room for `["NEG-MSG","<subscription id, JSON-escaped>",""]` around a hex frame, in bytes."""


def _parse_negentropy_filters(name: str, value: Any) -> tuple[dict, ...]:
    """`[negentropy] filters` or `protected_filters` (arrays of filter tables) checked with parse_filter;
    raises ConfigError."""
    from relay.protocol.filters import parse_filter
    from relay.protocol.rejection import Rejection

    for name, table in _tables(value, name, None):  # each a NIP-01 filter
        for key in ("since", "until", "limit", "search"):
            if key in table:
                raise ConfigError(f"{name}.{key}: an indexed filter has no {key}")
        try:
            if parse_filter(table).is_empty():
                raise ConfigError(f"{name}: matches no event")
        except Rejection as exc:
            raise ConfigError(f"{name}: {exc}") from None
    return tuple(value)


@dataclass(frozen=True)
class NegentropyConfig:
    """[negentropy]: answering NIP-77 NEG-OPEN (bytes, counts of items, seconds); `filters` from the file only.

    `filters` are NIP-01 filter tables without since/until/limit whose
    (created_at, id) index is kept in the write transaction, as it always is
    for the full set; other NEG-OPEN filters are answered from a query.
    """

    enabled: bool = key(True, "answer NEG-* and keep the index")
    frame_size_limit: int = key(500_000, "bytes per negentropy message we send", unit="bytes",
                                min=MIN_FRAME_SIZE_LIMIT, scope="per message")
    max_sync_events: int = key(1_000_000, "events at most in one NEG-OPEN answered from a query", unit="events",
                                scope="per NEG-OPEN")
    max_session_items: int = key(4_000_000, "items held in memory by all open NEG-OPEN sessions together",
                                 unit="items", scope="relay-wide, divided among workers")
    max_sessions_per_connection: int = key(8, "open NEG-OPEN sessions per connection", unit="sessions", min=1,
                                              scope="per connection")
    idle_timeout_seconds: float = key(60.0, "time without a NEG-MSG before a session is closed", unit="seconds",
                                      min=0.1)
    cache_items: int = key(2_000_000, "indexed items kept decoded in memory, for all sessions together",
                           unit="items", scope="relay-wide, divided among workers")
    filters: tuple[dict, ...] = key((), "filters indexed in the write transaction besides the full set",
                                    parse=_parse_negentropy_filters, toml_type="array of filter tables")
    protected_filters: tuple[dict, ...] = key((), "filters indexed like `filters`, never evicted by [retention]",
                                              parse=_parse_negentropy_filters, toml_type="array of filter tables")


# --- [search] (NIP-50: relay/store/search/, relay/protocol/search.py) -------------------------------------


@dataclass(frozen=True)
class SearchConfig:
    """[search]: the NIP-50 full-text index (kinds); changing it rebuilds the index at the next start."""

    enabled: bool = key(True, "keep the full-text index and answer NIP-50 search filters")
    kinds: tuple[int, ...] = key(DEFAULT_SEARCH_KINDS, "kinds indexed (0: profile name, display_name, about, nip05;"
                                 " 30023: title, summary, content; others: content)", parse=_KINDS,
                                 toml_type="array of kinds")


# --- [auth] and [rate_limits] (NIP-42 and access control: relay/server/access.py, relay/server/ratelimit.py) ---

WRITE_MODES = ("all", "authenticated", "listed")


@dataclass(frozen=True)
class AuthConfig:
    """[auth]: NIP-42 authentication, who may write, which kinds, private kinds (seconds, kinds, 64-hex pubkeys)."""

    challenge_on_connect: bool = key(True, "send an AUTH challenge when a connection opens")
    max_age_seconds: int = key(600, "how far an AUTH event's created_at may be from the relay's clock",
                               unit="seconds")
    write: str = key("all", "who may publish", choices=WRITE_MODES)
    write_pubkeys: tuple[str, ...] = key((), "64-hex pubkeys for write = listed / authenticated", parse=_PUBKEYS,
                                         toml_type="array of 64-hex pubkeys")
    allow_kinds: tuple[int, ...] = key((), "kinds accepted from clients; []: every kind", parse=_KINDS,
                                       toml_type="array of kinds")
    deny_kinds: tuple[int, ...] = key((), "kinds refused from clients", parse=_KINDS,
                                      toml_type="array of kinds")
    private_kinds: tuple[int, ...] = key((4, 1059), "kinds served only to their author or a p-tagged recipient",
                                         parse=_KINDS, toml_type="array of kinds")


def _rate(rate: float, what: str) -> Any:
    """The key of a per-connection token bucket's rate: `what` per second."""
    return key(rate, f"{what} per second per connection; 0: no limit", unit=f"{what} per second",
               scope="per connection")


def _burst(burst: int, what: str) -> Any:
    """The key of a per-connection token bucket's size: `what` at once; a bucket holds at least one token."""
    return key(burst, f"{what} at once per connection before the rate applies", unit=what, min=1,
               scope="per connection")


def _per_ip(default: float, per_connection: Any) -> Any:
    """The per-client-IP twin of the `per_connection` key (a field): the same rules, its own default and scope."""
    rules = per_connection.metadata
    return field(default=default, metadata={**rules, "doc": rules["doc"].replace("per connection", "per client IP"),
                                            "scope": "per client IP"})


@dataclass(frozen=True)
class RateLimitConfig:
    """[rate_limits]: token buckets per connection and per client IP (messages per second, burst in messages).

    A rate of 0 means no limit.  `exempt` and `trusted_proxies` hold IP
    addresses or networks ("10.0.0.0/8").
    """

    enabled: bool = key(True, "false: no rate limits at all")
    events_per_second: float = _rate(10.0, "EVENTs")
    events_burst: int = _burst(100, "EVENTs")
    reqs_per_second: float = _rate(10.0, "REQs")
    reqs_burst: int = _burst(50, "REQs")
    neg_opens_per_second: float = _rate(1.0, "NEG-OPENs")
    neg_opens_burst: int = _burst(10, "NEG-OPENs")
    ip_events_per_second: float = _per_ip(50.0, events_per_second)
    ip_events_burst: int = _per_ip(500, events_burst)
    ip_reqs_per_second: float = _per_ip(50.0, reqs_per_second)
    ip_reqs_burst: int = _per_ip(250, reqs_burst)
    ip_neg_opens_per_second: float = _per_ip(5.0, neg_opens_per_second)
    ip_neg_opens_burst: int = _per_ip(20, neg_opens_burst)
    ip_stored_results_bytes: int = key(67_108_864, "unsent REQ results of one IP's connections together; 0: no bound",
                                       unit="bytes", scope="per client IP")
    ip_connections: int = key(100, "connections open at once from one IP; 0: no bound", unit="connections",
                                scope="per client IP")
    exempt: tuple[str, ...] = key((), "client IPs or networks never limited", parse=_NETWORKS,
                                  toml_type="array of IPs or networks")
    exempt_loopback: bool = key(True, "a loopback client (127.0.0.0/8, ::1) is not limited, unless its request "
                                "carries X-Forwarded-For or Forwarded (a proxy on this host)")
    trusted_pubkeys: tuple[str, ...] = key((), "64-hex pubkeys not limited once a connection authenticates as one "
                                           "(NIP-42); NIP-86 trustpubkey adds more", parse=_PUBKEYS,
                                           toml_type="array of 64-hex pubkeys")
    trusted_proxies: tuple[str, ...] = key((), "reverse proxies whose X-Forwarded-For names the client IP",
                                           parse=_NETWORKS, toml_type="array of IPs or networks")


# --- [admin] (NIP-86 management API: relay/server/management.py; moderation: relay/ingest/moderation.py) ---


@dataclass(frozen=True)
class AdminConfig:
    """[admin]: who may manage the relay over NIP-86 (64-hex pubkeys), and how bans remove (seconds, events)."""

    pubkeys: tuple[str, ...] = key((), "64-hex pubkeys whose NIP-98 signed requests may call the NIP-86 API; []: "
                                   "no API", parse=_PUBKEYS, toml_type="array of 64-hex pubkeys")
    auth_max_age_seconds: int = key(60, "how far a NIP-98 auth event's created_at may be from the relay's clock",
                                    unit="seconds", min=1)
    purge_on_ban: bool = key(False, "banning a pubkey also removes its stored events (in batches)")
    purge_batch_size: int = key(500, "events removed per transaction when a banned pubkey's events are purged",
                                unit="events", min=1, scope="relay-wide, the writer's")
    refresh_seconds: float = key(1.0, "how often a running relay reads bans made by `relay ban` in another process",
                                 unit="seconds", min=0.05)


# --- [retention] (relay/retention.py, relay/store/retention.py; NIP-62: relay/store/vanish.py) ----------------


@dataclass(frozen=True)
class RetentionRule:
    """One `[[retention.rules]]` table: events of `kinds` (empty: every kind) older than `max_age_days`
    (by created_at) are removed."""

    max_age_days: float = _table_key("events whose created_at is older are removed", "number", unit="days")
    kinds: tuple[int, ...] = _table_key("the kinds the rule removes; []: every kind", "array of kinds", ())


def _parse_retention_rules(name: str, value: Any) -> tuple[RetentionRule, ...]:
    """`[[retention.rules]]` tables into RetentionRules; raises ConfigError naming `retention.rules[i].<key>`."""
    from relay.protocol.event import MAX_KIND

    rules = []
    for name, table in _tables(value, name, _table_keys(RetentionRule)):
        age = table.get("max_age_days")
        if type(age) not in (int, float) or not age > 0:
            raise ConfigError(f"{name}.max_age_days: must be a number of days > 0, got {age!r}")
        kinds = table.get("kinds", [])
        if type(kinds) is not list or not all(type(k) is int and 0 <= k <= MAX_KIND for k in kinds):
            raise ConfigError(f"{name}.kinds: must be an array of kinds 0..{MAX_KIND}, got {kinds!r}")
        rules.append(RetentionRule(float(age), tuple(sorted(set(kinds)))))
    return tuple(rules)


@dataclass(frozen=True)
class RetentionConfig:
    """[retention]: removing old events (days, seconds, counts)."""

    interval_seconds: float = key(3600.0, "time between retention runs", unit="seconds", min=0.01)
    batch_size: int = key(100, "events read per retention transaction", unit="events", min=1,
                          scope="relay-wide, the writer's")
    max_events: int = key(0, "events stored at most, the oldest removed first; 0: no maximum", unit="events",
                          scope="relay-wide, in the database")
    rules: tuple[RetentionRule, ...] = key((), "age rules ([[retention.rules]] tables)", parse=_parse_retention_rules,
                                         toml_type="array of tables ([[retention.rules]])")


# --- [[policies]] (relay/ingest/policies.py, relay/policies/) ------------------------------------------------

POLICY_SOURCES = ("client", "peer", "import", "record")


@dataclass(frozen=True)
class PolicyConfig:
    """One `[[policies]]` table: a write policy, run in file order on the events of `sources`.

    Either `call` ("module:function", a Python policy; with `options`, a
    factory called with them as keyword arguments) or `command` (argv of a
    strfry write-policy plugin).  `timeout_seconds` is its time budget per
    event; `name` names it in logs and metrics (default: `call` or the
    command's first word).
    """

    name: str = _table_key("names the policy in logs and metrics", "string",
                           default_text="call, or the command's program")
    call: str = _table_key('"module:function": a Python policy, or with options the factory returning it; give '
                           "either call or command", "string", "")
    command: tuple[str, ...] = _table_key("instead of call: a strfry write-policy plugin, run by the relay",
                                          "array of strings (the program, its arguments)", ())
    options: dict = field(default_factory=dict, metadata={
        "doc": "keyword arguments of call's factory", "type": "table", "unit": "", "choices": (), "default": "{}"})
    sources: tuple[str, ...] = _table_key("the events it judges", "array of sources", ("client",),
                                          choices=POLICY_SOURCES)
    timeout_seconds: float = _table_key("time budget per event; past it the event is refused with error:",
                                        "number", 0.5, unit="seconds")


def _parse_policies(value: Any) -> tuple[PolicyConfig, ...]:
    """`[[policies]]` tables into PolicyConfigs; raises ConfigError naming `policies[i].<key>`."""
    policies = []
    for name, table in _tables(value, "policies", _table_keys(PolicyConfig)):
        call, command, options = table.get("call", ""), table.get("command", []), table.get("options", {})
        if bool(call) == bool(command):
            raise ConfigError(f"{name}: give either call or command")
        if call and (type(call) is not str or not all(call.partition(":")[::2])):
            raise ConfigError(f"{name}.call: must be \"module:function\", got {call!r}")
        if command and (type(command) is not list or not all(type(w) is str and w for w in command)):
            raise ConfigError(f"{name}.command: must be an array of strings (the program and its arguments)")
        if type(options) is not dict or (options and not call):
            raise ConfigError(f"{name}.options: must be a table, with call only")
        sources = table.get("sources", ["client"])
        if type(sources) is not list or not sources or not set(sources) <= set(POLICY_SOURCES):
            raise ConfigError(f"{name}.sources: must list some of {', '.join(POLICY_SOURCES)}, got {sources!r}")
        timeout = table.get("timeout_seconds", 0.5)
        if type(timeout) not in (int, float) or not 0 < timeout < math.inf:
            raise ConfigError(f"{name}.timeout_seconds: must be a number of seconds > 0, got {timeout!r}")
        label = table.get("name", call or (command[0] if command else ""))
        if type(label) is not str or not label:
            raise ConfigError(f"{name}.name: must be a non-empty string")
        policies.append(PolicyConfig(label, call, tuple(command), options, tuple(dict.fromkeys(sources)),
                                     float(timeout)))
    return tuple(policies)


@dataclass(frozen=True)
class HttpConfig:
    """[http]: plain HTTP pages on the relay's port (beside NIP-11, /health and /metrics)."""

    status_page: bool = key(True, "a browser (Accept: text/html) asking for the relay's URL gets a status page",
                            restart=True)
    tables: bool = key(False, "GET /tables and /tables/NAME: projected tables' rows as JSON, read-only",
                       restart=True)
    tables_max_limit: int = key(1000, "GET /tables/NAME: rows of one page at most (a larger limit is clamped)",
                                unit="rows", min=1, restart=True, scope="per HTTP request")


@dataclass(frozen=True)
class Config:
    """The whole configuration, one attribute per TOML section."""

    server: ServerConfig = _section(ServerConfig)
    info: InfoConfig = _section(InfoConfig)
    limits: LimitsConfig = _section(LimitsConfig)
    store: StoreConfig = _section(StoreConfig)
    log: LogConfig = _section(LogConfig)
    sync: SyncConfig = _section(SyncConfig)
    negentropy: NegentropyConfig = _section(NegentropyConfig, restart=True)
    search: SearchConfig = _section(SearchConfig, restart=True)
    auth: AuthConfig = _section(AuthConfig, restart=True)
    rate_limits: RateLimitConfig = _section(RateLimitConfig, restart=True)
    admin: AdminConfig = _section(AdminConfig, restart=True)
    retention: RetentionConfig = _section(RetentionConfig, restart=True)
    sharding: ShardingConfig = _section(ShardingConfig, restart=True)
    http: HttpConfig = _section(HttpConfig)
    # [[projectors]]: an array of tables, not a section; absent from the file means the built-in ones.
    # Then the [[causal_projectors]] (relay/store/projectors/causal_toml.py): one list, as the store keeps them.
    projectors: tuple[ProjectorSpec | CausalSpec, ...] = field(default_factory=builtin_projectors)
    # [[policies]]: write policies, from the file only; none by default.
    policies: tuple[PolicyConfig, ...] = ()
    # [[shards]]: the shards this node declares, from the file only (projectors' `shard_id`s: see `shards_of`).
    shards: tuple[ShardConfig, ...] = ()


# top-level arrays of tables ([[projectors]]), from the file only
_TABLE_ARRAYS = ("projectors", "policies", "causal_projectors", "shards")
_SQLITE_MAX_LENGTH = 1_000_000_000  # SQLite's default bound on one string or blob (bytes)


def sections() -> dict[str, type]:
    """Each section's name and dataclass, in `Config` order ([[projectors]] aside)."""
    return {f.name: f.default_factory for f in dataclasses.fields(Config) if f.name not in _TABLE_ARRAYS}


@cache  # called per key
def section_keys(section: str) -> dict[str, dataclasses.Field]:
    """The keys of `section` by name: dataclass fields whose metadata holds their rules (see `key`)."""
    return {f.name: f for f in dataclasses.fields(sections()[section])}


def _check_value(section: str, key: str, value: Any) -> Any:
    """`value` for `section.key` once its rules (see `key`) hold; raises ConfigError naming the key."""
    declared = section_keys(section)[key]
    rules, name = declared.metadata, f"{section}.{key}"
    if rules.get("parse"):
        return rules["parse"](name, value)
    expected = type(declared.default)
    if expected is float and type(value) is int:
        value = float(value) if abs(value) < 2**1023 else math.inf  # no OverflowError past double range
    if type(value) is not expected:
        raise ConfigError(f"{name}: expected {expected.__name__}, got {type(value).__name__} {value!r}")
    if expected is float and not math.isfinite(value):
        # nan passes every `<` check; inf overflows asyncio timers.
        raise ConfigError(f"{name}: must be a finite number, got {value!r}")
    if expected in (int, float) and value < rules.get("min", 0):
        raise ConfigError(f"{name}: must be >= {rules.get('min', 0)}, got {value!r}")
    if rules.get("choices") and value not in rules["choices"]:
        raise ConfigError(f"{name}: must be one of {', '.join(rules['choices'])}, got {value!r}")
    if rules.get("max") is not None and value > rules["max"]:
        raise ConfigError(f"{name}: must be <= {rules['max']}, got {value!r}")
    return value


def _parse_env_value(section: str, key: str, text: str) -> Any:
    expected = type(section_keys(section)[key].default)
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


def _parse_projectors(value: Any) -> tuple[ProjectorSpec, ...]:
    """`[[projectors]]` tables (or `projectors = []`) into specs; raises ConfigError naming projector and field."""
    try:
        return parse_specs(value)
    except SpecError as exc:
        raise ConfigError(f"projectors: {exc}") from None


def _parse_causal_projectors(value: Any) -> tuple[CausalSpec, ...]:
    """`[[causal_projectors]]` tables into specs (their `apply` imported); raises ConfigError naming the key."""
    try:
        return parse_causal(value)
    except SpecError as exc:
        raise ConfigError(str(exc)) from None


def _merge_file(values: dict[str, dict[str, Any]], data: dict[str, Any]) -> None:
    for section, table in data.items():
        if section == "projectors":
            values["projectors"] = _parse_projectors(table)  # type: ignore[assignment]
            continue
        if section == "policies":
            values["policies"] = _parse_policies(table)  # type: ignore[assignment]
            continue
        if section == "causal_projectors":
            values["causal_projectors"] = _parse_causal_projectors(table)  # type: ignore[assignment]
            continue
        if section == "shards":
            values["shards"] = _parse_shards(table)  # type: ignore[assignment]
            continue
        if section not in sections():
            raise ConfigError(f"{section}: unknown section")
        if not isinstance(table, dict):
            raise ConfigError(f"{section}: must be a table")
        for key, value in table.items():
            if key not in section_keys(section):
                raise ConfigError(f"{section}.{key}: unknown key{_elsewhere(section, key)}")
            values[section][key] = _check_value(section, key, value)


def _merge_env(values: dict[str, dict[str, Any]], env: Mapping[str, str]) -> None:
    for name, text in env.items():
        if not name.startswith(ENV_PREFIX) or "__" not in name:
            continue
        section, _, key = name[len(ENV_PREFIX):].lower().partition("__")
        if section not in sections() or key not in section_keys(section):
            raise ConfigError(f"{name}: unknown setting {section}.{key}{_elsewhere(section, key)}")
        values[section][key] = _check_value(section, key, _parse_env_value(section, key, text))


def _elsewhere(section: str, key: str) -> str:
    """" (did you mean [other] key?)" when `key`, unknown in `section`, is a key of other sections; else ""."""
    found = [f"[{other}] {key}" for other in sections() if other != section and key in section_keys(other)]
    return f" (did you mean {' or '.join(found)}?)" if found else ""


def env_warnings(env: Mapping[str, str]) -> list[str]:
    """One line for each `RELAY_` variable that is not of the settings' form `RELAY_<SECTION>__<KEY>` (which
    `load_config` would otherwise ignore without a word), suggesting the setting it seems to mean; variables
    of that form are checked by `load_config` (an unknown one is an error, as an unknown key in the file)."""
    warnings = []
    for name in sorted(env):
        if not name.startswith(ENV_PREFIX) or "__" in name or name in ENV_NOT_SETTINGS:
            continue
        rest = name[len(ENV_PREFIX):].lower()
        meant = [f"{ENV_PREFIX}{s.upper()}__{rest[len(s) + 1:].upper()}" for s in sections()
                 if rest.startswith(s + "_") and rest[len(s) + 1:] in section_keys(s)]
        warnings.append(f"{name} is not a setting and is ignored: settings are {ENV_PREFIX}<SECTION>__<KEY> (two "
                        "underscores)" + (f"; did you mean {meant[0]}?" if meant else ""))
    return warnings


MAX_CONFIG_BYTES = 1 << 20
"""The largest configuration file read (1 MiB): a bound, as `--config` may name /dev/zero or a log by mistake."""


def _read_config_text(path: Path) -> str:
    """The UTF-8 text of the configuration file at `path` (a FIFO such as `<(...)` is fine), read with a bound.

    Raises:
        OSError, UnicodeDecodeError: unreadable, or not UTF-8.
        ConfigError: larger than MAX_CONFIG_BYTES.
    """
    with path.open("rb") as f:
        data = f.read(MAX_CONFIG_BYTES + 1)
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_CONFIG_BYTES} bytes: not a configuration file")
    return data.decode("utf-8")


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
    values: dict[str, Any] = {s: {} for s in sections()}
    if path is not None:
        try:
            data = tomllib.loads(_read_config_text(Path(path)))
        except OSError as exc:  # one line naming the file: "no such file or directory", "is a directory"
            raise ConfigError(f"{path}: {os_reason(exc)}") from None
        except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"{path}: {exc}") from None
        _merge_file(values, data)
    _merge_env(values, env or {})
    for section, table in (overrides or {}).items():
        for key, value in table.items():
            if value is not None:
                values[section][key] = _check_value(section, key, value)
    projectors = values.get("projectors", builtin_projectors()) + values.get("causal_projectors", ())
    config = Config(**{name: cls(**values[name]) for name, cls in sections().items()},
                    projectors=projectors, policies=values.get("policies", ()), shards=values.get("shards", ()))
    _check_consistency(config)
    return config


def _check_projector_names(projectors: tuple[ProjectorSpec | CausalSpec, ...]) -> None:
    """A causal projector's name and tables must not be a [[projectors]] table's (one table, one writer)."""
    taken: set[str] = set()
    for spec in projectors:
        names = {spec.name, *spec.table_names}
        if names & taken:
            raise ConfigError(f"causal_projectors: {spec.name!r}: name or table {sorted(names & taken)[0]!r} is "
                              "taken by another projector")
        taken |= names


def _check_consistency(config: Config) -> None:
    _check_projector_names(config.projectors)
    plain = {s.table for s in config.projectors if isinstance(s, ProjectorSpec)}
    if unknown := [t for t in config.store.row_change_tables if t not in plain]:
        raise ConfigError(f"store.row_change_tables: {unknown[0]!r} is not a [[projectors]] table")
    limits = config.limits
    if limits.default_limit > limits.max_limit:
        raise ConfigError("limits.default_limit: must not exceed limits.max_limit")
    if limits.max_live_queue <= config.store.max_batch:
        # One commit can queue a whole batch for a reader at once.
        raise ConfigError("limits.max_live_queue: must exceed store.max_batch")
    if config.store.max_batch_bytes < limits.max_message_bytes:
        raise ConfigError("store.max_batch_bytes: must be at least limits.max_message_bytes")
    sharding = config.sharding
    if 0 < sharding.claim_ttl_seconds < sharding.claim_interval_seconds:
        # A claim would lapse before the next one: the node's shards would look unheld most of the time.
        raise ConfigError("sharding.claim_ttl_seconds: must be 0 (3 x claim_interval_seconds) or at least "
                          "sharding.claim_interval_seconds")
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
    auth = config.auth
    if auth.write == "listed" and not (auth.write_pubkeys or config.admin.pubkeys or config.sync.peers):
        # an admin may list writers with NIP-86 allowpubkey; a pull-only mirror needs no writer
        raise ConfigError('auth.write: "listed" with no auth.write_pubkeys (and no [admin] pubkeys or [[sync.peers]]):'
                          ' nobody could ever publish; list pubkeys, or use write = "authenticated" or "all"')
    url = config.server.public_url
    if url and (not url.startswith(("ws://", "wss://")) or relay_url_key(url) is None):
        raise ConfigError(f"server.public_url: must be a ws:// or wss:// URL, got {url!r}")
    if config.admin.pubkeys and not url:
        raise ConfigError("server.public_url: must be set when admin.pubkeys is (NIP-98 requests name it)")
    if config.sync.backoff_initial_seconds > config.sync.backoff_max_seconds:
        raise ConfigError("sync.backoff_initial_seconds: must not exceed sync.backoff_max_seconds")
    neg = config.negentropy
    if neg.enabled and limits.max_message_bytes < 2 * neg.frame_size_limit + NEG_ENVELOPE_BYTES:
        # NIP-77 frames travel as hex: a NEG-MSG of a full frame is twice its size plus the envelope.
        raise ConfigError(f"limits.max_message_bytes: must be at least 2 * negentropy.frame_size_limit"
                          f" + {NEG_ENVELOPE_BYTES} = {2 * neg.frame_size_limit + NEG_ENVELOPE_BYTES}")
    if neg.max_session_items < neg.max_sync_events:
        raise ConfigError("negentropy.max_session_items: must be at least negentropy.max_sync_events")
    shards_of(config)


def shards_of(config: Config) -> tuple[ShardConfig, ...]:
    """Every shard this node declares: the `[[shards]]` tables, then one per `shard_id` of a projector not
    among them (its filter: the projector's kind), in that order.

    Raises:
        ConfigError: a `shard_id` that names a `[[shards]]` table of another filter, or two projectors of
            different kinds naming one `shard_id`.
    """
    found = {shard.id: shard for shard in config.shards}
    for spec in config.projectors:
        if spec.shard_id is None:
            continue
        shard = ShardConfig(spec.shard_id, f'{{"kinds":[{spec.kind:d}]}}')
        declared = found.setdefault(shard.id, shard)
        if declared.filter != shard.filter:
            raise ConfigError(f"projectors: {spec.name}.shard_id: {shard.id} is the shard of {declared.filter}, "
                              f"not of kind {spec.kind}")
    return tuple(found.values())


def fleet_pubkeys(config: Config) -> frozenset[str]:
    """The node pubkeys whose coverage claims count: `[sharding] fleet_pubkeys`, else the `[[sync.peers]]`'."""
    return frozenset(config.sharding.fleet_pubkeys or (p.pubkey for p in config.sync.peers if p.pubkey))


def worker_config(config: Config, workers: int) -> Config:
    """The configuration one of `workers` worker processes runs with: the relay-wide memory budgets divided
    among them (docs/operating.md, "Limits across processes").

    Each worker gets `budget // workers` of `limits.max_stored_results_bytes`, `negentropy.max_session_items`
    and `negentropy.cache_items`, but never less than one answer needs (`limits.max_query_bytes`,
    `negentropy.max_sync_events`), so the relay's total may pass a budget by at most that per worker.  Per-IP
    limits are not divided: the workers share them (relay/server/iptable.py).  `workers` 0 or 1: `config`.
    """
    if workers <= 1:
        return config
    limits, neg = config.limits, config.negentropy
    return dataclasses.replace(
        config,
        limits=dataclasses.replace(limits, max_stored_results_bytes=max(
            limits.max_stored_results_bytes // workers, limits.max_query_bytes)),
        negentropy=dataclasses.replace(neg, max_session_items=max(neg.max_session_items // workers,
                                                                  neg.max_sync_events),
                                       cache_items=neg.cache_items // workers))
