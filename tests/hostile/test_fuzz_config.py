"""Fuzz configuration loading: any TOML text and environment give a Config or `ConfigError`, nothing else.

Inputs: config/relay.toml with values replaced by random TOML values
(numbers at the edges, nan/inf, datetimes, strings, arrays, inline tables),
random `[[sync.peers]]`, `[negentropy] filters` and `[[projectors]]` tables,
random bytes as the file, and random `RELAY_<SECTION>__<KEY>` variables.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import re
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from relay.config import Config, ConfigError, load_config, sections
from tests.hostile.fuzzing import examples

RELAY_TOML = Path(__file__).resolve().parents[2] / "config" / "relay.toml"
_ASSIGNMENT = re.compile(r"^(\w+)\s*=\s*(.*?)(\s*#.*)?$")


def _toml_string(text: str) -> str:
    # A TOML basic string: json's escapes are TOML's, except that non-ASCII stays verbatim.
    return json.dumps(text, ensure_ascii=False)


def _toml(value: object) -> str:
    """`value` as a TOML inline value (dicts as inline tables)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return "nan" if value != value else "inf" if value == float("inf") else "-inf" if value == -float("inf") \
            else repr(value)
    if isinstance(value, (int, datetime.date, datetime.time)):
        return value.isoformat() if not isinstance(value, int) else str(value)
    if isinstance(value, str):
        return _toml_string(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return "{" + ", ".join(f"{_toml_string(k)} = {_toml(v)}" for k, v in value.items()) + "}"


_TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=12)  # TOML cannot hold lone surrogates
_TOML_SCALARS = st.one_of(
    st.integers(), st.sampled_from([0, -1, 2**63 - 1, -(2**63), 10**30, 4096, 65536]),
    st.floats(), st.booleans(), _TEXT, st.sampled_from(["", "ws://a", "wss://b/", "[" * 50, '{"kinds":[1]}']),
    st.sampled_from([datetime.datetime(1979, 5, 27, 7, 32, tzinfo=datetime.timezone.utc), datetime.date(1979, 5, 27),
                    datetime.time(7, 32)]),
)
TOML_VALUES = st.recursive(
    _TOML_SCALARS,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(
        st.sampled_from(["url", "direction", "filter", "pubkey", "kinds", "since", "limit", "#e", "authors",
                         "table", "kind", "fields", "name", "type", "source", "primary_key", "required",
                         "default", "indexes", "revision", "row_per_tag"]) | _TEXT, children, max_size=5),
    max_leaves=8,
)


_LINES = RELAY_TOML.read_text(encoding="utf-8").split("\n")
_ASSIGNMENTS = st.sampled_from([(i, m.group(1)) for i, line in enumerate(_LINES) if (m := _ASSIGNMENT.match(line))])
_EXTRA_TABLE = st.tuples(
    st.sampled_from(["sync.peers", "projectors", "negentropy.filters", "policies"]),
    st.dictionaries(_TEXT | st.sampled_from(["url", "direction", "filter", "table", "kind", "fields", "primary_key",
                                             "nip70_events", "call", "command", "options", "sources",
                                             "timeout_seconds", "name"]),
                    TOML_VALUES, max_size=5))


@st.composite
def mutated_relay_toml(draw) -> str:
    """config/relay.toml with some assignments given random values, and maybe extra tables appended."""
    lines = list(_LINES)
    for i, key in draw(st.lists(_ASSIGNMENTS, max_size=4)):
        lines[i] = f"{key} = {_toml(draw(TOML_VALUES))}"
    text = "\n".join(lines)
    for table, value in draw(st.lists(_EXTRA_TABLE, max_size=2)):
        if table == "negentropy.filters":
            text = text.replace("[negentropy]", f"[negentropy]\nfilters = [{_toml(value)}]", 1)
        else:
            text = text.replace("peers = []", "") + f"\n[[{table}]]\n" + "\n".join(
                f"{_toml_string(k)} = {_toml(v)}" for k, v in value.items()) + "\n"
    return text


def _setting_names() -> list[str]:
    return [f"RELAY_{name.upper()}__{f.name.upper()}" for name, section in sections().items()
            for f in dataclasses.fields(section)]


ENVIRONMENTS = st.dictionaries(
    st.sampled_from([*_setting_names(), "RELAY_NOPE__X", "RELAY_SERVER__", "RELAY___", "RELAY_PROJECTORS__TABLE"]),
    st.one_of(_TEXT, st.sampled_from(["nan", "inf", "-1", "1e999", "9" * 5000, "1_000", "0x10", "true", "٣"])),
    max_size=3,
)


def _load(tmp_path: Path, text: str | bytes, env: dict[str, str]) -> None:
    path = tmp_path / "relay.toml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    try:
        config = load_config(path, env)
    except ConfigError as exc:
        assert str(exc)
    else:
        assert type(config) is Config


@pytest.fixture(scope="module")
def tmp_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("config")


@examples(40)
@given(text=mutated_relay_toml(), env=ENVIRONMENTS)
@example(text="[server]\nshutdown_timeout_seconds = " + "9" * 400, env={})
@example(text='[[sync.peers]]\nurl = "ws://a"\nfilter = "' + "[" * 100_000 + '"', env={})
@example(text='[[sync.peers]]\nurl = "ws://a"\nfilter = {note = 1979-05-27T07:32:00Z}', env={})
@example(text="[sync]\ninterval_seconds = nan", env={})
@example(text="", env={"RELAY_STORE__EXPIRY_PURGE_INTERVAL_SECONDS": "inf"})
def test_fuzz_config_raises_only_config_error(tmp_dir, text, env):
    """A mutated relay.toml with random RELAY_* variables loads, or fails with ConfigError naming the key."""
    _load(tmp_dir, text, env)


@examples(40)
@given(st.binary(max_size=200) | TOML_VALUES.map(lambda v: f"x = {_toml(v)}").map(str.encode))
def test_fuzz_config_bytes_raise_only_config_error(tmp_dir, data):
    """Random bytes (invalid UTF-8, invalid TOML) as the file fail with ConfigError."""
    _load(tmp_dir, data, {})


_PROJECTOR = '[[projectors]]\ntable = "notes"\nkind = 1\nfields = [{ name = "id", type = "TEXT", source = "id" }]\nprimary_key = ["id"]\n'


@pytest.mark.parametrize("text, env, key", [
    ("[sync]\ninterval_seconds = nan", {}, "sync.interval_seconds"),
    ("[server]\nshutdown_timeout_seconds = inf", {}, "server.shutdown_timeout_seconds"),
    ("", {"RELAY_SYNC__TIMEOUT_SECONDS": "nan"}, "sync.timeout_seconds"),
    ("[server]\nshutdown_timeout_seconds = " + "9" * 400, {}, "server.shutdown_timeout_seconds"),
    ('[[sync.peers]]\nurl = "ws://a"\nfilter = {note = 1979-05-27}', {}, "sync.peers[0].filter"),
    ('[[sync.peers]]\nurl = "ws://a"\nfilter = "' + "[" * 100_000 + '"', {}, "sync.peers[0].filter"),
    ("", {"RELAY_SERVER__PORT": "٣"}, "server.port"),
    ("", {"RELAY_SERVER__PUBLIC_URL": "ws://"}, "server.public_url"),  # no host: would match any unparsable tag
    (_PROJECTOR.replace('["id"]', "[[]]"), {}, "projectors: projector 'notes'"),
    (_PROJECTOR + 'indexes = [["id", []]]\n', {}, "projectors: projector 'notes'"),
    (_PROJECTOR + "revision = " + str(2**70) + "\n", {}, "projectors: projector 'notes'"),
    (_PROJECTOR.replace("]\nprimary", ', { name = "n", type = "INTEGER", source = "content.n", default = '
                        + str(2**63) + " }]\nprimary"), {}, "projectors: projector 'notes', field 'n'"),
])
def test_bad_values_found_by_fuzzing_name_their_key(tmp_path, text, env, key):
    """Refused with ConfigError: NaN or infinite seconds, an integer past double range, a datetime or a 100,000-deep
    JSON filter, non-ASCII digits, a public URL without a host, a projector key or index naming a list, a revision or default past 64 bits."""
    path = tmp_path / "relay.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError, match=re.escape(key)):
        load_config(path, env)
