"""The projector command line as real subprocesses (`python -m relay`): verify, projectors list | rebuild |
refusals, query; configuration of projectors from TOML."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REAL_EVENTS, Keys

REPO = Path(__file__).resolve().parents[1]
BAD = Keys(0xBAD).sign(kind=0, content="{not json", created_at=1_700_000_000)
ZAPS_TOML = """
[[projectors]]
table = "zaps"
kind = 9735
primary_key = ["id"]
revision = {revision}
fields = [
    {{ name = "id", type = "TEXT", source = "id" }},
    {{ name = "recipient", type = "TEXT", source = "tag:p" }},
    {{ name = "bolt11", type = "TEXT", source = "tag:bolt11", required = true }},
]
"""


def relay(*args, check: int | None = 0) -> subprocess.CompletedProcess:
    """Run `python -m relay ARGS` (no RELAY_* environment); assert the exit code when `check` is not None."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RELAY_")}
    proc = subprocess.run([sys.executable, "-m", "relay", *map(str, args)], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=120)
    if check is not None:
        assert proc.returncode == check, proc.stdout + proc.stderr
    return proc


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> Path:
    """A database holding the first 2,000 real events and one malformed profile, imported with the defaults."""
    path = tmp_path_factory.mktemp("cli") / "relay.db"
    source = path.parent / "events.jsonl"
    lines = REAL_EVENTS.read_text(encoding="utf-8").split("\n")[:2000]
    source.write_text("\n".join(lines + [json.dumps(BAD)]) + "\n", encoding="utf-8")
    relay("import", "--create", source, "--db", path)
    return path


def test_verify_list_query_and_refusals_on_an_imported_store(db):
    """verify exits 0; list shows four current projectors; query and refusals print what is stored."""
    out = relay("verify", "--db", db).stdout
    assert "relay verify: 4 of 4 projected tables agree with the events" in out
    listing = relay("projectors", "list", "--db", db).stdout.splitlines()
    assert listing[0].split()[:4] == ["NAME", "KIND", "REV", "STATE"]
    assert [line.split()[0] for line in listing[1:]] == ["profiles", "follows", "relay_lists", "articles"]
    assert all(line.split()[3] == "current" for line in listing[1:])
    conn = sqlite3.connect(db)
    pubkey, name = conn.execute("SELECT pubkey, name FROM profiles WHERE name IS NOT NULL LIMIT 1").fetchone()
    follows = conn.execute("SELECT count(*) FROM follows").fetchone()[0]
    conn.close()
    found = relay("query", "profiles", "--db", db, "--where", f"pubkey = '{pubkey}'", "--json").stdout.splitlines()
    assert [json.loads(line)["name"] for line in found] == [name]
    table = relay("query", "follows", "--db", db).stdout.splitlines()
    assert table[0].split("\t")[:4] == ["_event_id", "_pubkey", "_created_at", "pubkey"] and len(table) == follows + 1
    refusals = relay("projectors", "refusals", "--db", db, "--json").stdout.splitlines()
    assert [(r["projector"], r["event_id"], r["reason"]) for r in map(json.loads, refusals)] == [
        ("profiles", BAD["id"], "content is not valid JSON")]


def test_query_refuses_unknown_tables_and_bad_sql(db):
    """Only projected tables can be queried (exit 2); a bad --where is reported (exit 2)."""
    assert "not a projected table" in relay("query", "events", "--db", db, check=2).stderr
    assert "no such column" in relay("query", "profiles", "--db", db, "--where", "nope = 1", check=2).stderr


def test_verify_reports_tampering_and_rebuild_repairs_it(db, tmp_path):
    """A changed, a deleted and an invented row: verify exits 1 naming them; `projectors rebuild` repairs."""
    copy = tmp_path / "copy.db"
    source = sqlite3.connect(db)
    source.backup(target := sqlite3.connect(copy))
    source.close()
    target.execute("UPDATE profiles SET name = 'tampered' WHERE pubkey = (SELECT min(pubkey) FROM profiles)")
    target.execute("DELETE FROM follows WHERE followed = (SELECT min(followed) FROM follows)")
    target.execute("INSERT INTO relay_lists (_event_id, _created_at, pubkey, url) VALUES ('e', 1, 'orphan-author', 'wss://orphan')")
    target.commit()
    target.close()
    out = relay("verify", "--db", copy, check=1).stdout
    assert "profiles: 0 missing, 0 orphan, 1 mismatched" in out
    assert "follows: " in out and " missing, 0 orphan, 0 mismatched" in out
    assert "relay_lists: 0 missing, 1 orphan, 0 mismatched" in out and "orphan: orphan-author | wss://orphan" in out
    for name in ("profiles", "follows", "relay_lists"):
        assert f"rebuilt {name} from" in relay("projectors", "rebuild", name, "--db", copy).stdout
    assert "4 of 4 projected tables agree" in relay("verify", "--db", copy).stdout
    assert "no configured projector 'nope'" in relay("projectors", "rebuild", "nope", "--db", copy, check=2).stderr


def test_configured_projector_revision_and_removal(db, tmp_path):
    """A projector from TOML: pending until the store opens, rebuilt on a revision bump, reported once removed."""
    copy = tmp_path / "copy.db"
    source = sqlite3.connect(db)
    source.backup(target := sqlite3.connect(copy))
    source.close()
    target.close()
    config = tmp_path / "relay.toml"
    config.write_text(ZAPS_TOML.format(revision=1))
    listing = relay("projectors", "list", "--config", config, "--db", copy).stdout
    assert "pending (new)" in listing and "removed from the configuration" in listing
    assert "not built for this configuration (new)" in relay("verify", "--config", config, "--db", copy, check=1).stdout
    relay("projectors", "rebuild", "zaps", "--config", config, "--db", copy)
    out = relay("verify", "--config", config, "--db", copy).stdout
    assert "zaps: ok" in out and "profiles: no longer configured" in out
    config.write_text(ZAPS_TOML.format(revision=2))
    assert "pending (revision 1 -> 2)" in relay("projectors", "list", "--config", config, "--db", copy).stdout
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    relay("import", "--create", empty, "--config", config, "--db", copy)  # any writer's start-up rebuilds what changed
    listing = relay("projectors", "list", "--config", config, "--db", copy).stdout.splitlines()
    assert next(line for line in listing if line.startswith("zaps ")).split()[:4] == ["zaps", "9735", "2", "current"]
    conn = sqlite3.connect(copy)
    assert conn.execute("SELECT count(*) FROM zaps").fetchone()[0] == conn.execute(
        "SELECT count(*) FROM events WHERE kind = 9735").fetchone()[0] > 0
    conn.close()


def test_bad_projector_config_exits_2_naming_projector_and_field(tmp_path):
    """A spec whose key does not match its kind stops every subcommand with exit 2 and a clear message."""
    config = tmp_path / "relay.toml"
    config.write_text(ZAPS_TOML.format(revision=1).replace('primary_key = ["id"]', 'primary_key = ["recipient"]'))
    err = relay("verify", "--config", config, "--db", tmp_path / "x.db", check=2).stderr
    assert "projectors: projector 'zaps': primary_key must be the fields whose sources are 'id'" in err


def _untsv(field: str) -> str | None:
    """A `relay query` TSV field back to its value (PostgreSQL COPY text format)."""
    if field == "\\N":
        return None
    escapes = {"\\\\": "\\", "\\t": "\t", "\\n": "\n", "\\r": "\r"}
    out, i = [], 0
    while i < len(field):
        pair = field[i:i + 2]
        out.append(escapes[pair] if pair in escapes else field[i])
        i += 2 if pair in escapes else 1
    return "".join(out)


def test_query_plain_output_is_one_line_per_row(db):
    """Tabs, newlines and backslashes in values are escaped (NULL is \\N), so each row is one line that reads
    back to the stored values; --csv gives the same rows as CSV."""
    conn = sqlite3.connect(db)
    stored = conn.execute("SELECT * FROM profiles").fetchall()
    conn.close()
    assert any("\n" in str(v) for row in stored for v in row)  # the real profiles hold multi-line `about`s
    lines = relay("query", "profiles", "--db", db).stdout.split("\n")
    assert lines[-1] == "" and len(lines) - 2 == len(stored)
    width = len(lines[0].split("\t"))
    rows = [tuple(_untsv(f) for f in line.split("\t")) for line in lines[1:-1]]
    assert all(len(row) == width for row in rows)
    assert sorted(rows, key=repr) == sorted((tuple(None if v is None else str(v) for v in row) for row in stored),
                                            key=repr)
    import csv
    import io

    table = list(csv.reader(io.StringIO(relay("query", "profiles", "--db", db, "--csv").stdout)))
    assert table[0] == lines[0].split("\t") and len(table) == len(stored) + 1


def test_refusals_say_none_when_there_are_none(db):
    """`projectors refusals` prints "none" rather than nothing when no event was refused (for that projector)."""
    assert relay("projectors", "refusals", "--db", db, "--projector", "follows").stdout == "none for follows\n"
    assert relay("projectors", "refusals", "--db", db, "--projector", "follows", "--json").stdout == ""


def test_query_limit_holds_against_a_where_comment_and_refuses_a_negative_limit(db):
    """A `--` comment ending --where cannot swallow the LIMIT (one row printed, not every row); --limit -1 is an
    argument error (exit 2), not "every row"."""
    rows = relay("query", "profiles", "--db", db, "--where", "1=1 -- c", "--limit", "1", "--json").stdout
    assert len(rows.splitlines()) == 1
    assert "a limit is a whole number" in relay("query", "profiles", "--db", db, "--limit", "-1", check=2).stderr
    assert "a limit is a whole number" in relay("projectors", "refusals", "--db", db, "--limit", "-1", check=2).stderr


def test_refusal_counts_of_a_full_log_are_lower_bounds(tmp_path):
    """With more refusals than `store.max_projector_refusals` keeps, verify says "at least N events refused" and
    projectors list "N+", not a total that is too small."""
    config = tmp_path / "relay.toml"
    config.write_text(f'[store]\npath = "{tmp_path / "relay.db"}"\nmax_projector_refusals = 1\n')
    source = tmp_path / "events.jsonl"
    bad = [Keys(0xBAD0 + i).sign(kind=0, content="{not json", created_at=1_700_000_000) for i in range(2)]
    source.write_text("".join(json.dumps(e) + "\n" for e in bad), encoding="utf-8")
    relay("import", "--create", source, "--config", config)
    assert "profiles: ok, 0 rows (at least 1 events refused)" in relay("verify", "--config", config).stdout
    listing = relay("projectors", "list", "--config", config).stdout.splitlines()
    assert next(line.split() for line in listing if line.startswith("profiles"))[5] == "1+"
