"""`ProjectorSpec`: a declared projection of one event kind into one SQL table.

A spec comes from Python (`ProjectorSpec(...)`) or from a `[[projectors]]`
table of the TOML configuration (`ProjectorSpec.from_dict`).  Either way it is
validated when built, and every error names the projector and the field.

What makes two nodes converge (docs/architecture.md, invariant 3): a row's primary key
is the key of the event's NIP-01 storage class, so the live event set decides
which event owns each row, whatever the arrival order:

    regular      (1, 7, 1000..9999, ...)  the event id           source `id`
    replaceable  (0, 3, 10000..19999)     the author             source `pubkey`
    addressable  (30000..39999)           the author + `d` tag   sources `pubkey`, `tag:d`

A projector with `row_per_tag = "p"` makes one row per distinct value of the
event's `p` tags (first occurrence wins); its key adds that value
(`tag:p`, position 1).  Every row also carries the reserved columns
`_event_id`, `_pubkey` (64-char hex) and `_created_at` (unix seconds).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import orjson

from relay.protocol.event import MAX_KIND, is_addressable, is_ephemeral, is_replaceable, kind_class

# Bump when the way rows are computed from events changes: every projector is then rebuilt once.
ENGINE_VERSION = 1

TYPES = ("TEXT", "INTEGER", "REAL")
RESERVED_COLUMNS = ("_event_id", "_pubkey", "_created_at")
# Tables of the store itself; a projector may not take their names.
STORE_TABLES = frozenset({"events", "tags", "tombstones", "address_tombstones", "coordinates", "meta",
                          "projector_refusals", "causal_ops"})
EVENT_ATTRIBUTES = {"id": "TEXT", "pubkey": "TEXT", "created_at": "INTEGER", "kind": "INTEGER"}
_IDENTIFIER = re.compile(r"[a-z][a-z0-9_]{0,62}")
_TAG_NAME = re.compile(r"[^:\s]{1,64}")
_JSON_KEY = re.compile(r"[^.\s]{1,128}")
_INT64_MAX = 2**63 - 1


class SpecError(ValueError):
    """A projector spec that cannot be used; the message names the projector and the field."""


@dataclass(frozen=True, slots=True)
class Source:
    """Where a column's value comes from (parsed from a source string by `parse_source`).

    `origin` is "attribute" (`name` is id, pubkey, created_at or kind), "tag"
    (`name` is the tag name, `position` the index in the tag array: 0 is the
    name, 1 the first value), "json" (`path` of keys into the JSON-object
    content) or "content" (the whole content string).
    """

    origin: str
    name: str = ""
    position: int = 1
    path: tuple[str, ...] = ()


@lru_cache(maxsize=1024)
def parse_source(text: str) -> Source:
    """Parse a source string: `id`, `pubkey`, `created_at`, `kind`, `tag:NAME`, `tag:NAME:POSITION`,
    `content`, or `content.KEY[.KEY...]`.

    Raises:
        SpecError: an unknown form (message without projector; callers add it).
    """
    if text in EVENT_ATTRIBUTES:
        return Source("attribute", text)
    if text == "content":
        return Source("content")
    if text.startswith("content."):
        path = tuple(text[len("content."):].split("."))
        if not all(_JSON_KEY.fullmatch(key) for key in path):
            raise SpecError(f"bad JSON path in source {text!r}")
        return Source("json", path=path)
    if text.startswith("tag:"):
        parts = text.split(":")
        if len(parts) not in (2, 3) or not _TAG_NAME.fullmatch(parts[1]):
            raise SpecError(f"bad tag source {text!r} (expected tag:NAME or tag:NAME:POSITION)")
        position = 1
        if len(parts) == 3:
            if not (parts[2].isascii() and parts[2].isdigit()) or len(parts[2]) > 4:
                raise SpecError(f"bad tag position in source {text!r} (expected a number, 0 is the tag name)")
            position = int(parts[2])
        return Source("tag", parts[1], position)
    raise SpecError(f"unknown source {text!r} (expected id, pubkey, created_at, kind, tag:NAME[:POSITION], "
                    "content or content.PATH)")


def _source_identity(source: Source) -> str:
    if source.origin == "attribute":
        return source.name
    if source.origin == "tag" and source.position == 1:
        return f"tag:{source.name}"
    return ""


@dataclass(frozen=True, slots=True)
class FieldSpec:
    """One column: `name`, SQL `type` (TEXT, INTEGER or REAL), `source` (see `parse_source`).

    A value that is absent (missing tag or position, missing JSON key, JSON
    null) takes `default` (None: SQL NULL); a `required` field with no value
    refuses the event instead.  Values are converted to the type strictly:
    INTEGER takes a JSON integer or a decimal string, REAL a number or a
    numeric string, TEXT only a string; anything else refuses the event.
    """

    # Field metadata: each key of a `fields` entry of a `[[projectors]]` table (docs/configuration.md).
    name: str = field(metadata={"doc": "the column's name (lowercase SQL identifier)", "type": "string"})
    type: str = field(metadata={"doc": "the column's SQL type", "type": "string", "choices": TYPES})
    source: str = field(metadata={
        "doc": "id, pubkey, created_at, kind, tag:NAME (first value), tag:NAME:POSITION (0: the tag name), "
               "content (the whole string) or content.KEY.KEY (a path into JSON-object content)", "type": "string"})
    required: bool = field(default=False, metadata={
        "doc": "an event without a value is refused (still stored, listed by `relay projectors refusals`)",
        "type": "boolean"})
    default: str | int | float | None = field(default=None, metadata={
        "doc": "the value of an absent one", "type": "string or number", "default": "none (NULL)"})


@dataclass(frozen=True, slots=True)
class ProjectorSpec:
    """A projection of events of one `kind` into the table `table`, one row per event
    (or one per distinct value of its `row_per_tag` tags).

    `primary_key` names fields (or reserved columns) whose sources are the key
    of the kind's storage class (module docstring); `indexes` are lists of
    column names (plain, non-unique indexes).  Bump `revision` to have the
    table rebuilt at the next start even though the spec did not change.
    `protected`: retention never removes an event of `kind` (every one backs,
    or may back, a row), see relay/store/retention.py; it changes no row.

    Raises:
        SpecError: on construction, for anything invalid; the message starts
        with "projector 'TABLE'" and names the field when there is one.
    """

    # Field metadata: each key of a `[[projectors]]` table (docs/configuration.md).
    table: str = field(metadata={"doc": "the table's name, and the projector's (lowercase SQL identifier)",
                                 "type": "string"})
    kind: int = field(metadata={"doc": "the event kind it reads (not ephemeral)", "type": "integer"})
    fields: tuple[FieldSpec, ...] = field(metadata={
        "doc": "the columns: { name, type, source, required, default } (below)", "type": "array of tables"})
    primary_key: tuple[str, ...] = field(metadata={
        "doc": "fields whose sources are the kind's NIP-01 key: regular id; replaceable pubkey; addressable "
               "pubkey and tag:d; with row_per_tag X, plus tag:X", "type": "array of field names"})
    indexes: tuple[tuple[str, ...], ...] = field(default=(), metadata={
        "doc": "lists of columns to index", "type": "array of arrays of column names"})
    row_per_tag: str | None = field(default=None, metadata={
        "doc": "one row per distinct value of the event's tags of this name (first occurrence wins)",
        "type": "string", "default": "none (one row per event)"})
    revision: int = field(default=1, metadata={
        "doc": "bump it to rebuild the table at the next start although the spec is unchanged", "type": "integer"})
    protected: bool = field(default=False, metadata={
        "doc": "[retention] never removes an event of this kind (no rebuild)", "type": "boolean"})
    shard_id: str | None = field(default=None, metadata={
        "doc": "the shard of this kind, held by this node (docs/peers.md, \"Shards\"; no rebuild)", "type": "string",
        "default": "none"})

    def __post_init__(self) -> None:
        object.__setattr__(self, "fields", tuple(
            f if isinstance(f, FieldSpec) else _field_from_dict(self.table, f) for f in self.fields))
        object.__setattr__(self, "primary_key", tuple(self.primary_key))
        object.__setattr__(self, "indexes", tuple(tuple(ix) for ix in self.indexes))
        _validate(self)

    @property
    def name(self) -> str:
        """The projector's name: its table's name."""
        return self.table

    @property
    def table_names(self) -> tuple[str, ...]:
        """The tables it writes: its one table (a causal projector's may be several)."""
        return (self.table,)

    @property
    def columns(self) -> tuple[str, ...]:
        """Every column in row order: the reserved columns, then the fields."""
        return RESERVED_COLUMNS + tuple(f.name for f in self.fields)

    @property
    def column_types(self) -> dict[str, str]:
        """Column name -> SQL type, in row order."""
        return {"_event_id": "TEXT", "_pubkey": "TEXT", "_created_at": "INTEGER",
                **{f.name: f.type for f in self.fields}}

    @property
    def aliases(self) -> dict[str, str]:
        """Reserved column -> the field it repeats (a field whose source is id, pubkey or created_at).

        Such a reserved column is a VIRTUAL generated column over that field:
        every row still has it, and no byte is stored twice.
        """
        out = {}
        for reserved, attribute in (("_event_id", "id"), ("_pubkey", "pubkey"), ("_created_at", "created_at")):
            field = next((f.name for f in self.fields if f.source == attribute), None)
            if field is not None:
                out[reserved] = field
        return out

    @property
    def stored_columns(self) -> tuple[str, ...]:
        """The columns written by INSERT, in the order of `RowMaker.rows`: `columns` without the aliases."""
        aliases = self.aliases
        return tuple(c for c in self.columns if c not in aliases)

    def key_columns(self) -> tuple[str, ...]:
        """The table's PRIMARY KEY in storage order: the class key (id | pubkey | pubkey, d), then the tag value.

        A reserved column named in `primary_key` stands for the field it aliases, if any.
        """
        by_identity = {column_identity(self, c): c for c in self.primary_key}
        order = _class_key(self.kind) + ((f"tag:{self.row_per_tag}",) if self.row_per_tag else ())
        aliases = self.aliases
        return tuple(aliases.get(by_identity[i], by_identity[i]) for i in order)

    def class_key_columns(self) -> tuple[str, ...]:
        """The leading key columns that identify one event's rows (without the per-tag value)."""
        return self.key_columns()[:len(_class_key(self.kind))]

    def to_dict(self) -> dict[str, Any]:
        """The spec as the TOML table `from_dict` reads (lists for arrays; default-valued keys left out)."""
        out: dict[str, Any] = {"table": self.table, "kind": self.kind, "primary_key": list(self.primary_key)}
        if self.row_per_tag is not None:
            out["row_per_tag"] = self.row_per_tag
        out["revision"] = self.revision
        fields = []
        for f in self.fields:
            d: dict[str, Any] = {"name": f.name, "type": f.type, "source": f.source}
            if f.required:
                d["required"] = True
            if f.default is not None:
                d["default"] = f.default
            fields.append(d)
        out["fields"] = fields
        if self.indexes:
            out["indexes"] = [list(ix) for ix in self.indexes]
        if self.protected:
            out["protected"] = True
        if self.shard_id is not None:
            out["shard_id"] = self.shard_id
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProjectorSpec:
        """Build a spec from one `[[projectors]]` TOML table.

        Keys: table, kind, fields (array of {name, type, source, required?,
        default?}), primary_key, indexes?, row_per_tag?, revision?, protected?.

        Raises:
            SpecError: an unknown or missing key, a value of the wrong type, or
            an invalid spec (see the class docstring).
        """
        if not isinstance(data, dict):
            raise SpecError("projector: must be a table")
        table = data.get("table")
        label = f"projector {table!r}" if isinstance(table, str) else "projector (no table)"
        known = {f.name for f in dataclasses.fields(cls)}  # the keys declared with their docs above
        for key in data:
            if key not in known:
                raise SpecError(f"{label}: unknown key {key!r}")
        for key in ("table", "kind", "fields", "primary_key"):
            if key not in data:
                raise SpecError(f"{label}: missing key {key!r}")
        _expect(label, "table", table, str)
        _expect(label, "kind", data["kind"], int)
        _expect(label, "revision", data.get("revision", 1), int)
        _expect(label, "protected", data.get("protected", False), bool)
        if data.get("shard_id") is not None:
            _expect(label, "shard_id", data["shard_id"], str)
        _expect(label, "fields", data["fields"], list)
        _expect(label, "primary_key", data["primary_key"], list)
        _expect(label, "indexes", data.get("indexes", []), list)
        if data.get("row_per_tag") is not None:
            _expect(label, "row_per_tag", data["row_per_tag"], str)
        for ix in data.get("indexes", []):
            _expect(label, "indexes", ix, list)
        return cls(table=table, kind=data["kind"], fields=tuple(_field_from_dict(table, f) for f in data["fields"]),
                   primary_key=tuple(data["primary_key"]), indexes=tuple(tuple(ix) for ix in data.get("indexes", [])),
                   row_per_tag=data.get("row_per_tag"), revision=data.get("revision", 1),
                   protected=data.get("protected", False), shard_id=data.get("shard_id"))


def spec_hash(spec: ProjectorSpec) -> str:
    """Hex SHA-256 of everything in the spec but its revision, `protected` and `shard_id`, plus ENGINE_VERSION."""
    return _hash_without(spec, ("revision", "protected", "shard_id"))  # retention and sync only: no row depends on them


def shape_hash(spec: ProjectorSpec) -> str:
    """Hex SHA-256 of what `spec_hash` covers but the fields and indexes: two specs of one shape differ only in
    fields and indexes (a spec that only adds fields keeps its rows: projectors/build.py)."""
    return _hash_without(spec, ("revision", "protected", "shard_id", "fields", "indexes"))


def _hash_without(spec: ProjectorSpec, keys: tuple[str, ...]) -> str:
    body = spec.to_dict()
    for key in keys:
        body.pop(key, None)
    body["engine_version"] = ENGINE_VERSION
    return hashlib.sha256(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest()


def _expect(label: str, key: str, value: object, expected: type) -> None:
    if type(value) is not expected:
        raise SpecError(f"{label}: {key} must be {expected.__name__}, got {type(value).__name__} {value!r}")


FIELD_KEYS = tuple(f.name for f in dataclasses.fields(FieldSpec))
"""The keys of one `fields` entry of a `[[projectors]]` table: FieldSpec's fields."""


def _field_from_dict(table: object, data: object) -> FieldSpec:
    label = f"projector {table!r}"
    if not isinstance(data, dict):
        raise SpecError(f"{label}: each field must be a table {{name, type, source}}, got {data!r}")
    name = data.get("name")
    where = f"{label}, field {name!r}"
    for key in data:
        if key not in FIELD_KEYS:
            raise SpecError(f"{where}: unknown key {key!r}")
    for key in ("name", "type", "source"):
        if key not in data:
            raise SpecError(f"{where}: missing key {key!r}")
        _expect(where, key, data[key], str)
    _expect(where, "required", data.get("required", False), bool)
    return FieldSpec(name, data["type"], data["source"], data.get("required", False), data.get("default"))


def _class_key(kind: int) -> tuple[str, ...]:
    if is_replaceable(kind):
        return ("pubkey",)
    if is_addressable(kind):
        return ("pubkey", "tag:d")
    return ("id",)


def column_identity(spec: ProjectorSpec, column: str) -> str:
    """What a key column holds: "id", "pubkey", "tag:NAME" (a tag's first value), or "" for anything else."""
    if column == "_event_id":
        return "id"
    if column == "_pubkey":
        return "pubkey"
    for f in spec.fields:
        if f.name == column:
            return _source_identity(parse_source(f.source))
    return ""


def _validate(spec: ProjectorSpec) -> None:
    label = f"projector {spec.table!r}"
    if type(spec.table) is not str or not _IDENTIFIER.fullmatch(spec.table):
        raise SpecError(f"{label}: table must be a lowercase SQL identifier ([a-z][a-z0-9_]*, at most 63 chars)")
    if spec.table in STORE_TABLES or spec.table.startswith("sqlite"):
        raise SpecError(f"{label}: table name is taken by the store")
    if type(spec.kind) is not int or not 0 <= spec.kind <= MAX_KIND:
        raise SpecError(f"{label}: kind must be an integer 0..{MAX_KIND}, got {spec.kind!r}")
    if is_ephemeral(spec.kind):
        raise SpecError(f"{label}: kind {spec.kind} is ephemeral (never stored), nothing to project")
    if type(spec.revision) is not int or not 0 <= spec.revision <= _INT64_MAX:
        raise SpecError(f"{label}: revision must be an integer from 0 to 2**63 - 1, got {spec.revision!r}")
    if not spec.fields:
        raise SpecError(f"{label}: fields must not be empty")
    if spec.row_per_tag is not None and (type(spec.row_per_tag) is not str or not _TAG_NAME.fullmatch(spec.row_per_tag)):
        raise SpecError(f"{label}: row_per_tag must be a tag name, got {spec.row_per_tag!r}")
    seen: set[str] = set()
    for f in spec.fields:
        _validate_field(spec, label, f, seen)
    _validate_key(spec, label, seen)
    for ix in spec.indexes:
        if not ix:
            raise SpecError(f"{label}: an index must name at least one column")
        for column in ix:
            if type(column) is not str or (column not in seen and column not in RESERVED_COLUMNS):
                raise SpecError(f"{label}: index {list(ix)} names unknown column {column!r}")
        if len(set(ix)) != len(ix):
            raise SpecError(f"{label}: index {list(ix)} repeats a column")


def _validate_field(spec: ProjectorSpec, label: str, f: FieldSpec, seen: set[str]) -> None:
    where = f"{label}, field {f.name!r}"
    if type(f.name) is not str or not _IDENTIFIER.fullmatch(f.name):
        raise SpecError(f"{where}: name must be a lowercase SQL identifier ([a-z][a-z0-9_]*; _-names are reserved)")
    if f.name in seen:
        raise SpecError(f"{where}: declared twice")
    seen.add(f.name)
    if f.type not in TYPES:
        raise SpecError(f"{where}: type must be one of {', '.join(TYPES)}, got {f.type!r}")
    try:
        source = parse_source(f.source)
    except SpecError as exc:
        raise SpecError(f"{where}: {exc}") from None
    except TypeError:
        raise SpecError(f"{where}: source must be a string, got {f.source!r}") from None
    if source.origin == "attribute" and EVENT_ATTRIBUTES[source.name] != f.type:
        raise SpecError(f"{where}: source {f.source!r} needs type {EVENT_ATTRIBUTES[source.name]}, not {f.type}")
    if source.origin == "content" and f.type != "TEXT":
        raise SpecError(f"{where}: source 'content' needs type TEXT, not {f.type}")
    if f.required and f.default is not None:
        raise SpecError(f"{where}: a required field cannot have a default")
    if f.default is not None:
        ok = {"TEXT": (str,), "INTEGER": (int,), "REAL": (int, float)}[f.type]
        if type(f.default) not in ok:
            raise SpecError(f"{where}: default {f.default!r} is not of type {f.type}")
        if not _storable(f.default):
            raise SpecError(f"{where}: default {f.default!r} is out of range")
    if type(f.required) is not bool:
        raise SpecError(f"{where}: required must be true or false")


def _storable(value: object) -> bool:
    """SQLite holds 64-bit integers and specs are hashed as JSON: no bigger integer, no NaN or infinity."""
    if type(value) is int:
        return -_INT64_MAX - 1 <= value <= _INT64_MAX
    return type(value) is not float or math.isfinite(value)


def _validate_key(spec: ProjectorSpec, label: str, fields: set[str]) -> None:
    if not spec.primary_key:
        raise SpecError(f"{label}: primary_key must not be empty")
    for column in spec.primary_key:
        if type(column) is not str or (column not in fields and column not in ("_event_id", "_pubkey")):
            raise SpecError(f"{label}: primary_key names unknown field {column!r}")
    if len(set(spec.primary_key)) != len(spec.primary_key):
        raise SpecError(f"{label}: primary_key repeats a column")
    expected = _class_key(spec.kind) + ((f"tag:{spec.row_per_tag}",) if spec.row_per_tag else ())
    identities = [column_identity(spec, c) for c in spec.primary_key]
    if sorted(identities) != sorted(expected):
        wanted = " + ".join(repr(e) for e in expected)
        got = ", ".join(f"{c} ({i or 'other'})" for c, i in zip(spec.primary_key, identities))
        per_tag = f" with one row per {spec.row_per_tag!r} tag" if spec.row_per_tag else ""
        raise SpecError(f"{label}: primary_key must be the fields whose sources are {wanted}: kind {spec.kind} is "
                        f"{kind_class(spec.kind)}{per_tag}; got {got}")
    if spec.row_per_tag is not None:
        for f in spec.fields:
            source = parse_source(f.source)
            if source.origin == "tag" and source.name == spec.row_per_tag and source.position == 0:
                raise SpecError(f"{label}, field {f.name!r}: position 0 of the row tag is always {spec.row_per_tag!r}")


def parse_specs(tables: object) -> tuple[ProjectorSpec, ...]:
    """Build and check the `[[projectors]]` array of the configuration.

    Raises:
        SpecError: a bad spec (message names projector and field), or two
        projectors writing the same table.
    """
    if not isinstance(tables, list):
        raise SpecError("projectors: must be an array of tables ([[projectors]])")
    specs = tuple(ProjectorSpec.from_dict(t) for t in tables)
    names = [s.table for s in specs]
    for name in names:
        if names.count(name) > 1:
            raise SpecError(f"projector {name!r}: declared twice")
    return specs


__all__ = ["ENGINE_VERSION", "FieldSpec", "ProjectorSpec", "RESERVED_COLUMNS", "Source", "SpecError", "TYPES",
           "column_identity", "parse_source", "parse_specs", "spec_hash"]
