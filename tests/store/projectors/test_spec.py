"""ProjectorSpec validation (Python and TOML) and row computation from single events (no database)."""

from __future__ import annotations

import pytest

from relay.config import ConfigError, load_config
from relay.store.projectors import BUILTIN_PROJECTORS, FieldSpec, ProjectorSpec, Refusal, RowMaker, SpecError
from relay.store.projectors.spec import spec_hash
from tests.helpers import Keys
from tests.store.projectors.common import event

ALICE = Keys(0xA11CE)


def spec(**overrides) -> ProjectorSpec:
    """A valid addressable spec with `overrides` applied."""
    values = dict(table="notes", kind=30023, primary_key=("pubkey", "d"),
                  fields=(FieldSpec("pubkey", "TEXT", "pubkey"), FieldSpec("d", "TEXT", "tag:d"),
                          FieldSpec("title", "TEXT", "tag:title")))
    values.update(overrides)
    return ProjectorSpec(**values)


@pytest.mark.parametrize("overrides, message", [
    (dict(kind=0), "primary_key must be the fields whose sources are 'pubkey': kind 0 is replaceable"),
    (dict(kind=1), "primary_key must be the fields whose sources are 'id': kind 1 is regular"),
    (dict(primary_key=("pubkey",)), "'pubkey' + 'tag:d': kind 30023 is addressable"),
    (dict(primary_key=("pubkey", "d", "title")), "kind 30023 is addressable"),
    (dict(primary_key=("pubkey", "nope")), "primary_key names unknown field 'nope'"),
    (dict(kind=20001), "kind 20001 is ephemeral"),
    (dict(table="events"), "table name is taken by the store"),
    (dict(table="Bad-Name"), "table must be a lowercase SQL identifier"),
    (dict(fields=(FieldSpec("pubkey", "TEXT", "pubkey"), FieldSpec("d", "TEXT", "tag:d"),
                  FieldSpec("title", "TXT", "tag:title"))), "field 'title': type must be one of TEXT, INTEGER, REAL"),
    (dict(fields=(FieldSpec("pubkey", "TEXT", "pubkey"), FieldSpec("d", "TEXT", "tag:d"),
                  FieldSpec("title", "TEXT", "tags:title"))), "field 'title': unknown source 'tags:title'"),
    (dict(fields=(FieldSpec("pubkey", "TEXT", "pubkey"), FieldSpec("d", "TEXT", "tag:d"),
                  FieldSpec("at", "TEXT", "created_at"))), "field 'at': source 'created_at' needs type INTEGER"),
    (dict(fields=(FieldSpec("pubkey", "TEXT", "pubkey"), FieldSpec("d", "TEXT", "tag:d"),
                  FieldSpec("d", "TEXT", "tag:x"))), "field 'd': declared twice"),
    (dict(fields=(FieldSpec("pubkey", "TEXT", "pubkey"), FieldSpec("d", "TEXT", "tag:d"),
                  FieldSpec("_event_id", "TEXT", "id"))), "field '_event_id': name must be a lowercase SQL identifier"),
    (dict(fields=(FieldSpec("pubkey", "TEXT", "pubkey"), FieldSpec("d", "TEXT", "tag:d"),
                  FieldSpec("n", "INTEGER", "tag:n", default="x"))), "field 'n': default 'x' is not of type INTEGER"),
    (dict(fields=(FieldSpec("pubkey", "TEXT", "pubkey"), FieldSpec("d", "TEXT", "tag:d"),
                  FieldSpec("n", "INTEGER", "tag:n", required=True, default=1))), "field 'n': a required field"),
    (dict(indexes=(("missing",),)), "index ['missing'] names unknown column 'missing'"),
])
def test_invalid_spec_is_refused_naming_projector_and_field(overrides, message):
    """Each invalid spec raises SpecError whose message names the projector (and field) and says why."""
    with pytest.raises(SpecError) as info:
        spec(**overrides)
    assert str(info.value).startswith("projector 'notes'") or str(info.value).startswith("projector 'Bad-Name'") \
        or "'events'" in str(info.value)
    assert message in str(info.value)


def test_per_tag_key_must_include_the_tag_value():
    """A row_per_tag projector keys on the class key plus that tag's value, nothing else."""
    fields = (FieldSpec("pubkey", "TEXT", "pubkey"), FieldSpec("followed", "TEXT", "tag:p"))
    ok = ProjectorSpec("f", 3, fields, ("followed", "pubkey"), row_per_tag="p")
    assert ok.key_columns() == ("pubkey", "followed")  # storage order: class key first
    with pytest.raises(SpecError, match="'pubkey' \\+ 'tag:p': kind 3 is replaceable with one row per 'p' tag"):
        ProjectorSpec("f", 3, fields, ("pubkey",), row_per_tag="p")


def test_reserved_columns_may_form_the_key():
    """`_pubkey` / `_event_id` count as the pubkey / id sources in a primary key."""
    s = ProjectorSpec("reactions", 7, (FieldSpec("emoji", "TEXT", "content"),), ("_event_id",))
    assert s.columns == ("_event_id", "_pubkey", "_created_at", "emoji")


def toml_config(tmp_path, text: str):
    path = tmp_path / "relay.toml"
    path.write_text(text)
    return load_config(path)


def test_toml_projector_errors_name_projector_and_field(tmp_path):
    """A bad [[projectors]] table stops the configuration with the projector, the field and the reason."""
    bad = """
[[projectors]]
table = "zaps"
kind = 9735
primary_key = ["id"]
fields = [ { name = "id", type = "TEXT", source = "id" }, { name = "amount", type = "INTEGER", source = "tag:amount:x" } ]
"""
    with pytest.raises(ConfigError, match="projectors: projector 'zaps', field 'amount': bad tag position"):
        toml_config(tmp_path, bad)
    with pytest.raises(ConfigError, match="projector 'zaps': unknown key 'colour'"):
        toml_config(tmp_path, bad.replace('kind = 9735', 'kind = 9735\ncolour = "red"'))
    with pytest.raises(ConfigError, match="projector 'zaps', field 'id': missing key 'type'"):
        toml_config(tmp_path, bad.replace('type = "TEXT", source = "id"', 'source = "id"'))
    with pytest.raises(ConfigError, match="projector 'zaps': declared twice"):
        good = bad.replace("tag:amount:x", "tag:amount")
        toml_config(tmp_path, good + good)


def test_toml_projectors_replace_the_builtin_ones(tmp_path):
    """[[projectors]] in the file are the projectors; `projectors = []` means none; absent means built-in."""
    config = toml_config(tmp_path, """
[[projectors]]
table = "zaps"
kind = 9735
primary_key = ["id"]
revision = 3
fields = [ { name = "id", type = "TEXT", source = "id" }, { name = "amount", type = "INTEGER", source = "tag:amount" } ]
""")
    assert [s.table for s in config.projectors] == ["zaps"] and config.projectors[0].revision == 3
    assert toml_config(tmp_path, "projectors = []\n[log]\nlevel = 'info'\n").projectors == ()
    assert toml_config(tmp_path, "[log]\nlevel = 'info'\n").projectors == BUILTIN_PROJECTORS


def test_spec_round_trips_through_its_dict_and_hash_ignores_revision():
    """from_dict(to_dict(spec)) == spec; the hash changes with the spec, not with the revision."""
    for s in BUILTIN_PROJECTORS:
        assert ProjectorSpec.from_dict(s.to_dict()) == s
    profiles = BUILTIN_PROJECTORS[0]
    bumped = ProjectorSpec.from_dict({**profiles.to_dict(), "revision": 2})
    assert spec_hash(bumped) == spec_hash(profiles)
    grown = ProjectorSpec.from_dict({**profiles.to_dict(), "fields": profiles.to_dict()["fields"]
                                     + [{"name": "website", "type": "TEXT", "source": "content.website"}]})
    assert spec_hash(grown) != spec_hash(profiles)


# ------------------------------------------------------------------ rows of one event

def test_tag_and_content_sources_and_conversions():
    """Tag positions, JSON paths, whole content and INTEGER/REAL conversion of strings."""
    s = ProjectorSpec("things", 1, (
        FieldSpec("id", "TEXT", "id"), FieldSpec("kind", "INTEGER", "kind"), FieldSpec("at", "INTEGER", "created_at"),
        FieldSpec("name", "TEXT", "tag:name"), FieldSpec("third", "TEXT", "tag:x:2"), FieldSpec("tagname", "TEXT", "tag:x:0"),
        FieldSpec("n", "INTEGER", "tag:n"), FieldSpec("r", "REAL", "content.score"),
        FieldSpec("deep", "TEXT", "content.a.b"), FieldSpec("first", "TEXT", "content.list.0"),
        FieldSpec("raw", "TEXT", "content"), FieldSpec("missing", "TEXT", "content.none", default="dflt"),
    ), ("id",))
    content = '{"score": "2.5", "a": {"b": "deep"}, "list": ["zero"]}'
    e = event(ALICE, 1, content, [["name", "first"], ["name", "second"], ["x", "1", "2"], ["n", "-42"]], 77)
    [row] = RowMaker(s).rows(e)
    # _event_id and _created_at repeat the fields id and at: generated columns, not in the stored row
    assert s.stored_columns[:4] == ("_pubkey", "id", "kind", "at")
    assert row == (e.pubkey, e.id, 1, 77, "first", "2", "x", -42, 2.5, "deep", "zero", content, "dflt")


@pytest.mark.parametrize("content, tags, reason", [
    ("not json", [], "content is not valid JSON"),
    ("[1, 2]", [], "content is not a JSON object"),
    ('{"title": 5}', [], "field 'title': expected TEXT, got integer 5"),
    ('{"title": "t"}', [["n", "12x"]], "field 'n': expected INTEGER, got text '12x'"),
    ('{}', [], "field 'title': required value is missing"),
])
def test_unprojectable_event_raises_refusal(content, tags, reason):
    """Content that is not a JSON object, a wrong type or a missing required value refuse the event."""
    s = ProjectorSpec("t", 1, (FieldSpec("id", "TEXT", "id"), FieldSpec("title", "TEXT", "content.title", True),
                               FieldSpec("n", "INTEGER", "tag:n")), ("id",))
    with pytest.raises(Refusal) as info:
        RowMaker(s).rows(event(ALICE, 1, content, tags))
    assert info.value.reason == reason


def test_one_row_per_distinct_tag_value_first_occurrence_wins():
    """follows: one row per p value; a repeated value keeps its first tag's relay and petname."""
    follows = BUILTIN_PROJECTORS[1]
    e = event(ALICE, 3, "", [["p", "aa", "wss://one", "first"], ["e", "zz"], ["p", "bb"], ["p", "aa", "wss://two"],
                             ["p"]])
    rows = RowMaker(follows).rows(e)
    assert [r[2:] for r in rows] == [(ALICE.pubkey, "aa", "wss://one", "first"), (ALICE.pubkey, "bb", None, None)]


def test_addressable_event_without_d_tag_has_empty_d():
    """NIP-01: the d of an addressable event without a d tag is "" (the coordinate's), never NULL."""
    [row] = RowMaker(BUILTIN_PROJECTORS[3]).rows(event(ALICE, 30023, "body", [["title", "T"], ["published_at", "17"]]))
    assert row[2:] == (ALICE.pubkey, "", "T", None, None, 17)
