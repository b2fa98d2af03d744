"""config/relay.toml against the one source of each key's rules: the fields of relay/config.py's sections."""

from __future__ import annotations

import dataclasses
import re
import tomllib
from pathlib import Path

import pytest

from relay.config import Config, ConfigError, load_config, section_keys, sections
from relay.protocol import negentropy
from relay.store.store import StoreOptions

RELAY_TOML = Path(__file__).resolve().parents[1] / "config" / "relay.toml"
_HEADER = re.compile(r"^\[(\w+)\]\s*(?:#\s*(.*))?$")
_ASSIGNMENT = re.compile(r"^(\w+)\s*=.*?(?:#\s*(.*))?$")
_CONTINUED = re.compile(r"^\s+#\s*(.*)$")


def _comments() -> dict[tuple[str, str | None], str]:
    """The comment of each `[section]` header (key None) and of each of its keys, continuation lines included."""
    comments: dict[tuple[str, str | None], str] = {}
    section = current = None
    for line in RELAY_TOML.read_text(encoding="utf-8").splitlines():
        if line.startswith("[[") or line.startswith("#"):  # [[projectors]], or a commented-out example
            current = None
        elif header := _HEADER.match(line):
            section, current = header.group(1), (header.group(1), None)
            comments[current] = header.group(2) or ""
        elif section and (assignment := _ASSIGNMENT.match(line)):
            current = (section, assignment.group(1))
            comments[current] = assignment.group(2) or ""
        elif current and (continued := _CONTINUED.match(line)):
            comments[current] += " " + continued.group(1)
    return comments


COMMENTS = _comments()
KEYS = [(section, name) for section in sections() for name in section_keys(section)]


def _rules(section: str, name: str) -> dict:
    return section_keys(section)[name].metadata


def test_every_section_key_is_in_the_file_with_its_default():
    """Each key of each section appears in config/relay.toml with its default, and the file has no other key."""
    data = tomllib.loads(RELAY_TOML.read_text(encoding="utf-8"))
    for section in sections():
        assert set(data[section]) == set(section_keys(section)), section
        for name, value in data[section].items():
            default = section_keys(section)[name].default
            assert (tuple(value) if type(value) is list else value) == default, f"{section}.{name}"


@pytest.mark.parametrize("section, name", KEYS)
def test_every_key_has_its_rules_and_a_comment(section, name):
    """A key declares a one-line doc (and a unit if it is a number), and the file says more in a comment."""
    rules, default = _rules(section, name), section_keys(section)[name].default
    assert rules.get("doc") and "\n" not in rules["doc"], f"{section}.{name}: no one-line doc"
    if type(default) in (int, float) and (section, name) != ("server", "port"):
        assert rules.get("unit"), f"{section}.{name}: a number without a unit"
    assert COMMENTS[section, name], f"{section}.{name}: no comment in {RELAY_TOML.name}"


@pytest.mark.parametrize("section, name", KEYS)
def test_file_comment_agrees_with_the_rules(section, name):
    """The comment names the key's unit (or the key's name does), lists its choices, and marks "(restart)" as
    the key does."""
    rules, comment = _rules(section, name), COMMENTS[section, name]
    unit = rules.get("unit", "").split()[0].lower() if rules.get("unit") else ""
    said = unit in comment.lower() or unit.replace("-", "_").rstrip("s") in name
    assert said, f"{section}.{name}: unit {unit!r} not said"
    for choice in rules.get("choices", ()):
        assert re.search(rf"\b{choice}\b", comment), f"{section}.{name}: choice {choice!r} not listed"
    assert ("(restart)" in comment) == bool(rules.get("restart")), f"{section}.{name}: (restart) mark"


def test_section_restart_marks_agree():
    """A section's header says "(restart)" exactly when the section is read only at start-up."""
    for f in dataclasses.fields(Config):
        if f.name in sections():
            assert ("(restart)" in COMMENTS[f.name, None]) == f.metadata["restart"], f.name


def test_store_keys_are_the_stores_own_fields():
    """Each `[store]` key the store reads is `StoreOptions`' field, default and rules alike, built by `options()`."""
    store_fields = {f.name: f for f in dataclasses.fields(StoreOptions) if f.metadata}
    for name, declared in store_fields.items():
        assert section_keys("store")[name].metadata == declared.metadata
        assert section_keys("store")[name].default == declared.default
    assert Config().store.options() == StoreOptions()


def test_frame_size_minimum_is_the_engines():
    """`[sync]` and `[negentropy]` frame_size_limit take the negentropy engine's minimum."""
    for section in ("sync", "negentropy"):
        assert _rules(section, "frame_size_limit")["min"] == negentropy.MIN_FRAME_SIZE_LIMIT


@pytest.mark.parametrize("text", ["auto", "0", "2", "64"])
def test_server_workers_takes_auto_or_a_count(text):
    """`RELAY_SERVER__WORKERS` is "auto" or a count from 0 to 64."""
    assert load_config(env={"RELAY_SERVER__WORKERS": text}).server.workers == (text if text == "auto" else int(text))


@pytest.mark.parametrize("text", ["65", "-1", "two", "", "9" * 5000])
def test_server_workers_refuses_anything_else_naming_the_key(text):
    """Anything else is a ConfigError naming `server.workers`, a 5,000-digit count included (int() refuses
    strings past 4,300 digits with ValueError: the fuzz test found it)."""
    with pytest.raises(ConfigError, match=r"^server\.workers: "):
        load_config(env={"RELAY_SERVER__WORKERS": text})
