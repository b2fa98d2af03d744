"""docs/configuration.md, rendered from the keys' declarations: `python -m relay.config_reference > docs/configuration.md`.

Each `[section]` key is a field of its section's dataclass in relay/config.py
(the store's and the protocol's own keys on `StoreOptions` and `EventLimits`);
each key of an array of tables (`[[sync.peers]]`, `[[retention.rules]]`,
`[[policies]]`, `[[projectors]]`, `[[causal_projectors]]`) is a field of the
table's dataclass.  Their metadata (`relay.config.key`) is all this module
reads: nothing here states a default or a rule of its own.
tests/test_config_reference.py fails when docs/configuration.md differs from
`render()`.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

from relay.config import SCOPES, Config, PeerConfig, PolicyConfig, RetentionRule, ShardConfig, section_keys, sections
from relay.store.projectors.causal import CausalSpec
from relay.store.projectors.spec import FieldSpec, ProjectorSpec

COMMAND = "python -m relay.config_reference > docs/configuration.md"
"""The command that writes docs/configuration.md (run from the repository's root, in its venv)."""

ARRAYS: tuple[tuple[str, type, str], ...] = (
    ("[[sync.peers]]", PeerConfig, "Relays kept in sync with this one (docs/peers.md); none by default (restart)."),
    ("[[retention.rules]]", RetentionRule, "Age rules of `[retention]` (docs/operating.md, \"Retention\"); none by "
                                           "default (restart)."),
    ("[[shards]]", ShardConfig, "The shards this node holds or hands over, each claimed in a kind-30803 event "
                                "(docs/peers.md, \"Shards\"); none by default: a full replica (restart)."),
    ("[[policies]]", PolicyConfig, "Write policies, run in file order on the events of their sources "
                                   "(docs/moderation.md, \"Policies\"); none by default (restart)."),
    ("[[projectors]]", ProjectorSpec, "SQL tables computed from events (docs/projectors.md). Absent from the file: "
                                      "the four built-in ones of config/relay.toml; `projectors = []` at the top of "
                                      "the file: none. Writing any replaces the built-in ones (restart)."),
    ("fields of [[projectors]]", FieldSpec, "Each entry of a projector's `fields`: one column. Every row also has "
                                            "`_event_id`, `_pubkey` (64-char hex) and `_created_at` (unix seconds)."),
    ("[[causal_projectors]]", CausalSpec, "Ordered operation logs per (log, author), folded into tables by your "
                                          "function (docs/projectors.md, \"Causal projectors\"); none by default "
                                          "(restart)."),
)
"""The arrays of tables documented after the sections: (heading, the dataclass of one table, what it is)."""

_INTRO = """\
# Configuration reference

Generated from the keys' declarations: `relay/config.py`, the store's own keys on `StoreOptions`
(`relay/store/options.py`), the event limits on `EventLimits` (`relay/protocol/event.py`), the projectors' keys on
their specs (`relay/store/projectors/spec.py`, `relay/store/projectors/causal.py`). Do not edit it by hand:
regenerate it with `{command}`;
`tests/test_config_reference.py` fails when it is out of date. `config/relay.toml` shows every key with its
default and says more about each (`tests/test_config.py` holds it to the declarations).

## How settings are read

- Every subcommand takes `--config` and `--db`. Without `--config`, the file `RELAY_CONFIG` names is read (if
  set), else the built-in defaults apply (they equal `config/relay.toml`).
- Environment variables `RELAY_<SECTION>__<KEY>` (two underscores) override scalar keys of the file
  (`RELAY_SERVER__PORT=8080`, `RELAY_STORE__PATH=/data/relay.db`); lists and tables come from the file only.
  Flags (`--host`, `--port`, `--workers`, `--db`) override both.
- An unknown key or a bad value stops the start with the key and the reason (exit 2); a key that belongs to
  another section says so (`server.tables: unknown key (did you mean [http] tables?)`), and so does an unknown
  `RELAY_<SECTION>__<KEY>` variable. A `RELAY_` variable not of that form (`RELAY_SERVER_PORT`, one underscore)
  would be ignored: every command warns about it in one stderr line, with the setting it seems to mean;
  `RELAY_CONFIG` and `RELAY_TEST_WORKERS` are not settings.
- Some rules span keys, checked at load: `limits.default_limit` <= `limits.max_limit`; `limits.max_live_queue` >
  `store.max_batch`; `store.max_batch_bytes` and `limits.max_live_queue_bytes` >= `limits.max_message_bytes` >=
  1024; `limits.max_message_bytes` <= `limits.max_query_bytes` <= `limits.max_stored_results_bytes` and
  1,000,000,000;
  `rate_limits.ip_stored_results_bytes` 0 or >= `limits.max_query_bytes`; `limits.max_message_bytes` >= 2 *
  `negentropy.frame_size_limit` + 512 while NIP-77 is enabled; `negentropy.max_session_items` >=
  `negentropy.max_sync_events`; `sync.backoff_initial_seconds` <= `sync.backoff_max_seconds`;
  `sharding.claim_ttl_seconds` 0 or >= `sharding.claim_interval_seconds`; `server.public_url` set when `admin.pubkeys` is; `auth.write = "listed"` needs someone listed (or
  `[admin] pubkeys`, or `[[sync.peers]]`); `store.row_change_tables` names `[[projectors]]` tables; a causal projector's name and tables are no
  other projector's.

Columns: **type** as the TOML file holds it (a `number` takes an integer too); **range**: a number's bounds, a
string's choices; **scope**: what a limit or budget counts (below); **restart**: `yes` (marked `(restart)` in
`config/relay.toml`) for a key that sizes or names something built at start-up (a pool of threads or
connections, a socket, a table, a peer), which only a restart can change; the others are read where they are
used. Today the relay reads its configuration once, when it starts, so a change to any key takes a restart;
the column says which keys a reload without restart could never take.

## Scopes

With `server.workers` worker processes, each limit and budget holds as its scope says (docs/operating.md,
"Limits across processes"):

"""


def _escape(text: str) -> str:
    """`text` for a cell of a Markdown table: pipes escaped, on one line."""
    return text.replace("|", "\\|").replace("\n", " ")


def _toml(value: Any) -> str:
    """`value` as TOML writes it: "text", true, 10.0, [4, 1059]."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + "}"
    return repr(value)


def _binary(count: int) -> str:
    """" (64 MiB)" for a whole number of KiB, MiB or GiB; else ""."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if count >= size and count % size == 0:
            return f" ({count // size} {unit})"
    return ""


def _type(declared: dataclasses.Field) -> str:
    """What the file holds for a key: its declared `type`, else the TOML type of its default."""
    if declared.metadata.get("type"):
        return declared.metadata["type"]
    default = declared.default
    return {bool: "boolean", int: "integer", float: "number", str: "string"}[type(default)]


def _default(declared: dataclasses.Field) -> str:
    """A key's default as the file would write it, with its size in KiB/MiB/GiB when it counts bytes;
    "required" for a key of a table that has none."""
    if declared.metadata.get("default"):
        return declared.metadata["default"]
    if declared.default is dataclasses.MISSING:
        return "required" if declared.default_factory is dataclasses.MISSING else _toml(declared.default_factory())
    text = f"`{_toml(declared.default)}`"
    if declared.metadata.get("unit") == "bytes" and type(declared.default) is int:
        text += _binary(declared.default)
    return text


def _range(declared: dataclasses.Field) -> str:
    """A number's bounds (">= 1", "0 to 65535") or a string's choices ("debug, info"); "" for others."""
    rules = declared.metadata
    if rules.get("choices"):
        return ", ".join(f"`{c}`" for c in rules["choices"])
    if type(declared.default) in (int, float) and not rules.get("parse"):
        low = rules.get("min", 0)
        return f"{low:g} to {rules['max']:g}" if rules.get("max") is not None else f">= {low:g}"
    return ""


def _section_table(section: str, restart_all: bool) -> list[str]:
    """The rows of one `[section]`'s table: one per key, in declaration order."""
    rows = ["| key | type | default | unit | range | scope | restart | meaning |",
            "|---|---|---|---|---|---|---|---|"]
    for name, declared in section_keys(section).items():
        rules = declared.metadata
        restart = "yes" if restart_all or rules.get("restart") else ""
        rows.append("| " + " | ".join(_escape(cell) for cell in (
            f"`{name}`", _type(declared), _default(declared), rules.get("unit", ""), _range(declared),
            rules.get("scope", ""), restart, rules["doc"])) + " |")
    return rows


def _array_table(cls: type) -> list[str]:
    """The rows of one array of tables' table: one per key of its dataclass, in declaration order."""
    rows = ["| key | type | default | unit | choices | meaning |", "|---|---|---|---|---|---|"]
    for declared in dataclasses.fields(cls):
        rules = declared.metadata
        choices = ", ".join(f"`{c}`" for c in rules.get("choices", ()))
        rows.append("| " + " | ".join(_escape(cell) for cell in (
            f"`{declared.name}`", rules["type"], _default(declared), rules.get("unit", ""), choices,
            rules["doc"])) + " |")
    return rows


def _first_line(cls: type) -> str:
    """The first paragraph of a dataclass's docstring, on one line, without its `[section]:` lead."""
    paragraph = (cls.__doc__ or "").strip().split("\n\n")[0]
    text = " ".join(line.strip() for line in paragraph.splitlines())
    return text.split(": ", 1)[1] if text.startswith("[") and ": " in text else text


def render() -> str:
    """docs/configuration.md: how settings are read, the scopes with their keys, one table per section (every
    key's type, default, unit, range, scope, restart and doc), then the arrays of tables.

    Raises:
        KeyError: a key declares a scope that is not one of `relay.config.SCOPES`, or a key of an array of
        tables declares no `doc` or `type` (each a declaration to fix, not a reason to skip the key).
    """
    lines = _INTRO.format(command=COMMAND).splitlines()
    keys_by_scope: dict[str, list[str]] = {scope: [] for scope in SCOPES}
    for section in sections():
        for name, declared in section_keys(section).items():
            if scope := declared.metadata.get("scope"):
                keys_by_scope[scope].append(f"`{section}.{name}`")
    lines += ["| scope | how it holds | keys |", "|---|---|---|"]
    lines += [f"| {_escape(scope)} | {_escape(SCOPES[scope])} | {', '.join(keys)} |"
              for scope, keys in keys_by_scope.items()]
    restart = {f.name: f.metadata.get("restart", False) for f in dataclasses.fields(Config)}
    for section, cls in sections().items():
        what = _first_line(cls)
        lines += ["", f"## [{section}]", "", f"{what[:1].upper()}{what[1:]}"
                  + (" The whole section is read only at start-up (restart)." if restart[section] else "")
                  + f" From the environment: `RELAY_{section.upper()}__<KEY>`.", ""]
        lines += _section_table(section, restart[section])
    lines += ["", "## Arrays of tables"]
    for heading, cls, what in ARRAYS:
        lines += ["", f"### {heading}", "", what, ""]
        lines += _array_table(cls)
    return "\n".join(lines) + "\n"


def main() -> None:
    """Write `render()` to stdout (`python -m relay.config_reference > docs/configuration.md`)."""
    sys.stdout.write(render())


if __name__ == "__main__":
    main()
