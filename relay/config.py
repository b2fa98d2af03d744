"""Configuration: TOML file, then `RELAY_<SECTION>__<KEY>` environment variables, then CLI flags.

Each section is a frozen dataclass; every key has a default, documented with
its unit in `config/relay.toml`.  Unknown keys and values of the wrong type
or range stop the start with the key and the reason (`ConfigError`).
Environment variables override scalar keys only; lists and tables come from
the file.
"""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from relay.protocol.event import EventLimits
from relay.store.store import StoreOptions

ENV_PREFIX = "RELAY_"


class ConfigError(ValueError):
    """A configuration key that is unknown or has a bad value; the message names it."""


@dataclass(frozen=True)
class ServerConfig:
    """[server]: where to listen."""

    host: str = "127.0.0.1"
    port: int = 7777
    shutdown_timeout_seconds: float = 10.0


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
    expiry_purge_interval_seconds: float = 60.0
    checkpoint_interval_seconds: float = 1.0
    verify_threads: int = 2

    def options(self, read_connections: int | None = None) -> StoreOptions:
        """The Store's options; `read_connections` overrides the pool size (offline commands need one)."""
        return StoreOptions(
            synchronous=self.synchronous, read_connections=read_connections or self.read_connections,
            writer_queue_size=self.writer_queue_size, max_batch=self.max_batch,
            checkpoint_interval_seconds=self.checkpoint_interval_seconds)


@dataclass(frozen=True)
class LogConfig:
    """[log]: structlog output."""

    level: str = "info"
    format: str = "auto"


@dataclass(frozen=True)
class Config:
    """The whole configuration, one attribute per TOML section."""

    server: ServerConfig = field(default_factory=ServerConfig)
    info: InfoConfig = field(default_factory=InfoConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    store: StoreConfig = field(default_factory=StoreConfig)
    log: LogConfig = field(default_factory=LogConfig)


_CHOICES = {
    ("store", "synchronous"): ("off", "normal", "full", "extra"),
    ("log", "level"): ("debug", "info", "warning", "error"),
    ("log", "format"): ("auto", "json", "console"),
}
_MINIMUM = {("server", "port"): 0, ("store", "read_connections"): 1, ("store", "verify_threads"): 1,
            ("store", "max_batch"): 1, ("store", "writer_queue_size"): 1}


def _section_types(section: str) -> dict[str, type]:
    cls = {f.name: f.default_factory for f in dataclasses.fields(Config)}[section]
    return {f.name: type(getattr(cls(), f.name)) for f in dataclasses.fields(cls)}


def _check_value(section: str, key: str, value: Any) -> Any:
    expected = _section_types(section)[key]
    name = f"{section}.{key}"
    if expected is float and type(value) is int:
        value = float(value)
    if type(value) is not expected:
        raise ConfigError(f"{name}: expected {expected.__name__}, got {type(value).__name__} {value!r}")
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
    if expected is str:
        return text
    if expected is bool:
        if text.lower() not in ("true", "false", "1", "0"):
            raise ConfigError(f"{section}.{key}: expected true or false, got {text!r}")
        return text.lower() in ("true", "1")
    try:
        return expected(text)
    except ValueError:
        raise ConfigError(f"{section}.{key}: expected {expected.__name__}, got {text!r}") from None


def _sections() -> set[str]:
    return {f.name for f in dataclasses.fields(Config)}


def _merge_file(values: dict[str, dict[str, Any]], data: dict[str, Any]) -> None:
    for section, table in data.items():
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
    values: dict[str, dict[str, Any]] = {s: {} for s in _sections()}
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
        f.name: f.default_factory(**values[f.name]) for f in dataclasses.fields(Config)
    })
    _check_consistency(config)
    return config


def _check_consistency(config: Config) -> None:
    limits = config.limits
    if limits.default_limit > limits.max_limit:
        raise ConfigError("limits.default_limit: must not exceed limits.max_limit")
    if limits.max_live_queue <= config.store.max_batch:
        # One commit can queue a whole batch for a reader at once.
        raise ConfigError("limits.max_live_queue: must exceed store.max_batch")
    if limits.max_message_bytes < 1024:
        raise ConfigError("limits.max_message_bytes: must be at least 1024")
