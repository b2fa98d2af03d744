"""docs/configuration.md is what relay/config_reference.py renders from the keys' declarations, and
config/relay.toml names each scope once per section, over the keys that declare it."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from relay.config import SCOPES, section_keys, sections
from relay.config_reference import ARRAYS, COMMAND, render

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "docs" / "configuration.md"
RELAY_TOML = ROOT / "config" / "relay.toml"

_SECTION = re.compile(r"^\[(\w+)\]")
_KEY = re.compile(r"^(\w+)\s*=")
_SCOPE = re.compile(r"^# Scope: (.+?): (.+)\.$")


def test_the_configuration_reference_is_up_to_date():
    """docs/configuration.md equals `render()`: a key added or changed without regenerating it fails here."""
    assert REFERENCE.read_text(encoding="utf-8") == render(), (
        f"docs/configuration.md is out of date: run `.venv/bin/{COMMAND}` from the repository's root")


def test_every_declared_scope_is_one_of_the_scopes():
    """Each key's scope, its own, the store's (`StoreOptions`) or the protocol's (`EventLimits`), is a key of
    SCOPES or empty (not a limit or budget)."""
    declared = {(section, name): field.metadata.get("scope", "")
                for section in sections() for name, field in section_keys(section).items()}
    unknown = {key: scope for key, scope in declared.items() if scope and scope not in SCOPES}
    assert not unknown, unknown
    assert set(SCOPES) == {scope for scope in declared.values() if scope}, "a scope no key declares"


def test_every_key_of_an_array_of_tables_has_a_doc_and_a_type():
    """The keys of [[sync.peers]], [[retention.rules]], [[policies]], [[projectors]] (and their fields) and
    [[causal_projectors]] are their dataclasses' fields, each with a one-line doc and the type the file holds."""
    for heading, cls, _ in ARRAYS:
        for declared in dataclasses.fields(cls):
            doc, toml_type = declared.metadata.get("doc"), declared.metadata.get("type")
            assert doc and "\n" not in doc and toml_type, f"{heading}.{declared.name}: no doc or type"


def _file_scopes() -> dict[tuple[str, str], str]:
    """Each key of each [section] of config/relay.toml with the scope it sits under ("" for none), checking
    that the file names each scope at most once per section, with SCOPES' words for how it holds."""
    found: dict[tuple[str, str], str] = {}
    section, scope, named = "", "", set()
    for number, line in enumerate(RELAY_TOML.read_text(encoding="utf-8").splitlines(), 1):
        if line.startswith("[["):  # [[projectors]] and the rest: no section keys after them
            section = ""
        elif header := _SECTION.match(line):
            section, scope, named = header.group(1), "", set()
        elif section and (scoped := _SCOPE.match(line)):
            scope, how = scoped.groups()
            assert scope not in named, f"relay.toml:{number}: [{section}] names {scope!r} twice"
            assert SCOPES.get(scope) == how, f"relay.toml:{number}: {scope!r} is not said as relay/config.py says"
            named.add(scope)
        elif line.startswith("#"):  # any other comment at the start of a line ends a scope's keys
            scope = ""
        elif section and (key := _KEY.match(line)):
            found[section, key.group(1)] = scope
    return found


def test_relay_toml_shows_each_scope_once_per_section_over_its_keys():
    """Every key of config/relay.toml sits under the `# Scope:` line of the scope it declares, or under none."""
    in_file = _file_scopes()
    declared = {(section, name): field.metadata.get("scope", "")
                for section in sections() for name, field in section_keys(section).items()}
    assert in_file.keys() == declared.keys()
    wrong = [f"{section}.{name}: under {in_file[section, name]!r}, declares {scope!r}"
             for (section, name), scope in declared.items() if in_file[section, name] != scope]
    assert not wrong, "\n".join(wrong)
