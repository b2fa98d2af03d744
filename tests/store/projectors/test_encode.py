"""The records encoder (relay/store/projectors/encode.py): a row of a declared projector to the unsigned event whose
projection is exactly that row, and refusals naming the field for rows no event projects to."""

from __future__ import annotations

import hashlib

import orjson
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from relay.protocol.event import Event, is_addressable, is_replaceable
from relay.store.projectors.builtin import ARTICLES, BUILTIN_PROJECTORS, FOLLOWS, PROFILES
from relay.store.projectors.encode import RowRefused, encode
from relay.store.projectors.rows import Refusal, RowMaker
from relay.store.projectors.spec import FieldSpec, ProjectorSpec

PUBKEY = "ab" * 32
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
TAG_NAMES = ("d", "p", "r", "t", "x", "title", "summary", "image", "published_at")


def _event(kind: int, tags: list, content: str, created_at: int = 1_700_000_000, pubkey: str = PUBKEY) -> Event:
    """An Event as the store reads it (id computed; the projection never looks at the signature)."""
    preimage = orjson.dumps([0, pubkey, created_at, kind, tags, content])
    d_tag = next((t[1] for t in tags if len(t) > 1 and t[0] == "d"), "")
    return Event(hashlib.sha256(preimage).hexdigest(), pubkey, created_at, kind, tags, content, "", preimage, d_tag,
                 None)


def _rows(spec: ProjectorSpec, event: Event) -> list[dict]:
    return [dict(zip(spec.stored_columns, r)) for r in RowMaker(spec).rows(event)]


def _without_id(spec: ProjectorSpec, row: dict) -> dict:
    """The row without the columns holding the event id (unknown before signing: the encoder refuses them)."""
    ids = {"_event_id"} | {f.name for f in spec.fields if f.source == "id"}
    return {c: v for c, v in row.items() if c not in ids}


def _round_trip(spec: ProjectorSpec, event: Event) -> None:
    """project(sign(encode(project(event)))) == project(event), but for the id."""
    rows = [_without_id(spec, r) for r in _rows(spec, event)]
    given_rows = rows if spec.row_per_tag else rows[0]
    unsigned = encode(spec, given_rows, event.pubkey, event.created_at)
    again = _event(unsigned.kind, unsigned.tags, unsigned.content, event.created_at, event.pubkey)
    assert [_without_id(spec, r) for r in _rows(spec, again)] == rows
    # and the new event's id is where the spec reads the id
    assert all(r.get("_event_id", again.id) == again.id for r in _rows(spec, again))


_items = st.one_of(st.from_regex(r"[0-9]{1,3}", fullmatch=True), st.sampled_from(["", "a", "b", "ab", "1.5"]),
                   st.text(max_size=4))
_tags = st.lists(st.lists(_items, min_size=0, max_size=4).flatmap(
    lambda rest: st.sampled_from(TAG_NAMES).map(lambda name: [name, *rest])), max_size=8)
_json_values = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), st.floats(allow_nan=False,
                         allow_infinity=False, width=32), st.text(max_size=5), st.lists(st.integers(-9, 9), max_size=2))
_content = st.one_of(
    st.dictionaries(st.sampled_from(["name", "about", "picture", "display_name", "nip05", "lud16", "a", "b", "zz"]),
                    _json_values, max_size=6).map(lambda d: orjson.dumps(d).decode()),
    st.fixed_dictionaries({"a": _json_values, "n": st.fixed_dictionaries({"c": _json_values})}).map(
        lambda d: orjson.dumps(d).decode()),
    st.text(max_size=8))


def _projectable(spec: ProjectorSpec, event: Event) -> bool:
    try:
        rows = RowMaker(spec).rows(event)
    except Refusal:
        return False
    return bool(rows) or spec.row_per_tag is not None


@pytest.mark.parametrize("spec", BUILTIN_PROJECTORS, ids=lambda s: s.table)
@SETTINGS
@given(tags=_tags, content=_content, created_at=st.integers(0, 2**40))
def test_a_built_in_projectors_rows_encode_to_an_event_that_projects_to_them(spec, tags, content, created_at):
    """For random events of the kind: the rows they project to encode to an event projecting to the same rows."""
    event = _event(spec.kind, tags, content, created_at)
    assume(_projectable(spec, event))
    _round_trip(spec, event)


_POOL = (FieldSpec("a", "TEXT", "content.a"), FieldSpec("c", "REAL", "content.n.c"),
         FieldSpec("b", "INTEGER", "content.b", default=7), FieldSpec("t1", "TEXT", "tag:t"),
         FieldSpec("t2", "INTEGER", "tag:t:2"), FieldSpec("t3", "TEXT", "tag:t:3", default="z"),
         FieldSpec("t0", "TEXT", "tag:t:0"), FieldSpec("when", "INTEGER", "created_at"),
         FieldSpec("k", "INTEGER", "kind"), FieldSpec("body", "TEXT", "content"), FieldSpec("pk", "TEXT", "pubkey"),
         FieldSpec("req", "TEXT", "tag:title", required=True))


@st.composite
def _specs(draw) -> ProjectorSpec:
    """A projector of a random kind class, with or without one row per `x` tag, and fields drawn from _POOL."""
    kind = draw(st.sampled_from([1111, 10111, 30111]))
    fields, key = [], []
    if is_replaceable(kind) or is_addressable(kind):
        fields.append(FieldSpec("author", "TEXT", "pubkey"))
        key.append("author")
    else:
        fields.append(FieldSpec("eid", "TEXT", "id"))
        key.append("eid")
    if is_addressable(kind):
        fields.append(FieldSpec("d", "TEXT", "tag:d"))
        key.append("d")
    row_tag = draw(st.sampled_from([None, "x"]))
    if row_tag:
        fields.append(FieldSpec("item", "TEXT", "tag:x", required=True))
        fields.append(FieldSpec("item_n", draw(st.sampled_from(["TEXT", "INTEGER"])), "tag:x:2"))
        key.append("item")
    fields += draw(st.lists(st.sampled_from([f for f in _POOL if f.source != "pubkey" or "author" not in key]),
                            unique=True, min_size=1, max_size=6))
    return ProjectorSpec(table="generated", kind=kind, fields=tuple(fields), primary_key=tuple(key), row_per_tag=row_tag)


@SETTINGS
@given(spec=_specs(), tags=_tags.map(lambda ts: ts + [["x", "1", "2"], ["x", "2"]]), content=_content,
       created_at=st.integers(0, 2**40))
def test_a_generated_projectors_rows_encode_to_an_event_that_projects_to_them(spec, tags, content, created_at):
    """The same round trip for generated specs (content, JSON paths, tag positions, attributes, row tags)."""
    event = _event(spec.kind, tags, content, created_at)
    assume(_projectable(spec, event))
    _round_trip(spec, event)


_row_values = st.dictionaries(st.sampled_from([f.name for f in _POOL] + ["d", "item", "item_n"]),
                              st.one_of(st.none(), st.integers(-5, 5), st.text(max_size=3)), max_size=6)


@SETTINGS
@given(spec=_specs(), drawn=st.lists(_row_values, min_size=1, max_size=3))
def test_any_row_either_round_trips_or_is_refused_naming_a_column(spec, drawn):
    """Arbitrary rows are refused naming one of the table's columns (or "row"), or their event projects to them."""
    rows = [{c: v for c, v in values.items() if c in spec.column_types} for values in drawn]
    if spec.row_per_tag is None:
        rows = rows[:1]
    try:
        unsigned = encode(spec, rows if spec.row_per_tag else rows[0], PUBKEY, 1_000)
    except RowRefused as refusal:
        assert refusal.parameter in (*spec.columns, "row"), refusal
        return
    got = _rows(spec, _event(unsigned.kind, unsigned.tags, unsigned.content, 1_000))
    decided = {"_event_id", "_pubkey", "_created_at"} | {f.name for f in spec.fields if f.source in
                                                         ("id", "pubkey", "created_at", "kind")}
    assert [{c: v for c, v in r.items() if c not in decided} for r in got] == \
        [{c: row.get(c) for c in spec.stored_columns if c not in decided} for row in rows]


def _refused(spec, rows, **kwargs) -> RowRefused:
    with pytest.raises(RowRefused) as caught:
        encode(spec, rows, PUBKEY, **kwargs)
    return caught.value


def test_a_null_where_the_tag_position_is_forced_to_empty_is_refused_naming_the_field():
    """follows: a petname without a relay needs relay = "" (NIP-02 tag ["p", key, "", name]); NULL is refused."""
    refusal = _refused(FOLLOWS, [{"followed": "aa" * 32, "petname": "bob"}])
    assert refusal.parameter == "relay" and "forced" in refusal.message
    tags = encode(FOLLOWS, [{"followed": "aa" * 32, "relay": "", "petname": "bob"}], PUBKEY).tags
    assert tags == [["p", "aa" * 32, "", "bob"]]


@pytest.mark.parametrize("column, value", [("_event_id", "cd" * 32), ("_created_at", 5), ("pubkey", "cd" * 32),
                                           ("_pubkey", "cd" * 32)])
def test_a_value_that_signing_decides_is_refused_naming_the_field(column, value):
    """id, created_at and a pubkey other than the signer's are decided by signing, not by the row."""
    assert _refused(PROFILES, {"name": "x", column: value}).parameter == column


def test_the_signers_own_pubkey_and_created_at_are_accepted():
    """A row read back (get_record) carries the signer's pubkey: putting it again is fine."""
    unsigned = encode(PROFILES, {"pubkey": PUBKEY, "_created_at": 9, "name": "x"}, PUBKEY, 9)
    assert (unsigned.kind, unsigned.content) == (0, '{"name":"x"}')


def test_a_required_null_an_unknown_column_and_a_wrong_type_are_refused_by_name():
    """Each refusal names its column."""
    assert _refused(FOLLOWS, [{"followed": None}]).parameter == "followed"
    assert _refused(PROFILES, {"nickname": "x"}).parameter == "nickname"
    assert _refused(ARTICLES, {"d": "a", "published_at": "soon"}).parameter == "published_at"


def test_a_null_for_a_field_with_a_default_is_refused():
    """Absent, the field takes its default: NULL is never projected."""
    spec = ProjectorSpec("notes", 30001, (FieldSpec("pubkey", "TEXT", "pubkey"), FieldSpec("d", "TEXT", "tag:d"),
                                          FieldSpec("level", "INTEGER", "content.level", default=3)),
                         ("pubkey", "d"))
    assert _refused(spec, {"d": "x", "level": None}).parameter == "level"
    assert encode(spec, {"d": "x", "level": 3}, PUBKEY).content == '{"level":3}'


def test_one_row_per_tag_takes_the_whole_set_and_refuses_a_shared_field_that_differs():
    """follows: the list is the whole set (a repeated key is refused); the follower is one for every row."""
    unsigned = encode(FOLLOWS, [{"followed": "aa" * 32}, {"followed": "bb" * 32, "relay": "wss://r"}], PUBKEY)
    assert unsigned.tags == [["p", "aa" * 32], ["p", "bb" * 32, "wss://r"]]
    assert encode(FOLLOWS, [], PUBKEY).tags == []
    assert _refused(FOLLOWS, [{"followed": "aa" * 32}, {"followed": "aa" * 32}]).parameter == "followed"
    assert _refused(FOLLOWS, {"followed": "aa" * 32}).parameter == "row"
    spec = ProjectorSpec("lists", 10005, (FieldSpec("pubkey", "TEXT", "pubkey"), FieldSpec("item", "TEXT", "tag:x"),
                                          FieldSpec("title", "TEXT", "content.title")), ("pubkey", "item"),
                         row_per_tag="x")
    assert _refused(spec, [{"item": "a", "title": "one"}, {"item": "b", "title": "two"}]).parameter == "title"


def test_an_extra_tag_that_changes_the_projection_is_refused():
    """extra_tags are part of the event: one that adds a row or changes a value is refused."""
    assert _refused(FOLLOWS, [{"followed": "aa" * 32}], extra_tags=[["p", "bb" * 32]]).parameter == "followed"
    assert encode(ARTICLES, {"d": "a"}, PUBKEY, extra_tags=[["t", "news"]]).tags == [["d", "a"], ["t", "news"]]
    assert _refused(ARTICLES, {"d": "a"}, extra_tags=[["t", 1]]).parameter == "extra_tags"
