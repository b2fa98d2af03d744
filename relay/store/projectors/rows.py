"""Rows of a projected table, computed from one event in Python (pure: no SQL).

`RowMaker(spec).rows(event)` returns the rows one event projects to, as
tuples in `spec.columns` order, or raises `Refusal` when the event cannot be
projected (content that is not a JSON object, a required value missing, a
value of the wrong type).  The result depends on the event alone, which is
what lets every node compute the same table from the same events.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

import orjson

from relay.protocol.event import Event, is_addressable
from relay.store.projectors.spec import ProjectorSpec, Source, parse_source

_INT64 = 2**63
_DECIMAL = re.compile(r"-?[0-9]{1,19}")
_NUMBER = re.compile(r"-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?")
_MISSING = object()


class Refusal(Exception):
    """An event that cannot be projected; `reason` says why (recorded in the refusal log)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def stored_event(raw: str | bytes) -> Event:
    """An `Event` from the canonical JSON the store keeps in `events.raw` (already validated: no checks).

    `d_tag` is the first `d` tag's value ("" when none), as at insertion; `expiration` is left None.
    """
    obj = orjson.loads(raw)
    tags = obj["tags"]
    d_tag = next((t[1] for t in tags if len(t) > 1 and t[0] == "d"), "")
    return Event(obj["id"], obj["pubkey"], obj["created_at"], obj["kind"], tags, obj["content"], obj["sig"],
                 raw if isinstance(raw, bytes) else raw.encode(), d_tag, None)


def _describe(value: object) -> str:
    kind = {bool: "boolean", int: "integer", float: "number", str: "text", dict: "object", list: "array"}
    text = repr(value)
    return f"{kind.get(type(value), type(value).__name__)} {text[:40] + '...' if len(text) > 40 else text}"


def to_text(value: object) -> str:
    """TEXT: a string only."""
    if type(value) is str:
        return value
    raise TypeError


def to_integer(value: object) -> int:
    """INTEGER: a JSON integer or a decimal string (e.g. a tag's "1700000000"), within 64-bit range."""
    if type(value) is int:
        result = value
    elif type(value) is str and _DECIMAL.fullmatch(value):
        result = int(value)
    else:
        raise TypeError
    if not -_INT64 <= result < _INT64:
        raise TypeError
    return result


def to_real(value: object) -> float:
    """REAL: a finite JSON number or numeric string."""
    if type(value) in (int, float):
        result = float(value)
    elif type(value) is str and len(value) <= 64 and _NUMBER.fullmatch(value):
        result = float(value)
    else:
        raise TypeError
    if not math.isfinite(result):
        raise TypeError
    return result


CONVERTERS: dict[str, Callable[[object], object]] = {"TEXT": to_text, "INTEGER": to_integer, "REAL": to_real}

# A getter reads one raw value from (event, parsed JSON content or None, the row's tag or None).
Getter = Callable[[Event, object, list | None], object]


def _tag_getter(source: Source, spec: ProjectorSpec) -> Getter:
    name, position = source.name, source.position
    if name == spec.row_per_tag:
        return lambda e, c, t: t[position] if len(t) > position else None
    if name == "d" and position == 1 and is_addressable(spec.kind):
        # NIP-01: an addressable event without a d tag has the coordinate d = "".
        return lambda e, c, t: e.d_tag

    def first_tag(e: Event, c: object, t: list | None) -> object:
        """The value at `position` of the first tag called `name` that has a value, else None."""
        for tag in e.tags:
            if len(tag) > 1 and tag[0] == name:
                return tag[position] if len(tag) > position else None
        return None

    return first_tag


def _json_getter(path: tuple[str, ...]) -> Getter:
    def walk(e: Event, c: object, t: list | None) -> object:
        """The value at `path` in the parsed content (digits index arrays), else None."""
        for key in path:
            if type(c) is dict:
                c = c.get(key)
            elif type(c) is list and key.isascii() and key.isdigit() and int(key) < len(c):
                c = c[int(key)]
            else:
                return None
        return c

    return walk


def getter(source: Source, spec: ProjectorSpec) -> Getter:
    """The function reading `source`'s raw value (None when absent) for `spec`'s rows."""
    if source.origin == "attribute":
        name = source.name
        return lambda e, c, t: getattr(e, name)
    if source.origin == "content":
        return lambda e, c, t: e.content
    if source.origin == "json":
        return _json_getter(source.path)
    return _tag_getter(source, spec)


class RowMaker:
    """The rows of `spec`'s table for one event (see module docstring)."""

    def __init__(self, spec: ProjectorSpec) -> None:
        self.spec = spec
        self.needs_json = any(parse_source(f.source).origin == "json" for f in spec.fields)
        self.row_tag = spec.row_per_tag
        aliases = spec.aliases
        # Reserved columns that are stored (not aliases of a field), as event attributes.
        self._head = tuple(attribute for column, attribute in
                           (("_event_id", "id"), ("_pubkey", "pubkey"), ("_created_at", "created_at"))
                           if column not in aliases)
        self._fields = [(f.name, getter(parse_source(f.source), spec), _converter(f), f.required,
                         None if f.default is None else CONVERTERS[f.type](f.default), f.type) for f in spec.fields]
        # The fast path of `_values`: when no field converts, requires or defaults, just the getters.
        simple = all(convert is None and default is None and (not required or _always_present(f, spec))
                     for f, (_, _, convert, required, default, _) in zip(spec.fields, self._fields))
        self._plain = [get for _, get, *_ in self._fields] if simple else None

    def rows(self, event: Event) -> list[tuple]:
        """The rows `event` projects to, in `spec.stored_columns` order (none for a per-tag projector without
        such tags).

        Raises:
            Refusal: the event cannot be projected; no row of it may be stored.
        """
        content = None
        if self.needs_json:
            try:
                content = orjson.loads(event.content)
            except orjson.JSONDecodeError:
                raise Refusal("content is not valid JSON") from None
            if type(content) is not dict:
                raise Refusal("content is not a JSON object")
        head = tuple(getattr(event, attribute) for attribute in self._head)
        if self.row_tag is None:
            return [head + self._values(event, content, None)]
        rows, seen, name = [], set(), self.row_tag
        for tag in event.tags:
            # One row per distinct value: the first occurrence of a value wins.
            if len(tag) > 1 and tag[0] == name and tag[1] not in seen:
                seen.add(tag[1])
                rows.append(head + self._values(event, content, tag))
        return rows

    def _values(self, event: Event, content: object, tag: list | None) -> tuple:
        if self._plain:  # every value is of the right type already, and nothing is required
            return tuple([get(event, content, tag) for get in self._plain])
        values = []
        for name, get, convert, required, default, type_ in self._fields:
            value = get(event, content, tag)
            if value is None:
                if required:
                    raise Refusal(f"field {name!r}: required value is missing")
                values.append(default)
                continue
            if convert is None:
                values.append(value)
                continue
            try:
                values.append(convert(value))
            except TypeError:
                raise Refusal(f"field {name!r}: expected {type_}, got {_describe(value)}") from None
        return tuple(values)


def _always_present(f, spec: ProjectorSpec) -> bool:
    """True when the field's source never lacks a value: an attribute, the content, the row tag's name or value."""
    source = parse_source(f.source)
    return source.origin in ("attribute", "content") or (
        source.origin == "tag" and source.name == spec.row_per_tag and source.position <= 1)


def _converter(f) -> Callable[[object], object] | None:
    """The field's conversion, or None when its source always yields the right type already (event
    attributes, checked against the type by the spec; the content string; tag items, which are strings)."""
    origin = parse_source(f.source).origin
    if origin in ("attribute", "content") or (origin == "tag" and f.type == "TEXT"):
        return None
    return CONVERTERS[f.type]
