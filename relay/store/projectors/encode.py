"""Records, the writing side's pure core: from rows of a declared projector to the unsigned event that projects to
exactly those rows (no I/O).

How this works.  `encode(spec, rows, pubkey, created_at)` inverts the spec's sources (spec.py): `content` fields
give the content string, `content.*` fields a JSON object, `tag:X[:N]` fields one tag per name X (the value at
position N), the `d` tag first for an addressable kind; a `row_per_tag` projector takes the key's whole set of
rows, one tag of its row tag per row, in order.  Values become what the projection converts back: a JSON string,
integer or number in the content, a string in a tag (an INTEGER 7 is "7").  The fields sourced from `id`,
`created_at`, `pubkey` and `kind` are decided by signing: they may be left out (or None), and any other value
than the signer's is refused.  The candidate event is then projected with the spec's own `RowMaker`, and any
difference from the rows asked for is refused naming the field, so a row with no event that projects to it
never reaches the signer (for example a NULL at a tag position that a later value forces to "", or a NULL for a
field whose absence takes a default).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import orjson

from relay.protocol.event import Event, is_addressable
from relay.store.projectors.rows import Refusal, RowMaker
from relay.store.projectors.spec import FieldSpec, ProjectorSpec, parse_source
from relay.store.records import RecordQueryError

_RESERVED_SOURCES = {"_event_id": "id", "_pubkey": "pubkey", "_created_at": "created_at"}
_PLACEHOLDER_ID = "0" * 64  # the id is unknown before signing; no projected column compared depends on it
_REFUSED_FIELD = re.compile(r"field '([^']+)'")


class RowRefused(RecordQueryError):
    """A row no event projects to; `parameter` names the field at fault (or "row")."""


@dataclass(frozen=True, slots=True)
class Unsigned:
    """An event before signing (NIP-01): `kind`, `tags` (lists of strings), `content`."""

    kind: int
    tags: list[list[str]]
    content: str


def encode(spec: ProjectorSpec, rows: Mapping[str, object] | Sequence[Mapping[str, object]], pubkey: str,
           created_at: int | None = None, extra_tags: Sequence[Sequence[str]] = ()) -> Unsigned:
    """The unsigned event of `spec.kind` that `pubkey` (64 hex) signs at `created_at` (unix seconds; None: not
    known yet) and whose projection is exactly `rows`; `extra_tags` are appended as given.

    `rows`: one row (column -> value) for a projector with one row per event; the key's whole list of rows
    (possibly empty) for a `row_per_tag` projector.  A column left out counts as NULL.

    Raises:
        RowRefused: naming the field (or "row", or "extra_tags" for a tag that is not a list of strings) when no
        such event exists.
    """
    listed = _rows_of(spec, rows)
    for row in listed:
        _check_columns(spec, row, pubkey, created_at)
    shared = [f for f in spec.fields if not _reads_row_tag(spec, f)]
    for f in shared:
        values = {repr(row.get(f.name)) for row in listed}
        if len(values) > 1:
            raise RowRefused(f.name, "differs between rows: one event holds them all")
    first = listed[0] if listed else {}
    tags = _tags(spec, listed, first)
    for tag in extra_tags:
        if isinstance(tag, str) or not all(type(item) is str for item in tag):
            raise RowRefused("extra_tags", f"a tag is a list of strings, got {tag!r}")
        tags.append(list(tag))
    unsigned = Unsigned(spec.kind, tags, _content(spec, first, bool(listed)))
    _check_projection(spec, unsigned, listed, pubkey, created_at)
    return unsigned


def _rows_of(spec: ProjectorSpec, rows: object) -> list[Mapping[str, object]]:
    if spec.row_per_tag is None:
        if not isinstance(rows, Mapping):
            raise RowRefused("row", f"{spec.table} has one row per event: give one row (an object)")
        return [rows]
    if isinstance(rows, Mapping) or not isinstance(rows, Sequence) or not all(isinstance(r, Mapping) for r in rows):
        raise RowRefused("row", f"{spec.table} has one row per {spec.row_per_tag!r} tag: give the key's whole list "
                                "of rows (removing one row is a put of the others)")
    return list(rows)


def _check_columns(spec: ProjectorSpec, row: Mapping[str, object], pubkey: str, created_at: int | None) -> None:
    """Unknown columns, text that is not UTF-8 (a lone surrogate), and values of the columns signing decides,
    refused."""
    attributes = {**_RESERVED_SOURCES, **{f.name: f.source for f in spec.fields
                                          if parse_source(f.source).origin == "attribute"}}
    decided = {"id": None, "pubkey": pubkey, "created_at": created_at, "kind": spec.kind}
    for column, value in row.items():
        if column not in spec.column_types:
            raise RowRefused(column, f"no such column in {spec.table} (columns: {', '.join(spec.columns)})")
        if type(value) is str and not value.isascii():
            try:
                value.encode()
            except UnicodeEncodeError:  # no event holds it: the JSON of an event is UTF-8 (NIP-01)
                raise RowRefused(column, "the text holds a lone surrogate (not valid UTF-8)") from None
        attribute = attributes.get(column)
        if attribute is None or value is None:
            continue
        if value != decided[attribute] or type(value) is not type(decided[attribute]):
            wanted = "leave it out" if decided[attribute] is None else f"the signer's is {decided[attribute]!r}"
            raise RowRefused(column, f"the event's {attribute} is decided by signing ({wanted})")


def _reads_row_tag(spec: ProjectorSpec, f: FieldSpec) -> bool:
    source = parse_source(f.source)
    return source.origin == "tag" and source.name == spec.row_per_tag


def _tags(spec: ProjectorSpec, rows: list[Mapping[str, object]], first: Mapping[str, object]) -> list[list[str]]:
    """The d tag (addressable), the row tags (one per row), then one tag per other tag name, in field order."""
    by_name: dict[str, list[FieldSpec]] = {}
    for f in spec.fields:
        source = parse_source(f.source)
        if source.origin == "tag":
            by_name.setdefault(source.name, []).append(f)
    tags = []
    if is_addressable(spec.kind) and "d" in by_name:  # NIP-01: the d tag names the coordinate
        tags.append(_tag("d", by_name.pop("d"), first, required=True))
    if spec.row_per_tag is not None:
        fields = by_name.pop(spec.row_per_tag, [])
        tags += [_tag(spec.row_per_tag, fields, row, required=True) for row in rows]
    for name, fields in by_name.items():
        tag = _tag(name, fields, first, required=False)
        if tag is not None:
            tags.append(tag)
    return tags


def _tag(name: str, fields: list[FieldSpec], row: Mapping[str, object], required: bool) -> list[str] | None:
    """The tag `[name, value1, ...]` holding `row`'s values of `fields` at their positions; None when it holds none
    but defaults (absent, the projection takes them) and is not `required`."""
    at: dict[int, str] = {}
    needed = []  # positions whose value only a present item gives (not NULL, not the default)
    for f in fields:
        position, value = parse_source(f.source).position, row.get(f.name)
        if value is None:
            continue
        text = _as_text(f, value)
        if position == 0 and text != name:
            raise RowRefused(f.name, f"position 0 of a {name!r} tag is always {name!r}")
        at[position] = text
        if value != f.default:
            needed.append(position)
    if not needed and not required:
        return None
    length = max([1, *needed]) + 1
    for f in fields:
        position = parse_source(f.source).position
        if row.get(f.name) is None and 0 < position < length:
            raise RowRefused(f.name, f"NULL where the tag position is forced to \"\" (a {name!r} tag holds a value "
                                     "after it, or is the row's tag)")
    return [name] + [at.get(i, "") for i in range(1, length)]


def _as_text(f: FieldSpec, value: object) -> str:
    """A tag item for `value`, which the projection converts back to `value` (INTEGER 7 -> "7")."""
    _check_type(f, value)
    return value if type(value) is str else repr(value) if type(value) is float else str(value)


def _check_type(f: FieldSpec, value: object) -> None:
    ok = {"TEXT": type(value) is str, "INTEGER": type(value) is int and -2**63 <= value < 2**63,
          "REAL": type(value) in (int, float) and math.isfinite(value)}[f.type]
    if not ok:
        raise RowRefused(f.name, f"expected {f.type}, got {value!r}")


def _content(spec: ProjectorSpec, row: Mapping[str, object], any_row: bool) -> str:
    """The content string: a `content` field's value, else the JSON object of the `content.*` fields ("" if none;
    with no row at all, "" or "{}")."""
    whole = next((f for f in spec.fields if parse_source(f.source).origin == "content"), None)
    if whole is not None and any_row:
        value = row.get(whole.name)
        if type(value) is not str:
            raise RowRefused(whole.name, f"the content is text, got {value!r}")
        return value
    paths = [(f, parse_source(f.source).path) for f in spec.fields if parse_source(f.source).origin == "json"]
    if not paths:
        return ""
    if not any_row:
        return "{}"
    obj: dict = {}
    for f, path in paths:
        value = row.get(f.name)
        if value is None:
            continue  # absent: the projection takes NULL or the default, which the check below compares
        _check_type(f, value)
        node = obj
        for key in path[:-1]:
            node = node.setdefault(key, {})
            if type(node) is not dict:
                raise RowRefused(f.name, f"content.{'.'.join(path)} lies inside another field's value")
        if type(node.get(path[-1])) is dict:
            raise RowRefused(f.name, f"content.{'.'.join(path)} holds other fields")
        node[path[-1]] = value
    return orjson.dumps(obj).decode()


def _check_projection(spec: ProjectorSpec, unsigned: Unsigned, rows: list[Mapping[str, object]], pubkey: str,
                      created_at: int | None) -> None:
    """Project the candidate event with the spec's own rules; refuse naming the first field that differs."""
    d_tag = next((t[1] for t in unsigned.tags if len(t) > 1 and t[0] == "d"), "")
    event = Event(_PLACEHOLDER_ID, pubkey, 0 if created_at is None else created_at, unsigned.kind, unsigned.tags,
                  unsigned.content, "", b"", d_tag, None)
    try:
        got = RowMaker(spec).rows(event)
    except Refusal as refusal:
        found = _REFUSED_FIELD.search(refusal.reason)
        raise RowRefused(found.group(1) if found else "row", f"the event would not be projected: {refusal.reason}") \
            from None
    if len(got) != len(rows):
        raise RowRefused(_row_tag_field(spec), f"the event would project to {len(got)} rows, not {len(rows)} "
                                               "(a repeated key value, or an extra tag)")
    skip = _decided_columns(spec)
    for row, values in zip(rows, got):
        for column, value in zip(spec.stored_columns, values):
            if column not in skip and row.get(column) != value:
                raise RowRefused(column, f"no event projects to {row.get(column)!r} here (it would read {value!r})")


def _row_tag_field(spec: ProjectorSpec) -> str:
    """The key field holding the row tag's value (`tag:X`, position 1), or "row" for a projector of one row per event."""
    return next((f.name for f in spec.fields if _reads_row_tag(spec, f) and parse_source(f.source).position == 1),
                "row")


def _decided_columns(spec: ProjectorSpec) -> set[str]:
    """Columns that signing decides (sourced from an event attribute): `_check_columns` checked them."""
    return set(_RESERVED_SOURCES) | {f.name for f in spec.fields if parse_source(f.source).origin == "attribute"}


__all__ = ["RowRefused", "Unsigned", "encode"]
