"""Causal projectors declared in the configuration: one `[[causal_projectors]]` table into a `CausalSpec`.

    [[causal_projectors]]
    name = "docs"                      # the projector's name (lowercase SQL identifier)
    kind = 4242                        # a regular kind: its events are the operations
    log_tag = "log"                    # optional, as are seq_tag ("seq") and prev_tag ("prev")
    apply = "myapp.docs:apply"         # module:function, called as apply(conn, op) (relay/store/projectors/causal.py)
    revision = 1                       # optional; bump when apply changes
    protected = false                  # optional; retention never removes an operation
    shard_id = "docs"                  # optional; this node holds the shard of `kind` (README, "Shards")
    [[causal_projectors.tables]]       # one or more
    name = "doc_values"
    columns = [{ name = "key", type = "TEXT" }, { name = "value", type = "TEXT" }]
    primary_key = ["_log", "_author", "key"]   # optional

The module is imported when the configuration loads, so every command that
reads it (`relay serve`, `status`, `projectors list`, `verify`) has the same
function, and an error stops `relay serve` before it opens anything.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
from typing import Any

from relay.store.projectors.causal import CausalSpec
from relay.store.projectors.spec import TYPES, SpecError
from relay.store.projectors.tables import quote

_IDENTIFIER = re.compile(r"[a-z][a-z0-9_]{0,62}")
_KEYS = {f.name for f in dataclasses.fields(CausalSpec)}  # the keys declared with their docs on CausalSpec
_TABLE_KEYS = {"name", "columns", "primary_key"}
_LEADING = ("_log", "_author")  # every causal table's first columns (causal.create_tables)


def causal_from_dict(label: str, data: object) -> CausalSpec:
    """The CausalSpec of one `[[causal_projectors]]` table; `label` names it in errors ("causal_projectors[0]").

    Raises:
        SpecError: the message starts with `label.<key>`: an unknown or missing key, a wrong type, a
        function that cannot be imported, or an invalid spec.
    """
    _check_keys(label, data, _KEYS, ("name", "kind", "tables", "apply"))
    for key, expected in (("name", str), ("kind", int), ("log_tag", str), ("seq_tag", str), ("prev_tag", str),
                          ("apply", str), ("revision", int), ("protected", bool), ("tables", list),
                          ("shard_id", str)):
        if key in data and type(data[key]) is not expected:
            raise SpecError(f"{label}.{key}: expected {expected.__name__}, got {data[key]!r}")
    tables = tuple(_table(f"{label}.tables[{i}]", t) for i, t in enumerate(data["tables"]))
    optional = {k: data[k] for k in ("log_tag", "seq_tag", "prev_tag", "revision", "protected", "shard_id")
                if k in data}
    try:
        return CausalSpec(name=data["name"], kind=data["kind"], tables=tables,
                          apply=resolve(f"{label}.apply", data["apply"]), **optional)
    except SpecError as exc:
        raise SpecError(f"{label}: {exc}") from None


def _check_keys(label: str, data: object, known: set[str], required: tuple[str, ...]) -> None:
    """`data` is a table with only `known` keys and every `required` one; else SpecError naming the key."""
    if not isinstance(data, dict):
        raise SpecError(f"{label}: must be a table with the keys {', '.join(required)}")
    unknown = next((key for key in data if key not in known), None)
    if unknown is not None:
        raise SpecError(f"{label}.{unknown}: unknown key")
    missing = next((key for key in required if key not in data), None)
    if missing is not None:
        raise SpecError(f"{label}.{missing}: missing")


def resolve(label: str, reference: str) -> Any:
    """The callable `reference` ("module:function") names.

    Raises:
        SpecError: naming `label`, when the module cannot be imported or has no such callable.
    """
    module_name, sep, function_name = reference.partition(":")
    if not sep or not module_name or not function_name:
        raise SpecError(f"{label}: expected module:function, got {reference!r}")
    try:
        function = getattr(importlib.import_module(module_name), function_name)
    except Exception as exc:  # whatever the module's import raises stops the start, named
        raise SpecError(f"{label}: cannot load {reference!r}: {exc!r}") from None
    if not callable(function):
        raise SpecError(f"{label}: {reference!r} is not callable")
    return function


def _table(label: str, data: object) -> tuple[str, str]:
    """(table name, column definitions SQL) of one `tables` entry."""
    _check_keys(label, data, _TABLE_KEYS, ("name", "columns"))
    name, columns = data.get("name"), data.get("columns")
    if type(name) is not str or not _IDENTIFIER.fullmatch(name):
        raise SpecError(f"{label}.name: must be a lowercase SQL identifier, got {name!r}")
    if type(columns) is not list or not columns:
        raise SpecError(f"{label}.columns: must be a non-empty array of {{name, type}}")
    definitions, names = [], list(_LEADING)
    for i, column in enumerate(columns):
        where = f"{label}.columns[{i}]"
        if not isinstance(column, dict) or set(column) != {"name", "type"}:
            raise SpecError(f"{where}: must be a table {{name, type}}")
        if type(column["name"]) is not str or not _IDENTIFIER.fullmatch(column["name"]) or column["name"] in names:
            raise SpecError(f"{where}.name: must be a new lowercase SQL identifier, got {column['name']!r}")
        if column["type"] not in TYPES:
            raise SpecError(f"{where}.type: must be one of {', '.join(TYPES)}, got {column['type']!r}")
        names.append(column["name"])
        definitions.append(f"{quote(column['name'])} {column['type']}")
    key = data.get("primary_key")
    if key is not None:
        if type(key) is not list or not key or not all(k in names for k in key) or len(set(key)) != len(key):
            raise SpecError(f"{label}.primary_key: must list distinct columns of the table (or _log, _author)")
        definitions.append("PRIMARY KEY (" + ", ".join(quote(k) for k in key) + ")")
    return name, ", ".join(definitions)


def parse_causal(tables: object) -> tuple[CausalSpec, ...]:
    """The `[[causal_projectors]]` array into specs, names unique.

    Raises:
        SpecError: as `causal_from_dict`, or "causal_projectors: must be an array of tables".
    """
    if not isinstance(tables, list):
        raise SpecError("causal_projectors: must be an array of tables ([[causal_projectors]])")
    specs = tuple(causal_from_dict(f"causal_projectors[{i}]", t) for i, t in enumerate(tables))
    names = [s.name for s in specs]
    for i, name in enumerate(names):
        if names.index(name) != i:
            raise SpecError(f"causal_projectors[{i}].name: {name!r} declared twice")
    return specs


__all__ = ["causal_from_dict", "parse_causal", "resolve"]
