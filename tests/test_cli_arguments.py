"""Every `relay` argument is checked before anything runs (relay/arguments.py): a bad value exits 2 with one line
naming the option, never a traceback, and writes nothing.  Run in-process on a real SQLite file."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from nostr_sdk import EventId, PublicKey

from tests.cli_main import run_main
from tests.helpers import Keys

NOT_UTF8 = b"\xff".decode("utf-8", "surrogateescape")  # how Python hands over an argv byte that is not UTF-8
DEEP = "[" * 5000 + "]" * 5000


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> Path:
    """A database with every default projector's table (a `record put` builds them)."""
    path = tmp_path_factory.mktemp("arguments") / "relay.db"
    code, _, err = run_main(["record", "put", "profiles", "--row", '{"name": "a"}', "--db", path])
    assert code == 0, err
    return path


def _refused(argv: list, option: str) -> str:
    code, out, err = run_main(argv)
    assert "Traceback" not in err + out, err
    assert code == 2 and out == "", (code, out, err)
    assert f"error: argument {option}: " in err, err
    return err


@pytest.mark.parametrize("argv, option", [
    (["record", "get", "profiles", "--pk", '{"pubkey": "\\ud800"}'], "--pk"),
    (["record", "get", "profiles", "--pk", '{"pubkey": "%s"}' % NOT_UTF8], "--pk"),
    (["record", "get", "profiles", "--pk", DEEP], "--pk"),
    (["record", "get", "profiles", "--pk", '{"pubkey": %s}' % DEEP], "--pk"),
    (["record", "delete", "profiles", "--pk", '{"pubkey": "a"}', "--reason", NOT_UTF8], "--reason"),
    (["record", "put", "articles", "--row", '{"d": "x", "published_at": %d}' % 2**63], "--row"),
    (["query", "profiles", "--pk", '{"pubkey": "\\udfff"}'], "--pk"),
    (["query", "profiles", "--param", "pubkey=" + NOT_UTF8], "--param"),
    (["query", "profiles", "--where", "name = '" + NOT_UTF8 + "'"], "--where"),
    (["query", "profiles", "--where", "name = 'a\x00'"], "--where"),
    (["query", "articles", "--order-by", "published_at", "--after",
      base64.urlsafe_b64encode(json.dumps([2**63, "a", "b"]).encode()).decode()], "--after"),
    (["changes", "--table", NOT_UTF8], "--table"),
    (["projectors", "refusals", "--projector", NOT_UTF8], "--projector"),
    (["serve", "--host", NOT_UTF8, "--port", "0"], "--host"),
    (["serve", "--port", "-1"], "--port"),
    (["sync", "ws://" + NOT_UTF8], "url"),
    (["sync", "ws://[::1"], "url"),
    (["sync", "ws://"], "url"),
    (["sync", "ws://127.0.0.1:1", "--filter", '{"limit": 1}'], "--filter"),
    (["export", "--filter", '{"#t": ["\\ud800"]}'], "--filter"),
    (["backup", "copy" + NOT_UTF8 + ".db"], "path"),
    (["ban", "event", NOT_UTF8], "item"),
    (["ban", "pubkey", "npub1nothex"], "item"),
    (["ban", "ip", "192.0.2.1", "--reason", NOT_UTF8], "--reason"),
    (["changes", "--kinds", "\u00b2"], "--kinds"),
    (["record", "put", "profiles", "--row", "{}", "--key", "k" * 300], "--key"),
    (["export", "-o", "e" * 300], "--output/-o"),
    (["changes", "--since", "9" * 5000], "--since"),
], ids=lambda v: None if isinstance(v, list) else v)
def test_a_bad_value_exits_2_naming_the_option(db, argv, option):
    """Lone surrogates (escaped in JSON, or a non-UTF-8 argv byte), deep JSON, integers past 64 bits, NUL in SQL,
    a URL without host: one line naming the option, exit 2 (each was a traceback, exit 1, or got further)."""
    _refused([*argv, "--db", db], option)


def test_paths_are_checked_before_anything_runs(db, tmp_path):
    """import FILE must exist and not be a directory; outputs (backup, export -o, import --rejects) need an
    existing directory to be written in, and may not be one."""
    lines = tmp_path / "events.jsonl"
    lines.write_text("")
    assert "No such file" in _refused(["import", tmp_path / "missing.jsonl", "--db", db], "file")
    assert "is a directory" in _refused(["import", tmp_path, "--db", db], "file")
    assert "is a directory" in _refused(["export", "-o", tmp_path, "--db", db], "--output/-o")
    assert "no directory" in _refused(["backup", tmp_path / "nowhere" / "copy.db", "--db", db], "path")
    assert "no directory" in _refused(["import", lines, "--rejects", tmp_path / "no" / "r.jsonl", "--db", db],
                                      "--rejects")
    assert "not a directory" in _refused(["key", "--file", lines / "node.key", "--db", db], "--file")
    assert not (tmp_path / "nowhere").exists() and not (tmp_path / "no").exists()


def test_a_non_utf8_ban_reason_is_never_stored(db):
    """`relay ban pubkey X --reason $'\\xff'` (it once reached the serving relay's writer and crashed it): refused
    at the command line, and the ban list stays empty."""
    _refused(["ban", "pubkey", Keys(5).pubkey, "--reason", "spam " + NOT_UTF8, "--db", db], "--reason")
    code, out, _ = run_main(["bans", "--json", "--db", db])
    assert code == 0 and json.loads(out)["pubkeys"] == []


def test_an_integer_param_past_64_bits_exits_2_naming_the_column(db):
    """`--param published_at=2^63` on an INTEGER column was an OverflowError traceback; now exit 2 naming it."""
    for value in (str(2**63), str(-(2**63) - 1)):
        code, out, err = run_main(["query", "articles", "--param", f"published_at={value}", "--db", db])
        assert code == 2 and "Traceback" not in err and "relay query: published_at: " in err, err
    code, out, err = run_main(["query", "articles", "--param", f"published_at={-(2**63)}", "--db", db])
    assert code == 0, err


def test_ban_and_unban_take_npub_and_note(db):
    """A pubkey given as npub1... and an event id as note1... are banned as their hex, and unbanned by either."""
    pubkey, event_id = Keys(9).pubkey, "ab" * 32
    npub, note = PublicKey.parse(pubkey).to_bech32(), EventId.parse(event_id).to_bech32()
    assert run_main(["ban", "pubkey", npub, "--reason", "spam", "--db", db])[0] == 0
    assert run_main(["ban", "event", note, "--db", db])[0] == 0
    code, out, _ = run_main(["bans", "--json", "--db", db])
    found = json.loads(out)
    assert [p["pubkey"] for p in found["pubkeys"]] == [pubkey] and [e["id"] for e in found["events"]] == [event_id]
    assert run_main(["unban", "pubkey", pubkey, "--db", db])[0] == 0
    assert run_main(["unban", "event", note, "--db", db])[0] == 0
    assert "bad bech32 checksum" in _refused(["ban", "pubkey", npub[:-1] + ("q" if npub[-1] != "q" else "p"),
                                              "--db", db], "item")
    assert "64 lowercase hex characters or npub1" in _refused(["ban", "pubkey", note, "--db", db], "item")
