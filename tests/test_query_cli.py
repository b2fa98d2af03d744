"""`relay query` with bound parameters (--pk, --param, --order-by, --after) as a real subprocess, on a real store."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from tests.helpers import REAL_EVENTS
from tests.test_projectors_cli import relay


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> Path:
    """A database of the first 1,500 real events."""
    tmp_path = tmp_path_factory.mktemp("query")
    path = tmp_path / "relay.db"
    source = tmp_path / "events.jsonl"
    source.write_text("\n".join(REAL_EVENTS.read_text(encoding="utf-8").split("\n")[:1500]) + "\n", encoding="utf-8")
    relay("import", "--create", source, "--db", path)
    return path


def test_pages_by_param_and_order_join_to_the_sql_answer(db):
    """--param/--order-by/--limit pages, followed by their --after cursors, hold exactly the rows SQL returns."""
    conn = sqlite3.connect(db)
    author, = conn.execute("SELECT pubkey FROM follows GROUP BY pubkey ORDER BY count(*) DESC LIMIT 1").fetchone()
    expected = [r[0] for r in conn.execute("SELECT followed FROM follows WHERE pubkey = ? ORDER BY followed",
                                           (author,))]
    conn.close()
    assert len(expected) > 6
    limit = len(expected) // 8 + 1  # about 8 pages (a process each), whatever the list's length
    got, after, pages = [], [], 0
    while True:
        proc = relay("query", "follows", "--db", db, "--param", f"pubkey={author}", "--order-by", "followed",
                     "--limit", str(limit), "--json", *after)
        got += [json.loads(line)["followed"] for line in proc.stdout.splitlines()]
        pages += 1
        if "--after" not in proc.stderr:
            break
        after = ["--after", proc.stderr.split("--after ")[1].split()[0]]
    assert got == expected and pages > 2


def test_pk_reads_one_row_and_bad_parameters_are_named(db):
    """--pk gives the one row of that key; a partial key, an unindexed column, a bad cursor: exit 2 naming it."""
    conn = sqlite3.connect(db)
    pubkey, name = conn.execute("SELECT pubkey, name FROM profiles WHERE name IS NOT NULL LIMIT 1").fetchone()
    conn.close()
    rows = relay("query", "profiles", "--db", db, "--pk", json.dumps({"pubkey": pubkey}), "--json").stdout
    assert [json.loads(line)["name"] for line in rows.splitlines()] == [name]
    assert relay("query", "profiles", "--db", db, "--pk", json.dumps({"pubkey": "0" * 64})).stdout.count("\n") == 1
    assert "followed: missing" in relay("query", "follows", "--db", db, "--pk", json.dumps({"pubkey": pubkey}),
                                        check=2).stderr
    assert "about: not the key or an indexed column" in relay("query", "profiles", "--db", db, "--param", "about=x",
                                                              check=2).stderr
    assert "after: not a cursor" in relay("query", "profiles", "--db", db, "--after", "nope", check=2).stderr
    assert "go alone" in relay("query", "profiles", "--db", db, "--where", "1", "--param", "nip05=x", check=2).stderr


def test_limit_zero_huge_and_a_repeated_param_are_answered(db):
    """--limit 0 prints no row; a limit past SQLite's 64-bit INTEGER, or a column given twice: exit 2 naming it."""
    for extra in ([], ["--param", "nip05=x"], ["--after", relay("query", "profiles", "--db", db, "--order-by", "nip05",
                                                                 "--limit", "1").stderr.split("--after ")[1].split()[0]]):
        proc = relay("query", "profiles", "--db", db, "--limit", "0", "--order-by", "nip05", *extra)
        assert proc.stdout.count("\n") == 1 and "--after" not in proc.stderr  # the header alone
    assert relay("query", "profiles", "--db", db, "--limit", str(2**63 - 1), "--order-by", "nip05").stdout.count(
        "\n") > 1
    for limit in (str(2**63), "9" * 23):
        assert "--limit: a limit is a whole number" in relay("query", "profiles", "--db", db, "--limit", limit,
                                                             "--order-by", "nip05", check=2).stderr
    assert "pubkey: given twice" in relay("query", "profiles", "--db", db, "--param", "pubkey=a", "--param",
                                          "pubkey=b", check=2).stderr
